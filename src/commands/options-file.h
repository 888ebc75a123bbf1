// A command's settings read from a TOML file (`keepwarm serve --config FILE`): each top-level key is one of the
// command's long options without its dashes (`ctx-size = 65536`; `ctx_size` is the same key), with the value it
// would take on the command line: a string, a number, a boolean for a flag, an array for an option given several
// times. The command line wins: an option given there (or excluded by one given there) keeps its value and the file's
// is skipped. Each value goes through the option's own checks, so a mistake is the same error the command line would
// give, prefixed with the file, line and column. Tables (`[policy]`) go to the command's own readers.
// Threading: called once, while the command line is parsed.
#pragma once

#include <toml++/toml.h>
#include <CLI/CLI.hpp>

#include <functional>
#include <map>
#include <set>
#include <string>
#include <string_view>

#include "config/toml-reader.h"

namespace keepwarm {

struct options_file_rules {
    // Options whose value is a path: a relative one is taken from the file's folder, not the working directory.
    std::set<std::string> path_options;
    // Options a file may not set (the file's own option, --help): named in the error.
    std::set<std::string> not_in_file;
    // What a table key holds, read by its own reader (errors through the reader, naming the line).
    std::map<std::string, std::function<void(const toml::table&, const config::toml_reader&)>> tables;
    // Settings or tables that hold keys (api-key, [tenants]): a file that sets one is warned about at start-up when
    // other users can read it (config/key-file-mode.h).
    std::set<std::string> key_settings;
};

// Applies the file at `path` (at most 1 MiB) to the options of `cmd` not given on its command line, and logs a warning
// if it holds one of rules.key_settings and other users can read it. Throws
// config::config_file_error ("FILE:LINE:COLUMN: ...") for a mistake, std::runtime_error if the file cannot be read.
void apply_options_file(CLI::App& cmd, const std::string& path, const options_file_rules& rules);
// The same from text; `source_name` names it in errors, `base_dir` is where relative paths start.
// Returns whether the text sets one of rules.key_settings.
bool apply_options_text(CLI::App& cmd, std::string_view text, const std::string& source_name,
                        const std::string& base_dir, const options_file_rules& rules);

}  // namespace keepwarm

// How a command's settings file (`keepwarm serve --config FILE`, `keepwarm proxy --config FILE`) is read, one way
// for every command: at most 1 MiB, read whole, parsed as TOML (a syntax error names the file, line and column), with
// the folder its relative paths start from. What its keys mean is the command's own reader's (config::toml_reader),
// and so are its messages; each names the file and line.
// Threading: any thread; no shared state.
#pragma once

#include <toml++/toml.h>

#include <cstdint>
#include <filesystem>
#include <string>

namespace keepwarm::config {

constexpr std::uintmax_t max_settings_file_bytes = 1u << 20;

struct settings_file {
    std::string path;                // as given: names the file in messages
    std::filesystem::path base_dir;  // the file's folder, absolute: where its relative paths start
    toml::table root;
};

// Throws std::runtime_error naming the file when it cannot be read or is over max_settings_file_bytes, and
// config_file_error ("FILE:LINE:COLUMN: ...") when it is not TOML.
settings_file read_settings_file(const std::string& path);

}  // namespace keepwarm::config

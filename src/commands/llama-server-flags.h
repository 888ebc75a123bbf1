// llama-server's command line, as far as `keepwarm serve` can take it: its multi-letter single-dash flags spelled
// as keepwarm's long options, the flags that describe what keepwarm always does (accepted), and those it cannot
// honour (refused with exit status 2 and what to do instead). The flags with a real meaning (-fa, --temp, -a, ...)
// are ordinary options of serve-command.cpp.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace keepwarm {

// The exit status of a refused flag: a usage error.
inline constexpr int refused_flag_exit_code = 2;

// The arguments after the program name, with llama-server's multi-letter single-dash flags (-ngl, -fa, -hf, ...)
// replaced by their long names. CLI11 reads "-hf" as "-h -f" (help, exit 0): any other single-dash word of two or
// more letters is refused here (CLI::ParseError, refused_flag_exit_code) rather than taken apart into short flags.
// Everything after "--" is left alone.
std::vector<std::string> expand_llama_server_flags(const std::vector<std::string>& args);

// Adds to `serve` the llama-server flags that need no option of their own: those true of keepwarm anyway (--jinja,
// --cont-batching, --no-webui, --metrics, --slots, --reasoning-format deepseek|auto), accepted and shown in the help,
// and those keepwarm cannot honour (--hf-repo and the other downloads, --timeout, --threads-http, --no-jinja, ...),
// hidden from the help and refused when given with a message that says what to do instead.
void add_llama_server_flags(CLI::App& serve);

}  // namespace keepwarm

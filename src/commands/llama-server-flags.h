// llama-server's command line, as far as `keepwarm serve` can take it: its multi-letter single-dash flags spelled
// as keepwarm's long options, the flags that describe what keepwarm always does (accepted), and those it cannot
// honour (refused with exit status 2 and what to do instead). The flags with a real meaning (-fa, --temp, -a, ...)
// are ordinary options of serve-command.cpp.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "commands/environment-options.h"

namespace keepwarm {

// The exit status of a refused flag: a usage error.
inline constexpr int refused_flag_exit_code = 2;

// The arguments after the program name, with llama-server's multi-letter single-dash flags (-ngl, -fa, -hf, ...)
// replaced by their long names. CLI11 reads "-hf" as "-h -f" (help, exit 0): any other single-dash word of two or
// more letters is refused here (CLI::ParseError, refused_flag_exit_code) rather than taken apart into short flags.
// Everything after "--" is left alone.
std::vector<std::string> expand_llama_server_flags(const std::vector<std::string>& args);

// llama-server's single-dash names of keepwarm's long option `long_name` ("--parallel" -> {"-np"}): shown in the help.
std::vector<std::string> llama_server_single_dash_names(const std::string& long_name);

// The help group of the flags below that are shown.
inline constexpr const char* llama_server_flags_group = "llama-server flags that keepwarm follows anyway";

// Adds to `serve` the llama-server flags that need no option of their own: those true of keepwarm anyway (--jinja,
// --cont-batching, --no-webui, --metrics, --slots, --reasoning-format deepseek|auto), accepted and shown in the help,
// and those keepwarm cannot honour (--hf-repo and the other downloads, --timeout, --threads-http, --no-jinja, ...),
// hidden from the help and refused when given with a message that says what to do instead.
void add_llama_server_flags(CLI::App& serve);

// The environment variables `serve` reads: llama-server's LLAMA_ARG_* of every flag serve accepts or refuses, under
// the names the pinned common/arg.cpp gives them (LLAMA_ARG_MODEL, LLAMA_ARG_CTX_SIZE, ...), and the API key's
// KEEPWARM_API_KEY and LLAMA_API_KEY (first found wins).
const std::vector<environment_binding>& llama_server_environment();

// The variables of the API key alone (KEEPWARM_API_KEY, LLAMA_API_KEY): what `proxy` reads.
const std::vector<environment_binding>& api_key_environment();

}  // namespace keepwarm

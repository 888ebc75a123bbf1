// Options read from environment variables, as llama-server reads its LLAMA_ARG_* (common/arg.cpp's set_env): a
// variable gives the value its option would take on the command line, through the option's own checks, so a mistake
// is the error the flag would give, prefixed with the variable's name (never its value: it may be a key). Precedence:
// the command line, then the environment, then a settings file (--config): an option given on the command line keeps
// its value, and one the environment set counts as given when the settings file is read.
// Threading: called once, while the command line is parsed.
#pragma once

#include <CLI/CLI.hpp>

#include <map>
#include <string>
#include <vector>

namespace keepwarm {

struct environment_binding {
    std::string option;    // the option's long name: "--ctx-size"
    std::string variable;  // "LLAMA_ARG_CTX_SIZE"
    // A flag bound to the negative of its variable (LLAMA_ARG_MMAP=false gives --no-mmap); llama.cpp's true values
    // are on, enabled, true, 1 and its false ones off, disabled, false, 0.
    bool inverted = false;
};

using environment = std::map<std::string, std::string>;

// This process's environment variables.
environment process_environment();

// Applies to `cmd` the variables of `bindings` that `env` holds, for options not given on the command line, in the
// order of `bindings` (the first variable of an option wins). A flag is given by a true value and left alone by a
// false one. Bindings to options `cmd` does not have are skipped. Returns the variables applied, in order.
// Throws the option's CLI::ParseError (its exit status kept), the message prefixed with "VARIABLE (environment): ".
std::vector<std::string> apply_environment(CLI::App& cmd, const std::vector<environment_binding>& bindings,
                                           const environment& env);

// The variables of `env` that start with `prefix` and are not in `bindings`: read by nobody here.
std::vector<std::string> unread_variables(const std::vector<environment_binding>& bindings, const environment& env,
                                          const std::string& prefix);

}  // namespace keepwarm

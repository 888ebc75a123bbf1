// How a subcommand (`keepwarm serve`, `keepwarm bench depth`, ...) ends: its error as one line in the log and an exit
// status, through CLI11, which main() turns into the process's exit code. Threading: the command's own thread.
#pragma once

#include <CLI/CLI.hpp>
#include <exception>
#include <string_view>

#include "base/logger.h"

namespace keepwarm {

// Ends the command named `command` (as the log line names it) with `message` and `exit_status`.
[[noreturn]] inline void fail_command(std::string_view command, std::string_view message, int exit_status = 1) {
    log::error(command, "{}", message);
    throw CLI::RuntimeError(exit_status);
}

// Runs `body`, a command's work that returns its exit status: a nonzero status ends the command with it; an exception
// (other than CLI11's own, which carry their status) ends it with the exception's message and `error_status`.
template <typename Body>
void run_command(std::string_view command, Body&& body, int error_status = 1) {
    int status = 0;
    try {
        status = body();
    } catch (const CLI::Error&) {
        throw;
    } catch (const std::exception& e) {
        fail_command(command, e.what(), error_status);
    }
    if (status != 0) throw CLI::RuntimeError(status);
}

}  // namespace keepwarm

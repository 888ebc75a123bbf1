// keepwarm: an LLM server for agentic workloads that computes a long shared prefix once and reuses it.
// This file only assembles the subcommands; each lives with the component it drives.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "bench/depth-bench.h"
#include "commands/command-line-help.h"
#include "commands/doctor-command.h"
#include "commands/llama-server-flags.h"
#include "commands/model-commands.h"
#include "commands/proxy-command.h"
#include "commands/serve-command.h"

int main(int argc, char** argv) {
    CLI::App app{"keepwarm: an LLM server that keeps the KV cache of agent prompts warm"};
    app.set_version_flag("--version", std::string("keepwarm ") + KEEPWARM_VERSION);
    app.require_subcommand(1);

    keepwarm::add_serve_command(app);
    keepwarm::add_mkmodel_command(app);
    keepwarm::add_inspect_command(app);
    keepwarm::bench::add_bench_command(app);
    keepwarm::add_doctor_command(app);
    keepwarm::add_proxy_command(app);

    std::vector<std::string> args;
    try {
        // llama-server's command lines work here too: its -ngl, -fa, ... (CLI11 only knows -x and --xx).
        args = keepwarm::expand_llama_server_flags({argv + 1, argv + argc});
        std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes the arguments in reverse order
        app.parse(reversed);
    } catch (const CLI::ParseError& e) {
        // A mistyped command or option: say which, and the nearest one, rather than "not expected".
        const bool unexpected = dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr ||
                                dynamic_cast<const CLI::RequiredError*>(&e) != nullptr;
        if (unexpected) {
            if (const auto message = keepwarm::unknown_word_message(app, args)) {
                std::cerr << *message << std::endl;
                return e.get_exit_code();
            }
        }
        return app.exit(e);
    }
    return 0;
}

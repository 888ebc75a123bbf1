// keepwarm: an LLM server for agentic workloads that computes a long shared prefix once and reuses it.
// This file only assembles the subcommands; each lives with the component it drives.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "bench/depth-bench.h"
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

    try {
        // llama-server's command lines work here too: its -ngl, -fa, ... (CLI11 only knows -x and --xx).
        std::vector<std::string> args = keepwarm::expand_llama_server_flags({argv + 1, argv + argc});
        std::reverse(args.begin(), args.end());  // CLI11 takes the arguments in reverse order
        app.parse(args);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    return 0;
}

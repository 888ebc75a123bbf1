// keepwarm: an LLM server for agentic workloads that computes a long shared prefix once and reuses it.
// This file only assembles the subcommands; each lives with the component it drives.
#include <CLI/CLI.hpp>

#include "model/model-commands.h"
#include "server/serve-command.h"

int main(int argc, char** argv) {
    CLI::App app{"keepwarm: an LLM server that keeps the KV cache of agent prompts warm"};
    app.set_version_flag("--version", std::string("keepwarm ") + KEEPWARM_VERSION);
    app.require_subcommand(1);

    keepwarm::add_serve_command(app);
    keepwarm::add_mkmodel_command(app);
    keepwarm::add_inspect_command(app);

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    return 0;
}

// `keepwarm mkmodel` (generate a random-weight GGUF) and `keepwarm inspect` (what a GGUF costs to serve).
#pragma once

#include <CLI/CLI.hpp>

namespace keepwarm {

void add_mkmodel_command(CLI::App& app);
void add_inspect_command(CLI::App& app);

}  // namespace keepwarm

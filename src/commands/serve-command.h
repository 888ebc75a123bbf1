// `keepwarm serve`: loads a model (or the generated demo model), starts the engine and the HTTP API.
#pragma once

#include <CLI/CLI.hpp>

namespace keepwarm {

void add_serve_command(CLI::App& app);

}  // namespace keepwarm

// `keepwarm bench gauntlet`: writes a workload (--generate), or replays one (a file, or generated in memory) against
// --target endpoints or servers it launches itself (--launch), and reports per target against the ideal prefill.
#pragma once

#include <CLI/CLI.hpp>

namespace keepwarm::bench::gauntlet {

// Adds `gauntlet` under the `bench` command.
void add_gauntlet_command(CLI::App& bench);

}  // namespace keepwarm::bench::gauntlet

// `keepwarm bench experts`: records which experts each MoE layer routes every token to over a workload (or reads a
// trace recorded earlier), then simulates a per-layer GPU expert cache of S slots (plain LRU, and LRU behind an
// admission gate) to show how many slots a model and its traffic need: a table, and optionally JSON, SVG and the
// trace file.
// Threading: the command runs on the thread that parses the command line, as CLI11 calls it back.
#pragma once

#include <CLI/CLI.hpp>

namespace keepwarm::bench {

// Adds `experts` under the `bench` command.
void add_experts_bench_command(CLI::App& bench);

}  // namespace keepwarm::bench

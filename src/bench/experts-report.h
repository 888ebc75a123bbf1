// How `bench experts` shows a sweep: the terminal table, the JSON document written by --json and the SVG chart of
// hit rate against slots per layer written by --svg.
// Threading: pure functions; any thread.
#pragma once

#include <string>

#include "bench/experts-simulation.h"

namespace keepwarm::bench {

std::string format_experts_table(const experts_bench_report& report);
std::string format_experts_json(const experts_bench_report& report);
std::string format_experts_svg(const experts_bench_report& report);

}  // namespace keepwarm::bench

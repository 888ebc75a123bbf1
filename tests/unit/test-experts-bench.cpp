// `keepwarm bench experts`' simulation and reports: the expert cache replayed over synthetic traces with
// hand-checked counts, the slot lists a sweep covers, and the table, JSON and SVG renderers.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "bench/experts-report.h"
#include "bench/experts-simulation.h"

using namespace keepwarm;
using namespace keepwarm::bench;

namespace {

// One layer, one expert per token, 100 bytes per expert: 0 1 0 2 0 1.
expert_trace single_layer_trace() {
    expert_trace trace;
    trace.model_desc = "synthetic";
    trace.n_expert = 4;
    trace.n_expert_used = 1;
    trace.n_prompt_tokens = 4;
    trace.n_generated_tokens = 2;
    trace.layers = {{0, 100, {0, 1, 0, 2, 0, 1}}};
    return trace;
}

// Two layers of different expert sizes, two experts per token, three tokens.
expert_trace two_layer_trace() {
    expert_trace trace;
    trace.model_desc = "qwen3moe <synthetic> & co";
    trace.n_expert = 4;
    trace.n_expert_used = 2;
    trace.n_prompt_tokens = 2;
    trace.n_generated_tokens = 1;
    trace.layers = {{0, 10, {0, 1, 0, 1, 2, 3}}, {1, 1000, {0, 1, 2, 3, 0, 1}}};
    return trace;
}

void expect_stats(const expert_cache_stats& s, uint64_t hits, uint64_t fills, uint64_t streamed, uint64_t evictions,
                  uint64_t bytes) {
    EXPECT_EQ(s.hits, hits);
    EXPECT_EQ(s.fills, fills);
    EXPECT_EQ(s.streamed, streamed);
    EXPECT_EQ(s.evictions, evictions);
    EXPECT_EQ(s.bytes_moved, bytes);
    EXPECT_EQ(s.hits + s.uploads(), s.lookups);
}

}  // namespace

TEST(experts_simulation, lru_counts_hits_and_evictions_per_slot_count) {
    const expert_trace trace = single_layer_trace();
    // S=1: every change of expert evicts the previous one.
    expect_stats(simulate_expert_cache(trace, 1, {}), 0, 6, 0, 5, 600);
    // S=2: [0] [1 0] hit0 [2 0]: evicts 1, hit0, [1 0]: evicts 2.
    expect_stats(simulate_expert_cache(trace, 2, {}), 2, 4, 0, 2, 400);
    // S=3 holds the working set: only the three cold misses.
    expect_stats(simulate_expert_cache(trace, 3, {}), 3, 3, 0, 0, 300);
    expect_stats(simulate_expert_cache(trace, 4, {}), 3, 3, 0, 0, 300);
    EXPECT_EQ(simulate_expert_cache(trace, 2, {}).lookups, 6u);
    EXPECT_DOUBLE_EQ(simulate_expert_cache(trace, 3, {}).hit_rate(), 0.5);
}

TEST(experts_simulation, admission_gate_streams_until_k_uses_in_the_window) {
    const expert_trace trace = single_layer_trace();
    // k=2, w=3, S=1: t0 e0 streamed, t1 e1 streamed, t2 e0 (uses t0,t2) admitted, t3 e2 streamed, t4 e0 hit,
    // t5 e1 (t1 has left the window t3..t5) streamed.
    expect_stats(simulate_expert_cache(trace, 1, {2, 3}), 1, 1, 4, 0, 500);
    // w=5 keeps t1 in the window at t5, so e1 is admitted there and evicts e0.
    expect_stats(simulate_expert_cache(trace, 1, {2, 5}), 1, 2, 3, 1, 500);
    // No expert serves two consecutive tokens, so a two-token window never admits one: everything streams.
    expect_stats(simulate_expert_cache(trace, 4, {2, 2}), 0, 0, 6, 0, 600);
    // k=1 admits on first use: plain LRU.
    expect_stats(simulate_expert_cache(trace, 2, {1, 8}), 2, 4, 0, 2, 400);
}

TEST(experts_simulation, rejects_impossible_gates_and_empty_caches) {
    const expert_trace trace = single_layer_trace();
    EXPECT_THROW(simulate_expert_cache(trace, 0, {}), std::invalid_argument);
    EXPECT_THROW(simulate_expert_cache(trace, 2, {3, 2}), std::invalid_argument);
    EXPECT_THROW(simulate_expert_cache(trace, 2, {0, 2}), std::invalid_argument);
}

TEST(experts_simulation, sums_layers_with_their_own_expert_sizes) {
    const expert_trace trace = two_layer_trace();
    // S=2: layer 0 hits both experts of token 1 (2 hits, 4 fills, 2 evictions, 4 x 10 bytes); layer 1 changes pair
    // every token (6 fills, 4 evictions, 6 x 1000 bytes).
    expect_stats(simulate_expert_cache(trace, 2, {}), 2, 10, 0, 6, 6040);
    // S=4: each layer loads its four experts once and hits twice.
    expect_stats(simulate_expert_cache(trace, 4, {}), 4, 8, 0, 0, 4040);

    const experts_bench_report report = simulate_expert_caches(trace, {2, 4}, {2, 2});
    EXPECT_EQ(report.n_moe_layers, 2u);
    EXPECT_EQ(report.n_tokens(), 3u);
    EXPECT_EQ(report.bytes_per_token_uncached, 2u * 10 + 2u * 1000);
    ASSERT_EQ(report.lru.size(), 2u);
    ASSERT_EQ(report.gated.size(), 2u);
    EXPECT_EQ(report.lru[0].lookups, 12u);
    EXPECT_EQ(report.lru[1].hits, 4u);
    // Gated, k=2 w=2, S=4: layer 0 streams token 0, admits 0 and 1 at token 1, streams 2 and 3 at token 2; layer 1
    // sees no expert on two consecutive tokens, so it streams all six.
    expect_stats(report.gated[1], 0, 2, 10, 0, 6 * 10 + 6 * 1000);
}

TEST(experts_simulation, parses_slot_lists) {
    EXPECT_EQ(parse_slot_list("1,2,4,8"), (std::vector<uint32_t>{1, 2, 4, 8}));
    EXPECT_EQ(parse_slot_list("16"), (std::vector<uint32_t>{16}));
    for (const char* bad : {"", "0", "1,,2", "-1", "x", "4,", "99999999"}) {
        EXPECT_THROW(parse_slot_list(bad), std::invalid_argument) << bad;
    }
    EXPECT_EQ(default_slot_list(8, 2), (std::vector<uint32_t>{1, 2, 4, 8}));
    EXPECT_EQ(default_slot_list(6, 3), (std::vector<uint32_t>{1, 2, 3, 4, 6}));
    EXPECT_EQ(default_slot_list(128, 8), (std::vector<uint32_t>{1, 2, 4, 8, 16, 32, 64, 128}));
}

TEST(experts_report, renders_table_json_and_svg) {
    const experts_bench_report report = simulate_expert_caches(two_layer_trace(), {2, 4}, {2, 2});
    const std::string table = format_experts_table(report);
    EXPECT_NE(table.find("LRU hit %"), std::string::npos) << table;
    EXPECT_NE(table.find("gated bytes/tok"), std::string::npos) << table;
    EXPECT_NE(table.find("3 tokens (2 prompt + 1 generated), 2 MoE layers"), std::string::npos) << table;
    EXPECT_NE(table.find("33.3"), std::string::npos) << table;      // LRU hit rate at S=4: 4 of 12
    EXPECT_NE(table.find("1.97 KiB"), std::string::npos) << table;  // uncached: 2020 bytes per token

    const auto j = nlohmann::json::parse(format_experts_json(report));
    EXPECT_EQ(j["n_expert"], 4);
    EXPECT_EQ(j["moe_layers"], 2);
    EXPECT_EQ(j["uncached"]["bytes_per_token"], 2020);
    EXPECT_EQ(j["admission"]["k"], 2);
    ASSERT_EQ(j["results"].size(), 4u);
    const auto& lru2 = j["results"][0];
    EXPECT_EQ(lru2["policy"], "lru");
    EXPECT_EQ(lru2["slots"], 2);
    EXPECT_EQ(lru2["bytes_moved"], 6040);
    EXPECT_DOUBLE_EQ(lru2["hit_rate"].get<double>(), 2.0 / 12);
    EXPECT_DOUBLE_EQ(lru2["uploads_per_token"].get<double>(), 10.0 / 3);
    EXPECT_EQ(j["results"][3]["policy"], "gated");
    EXPECT_EQ(j["results"][3]["streamed"], 10);

    const std::string svg = format_experts_svg(report);
    EXPECT_EQ(svg.rfind("<svg", 0), 0u);
    EXPECT_NE(svg.find("</svg>"), std::string::npos);
    EXPECT_NE(svg.find("<polyline class=\"policy-lru\""), std::string::npos);
    EXPECT_NE(svg.find("<polyline class=\"policy-gated\""), std::string::npos);
    EXPECT_NE(svg.find("hit rate"), std::string::npos);
    EXPECT_NE(svg.find("&lt;synthetic&gt; &amp; co"), std::string::npos);
    EXPECT_EQ(svg.find("<synthetic>"), std::string::npos);
}

// `keepwarm bench experts`: the expert cache simulation on synthetic traces with hand-checked counts, trace files,
// the renderers, and recording the router of the generated tiny-moe model (and refusing a dense one).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench/experts-bench.h"
#include "generated-models.h"
#include "model/model-inspect.h"

using namespace keepwarm;

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

std::string temp_path(const std::string& name) {
    return (std::filesystem::temp_directory_path() / ("keepwarm-test-experts-" + name)).string();
}

const std::string& moe_model() {
    static const std::string path = test_models::generated_model("unit-experts-bench", "tiny-moe");
    return path;
}

}  // namespace

TEST(experts_bench, lru_counts_hits_and_evictions_per_slot_count) {
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

TEST(experts_bench, admission_gate_streams_until_k_uses_in_the_window) {
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

TEST(experts_bench, rejects_impossible_gates_and_empty_caches) {
    const expert_trace trace = single_layer_trace();
    EXPECT_THROW(simulate_expert_cache(trace, 0, {}), std::invalid_argument);
    EXPECT_THROW(simulate_expert_cache(trace, 2, {3, 2}), std::invalid_argument);
    EXPECT_THROW(simulate_expert_cache(trace, 2, {0, 2}), std::invalid_argument);
}

TEST(experts_bench, sums_layers_with_their_own_expert_sizes) {
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

TEST(experts_bench, validates_traces) {
    EXPECT_NO_THROW(validate_expert_trace(two_layer_trace()));
    expert_trace out_of_range = two_layer_trace();
    out_of_range.layers[1].ids[3] = 4;
    try {
        validate_expert_trace(out_of_range);
        ADD_FAILURE() << "accepted expert id 4 of 4";
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("layer 1, token 1"), std::string::npos) << e.what();
    }
    expert_trace twice = two_layer_trace();
    twice.layers[0].ids[1] = 0;
    EXPECT_THROW(validate_expert_trace(twice), std::invalid_argument);
    expert_trace short_layer = two_layer_trace();
    short_layer.layers[0].ids.pop_back();
    EXPECT_THROW(validate_expert_trace(short_layer), std::invalid_argument);
    expert_trace no_layers = two_layer_trace();
    no_layers.layers.clear();
    EXPECT_THROW(validate_expert_trace(no_layers), std::invalid_argument);
}

TEST(experts_bench, parses_slot_lists) {
    EXPECT_EQ(parse_slot_list("1,2,4,8"), (std::vector<uint32_t>{1, 2, 4, 8}));
    EXPECT_EQ(parse_slot_list("16"), (std::vector<uint32_t>{16}));
    for (const char* bad : {"", "0", "1,,2", "-1", "x", "4,", "99999999"}) {
        EXPECT_THROW(parse_slot_list(bad), std::invalid_argument) << bad;
    }
    EXPECT_EQ(default_slot_list(8, 2), (std::vector<uint32_t>{1, 2, 4, 8}));
    EXPECT_EQ(default_slot_list(6, 3), (std::vector<uint32_t>{1, 2, 3, 4, 6}));
    EXPECT_EQ(default_slot_list(128, 8), (std::vector<uint32_t>{1, 2, 4, 8, 16, 32, 64, 128}));
}

TEST(experts_bench, trace_files_round_trip_as_json_and_binary) {
    const expert_trace trace = two_layer_trace();
    for (const std::string name : {"trace.json", "trace.bin"}) {
        const std::string path = temp_path(name);
        write_expert_trace(trace, path);
        const expert_trace back = read_expert_trace(path);
        EXPECT_EQ(back.model_desc, trace.model_desc);
        EXPECT_EQ(back.n_expert, 4u);
        EXPECT_EQ(back.n_expert_used, 2u);
        EXPECT_EQ(back.n_prompt_tokens, 2u);
        EXPECT_EQ(back.n_generated_tokens, 1u);
        ASSERT_EQ(back.layers.size(), 2u);
        EXPECT_EQ(back.layers[1].layer, 1);
        EXPECT_EQ(back.layers[1].expert_bytes, 1000u);
        EXPECT_EQ(back.layers[1].ids, trace.layers[1].ids);
        std::filesystem::remove(path);
    }
}

TEST(experts_bench, rejects_bad_trace_files) {
    const std::string bin = temp_path("bad.bin");
    write_expert_trace(two_layer_trace(), bin);
    std::filesystem::resize_file(bin, std::filesystem::file_size(bin) - 3);
    EXPECT_THROW(read_expert_trace(bin), std::runtime_error);

    const std::string json = temp_path("bad.json");
    expert_trace bad = two_layer_trace();
    bad.layers[0].ids[0] = 9;
    EXPECT_THROW(write_expert_trace(bad, json), std::invalid_argument);
    write_expert_trace(two_layer_trace(), json);
    nlohmann::json edited = nlohmann::json::parse(std::ifstream(json));
    edited["layers"][0]["ids"][0] = 9;
    std::ofstream(json) << edited.dump();
    try {
        read_expert_trace(json);
        ADD_FAILURE() << "accepted expert id 9";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("bad trace file"), std::string::npos) << e.what();
    }
    std::ofstream(json) << "{\"not\": \"a trace\"}";
    EXPECT_THROW(read_expert_trace(json), std::runtime_error);
    EXPECT_THROW(read_expert_trace(temp_path("missing.json")), std::runtime_error);
    std::filesystem::remove(bin);
    std::filesystem::remove(json);
}

TEST(experts_bench, renders_table_json_and_svg) {
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

TEST(experts_bench, records_every_layer_and_token_of_a_moe_model) {
    const model_report shape = inspect_model(moe_model());
    ASSERT_EQ(shape.n_expert, 8u);
    ASSERT_EQ(shape.n_expert_used, 2u);
    expert_record_options o;
    o.model_path = moe_model();
    o.n_gen = 6;
    o.threads = 1;
    std::ostringstream progress;
    const expert_trace trace = record_expert_trace(o, progress);

    EXPECT_GT(trace.n_prompt_tokens, 300u) << "the built-in workload spans several prefill chunks";
    EXPECT_LE(trace.n_generated_tokens, 6u);
    EXPECT_EQ(trace.n_expert, 8u);
    EXPECT_EQ(trace.n_expert_used, 2u);
    EXPECT_FALSE(trace.model_desc.empty());
    ASSERT_EQ(trace.layers.size(), shape.n_layer) << progress.str();
    for (size_t i = 0; i < trace.layers.size(); ++i) {
        const auto& layer = trace.layers[i];
        EXPECT_EQ(layer.layer, int(i));
        // The last layer too: every token is an output, so none is dropped before its feed-forward.
        EXPECT_EQ(layer.ids.size(), trace.n_tokens() * 2) << "layer " << i;
        for (const int32_t id : layer.ids) {
            ASSERT_GE(id, 0);
            ASSERT_LT(id, 8);
        }
        // q8_0 gate, up and down slices of 512 x 256 values: 3 x 131072 / 32 x 34 bytes.
        EXPECT_EQ(layer.expert_bytes, 3u * 131072 / 32 * 34);
    }
    EXPECT_NO_THROW(validate_expert_trace(trace));
    EXPECT_NE(progress.str().find("[prefill]"), std::string::npos) << progress.str();
    EXPECT_NE(progress.str().find("[decode]"), std::string::npos) << progress.str();

    // With every expert resident, only the first use of each expert in each layer misses.
    const expert_cache_stats all = simulate_expert_cache(trace, 8, {});
    EXPECT_LE(all.fills, 8u * trace.layers.size());
    EXPECT_EQ(all.evictions, 0u);

    // A short prompt of our own is routed token by token too.
    o.prompt_text = "def add(a, b):\n    return a + b\n";
    o.n_gen = 0;
    const expert_trace small = record_expert_trace(o, progress);
    EXPECT_EQ(small.n_generated_tokens, 0u);
    EXPECT_GT(small.n_prompt_tokens, 5u);
    EXPECT_LT(small.n_prompt_tokens, 40u);
    for (const auto& layer : small.layers) EXPECT_EQ(layer.ids.size(), small.n_prompt_tokens * 2);
}

TEST(experts_bench, refuses_a_dense_model) {
    expert_record_options o;
    o.model_path = test_models::generated_model("unit-experts-bench", "tiny");
    o.n_gen = 1;
    std::ostringstream progress;
    try {
        record_expert_trace(o, progress);
        ADD_FAILURE() << "recorded a dense model";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("not a mixture-of-experts model"), std::string::npos) << e.what();
    }
}

// `keepwarm bench experts`' trace files: validation, the JSON and binary forms read back as written, and bad files
// reported as errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bench/experts-trace.h"

using namespace keepwarm;

namespace {

// Two MoE layers of a mixed model (the blocks between them dense, so untraced), 300 experts so that ids need 16 bits,
// two experts per token over two prompt tokens and one generated one.
expert_trace mixed_model_trace() {
    expert_trace trace;
    trace.model_path = "/models/mixed-moe.gguf";
    trace.model_desc = "qwen3moe 30B.A3B Q4_K \"\xc3\xa4\"";
    trace.n_expert = 300;
    trace.n_expert_used = 2;
    trace.n_prompt_tokens = 2;
    trace.n_generated_tokens = 1;
    trace.layers = {{3, 4096, {0, 299, 258, 1, 17, 256}}, {5, 8192, {299, 0, 1, 2, 3, 4}}};
    return trace;
}

void expect_same_trace(const expert_trace& a, const expert_trace& b) {
    EXPECT_EQ(a.model_path, b.model_path);
    EXPECT_EQ(a.model_desc, b.model_desc);
    EXPECT_EQ(a.n_expert, b.n_expert);
    EXPECT_EQ(a.n_expert_used, b.n_expert_used);
    EXPECT_EQ(a.n_prompt_tokens, b.n_prompt_tokens);
    EXPECT_EQ(a.n_generated_tokens, b.n_generated_tokens);
    ASSERT_EQ(a.layers.size(), b.layers.size());
    for (size_t i = 0; i < a.layers.size(); ++i) {
        EXPECT_EQ(a.layers[i].layer, b.layers[i].layer);
        EXPECT_EQ(a.layers[i].expert_bytes, b.layers[i].expert_bytes);
        EXPECT_EQ(a.layers[i].ids, b.layers[i].ids);
    }
}

std::string temp_path(const std::string& name) {
    return (std::filesystem::temp_directory_path() / ("keepwarm-test-experts-trace-" + name)).string();
}

}  // namespace

TEST(experts_trace, validates_traces) {
    EXPECT_NO_THROW(validate_expert_trace(mixed_model_trace()));
    expert_trace out_of_range = mixed_model_trace();
    out_of_range.layers[1].ids[3] = 300;
    try {
        validate_expert_trace(out_of_range);
        ADD_FAILURE() << "accepted expert id 300 of 300";
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("layer 5, token 1"), std::string::npos) << e.what();
    }
    expert_trace twice = mixed_model_trace();
    twice.layers[0].ids[1] = 0;
    EXPECT_THROW(validate_expert_trace(twice), std::invalid_argument);
    expert_trace short_layer = mixed_model_trace();
    short_layer.layers[0].ids.pop_back();
    EXPECT_THROW(validate_expert_trace(short_layer), std::invalid_argument);
    expert_trace no_layers = mixed_model_trace();
    no_layers.layers.clear();
    EXPECT_THROW(validate_expert_trace(no_layers), std::invalid_argument);
}

TEST(experts_trace, files_round_trip_as_json_and_binary) {
    const expert_trace trace = mixed_model_trace();
    for (const std::string name : {"trace.json", "trace.bin"}) {
        const std::string path = temp_path(name);
        write_expert_trace(trace, path);
        expect_same_trace(read_expert_trace(path), trace);
        std::filesystem::remove(path);
    }
    // The form follows the name when writing and the content when reading.
    const std::string json = temp_path("trace.json"), bin = temp_path("trace.bin"), renamed = temp_path("trace.data");
    write_expert_trace(trace, json);
    write_expert_trace(trace, bin);
    EXPECT_EQ(nlohmann::json::parse(std::ifstream(json))["format"], "keepwarm-expert-trace");
    EXPECT_EQ(std::ifstream(bin).get(), 'K');
    std::filesystem::rename(json, renamed);
    expect_same_trace(read_expert_trace(renamed), trace);
    std::filesystem::remove(renamed);
    std::filesystem::remove(bin);
}

TEST(experts_trace, rejects_bad_trace_files) {
    const std::string bin = temp_path("bad.bin");
    write_expert_trace(mixed_model_trace(), bin);
    std::filesystem::resize_file(bin, std::filesystem::file_size(bin) - 3);
    EXPECT_THROW(read_expert_trace(bin), std::runtime_error);

    const std::string json = temp_path("bad.json");
    expert_trace bad = mixed_model_trace();
    bad.layers[0].ids[0] = 300;
    EXPECT_THROW(write_expert_trace(bad, json), std::invalid_argument);
    write_expert_trace(mixed_model_trace(), json);
    nlohmann::json edited = nlohmann::json::parse(std::ifstream(json));
    edited["layers"][0]["ids"][0] = 300;
    std::ofstream(json) << edited.dump();
    try {
        read_expert_trace(json);
        ADD_FAILURE() << "accepted expert id 300";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("bad trace file"), std::string::npos) << e.what();
    }
    std::ofstream(json) << "{\"not\": \"a trace\"}";
    EXPECT_THROW(read_expert_trace(json), std::runtime_error);
    EXPECT_THROW(read_expert_trace(temp_path("missing.json")), std::runtime_error);
    EXPECT_THROW(write_expert_trace(mixed_model_trace(), temp_path("no-such-dir/trace.bin")), std::runtime_error);
    std::filesystem::remove(bin);
    std::filesystem::remove(json);
}

// `keepwarm bench experts`' trace files: validation, the JSON and binary forms read back as written, and bad files
// (missing, truncated anywhere, corrupted, fields of the wrong kind) reported as errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "bench/experts-trace.h"

using namespace keepwarm;
using namespace keepwarm::bench;

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

std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
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

// A trace file is input: whatever is in it, reading it gives the trace or a std::runtime_error, never a crash.

TEST(experts_trace, every_truncation_of_a_file_is_an_error) {
    for (const std::string name : {"cut.bin", "cut.json"}) {
        const std::string path = temp_path(name);
        write_expert_trace(mixed_model_trace(), path);
        const std::string whole = read_text(path);
        // The JSON form ends in a newline it can lose and stay whole.
        const size_t complete = name == "cut.json" ? whole.size() - 1 : whole.size();
        for (size_t size = 0; size < complete; ++size) {
            std::ofstream(path, std::ios::binary) << whole.substr(0, size);
            EXPECT_THROW(read_expert_trace(path), std::runtime_error) << name << " cut to " << size << " bytes";
        }
        std::filesystem::remove(path);
    }
}

TEST(experts_trace, every_corrupted_byte_of_a_binary_file_is_read_or_refused) {
    const std::string path = temp_path("flipped.bin");
    write_expert_trace(mixed_model_trace(), path);
    const std::string whole = read_text(path);
    std::vector<bool> refused(whole.size(), false);
    for (size_t at = 0; at < whole.size(); ++at) {
        std::string flipped = whole;
        flipped[at] = char(~flipped[at]);
        std::ofstream(path, std::ios::binary) << flipped;
        try {
            validate_expert_trace(read_expert_trace(path));  // what is read is a valid trace
        } catch (const std::runtime_error&) {
            refused[at] = true;
        }
    }
    // The magic, the counts and each string's length are refused wherever they break. The strings, layer numbers,
    // expert sizes, some ids and the low bytes of the expert count (300 becomes 467 or 65068) may hold other values.
    const size_t desc_length_at = 32 + 4 + mixed_model_trace().model_path.size();
    for (size_t at = 0; at < 36; ++at) {
        if (at != 8 && at != 9) EXPECT_TRUE(refused[at]) << "byte " << at;
    }
    for (size_t at = desc_length_at; at < desc_length_at + 4; ++at) EXPECT_TRUE(refused[at]) << "byte " << at;
    std::filesystem::remove(path);
}

TEST(experts_trace, binary_lengths_beyond_the_file_are_refused_before_anything_is_allocated) {
    const std::string path = temp_path("lengths.bin");
    write_expert_trace(mixed_model_trace(), path);
    const std::string whole = read_text(path);
    // magic(8) n_expert(4) n_expert_used(4) prompt(8) generated(8), then the model path's 32-bit length.
    const auto with = [&](size_t at, std::string bytes) {
        std::string edited = whole;
        edited.replace(at, bytes.size(), bytes);
        std::ofstream(path, std::ios::binary) << edited;
    };
    with(32, std::string(4, '\xff'));  // a 4 GiB model path
    EXPECT_THROW(read_expert_trace(path), std::runtime_error);
    with(16, std::string(8, '\xff'));  // 2^64 - 1 prompt tokens
    EXPECT_THROW(read_expert_trace(path), std::runtime_error);
    const size_t n_layers_at =
        32 + 4 + mixed_model_trace().model_path.size() + 4 + mixed_model_trace().model_desc.size();
    with(n_layers_at, std::string(4, '\xff'));  // 2^32 - 1 layers
    EXPECT_THROW(read_expert_trace(path), std::runtime_error);
    std::ofstream(path, std::ios::binary) << whole << "junk";
    try {
        read_expert_trace(path);
        ADD_FAILURE() << "accepted bytes after the last layer";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("after the last layer"), std::string::npos) << e.what();
    }
    std::filesystem::remove(path);
}

TEST(experts_trace, json_fields_of_the_wrong_kind_are_refused) {
    const std::string path = temp_path("kinds.json");
    write_expert_trace(mixed_model_trace(), path);
    const nlohmann::json whole = nlohmann::json::parse(read_text(path));
    const std::vector<std::pair<std::string, nlohmann::json>> edits = {
        {"/layers/0/ids/2", 2.5},  // would truncate to expert 2, which makes a valid trace
        {"/layers/0/ids/2", 1e30},
        {"/layers/0/ids/2", "258"},
        {"/layers/0/ids", "0,299"},
        {"/layers/1/layer", 1e30},
        {"/layers/1/expert_bytes", -1},
        {"/layers", nlohmann::json::object()},
        {"/n_expert", -1},
        {"/n_expert", 300.5},
        {"/n_expert_used", nullptr},
        {"/prompt_tokens", "2"},
        {"/model", 5},
        {"/format", "something-else"},
    };
    for (const auto& [pointer, value] : edits) {
        nlohmann::json edited = whole;
        edited[nlohmann::json::json_pointer(pointer)] = value;
        std::ofstream(path) << edited.dump();
        EXPECT_THROW(read_expert_trace(path), std::runtime_error) << pointer << " = " << value.dump();
    }
    // Token counts whose sum wraps around to 0 would make empty layers look complete.
    nlohmann::json wrapped = whole;
    wrapped["prompt_tokens"] = std::numeric_limits<uint64_t>::max();
    wrapped["generated_tokens"] = 1;
    for (auto& layer : wrapped["layers"]) layer["ids"] = nlohmann::json::array();
    std::ofstream(path) << wrapped.dump();
    EXPECT_THROW(read_expert_trace(path), std::runtime_error);
    for (const char* text :
         {"[]", "5", "null", "\"keepwarm-expert-trace\"", "{\"format\": \"keepwarm-expert-trace\"}"}) {
        std::ofstream(path) << text;
        EXPECT_THROW(read_expert_trace(path), std::runtime_error) << text;
    }
    std::filesystem::remove(path);
}

TEST(experts_trace, a_directory_is_not_a_trace) {
    EXPECT_THROW(read_expert_trace(std::filesystem::temp_directory_path().string()), std::runtime_error);
}

// Unit tests for what model-inspect reads without a model loaded (src/model/model-inspect.*): a GGUF's metadata as
// typed JSON (Ollama's /api/show model_info) and the memory a server holding a model takes (Ollama's /api/ps). The
// layer layout and KV sizes of generated models are tested in test-model-builder.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "gguf.h"
#include "model/model-inspect.h"

namespace fs = std::filesystem;
using namespace keepwarm;
using json = nlohmann::ordered_json;

namespace {

// A GGUF file with only a header, removed when the test ends.
class metadata_file {
public:
    explicit metadata_file(const std::function<void(gguf_context*)>& fill)
        : path_(fs::temp_directory_path() / ("keepwarm-test-inspect-" + std::to_string(getpid()) + ".gguf")) {
        std::unique_ptr<gguf_context, decltype(&gguf_free)> ctx(gguf_init_empty(), gguf_free);
        fill(ctx.get());
        if (!gguf_write_to_file(ctx.get(), path_.c_str(), /*only_meta =*/true)) throw std::runtime_error("write");
    }
    ~metadata_file() { fs::remove(path_); }
    std::string path() const { return path_.string(); }

private:
    fs::path path_;
};

}  // namespace

TEST(ModelInspect, MetadataKeepsEachValuesType) {
    const metadata_file file([](gguf_context* g) {
        gguf_set_val_str(g, "general.architecture", "qwen3");
        gguf_set_val_u32(g, "qwen3.block_count", 28);
        gguf_set_val_i32(g, "test.negative", -5);
        gguf_set_val_i8(g, "test.small", -1);
        gguf_set_val_u64(g, "test.big", 1ull << 40);
        gguf_set_val_f32(g, "qwen3.attention.layer_norm_rms_epsilon", 1e-6f);
        gguf_set_val_f32(g, "qwen3.rope.freq_base", 1000000.0f);
        gguf_set_val_f64(g, "test.double", 0.1);
        gguf_set_val_bool(g, "keepwarm.random_weights", true);
        const int32_t sections[] = {11, 11, 10, 0};
        gguf_set_arr_data(g, "qwen3.rope.dimension_sections", GGUF_TYPE_INT32, sections, 4);
        const char* merges[] = {"a b", "c d", "e f"};
        gguf_set_arr_str(g, "tokenizer.ggml.merges", merges, 3);
        std::vector<float> scores(5, 0.5f);
        gguf_set_arr_data(g, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores.data(), scores.size());
    });
    const json info = read_gguf_metadata(file.path(), 4);

    EXPECT_EQ(info["general.architecture"], "qwen3");
    EXPECT_TRUE(info["qwen3.block_count"].is_number_unsigned());
    EXPECT_EQ(info["qwen3.block_count"], 28);
    EXPECT_EQ(info["test.negative"], -5) << "signed values keep their sign";
    EXPECT_EQ(info["test.small"], -1);
    EXPECT_EQ(info["test.big"], 1ull << 40);
    // A float32 is written as Go prints it, with the fewest digits that read back the same: 1e-06, not 9.99999997e-07.
    EXPECT_EQ(info["qwen3.attention.layer_norm_rms_epsilon"].dump(), "1e-06");
    EXPECT_EQ(info["qwen3.rope.freq_base"], 1000000.0);
    EXPECT_EQ(info["test.double"], 0.1);
    EXPECT_EQ(info["keepwarm.random_weights"], true);
    EXPECT_EQ(info["qwen3.rope.dimension_sections"], json::parse("[11, 11, 10, 0]"));
    EXPECT_EQ(info["tokenizer.ggml.merges"], json::parse(R"(["a b", "c d", "e f"])"));
    EXPECT_TRUE(info["tokenizer.ggml.scores"].is_null()) << "5 values, more than the 4 asked for";

    // In the file's order.
    EXPECT_EQ(info.begin().key(), "general.architecture");
    EXPECT_EQ(info.size(), 12u);
}

TEST(ModelInspect, MetadataOfAFileThatIsNotGguf) {
    const fs::path path = fs::temp_directory_path() / ("keepwarm-test-not-gguf-" + std::to_string(getpid()));
    { std::ofstream(path) << "not a model"; }
    EXPECT_THROW(read_gguf_metadata(path.string(), 256), std::runtime_error);
    fs::remove(path);
    EXPECT_THROW(read_gguf_metadata(path.string(), 256), std::runtime_error);
}

namespace {

// Three layers: two attention layers of 2 KV heads x 64 (128 K and 128 V values a token each) and one recurrent layer
// whose state is 1000 bytes a sequence.
model_report hybrid_report() {
    model_report r;
    r.n_layer = 3;
    r.layers = {layer_kind::full_attention, layer_kind::recurrent, layer_kind::sliding_window};
    r.k_per_token = {128, 0, 128};
    r.v_per_token = {128, 0, 128};
    r.sliding_window = 16;
    r.recurrent_state_bytes = 1000;
    return r;
}

}  // namespace

TEST(ModelInspect, ServingMemoryCountsWeightsKvAndStates) {
    const model_report r = hybrid_report();
    serving_layout layout{.weight_bytes = 1'000'000, .context_size = 4096, .sequences = 5};

    // f16: 2 layers x (128 + 128) values x 2 bytes = 1024 bytes a token, for every cell of the context (the SWA layer
    // is not capped at its window: a server's context holds them all).
    serving_memory m = estimate_serving_memory(r, layout);
    EXPECT_EQ(m.total_bytes, 1'000'000u + 1024u * 4096 + 5 * 1000);
    EXPECT_EQ(m.gpu_bytes, 0u) << "no GPU: nothing offloaded";

    // q8_0 K (4 blocks of 34 bytes per 128 values), f32 V.
    layout.cache_type_k = GGML_TYPE_Q8_0;
    layout.cache_type_v = GGML_TYPE_F32;
    m = estimate_serving_memory(r, layout);
    EXPECT_EQ(m.total_bytes, 1'000'000u + 2u * (4 * 34 + 128 * 4) * 4096 + 5 * 1000);
}

TEST(ModelInspect, ServingMemoryOnAGpuIsTheOffloadedLayersShare) {
    const model_report r = hybrid_report();  // 3 layers + the output layer
    serving_layout layout{.weight_bytes = 4000, .context_size = 0, .sequences = 0, .has_gpu = true};

    layout.gpu_layers = 2;
    EXPECT_EQ(estimate_serving_memory(r, layout).gpu_bytes, 2000u);
    layout.gpu_layers = -1;
    EXPECT_EQ(estimate_serving_memory(r, layout).gpu_bytes, 4000u) << "-1: every layer";
    layout.gpu_layers = 99;
    EXPECT_EQ(estimate_serving_memory(r, layout).gpu_bytes, 4000u) << "never more than the model has";
    layout.gpu_layers = 0;
    EXPECT_EQ(estimate_serving_memory(r, layout).gpu_bytes, 0u);
    layout.has_gpu = false;
    layout.gpu_layers = -1;
    EXPECT_EQ(estimate_serving_memory(r, layout).gpu_bytes, 0u);
}

TEST(ModelInspect, KvTypeBytesInWholeBlocks) {
    EXPECT_EQ(kv_type_bytes(kv_cache_type::f16, 96), 192u);
    EXPECT_EQ(kv_type_bytes(kv_cache_type::q8_0, 96), 3u * 34);
    EXPECT_EQ(kv_type_bytes(kv_cache_type::q4_0, 96), 3u * 18);
    EXPECT_EQ(kv_type_bytes(kv_cache_type::q8_0, 33), 2u * 34) << "a partial block takes a whole one";
}

// `keepwarm bench experts`' recording: the router of the generated tiny-moe model traced for every layer and token,
// of the built-in workload and of a prompt of our own, and a dense model refused.
#include <gtest/gtest.h>

#include <sstream>

#include "bench/experts-recording.h"
#include "bench/experts-simulation.h"
#include "generated-models.h"
#include "model/model-inspect.h"

using namespace keepwarm;
using namespace keepwarm::bench;

namespace {

const std::string& moe_model() {
    static const std::string path = test_models::generated_model("unit-experts-bench", "tiny-moe");
    return path;
}

}  // namespace

TEST(experts_recording, records_every_layer_and_token_of_a_moe_model) {
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

TEST(experts_recording, refuses_a_dense_model) {
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

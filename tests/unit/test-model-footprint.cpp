// A router model's footprint for --models-memory (src/commands/model-footprint.*): the weights (the file's size), the
// KV cache of the context and slots its server gets, as `keepwarm inspect` counts KV bytes per token, and its RAM tier;
// a [models.NAME] table's options over the router's; -c 0 counts the most the server's own sizing can choose.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "commands/model-footprint.h"
#include "commands/serve-router.h"
#include "generated-models.h"
#include "model/context-sizing.h"
#include "model/model-inspect.h"

using namespace keepwarm;
using json = nlohmann::json;

namespace {

const std::string& tiny() {
    static const std::string path = test_models::generated_model("unit-footprint");
    return path;
}

// `keepwarm inspect --json`'s KV bytes per token of the tiny model, by cache type.
json inspected_kv_per_token() {
    return json::parse(format_report_json(inspect_model(tiny()), {}))["kv_bytes_per_token"];
}

}  // namespace

TEST(ModelFootprint, WeightsPlusInspectsKvForTheContextPlusTheRamTier) {
    const model_report report = inspect_model(tiny());
    ASSERT_EQ(report.recurrent_state_bytes, 0u);  // attention only: the KV cache is all per token
    footprint_settings s;
    s.context_size = 4096;
    s.slots = 2;
    s.cache_ram = uint64_t{256} << 20;
    const model_footprint f = compute_footprint(report, s);
    EXPECT_EQ(f.weight_bytes, std::filesystem::file_size(tiny()));
    EXPECT_EQ(f.kv_bytes, inspected_kv_per_token()["f16"].get<uint64_t>() * 4096);
    EXPECT_EQ(f.cache_ram_bytes, uint64_t{256} << 20);
    EXPECT_EQ(f.total(), f.weight_bytes + f.kv_bytes + f.cache_ram_bytes);
    EXPECT_FALSE(f.auto_context);

    s.cache_type_k = s.cache_type_v = "q8_0";
    EXPECT_EQ(compute_footprint(report, s).kv_bytes, inspected_kv_per_token()["q8_0"].get<uint64_t>() * 4096);
    s.cache_ram = uint64_t{0};
    EXPECT_EQ(compute_footprint(report, s).cache_ram_bytes, 0u);
}

TEST(ModelFootprint, AModelsTableOverridesTheRoutersOptions) {
    footprint_settings base;
    base.context_size = 8192;
    router::model_entry m;
    m.name = "small";
    m.options = {{"ctx-size", {"2048"}},
                 {"parallel", {"1"}},
                 {"cache-type-k", {"q4_0"}},
                 {"cache-ram", {"512MiB"}},
                 {"cache-parked", {"0"}},
                 {"flash-attn", {"on"}},
                 {"no-mmap", {}}};
    const footprint_settings s = footprint_settings_for(base, m);
    EXPECT_EQ(s.context_size, 2048u);
    EXPECT_EQ(s.slots, 1);
    EXPECT_EQ(s.parked, 0);
    EXPECT_EQ(s.cache_type_k, "q4_0");
    EXPECT_EQ(s.cache_type_v, "f16");
    EXPECT_EQ(s.cache_ram, std::optional<uint64_t>(uint64_t{512} << 20));

    m.options = {{"ctx-size", {"lots"}}};
    try {
        footprint_settings_for(base, m);
        FAIL() << "a ctx-size that is no number was taken";
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("small"), std::string::npos) << e.what();
    }
    footprint_settings bad;
    bad.cache_type_v = "q5_9";
    EXPECT_THROW(compute_footprint(inspect_model(tiny()), bad), std::invalid_argument);
}

TEST(ModelFootprint, NoContextSizeCountsTheMostTheServersOwnSizingChooses) {
    const model_report report = inspect_model(tiny());
    ASSERT_GT(report.n_ctx_train, 0u);
    footprint_settings s;  // -c 0
    s.slots = 3;
    s.cache_ram = uint64_t{0};
    const model_footprint f = compute_footprint(report, s);
    EXPECT_TRUE(f.auto_context);
    const uint64_t per_slot = std::min<uint64_t>(report.n_ctx_train, largest_default_slot_tokens);
    EXPECT_EQ(f.context_size, per_slot * 3);
    EXPECT_EQ(f.kv_bytes, inspected_kv_per_token()["f16"].get<uint64_t>() * per_slot * 3);
    EXPECT_NE(describe_footprint(f).find("-c 0"), std::string::npos);
}

TEST(ModelFootprint, AModelWithoutAFootprintStopsStartUpOnlyUnderABudget) {
    router::model_entry good;
    good.name = "good";
    good.path = tiny();
    router::model_entry broken;
    broken.name = "broken";
    broken.path = "/nonexistent/broken.gguf";
    broken.source = "models/";
    footprint_settings base;
    base.context_size = 1024;
    std::vector<router::model_entry> models = {good, broken};
    const std::vector<model_footprint> f = set_footprints(models, base, /*budget=*/0);  // a warning, no footprint
    ASSERT_EQ(f.size(), 2u);
    EXPECT_EQ(models[0].footprint_bytes, compute_footprint(inspect_model(tiny()), base).total());
    EXPECT_EQ(models[1].footprint_bytes, 0u);
    try {
        set_footprints(models, base, uint64_t{1} << 30);
        FAIL() << "a model whose footprint is unknown was served under --models-memory";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("broken"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("--models-memory"), std::string::npos) << e.what();
    }
}

// A draft model (-md) takes its weights and a KV cell per cell of the model's context, with its own cache types.
TEST(ModelFootprint, ADraftModelCountsItsWeightsAndItsContextsKv) {
    const std::string draft = test_models::generated_model("unit-footprint", "tiny-draft");
    const model_report report = inspect_model(tiny());
    const model_report draft_report = inspect_model(draft);
    footprint_settings s;
    s.context_size = 4096;
    s.cache_ram = uint64_t{0};
    const model_footprint alone = compute_footprint(report, s);
    EXPECT_EQ(alone.draft_bytes, 0u);
    s.draft_model = draft;
    const model_footprint with = compute_footprint(report, s, &draft_report);
    const serving_layout f16{.context_size = 4096, .sequences = 0};
    const uint64_t draft_kv = estimate_serving_memory(draft_report, f16).total_bytes;
    ASSERT_GT(draft_kv, 0u);
    EXPECT_EQ(with.draft_bytes, std::filesystem::file_size(draft) + draft_kv);
    EXPECT_EQ(with.total(), alone.total() + with.draft_bytes);
    EXPECT_NE(describe_footprint(with).find("draft model"), std::string::npos);
    s.cache_type_k_draft = s.cache_type_v_draft = "q8_0";
    EXPECT_LT(compute_footprint(report, s, &draft_report).draft_bytes, with.draft_bytes);

    // A model's table names its draft model, or turns drafting off.
    router::model_entry m;
    m.name = "small";
    m.path = tiny();
    m.options = {{"spec-draft-model", {draft}}, {"spec-draft-type-k", {"q4_0"}}};
    const footprint_settings table = footprint_settings_for(footprint_settings{}, m);
    EXPECT_EQ(table.draft_model, draft);
    EXPECT_EQ(table.cache_type_k_draft, "q4_0");
    m.options = {{"spec-type", {"none"}}};
    EXPECT_EQ(footprint_settings_for(s, m).draft_model, "");
    // The router's footprints read the draft model's header.
    std::vector<router::model_entry> models = {m};
    models[0].options = {{"model-draft", {draft}}};
    s.draft_model.clear();
    s.cache_type_k_draft = s.cache_type_v_draft = "f16";
    set_footprints(models, s, 0);
    EXPECT_EQ(models[0].footprint_bytes, with.total());
}

// serve -c 0 sizes its context in the memory the model, the RAM tier and the draft model leave: the draft's weights
// come out of it, and each cell costs the draft context's too.
TEST(ModelFootprint, TheDefaultContextLeavesRoomForTheDraftModel) {
    const model_report report = inspect_model(tiny());
    const model_report draft = inspect_model(test_models::generated_model("unit-footprint", "tiny-draft"));
    const uint64_t free_memory = report.file_size + draft.file_size + (uint64_t{96} << 20);
    const context_sizing_input alone =
        sizing_input_for(report, GGML_TYPE_F16, GGML_TYPE_F16, 1, 3, free_memory, report.file_size);
    const context_sizing_input with = with_draft_model(alone, draft, GGML_TYPE_F16, GGML_TYPE_F16);
    EXPECT_EQ(with.memory_for_cache, alone.memory_for_cache - draft.file_size);
    const serving_layout one_cell{.context_size = 1, .sequences = 0};
    EXPECT_EQ(with.bytes_per_cell, alone.bytes_per_cell + estimate_serving_memory(draft, one_cell).total_bytes);
    // Short of memory, the context is smaller with the draft model beside it.
    const context_choice a = choose_default_context(alone);
    const context_choice b = choose_default_context(with);
    EXPECT_LT(b.context_size, a.context_size) << a.why << " / " << b.why;
    EXPECT_LE(b.cache_bytes, with.memory_for_cache);
}

// --spec-type draft-mtp: the MTP context holds a cell per cell of the context in the heads' layers, with the draft
// cache types; the router counts it for a model whose table turns it on, and serve -c 0 sizes the context with it.
TEST(ModelFootprint, MtpHeadsCountTheirContextsKv) {
    const model_report report = inspect_model(test_models::generated_model("unit-footprint", "tiny-hybrid-mtp"));
    const uint64_t per_cell = mtp_kv_bytes_per_cell(report, GGML_TYPE_F16, GGML_TYPE_F16);
    ASSERT_GT(per_cell, 0u);
    footprint_settings s;
    s.context_size = 4096;
    s.cache_ram = uint64_t{0};
    const model_footprint alone = compute_footprint(report, s);
    EXPECT_EQ(alone.mtp_bytes, 0u);
    router::model_entry m;
    m.name = "mtp";
    m.options = {{"spec-type", {"draft-mtp"}}};
    const model_footprint with = compute_footprint(report, footprint_settings_for(s, m));
    EXPECT_EQ(with.mtp_bytes, 4096 * per_cell);
    EXPECT_EQ(with.total(), alone.total() + with.mtp_bytes);
    EXPECT_NE(describe_footprint(with).find("MTP context"), std::string::npos) << describe_footprint(with);
    m.options = {{"spec-type", {"draft-mtp"}}, {"spec-draft-type-k", {"q8_0"}}};
    EXPECT_LT(compute_footprint(report, footprint_settings_for(s, m)).mtp_bytes, with.mtp_bytes);

    const uint64_t free_memory = report.file_size + (uint64_t{8} << 20);
    const context_sizing_input plain =
        sizing_input_for(report, GGML_TYPE_F16, GGML_TYPE_F16, 1, 3, free_memory, report.file_size);
    const context_sizing_input drafting = with_mtp_heads(plain, report, GGML_TYPE_F16, GGML_TYPE_F16);
    EXPECT_EQ(drafting.bytes_per_cell, plain.bytes_per_cell + per_cell);
    EXPECT_LT(choose_default_context(drafting).context_size, choose_default_context(plain).context_size);
}

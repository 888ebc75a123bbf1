// Unit tests for llama-server's /slots and /props bodies (src/local/server-status.*): the shape, the prefill
// progress, and what a slot of another tenant leaves out.
#include <gtest/gtest.h>

#include "local/server-status.h"

using namespace keepwarm;
using json = nlohmann::ordered_json;

TEST(ServerStatus, SlotsInLlamaServersShapeWithKeepwarmsOwnFields) {
    const auto at = std::chrono::system_clock::time_point(std::chrono::seconds(1'700'000'000));
    std::vector<slot_status> slots(3);
    slots[0] = {.id = 0};  // never used
    slots[1] = {.id = 1,
                .busy = true,
                .cached_tokens = 700,
                .tenant = "alice",
                .request_id = "req-1",
                .prompt_tokens = 1000,
                .prompt_reused = 400,
                .prompt_done = 700,
                .generated = 0,
                .last_used = at};
    slots[2] = {.id = 2,
                .busy = false,
                .cached_tokens = 60,
                .tenant = "bob",
                .request_id = "req-2",
                .prompt_tokens = 50,
                .prompt_reused = 10,
                .prompt_done = 50,
                .generated = 10,
                .last_used = at + std::chrono::seconds(5)};

    const json out = slots_json(slots, 2048, "alice");
    ASSERT_TRUE(out.is_array());
    ASSERT_EQ(out.size(), 3u);

    const json& fresh = out[0];
    EXPECT_EQ(fresh["id"], 0);
    EXPECT_EQ(fresh["n_ctx"], 2048);
    EXPECT_EQ(fresh["speculative"], false);
    EXPECT_EQ(fresh["is_processing"], false);
    EXPECT_EQ(fresh["state"], "idle");
    EXPECT_EQ(fresh["n_tokens_cached"], 0);
    EXPECT_FALSE(fresh.contains("n_prompt_tokens")) << "no request yet: no request fields, as llama-server";
    EXPECT_FALSE(fresh.contains("last_used"));

    const json& prefilling = out[1];
    EXPECT_EQ(prefilling["is_processing"], true);
    EXPECT_EQ(prefilling["state"], "processing_prompt");
    EXPECT_EQ(prefilling["n_prompt_tokens"], 1000);
    EXPECT_EQ(prefilling["n_prompt_tokens_cache"], 400);
    EXPECT_EQ(prefilling["n_prompt_tokens_processed"], 300) << "computed so far, without what was reused";
    EXPECT_EQ(prefilling["n_tokens_cached"], 700);
    EXPECT_EQ(prefilling["next_token"][0]["has_next_token"], true);
    EXPECT_EQ(prefilling["next_token"][0]["n_decoded"], 0);
    EXPECT_EQ(prefilling["last_used"], 1'700'000'000);
    EXPECT_EQ(prefilling["request_id"], "req-1") << "the viewer's own tenant";
    EXPECT_FALSE(prefilling.contains("prompt"));
    EXPECT_FALSE(prefilling.contains("tenant"));

    const json& others = out[2];
    EXPECT_EQ(others["state"], "idle");
    EXPECT_EQ(others["n_tokens_cached"], 60) << "counts of another tenant's slot are shown";
    EXPECT_EQ(others["next_token"][0]["n_decoded"], 10);
    EXPECT_FALSE(others.contains("request_id")) << "but not what it served";

    slots[2].busy = true;
    EXPECT_EQ(slots_json(slots, 2048, "bob")[2]["state"], "generating");
    EXPECT_EQ(slots_json(slots, 2048, "bob")[2]["request_id"], "req-2");
    EXPECT_FALSE(slots_json(slots, 2048, "bob")[1].contains("request_id"));
}

TEST(ServerStatus, PropsInLlamaServersShape) {
    server_props p{.slot_context_size = 2048,
                   .total_slots = 2,
                   .model_alias = "tiny",
                   .model_path = "/models/tiny.gguf",
                   .chat_template = "{{ messages }}",
                   .bos_token = "<s>",
                   .eos_token = "</s>",
                   .build_info = "keepwarm 1.0 (llama.cpp b1-abc)",
                   .default_max_tokens = 4096,
                   .sampling = common_params_sampling{}};
    const json props = props_json(p);
    EXPECT_EQ(props["default_generation_settings"]["n_ctx"], 2048);
    const json& params = props["default_generation_settings"]["params"];
    EXPECT_EQ(params["n_predict"], 4096);
    EXPECT_EQ(params["max_tokens"], 4096);
    EXPECT_FLOAT_EQ(params["temperature"].get<float>(), common_params_sampling{}.temp);
    EXPECT_EQ(params["top_k"], common_params_sampling{}.top_k);
    EXPECT_TRUE(params["samplers"].is_array());
    EXPECT_FALSE(params["samplers"].empty());
    EXPECT_EQ(props["total_slots"], 2);
    EXPECT_EQ(props["model_alias"], "tiny");
    EXPECT_EQ(props["model_path"], "/models/tiny.gguf");
    EXPECT_EQ(props["modalities"], (json{{"vision", false}, {"video", false}, {"audio", false}}));
    EXPECT_EQ(props["chat_template"], "{{ messages }}");
    EXPECT_EQ(props["bos_token"], "<s>");
    EXPECT_EQ(props["eos_token"], "</s>");
    EXPECT_EQ(props["build_info"], "keepwarm 1.0 (llama.cpp b1-abc)");
    EXPECT_EQ(props["endpoint_slots"], true);
    EXPECT_EQ(props["endpoint_props"], false);
    EXPECT_EQ(props["is_sleeping"], false);
}

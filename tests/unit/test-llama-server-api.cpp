// Unit tests for llama-server's native request parsing and response shapes (src/api/llama-server-api.*), and for
// n_predict read by the OpenAI parsers as llama-server's oaicompat parsing does.
#include <gtest/gtest.h>

#include "api/llama-server-api.h"
#include "api/openai-api.h"
#include "base/request-error.h"

using namespace keepwarm;
using namespace keepwarm::api;

namespace {

template <typename F>
void expect_400(F parse, const char* body, const std::string& needle) {
    try {
        parse(json::parse(body));
        ADD_FAILURE() << "expected a 400 for " << body;
    } catch (const request_error& e) {
        EXPECT_EQ(e.status, 400);
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
}

}  // namespace

TEST(NativeCompletion, StringPromptAndSwitches) {
    const auto r = parse_native_completion_request(json::parse(
        R"({"prompt":"Hello","n_predict":7,"stream":true,"stop":["\n"],"temperature":0,"top_k":5,"top_p":0.9,
            "min_p":0.1,"seed":42,"cache_prompt":false,"return_tokens":true,"return_progress":true})"));
    EXPECT_EQ(r.prompt, "Hello");
    EXPECT_TRUE(r.pieces.empty());
    EXPECT_EQ(r.params.max_tokens, 7);
    EXPECT_TRUE(r.params.stream);
    EXPECT_EQ(r.params.stop, std::vector<std::string>{"\n"});
    EXPECT_EQ(r.params.sampling.temperature, 0.0f);
    EXPECT_EQ(r.params.sampling.top_k, 5);
    EXPECT_EQ(r.params.sampling.seed, 42u);
    EXPECT_TRUE(r.return_tokens);
    EXPECT_TRUE(r.params.return_progress);
}

TEST(NativeCompletion, NPredictMinusOneLeavesTheLimitToTheServer) {
    EXPECT_FALSE(parse_native_completion_request(json::parse(R"({"prompt":"a","n_predict":-1})")).params.max_tokens);
    EXPECT_FALSE(parse_native_completion_request(json::parse(R"({"prompt":"a"})")).params.max_tokens);
    expect_400(parse_native_completion_request, R"({"prompt":"a","n_predict":-2})", "n_predict");
    expect_400(parse_native_completion_request, R"({"prompt":"a","n_predict":"5"})", "n_predict");
}

TEST(NativeCompletion, TokenAndMixedPrompts) {
    const auto ids = parse_native_completion_request(json::parse(R"({"prompt":[1,2,3]})"));
    ASSERT_EQ(ids.pieces.size(), 3u);
    EXPECT_EQ(ids.pieces[2].token, 3);
    const auto mixed = parse_native_completion_request(json::parse(R"({"prompt":["Hi",12," there",7]})"));
    ASSERT_EQ(mixed.pieces.size(), 4u);
    EXPECT_EQ(mixed.pieces[0].text, "Hi");
    EXPECT_EQ(mixed.pieces[0].token, LLAMA_TOKEN_NULL);
    EXPECT_EQ(mixed.pieces[1].token, 12);
    const auto one = parse_native_completion_request(json::parse(R"({"prompt":["Only"]})"));
    EXPECT_EQ(one.prompt, "Only");
}

TEST(NativeCompletion, HostilePromptsAre400s) {
    expect_400(parse_native_completion_request, R"({})", "'prompt' is required");
    expect_400(parse_native_completion_request, R"({"prompt":""})", "'prompt'");
    expect_400(parse_native_completion_request, R"({"prompt":[]})", "'prompt'");
    expect_400(parse_native_completion_request, R"({"prompt":["a","b"]})", "several prompts");
    expect_400(parse_native_completion_request, R"({"prompt":[[1,2],[3]]})", "several prompts");
    expect_400(parse_native_completion_request, R"({"prompt":[1,-5]})", "'prompt[1]'");
    expect_400(parse_native_completion_request, R"({"prompt":[1,2.5]})", "'prompt[1]'");
    expect_400(parse_native_completion_request, R"({"prompt":[1,4294967296]})", "'prompt[1]'");
    expect_400(parse_native_completion_request, R"({"prompt":[1,{"a":1}]})", "'prompt[1]'");
    expect_400(parse_native_completion_request, R"({"prompt":"a","n_probs":3})", "n_probs");
    expect_400(parse_native_completion_request, R"({"prompt":"a","cache_prompt":"yes"})", "cache_prompt");
    expect_400(parse_native_completion_request, R"({"prompt":"a","temperature":-1})", "temperature");
}

TEST(Infill, FieldsAsLlamaServerChecksThem) {
    const auto r = parse_infill_request(json::parse(
        R"({"input_prefix":"def f(","input_suffix":"\n","input_extra":[{"filename":"a.py","text":"x=1"},{"text":"y"}],
            "prompt":"x","n_predict":4})"));
    EXPECT_EQ(r.parts.prefix, "def f(");
    EXPECT_EQ(r.parts.suffix, "\n");
    ASSERT_EQ(r.parts.extra.size(), 2u);
    EXPECT_EQ(r.parts.extra[0].name, "a.py");
    EXPECT_EQ(r.parts.extra[1].name, "tmp");
    EXPECT_EQ(r.completion.prompt, "x");
    EXPECT_EQ(r.completion.params.max_tokens, 4);
    expect_400(parse_infill_request, R"({"input_suffix":""})", "\"input_prefix\" is required");
    expect_400(parse_infill_request, R"({"input_prefix":""})", "\"input_suffix\" is required");
    expect_400(parse_infill_request, R"({"input_prefix":"","input_suffix":"","prompt":[1]})", "\"prompt\" must be");
    expect_400(parse_infill_request, R"({"input_prefix":"","input_suffix":"","input_extra":{}})", "input_extra");
    expect_400(parse_infill_request, R"({"input_prefix":"","input_suffix":"","input_extra":[{"text":1}]})",
               "\"text\" field");
    expect_400(parse_infill_request, R"({"input_prefix":"","input_suffix":"","input_extra":[5]})", "\"text\" field");
    expect_400(parse_infill_request,
               R"({"input_prefix":"","input_suffix":"","input_extra":[{"text":"","filename":3}]})", "\"filename\"");
}

TEST(NativeCompletion, ResponseShape) {
    native_completion_result r;
    r.content = "hi";
    r.tokens = {5, 6};
    r.id_slot = 1;
    r.model = "tiny";
    r.tokens_predicted = 2;
    r.tokens_evaluated = 9;
    r.prompt = "p";
    r.stop_type = native_stop_type(true, "");
    r.tokens_cached = 10;
    r.timings.prompt_n = 4;
    r.timings.cache_n = 5;
    const json j = native_completion_json(r);
    for (const char* key : {"content", "tokens", "id_slot", "stop", "model", "tokens_predicted", "tokens_evaluated",
                            "prompt", "stop_type", "stopping_word", "tokens_cached", "truncated", "timings"}) {
        EXPECT_TRUE(j.contains(key)) << key;
    }
    EXPECT_EQ(j["stop"], true);
    EXPECT_EQ(j["stop_type"], "limit");
    EXPECT_EQ(j["tokens"], json::array({5, 6}));
    EXPECT_EQ(j["timings"]["cache_n"], 5);
    EXPECT_TRUE(j["timings"].contains("prompt_per_second"));
    EXPECT_EQ(native_stop_type(false, "\n"), "word");
    EXPECT_EQ(native_stop_type(false, ""), "eos");
    const json chunk = native_chunk_json("x", 1, 9, prompt_progress_json(9, 5, 9, 1.5));
    EXPECT_EQ(chunk["stop"], false);
    EXPECT_EQ(chunk["prompt_progress"]["processed"], 9);
    EXPECT_FALSE(native_chunk_json("x", 1, 9).contains("prompt_progress"));
}

TEST(OpenAiNPredict, IsAnAliasOfMaxTokensThatWinsAsInLlamaServer) {
    EXPECT_EQ(
        parse_chat_request(json::parse(R"({"messages":[{"role":"user","content":"a"}],"n_predict":3})")).max_tokens, 3);
    EXPECT_EQ(
        parse_chat_request(json::parse(R"({"messages":[{"role":"user","content":"a"}],"max_tokens":9,"n_predict":3})"))
            .max_tokens,
        3);
    EXPECT_FALSE(
        parse_chat_request(json::parse(R"({"messages":[{"role":"user","content":"a"}],"n_predict":-1})")).max_tokens);
    EXPECT_EQ(parse_completion_request(json::parse(R"({"prompt":"a","n_predict":3})")).max_tokens, 3);
    EXPECT_TRUE(
        parse_chat_request(json::parse(R"({"messages":[{"role":"user","content":"a"}],"return_progress":true})"))
            .return_progress);
}

// Issue 36: /completion's speculative.n_max, as llama-server spells it, and its companions checked.
TEST(NativeCompletion, SpeculativeNMax) {
    EXPECT_EQ(parse_native_completion_request(json::parse(R"({"prompt":"a","speculative.n_max":0})")).params.draft_max,
              0);
    EXPECT_EQ(parse_native_completion_request(json::parse(R"({"prompt":"a","speculative.n_max":12,
        "speculative.n_min":2,"speculative.p_min":0.5})"))
                  .params.draft_max,
              12);
    EXPECT_FALSE(parse_native_completion_request(json::parse(R"({"prompt":"a"})")).params.draft_max.has_value());
    EXPECT_EQ(parse_infill_request(json::parse(R"({"input_prefix":"a","input_suffix":"b","speculative.n_max":3})"))
                  .completion.params.draft_max,
              3);
    expect_400(parse_native_completion_request, R"({"prompt":"a","speculative.n_max":-1})",
               "'speculative.n_max' must be an integer between 0 and 1024");
    expect_400(parse_native_completion_request, R"({"prompt":"a","speculative.n_max":"4"})",
               "'speculative.n_max' must be an integer");
    expect_400(parse_native_completion_request, R"({"prompt":"a","speculative.p_min":-0.1})",
               "'speculative.p_min' must be a number between 0 and 1");
}

TEST(NativeCompletion, TimingsCarryDraftCounts) {
    native_completion_result r;
    EXPECT_FALSE(native_completion_json(r)["timings"].contains("draft_n"));
    r.timings.draft_n = 9;
    r.timings.draft_n_accepted = 7;
    const json j = native_completion_json(r);
    EXPECT_EQ(j["timings"]["draft_n"], 9);
    EXPECT_EQ(j["timings"]["draft_n_accepted"], 7);
}

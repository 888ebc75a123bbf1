// The proxy's dialect conversions against keepwarm's own API code: a request built for an upstream must parse back,
// with keepwarm's parser for that API, into the same conversation; and a stream keepwarm's routes would write must
// decode into the same message and numbers, whatever byte boundaries the socket cuts it at.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "api/anthropic-api.h"
#include "api/ollama-api.h"
#include "api/openai-api.h"
#include "proxy/upstream-dialects.h"

using namespace keepwarm;
using namespace keepwarm::proxy;
using json = nlohmann::ordered_json;

namespace {

common_chat_msg message(std::string role, std::string content) {
    common_chat_msg m;
    m.role = std::move(role);
    m.content = std::move(content);
    return m;
}

// A conversation with a system prompt, a tool, an assistant tool call and its result, then a user turn.
chat_request agent_turn() {
    chat_request chat;
    chat.model = "client-name";
    chat.messages.push_back(message("system", "You are terse."));
    chat.messages.push_back(message("user", "List the files."));
    common_chat_msg call = message("assistant", "");
    call.tool_calls.push_back({"ls", R"({"path":"."})", "call_1"});
    chat.messages.push_back(call);
    common_chat_msg result = message("tool", "a.txt b.txt");
    result.tool_call_id = "call_1";
    chat.messages.push_back(result);
    chat.messages.push_back(message("user", "Thanks. Which is bigger?"));
    chat.tools.push_back({"ls", "List a folder", R"({"type":"object","properties":{"path":{"type":"string"}}})"});
    chat.max_tokens = 17;
    chat.stop = {"END"};
    chat.sampling.temperature = 0.5f;
    chat.sampling.top_k = 7;
    chat.stream = false;  // the client's choice; upstreams are always asked for a stream
    return chat;
}

void expect_same_conversation(const chat_request& sent, const chat_request& parsed) {
    ASSERT_EQ(parsed.messages.size(), sent.messages.size());
    for (size_t i = 0; i < sent.messages.size(); i++) {
        SCOPED_TRACE(i);
        EXPECT_EQ(parsed.messages[i].role, sent.messages[i].role);
        EXPECT_EQ(
            parsed.messages[i].content +
                [&] {
                    std::string t;
                    for (const auto& p : parsed.messages[i].content_parts) t += p.text;
                    return t;
                }(),
            sent.messages[i].content);
        ASSERT_EQ(parsed.messages[i].tool_calls.size(), sent.messages[i].tool_calls.size());
        for (size_t c = 0; c < sent.messages[i].tool_calls.size(); c++) {
            EXPECT_EQ(parsed.messages[i].tool_calls[c].name, sent.messages[i].tool_calls[c].name);
            EXPECT_EQ(json::parse(parsed.messages[i].tool_calls[c].arguments),
                      json::parse(sent.messages[i].tool_calls[c].arguments));
        }
    }
    ASSERT_EQ(parsed.tools.size(), 1u);
    EXPECT_EQ(parsed.tools[0].name, "ls");
    EXPECT_EQ(json::parse(parsed.tools[0].parameters), json::parse(sent.tools[0].parameters));
    EXPECT_EQ(parsed.max_tokens, sent.max_tokens);
    EXPECT_EQ(parsed.stop, sent.stop);
    EXPECT_EQ(parsed.sampling.temperature, sent.sampling.temperature);
    EXPECT_EQ(parsed.sampling.top_k, sent.sampling.top_k);
    EXPECT_TRUE(parsed.stream);
}

// Feeds `body` one byte at a time: events split anywhere must decode the same.
std::vector<common_chat_msg_diff> feed_bytewise(stream_decoder& decoder, const std::string& body) {
    std::vector<common_chat_msg_diff> all;
    for (char c : body) {
        auto diffs = decoder.push(std::string_view(&c, 1));
        all.insert(all.end(), diffs.begin(), diffs.end());
    }
    return all;
}

common_chat_msg answer_with_tool_call() {
    common_chat_msg m = message("assistant", "Checking.");
    m.reasoning_content = "The user wants sizes.";
    m.tool_calls.push_back({"stat", R"({"path":"a.txt"})", "call_9"});
    return m;
}

void expect_answer(const stream_decoder& decoder, const common_chat_msg& want) {
    EXPECT_TRUE(decoder.done());
    EXPECT_EQ(decoder.error(), "");
    EXPECT_EQ(decoder.message().content, want.content);
    EXPECT_EQ(decoder.message().reasoning_content, want.reasoning_content);
    ASSERT_EQ(decoder.message().tool_calls.size(), 1u);
    EXPECT_EQ(decoder.message().tool_calls[0].name, "stat");
    EXPECT_EQ(json::parse(decoder.message().tool_calls[0].arguments), json::parse(want.tool_calls[0].arguments));
}

}  // namespace

TEST(UpstreamDialects, OpenAIRequestParsesBackIntoTheSameConversation) {
    const chat_request sent = agent_turn();
    const upstream_call call = build_call(upstream_dialect::openai, sent, "pinned", "secret");
    EXPECT_EQ(call.target, "/v1/chat/completions");
    const json body = json::parse(call.body);
    EXPECT_EQ(body["model"], "pinned");
    EXPECT_EQ(body["stream_options"]["include_usage"], true);
    expect_same_conversation(sent, api::parse_chat_request(body));
    EXPECT_EQ(call.headers.at(0), (std::pair<std::string, std::string>{"authorization", "Bearer secret"}));
}

TEST(UpstreamDialects, LogitBiasesGoOutInTheApisRangeABanAsMinus100) {
    chat_request sent = agent_turn();
    sent.sampling.logit_bias = {{11, 5.5f}, {12, -INFINITY}};
    const json body = json::parse(build_call(upstream_dialect::openai, sent, "pinned", "").body);
    EXPECT_EQ(body["logit_bias"], json::parse(R"({"11": 5.5, "12": -100.0})"));
    const chat_request back = api::parse_chat_request(body);
    ASSERT_EQ(back.sampling.logit_bias.size(), 2u);
    EXPECT_EQ(back.sampling.logit_bias[1].first, 12);
    EXPECT_TRUE(std::isinf(back.sampling.logit_bias[1].second));
}

TEST(UpstreamDialects, AnthropicRequestParsesBackIntoTheSameConversation) {
    const chat_request sent = agent_turn();
    const upstream_call call = build_call(upstream_dialect::anthropic, sent, "pinned");
    EXPECT_EQ(call.target, "/v1/messages");
    const json body = json::parse(call.body);
    EXPECT_EQ(body["system"], "You are terse.");
    EXPECT_EQ(body["messages"][2]["content"][0]["type"], "tool_result");
    expect_same_conversation(sent, api::anthropic::parse_messages_request(body));
}

TEST(UpstreamDialects, AnthropicRequestWithoutMaxTokensGetsTheDefault) {
    chat_request chat = agent_turn();
    chat.max_tokens.reset();
    const json body = json::parse(build_call(upstream_dialect::anthropic, chat, "m").body);
    EXPECT_EQ(body["max_tokens"], anthropic_default_max_tokens);
}

TEST(UpstreamDialects, OllamaRequestParsesBackIntoTheSameConversation) {
    const chat_request sent = agent_turn();
    const upstream_call call = build_call(upstream_dialect::ollama, sent, "tiny:latest");
    EXPECT_EQ(call.target, "/api/chat");
    const json body = json::parse(call.body);
    EXPECT_TRUE(body["messages"][2]["tool_calls"][0]["function"]["arguments"].is_object());
    expect_same_conversation(sent, api::ollama::parse_chat_request(body));
}

TEST(UpstreamDialects, DecodesKeepwarmsOpenAIStream) {
    const common_chat_msg want = answer_with_tool_call();
    const auto diffs = common_chat_msg_diff::compute_diffs(message("assistant", ""), want);
    std::string body;
    const auto sse = [&body](const json& j) { body += "data: " + j.dump() + "\n\n"; };
    for (const json& chunk : api::chat_chunk_json("id", "m", 0, diffs, true)) sse(chunk);
    sse(api::chat_final_chunk_json("id", "m", 0, want, "tool_calls"));
    sse(api::chat_usage_chunk_json("id", "m", 0, {.prompt_tokens = 40, .completion_tokens = 9, .cached_tokens = 32}));
    body += "data: [DONE]\n\n";

    stream_decoder decoder(upstream_dialect::openai);
    const auto got = feed_bytewise(decoder, body);
    EXPECT_FALSE(got.empty());
    expect_answer(decoder, want);
    EXPECT_EQ(decoder.usage().prompt_tokens, 40);
    EXPECT_EQ(decoder.usage().cached_tokens, 32);
    EXPECT_EQ(decoder.usage().completion_tokens, 9);
    EXPECT_FALSE(decoder.usage().hit_token_limit);
}

TEST(UpstreamDialects, ReadsLlamaServerReuseFromTimings) {
    stream_decoder decoder(upstream_dialect::openai);
    decoder.push(R"(data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"length"}],)"
                 R"("timings":{"cache_n":30,"prompt_n":5,"predicted_n":2}})"
                 "\r\n\r\ndata: [DONE]\r\n\r\n");
    EXPECT_TRUE(decoder.done());
    EXPECT_EQ(decoder.message().content, "hi");
    EXPECT_EQ(decoder.usage().prompt_tokens, 35);
    EXPECT_EQ(decoder.usage().cached_tokens, 30);
    EXPECT_TRUE(decoder.usage().hit_token_limit);
}

TEST(UpstreamDialects, DecodesKeepwarmsAnthropicStream) {
    const common_chat_msg want = answer_with_tool_call();
    api::anthropic::message_stream stream("msg_1", "m");
    std::string body = api::anthropic::to_sse(stream.start(40)) + api::anthropic::to_sse(api::anthropic::ping_event());
    for (const auto& e : stream.push(common_chat_msg_diff::compute_diffs(message("assistant", ""), want))) {
        body += api::anthropic::to_sse(e);
    }
    for (const auto& e :
         stream.finish("tool_use", {.prompt_tokens = 40, .completion_tokens = 9, .cached_tokens = 32})) {
        body += api::anthropic::to_sse(e);
    }
    stream_decoder decoder(upstream_dialect::anthropic);
    feed_bytewise(decoder, body);
    expect_answer(decoder, want);
    EXPECT_EQ(decoder.usage().prompt_tokens, 40);
    EXPECT_EQ(decoder.usage().cached_tokens, 32);
    EXPECT_EQ(decoder.usage().completion_tokens, 9);
}

TEST(UpstreamDialects, DecodesKeepwarmsOllamaStream) {
    const common_chat_msg want = answer_with_tool_call();
    namespace ollama = api::ollama;
    std::string body = ollama::ndjson_line(ollama::chat_chunk_json("m", "t", "", want.reasoning_content)) +
                       ollama::ndjson_line(ollama::chat_chunk_json("m", "t", want.content, "")) +
                       ollama::ndjson_line(ollama::chat_chunk_json("m", "t", "", "", want.tool_calls)) +
                       ollama::ndjson_line(ollama::chat_final_chunk_json(
                           "m", "t", "length", {.prompt_tokens = 40, .cached_tokens = 32, .generated_tokens = 9}));
    stream_decoder decoder(upstream_dialect::ollama);
    feed_bytewise(decoder, body);
    expect_answer(decoder, want);
    EXPECT_EQ(decoder.usage().prompt_tokens, 40);
    EXPECT_EQ(decoder.usage().cached_tokens, 32);
    EXPECT_EQ(decoder.usage().completion_tokens, 9);
    EXPECT_TRUE(decoder.usage().hit_token_limit);
}

TEST(UpstreamDialects, AnErrorInsideTheStreamEndsItWithThatError) {
    stream_decoder anthropic(upstream_dialect::anthropic);
    anthropic.push(api::anthropic::to_sse(api::anthropic::error_event("overloaded_error", "busy now")));
    EXPECT_TRUE(anthropic.done());
    EXPECT_EQ(anthropic.error(), "busy now");

    stream_decoder ollama(upstream_dialect::ollama);
    ollama.push(api::ollama::error_body(500, "server_error", "engine failed") + "\n");
    EXPECT_EQ(ollama.error(), "engine failed");

    stream_decoder openai(upstream_dialect::openai);
    openai.push("data: not json\n\n");
    EXPECT_TRUE(openai.done());
    EXPECT_NE(openai.error().find("not JSON"), std::string::npos);
}

TEST(UpstreamDialects, ErrorBodiesOfEveryShape) {
    EXPECT_EQ(parse_error_body(R"({"error":{"message":"too long","type":"exceed_context_size_error"}})").type,
              "exceed_context_size_error");
    EXPECT_EQ(parse_error_body(R"({"type":"error","error":{"type":"x","message":"m"}})").message, "m");
    EXPECT_EQ(parse_error_body(R"({"error":"model not found"})").message, "model not found");
    EXPECT_EQ(parse_error_body("Bad Gateway").message, "Bad Gateway");
}

// nlohmann throws out_of_range, not parse_error, for a number past double's range: the fuzzer's find (openai-stream).
TEST(UpstreamDialects, ANumberOutOfRangeInAnErrorOrListingIsNotAnException) {
    const std::string body = R"({"error":{"message":"m","code":2e999}})";
    EXPECT_EQ(parse_error_body(body).message, body);
    EXPECT_EQ(upstream_request_error(500, body, "http://upstream").status, 502);
    EXPECT_EQ(parse_listing(upstream_dialect::openai, R"({"data":[{"id":"q","created":1e999}]})").model, "");
}

TEST(UpstreamDialects, HealthListings) {
    EXPECT_EQ(health_target(upstream_dialect::ollama), "/api/tags");
    EXPECT_EQ(health_target(upstream_dialect::openai), "/v1/models");
    const auto keepwarm = parse_listing(upstream_dialect::openai,
                                        R"({"data":[{"id":"tiny","owned_by":"keepwarm","created":1700000000}]})");
    EXPECT_EQ(keepwarm.model, "tiny");
    EXPECT_EQ(keepwarm.instance, "1700000000");
    // llama-server's "created" is the time of the request: not an instance.
    EXPECT_EQ(
        parse_listing(upstream_dialect::openai, R"({"data":[{"id":"q","owned_by":"llamacpp","created":5}]})").instance,
        "");
    EXPECT_EQ(parse_listing(upstream_dialect::ollama, R"({"models":[{"name":"tiny:latest"}]})").model, "tiny:latest");
    EXPECT_EQ(parse_listing(upstream_dialect::ollama, "garbage").model, "");
}

TEST(UpstreamDialects, DialectNames) {
    EXPECT_EQ(parse_dialect("anthropic"), upstream_dialect::anthropic);
    EXPECT_STREQ(dialect_name(upstream_dialect::ollama), "ollama");
    EXPECT_THROW(parse_dialect("vllm"), std::invalid_argument);
}

// A client's cache hint reaches the upstream: as one Anthropic breakpoint that parses back to the same prefix, and
// as the prompt_cache_key for an OpenAI-dialect upstream.
TEST(UpstreamDialects, CacheHintsGoOnToTheUpstream) {
    chat_request sent = agent_turn();
    const size_t n = sent.messages.size();
    for (size_t k = 1; k <= n; k++) {
        sent.hint =
            cache_hint{.messages = k == n ? std::numeric_limits<size_t>::max() : k, .ttl = std::chrono::hours(1)};
        const json body = json::parse(build_call(upstream_dialect::anthropic, sent, "pinned").body);
        const chat_request back = api::anthropic::parse_messages_request(body);
        ASSERT_TRUE(back.hint.has_value()) << "hint through message " << k;
        // At least what the client marked; a tool result shares its Anthropic turn with the text after it, so a mark
        // between them moves to the end of that turn.
        EXPECT_GE(std::min(back.hint->messages, n), k) << body.dump();
        EXPECT_LE(std::min(back.hint->messages, n), sent.messages[k - 1].role == "tool" ? n : k) << body.dump();
        EXPECT_EQ(back.hint->ttl, std::chrono::hours(1));
        expect_same_conversation(sent, back);
    }
    sent.hint.reset();
    EXPECT_EQ(build_call(upstream_dialect::anthropic, sent, "pinned").body.find("cache_control"), std::string::npos);

    sent.prompt_cache_key = "session-9";
    sent.hint = cache_hint{.messages = std::numeric_limits<size_t>::max(), .ttl = std::chrono::minutes(10)};
    const chat_request back =
        api::parse_chat_request(json::parse(build_call(upstream_dialect::openai, sent, "m", "").body));
    EXPECT_EQ(back.prompt_cache_key, "session-9");
    EXPECT_TRUE(back.hint.has_value());
}

// A client's per-request drafting limit (llama-server's speculative.n_max) reaches an OpenAI-dialect upstream (a
// llama-server or keepwarm behind the proxy), and is not invented where the client set none.
TEST(UpstreamDialects, DraftLimitGoesOnToAnOpenAiUpstream) {
    chat_request sent = agent_turn();
    EXPECT_EQ(build_call(upstream_dialect::openai, sent, "m", "").body.find("speculative"), std::string::npos);
    sent.draft_max = 0;
    const chat_request back =
        api::parse_chat_request(json::parse(build_call(upstream_dialect::openai, sent, "m", "").body));
    EXPECT_EQ(back.draft_max, 0);
}

// Routing by model name reads every model a health answer lists, within bounds: hostile listings stay small.
TEST(UpstreamDialects, AListingKeepsEveryModelWithinBounds) {
    const auto two = parse_listing(upstream_dialect::openai,
                                   R"({"data":[{"id":"a"},{"id":"b"},{"id":"a"},{"id":7},{"id":""},42,{"x":1}]})");
    EXPECT_EQ(two.model, "a");
    EXPECT_EQ(two.models, (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ(parse_listing(upstream_dialect::ollama, R"({"models":[{"name":"x:1"},{"name":"y:2"}]})").models,
              (std::vector<std::string>{"x:1", "y:2"}));

    nlohmann::json many = {{"data", nlohmann::json::array()}};
    many["data"].push_back({{"id", std::string(max_model_name_bytes + 1, 'l')}});  // too long: left out
    for (size_t i = 0; i < max_listed_models + 10; i++) many["data"].push_back({{"id", "m" + std::to_string(i)}});
    const auto bounded = parse_listing(upstream_dialect::openai, many.dump());
    ASSERT_EQ(bounded.models.size(), max_listed_models);
    EXPECT_EQ(bounded.models.front(), "m0");
    EXPECT_EQ(bounded.models.back(), "m" + std::to_string(max_listed_models - 1));
}

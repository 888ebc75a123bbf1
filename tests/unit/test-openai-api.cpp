// Unit tests for OpenAI request parsing/validation and response/chunk JSON shapes (src/api/openai-api.*).
#include <gtest/gtest.h>

#include <cmath>

#include "api/openai-api.h"
#include "api/request-limits.h"
#include "http/http-server.h"

using namespace keepwarm;
using namespace keepwarm::api;
using keepwarm::request_error;

namespace {

json body_of(const char* text) {
    return json::parse(text);
}

json minimal_chat() {
    return body_of(R"({"model":"m","messages":[{"role":"user","content":"hi"}]})");
}

// Runs `parse` and checks that it fails with a 400 whose message contains `needle`.
template <typename F>
void expect_400(F parse, const json& body, const std::string& needle) {
    try {
        parse(body);
        ADD_FAILURE() << "expected a 400 for " << body.dump();
    } catch (const request_error& e) {
        EXPECT_EQ(e.status, 400);
        EXPECT_EQ(e.type, "invalid_request_error");
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
            << "message '" << e.what() << "' lacks '" << needle << "' for " << body.dump();
    } catch (const std::exception& e) {
        ADD_FAILURE() << "expected request_error, got " << e.what() << " for " << body.dump();
    }
}

void expect_chat_400(const json& body, const std::string& needle) {
    expect_400(parse_chat_request, body, needle);
}

// minimal_chat() with one field replaced.
json chat_with(const std::string& key, const json& value) {
    json b = minimal_chat();
    b[key] = value;
    return b;
}

}  // namespace

TEST(OpenAiParse, MinimalChatDefaults) {
    auto r = parse_chat_request(minimal_chat());
    EXPECT_EQ(r.model, "m");
    ASSERT_EQ(r.messages.size(), 1u);
    EXPECT_EQ(r.messages[0].role, "user");
    EXPECT_EQ(r.messages[0].content, "hi");
    EXPECT_FALSE(r.stream);
    EXPECT_FALSE(r.include_usage);
    EXPECT_FALSE(r.max_tokens.has_value());
    EXPECT_TRUE(r.stop.empty());
    EXPECT_TRUE(r.tools.empty());
    EXPECT_EQ(r.tool_choice, COMMON_CHAT_TOOL_CHOICE_AUTO);
    EXPECT_FALSE(r.parallel_tool_calls.has_value());
    EXPECT_FALSE(r.enable_thinking.has_value());
    EXPECT_TRUE(r.json_schema.empty());
    EXPECT_FALSE(r.sampling.temperature.has_value());
    EXPECT_EQ(r.n, 1);
}

TEST(OpenAiParse, ContentPartsAndRoles) {
    auto r = parse_chat_request(body_of(R"({"messages":[
        {"role":"developer","content":"be brief"},
        {"role":"system","content":[{"type":"text","text":"sys"}]},
        {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
        {"role":"assistant","content":[{"type":"refusal","refusal":"no"}]},
        {"role":"user","content":"again"}]})"));
    ASSERT_EQ(r.messages.size(), 5u);
    EXPECT_EQ(r.messages[0].role, "developer");
    EXPECT_EQ(r.messages[1].content_parts.size(), 1u);
    ASSERT_EQ(r.messages[2].content_parts.size(), 2u);
    EXPECT_EQ(r.messages[2].content_parts[1].type, "text");
    EXPECT_EQ(r.messages[2].content_parts[1].text, "b");
    EXPECT_TRUE(r.messages[2].content.empty());
    EXPECT_EQ(r.messages[3].content_parts.at(0).text, "no");
}

TEST(OpenAiParse, ToolsAndToolMessages) {
    auto r = parse_chat_request(body_of(R"({"messages":[
        {"role":"user","content":"weather?"},
        {"role":"assistant","content":null,"reasoning_content":"think","tool_calls":[
            {"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},
            {"id":"call_2","type":"function","function":{"name":"get_weather","arguments":{"city":"Rome"}}},
            {"id":"call_3","type":"function","function":{"name":"no_args","arguments":""}}]},
        {"role":"tool","tool_call_id":"call_1","name":"get_weather","content":"sunny"},
        {"role":"tool","tool_call_id":"call_2","content":[{"type":"text","text":"rainy"}]}],
      "tools":[{"type":"function","function":{"name":"get_weather","description":"Get weather",
               "parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}},
               {"type":"function","function":{"name":"no_args"}}],
      "tool_choice":"required","parallel_tool_calls":false})"));
    ASSERT_EQ(r.messages.size(), 4u);
    const auto& a = r.messages[1];
    EXPECT_TRUE(a.content.empty());
    EXPECT_EQ(a.reasoning_content, "think");
    ASSERT_EQ(a.tool_calls.size(), 3u);
    EXPECT_EQ(a.tool_calls[2].arguments, "{}");
    EXPECT_EQ(a.tool_calls[0].id, "call_1");
    EXPECT_EQ(a.tool_calls[0].name, "get_weather");
    EXPECT_EQ(json::parse(a.tool_calls[0].arguments), json::parse(R"({"city":"Paris"})"));
    EXPECT_EQ(json::parse(a.tool_calls[1].arguments), json::parse(R"({"city":"Rome"})"));
    EXPECT_EQ(r.messages[2].tool_call_id, "call_1");
    EXPECT_EQ(r.messages[2].tool_name, "get_weather");
    EXPECT_EQ(r.messages[3].content_parts.at(0).text, "rainy");
    ASSERT_EQ(r.tools.size(), 2u);
    EXPECT_EQ(r.tools[0].name, "get_weather");
    EXPECT_EQ(r.tools[0].description, "Get weather");
    EXPECT_EQ(json::parse(r.tools[0].parameters)["required"][0], "city");
    EXPECT_EQ(json::parse(r.tools[1].parameters)["type"], "object");
    EXPECT_EQ(r.tool_choice, COMMON_CHAT_TOOL_CHOICE_REQUIRED);
    EXPECT_EQ(r.parallel_tool_calls, std::optional<bool>(false));
}

TEST(OpenAiParse, NamedToolChoiceNarrowsTools) {
    auto b = minimal_chat();
    b["tools"] =
        body_of(R"([{"type":"function","function":{"name":"a"}},{"type":"function","function":{"name":"b"}}])");
    b["tool_choice"] = body_of(R"({"type":"function","function":{"name":"b"}})");
    auto r = parse_chat_request(b);
    ASSERT_EQ(r.tools.size(), 1u);
    EXPECT_EQ(r.tools[0].name, "b");
    EXPECT_EQ(r.tool_choice, COMMON_CHAT_TOOL_CHOICE_REQUIRED);
    b["tool_choice"] = "none";
    EXPECT_EQ(parse_chat_request(b).tool_choice, COMMON_CHAT_TOOL_CHOICE_NONE);
}

TEST(OpenAiParse, StopStringOrArray) {
    EXPECT_EQ(parse_chat_request(chat_with("stop", "END")).stop, std::vector<std::string>{"END"});
    EXPECT_EQ(parse_chat_request(chat_with("stop", body_of(R"(["a","","b"])"))).stop,
              (std::vector<std::string>{"a", "b"}));
    EXPECT_TRUE(parse_chat_request(chat_with("stop", nullptr)).stop.empty());
    EXPECT_TRUE(parse_chat_request(chat_with("stop", "")).stop.empty());
}

TEST(OpenAiParse, MaxTokens) {
    EXPECT_EQ(parse_chat_request(chat_with("max_tokens", 64)).max_tokens, std::optional<int>(64));
    EXPECT_EQ(parse_chat_request(chat_with("max_completion_tokens", 32)).max_tokens, std::optional<int>(32));
    EXPECT_EQ(parse_chat_request(chat_with("max_tokens", 128.0)).max_tokens, std::optional<int>(128));
    auto b = chat_with("max_tokens", 64);
    b["max_completion_tokens"] = 10;  // the current name wins over the deprecated one
    EXPECT_EQ(parse_chat_request(b).max_tokens, std::optional<int>(10));
    EXPECT_EQ(parse_chat_request(chat_with("max_tokens", 1e12)).max_tokens, std::optional<int>(2147483647));
    EXPECT_FALSE(parse_chat_request(chat_with("max_tokens", nullptr)).max_tokens.has_value());
}

// Token probabilities are not returned: asking for them is a 400 that says so, not an answer without them.
TEST(OpenAiParse, AskingForLogprobsIsRefusedNotIgnored) {
    const auto chat = [](const char* extra) {
        return json::parse(std::string(R"({"messages":[{"role":"user","content":"x"}],)") + extra + "}");
    };
    expect_400(parse_chat_request, chat(R"("logprobs":true)"), "'logprobs' is not supported");
    expect_400(parse_chat_request, chat(R"("top_logprobs":5)"), "'top_logprobs' is not supported");
    EXPECT_NO_THROW(parse_chat_request(chat(R"("logprobs":false,"top_logprobs":null)")));
    EXPECT_NO_THROW(parse_completion_request(json::parse(R"({"prompt":"x","logprobs":0})")));
}

TEST(OpenAiParse, StreamSamplingAndExtras) {
    auto r = parse_chat_request(body_of(R"({"messages":[{"role":"user","content":"x"}],
        "stream":true,"stream_options":{"include_usage":true},
        "temperature":0.5,"top_p":0.9,"min_p":0.1,"top_k":20,"repeat_penalty":1.1,"repeat_last_n":-1,
        "presence_penalty":0.5,"frequency_penalty":-0.5,"seed":42,"n":1,"logprobs":false,"top_logprobs":0,
        "user":"u","metadata":{"a":1},
        "response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object"}}},
        "chat_template_kwargs":{"enable_thinking":false,"custom":"v"}})"));
    EXPECT_TRUE(r.stream);
    EXPECT_TRUE(r.include_usage);
    EXPECT_FLOAT_EQ(*r.sampling.temperature, 0.5f);
    EXPECT_FLOAT_EQ(*r.sampling.top_p, 0.9f);
    EXPECT_FLOAT_EQ(*r.sampling.min_p, 0.1f);
    EXPECT_EQ(*r.sampling.top_k, 20);
    EXPECT_FLOAT_EQ(*r.sampling.repeat_penalty, 1.1f);
    EXPECT_EQ(*r.sampling.repeat_last_n, -1);
    EXPECT_FLOAT_EQ(*r.sampling.presence_penalty, 0.5f);
    EXPECT_FLOAT_EQ(*r.sampling.frequency_penalty, -0.5f);
    EXPECT_EQ(*r.sampling.seed, 42u);
    EXPECT_EQ(json::parse(r.json_schema), json::parse(R"({"type":"object"})"));
    EXPECT_EQ(r.enable_thinking, std::optional<bool>(false));
    EXPECT_EQ(r.chat_template_kwargs.count("enable_thinking"), 0u);
    EXPECT_EQ(r.chat_template_kwargs.at("custom"), "\"v\"");  // JSON text, as common expects
}

TEST(OpenAiParse, ThinkingSwitches) {
    auto b = chat_with("reasoning_effort", "none");
    b["chat_template_kwargs"] = body_of(R"({"enable_thinking":true})");
    auto r = parse_chat_request(b);
    EXPECT_EQ(r.enable_thinking, std::optional<bool>(false));  // reasoning_effort "none" wins, like llama-server
    r = parse_chat_request(chat_with("reasoning_effort", "high"));
    EXPECT_FALSE(r.enable_thinking.has_value());
    EXPECT_EQ(r.chat_template_kwargs.at("reasoning_effort"), "\"high\"");
    EXPECT_EQ(
        parse_chat_request(chat_with("chat_template_kwargs", body_of(R"({"enable_thinking":true})"))).enable_thinking,
        std::optional<bool>(true));
    EXPECT_EQ(parse_chat_request(chat_with("response_format", body_of(R"({"type":"json_object"})"))).json_schema,
              R"({"type":"object"})");
    EXPECT_TRUE(parse_chat_request(chat_with("response_format", body_of(R"({"type":"text"})"))).json_schema.empty());
    EXPECT_EQ(*parse_chat_request(chat_with("seed", -1)).sampling.seed, LLAMA_DEFAULT_SEED);
}

TEST(OpenAiParse, BadChatRequests) {
    expect_chat_400(json::array(), "request body must be a JSON object");
    expect_chat_400(body_of(R"({"model":"m"})"), "'messages' must be a non-empty array");
    expect_chat_400(chat_with("messages", json::array()), "'messages' must be a non-empty array");
    expect_chat_400(chat_with("messages", "hi"), "'messages' must be a non-empty array");
    expect_chat_400(chat_with("messages", body_of(R"([1])")), "'messages[0]' must be an object");
    expect_chat_400(chat_with("messages", body_of(R"([{"role":"user","content":"a"},{"role":"bot","content":"b"}])")),
                    "'messages[1].role' must be one of system, user, assistant, tool, developer");
    expect_chat_400(chat_with("messages", body_of(R"([{"content":"b"}])")), "'messages[0].role' must be one of");
    expect_chat_400(chat_with("messages", body_of(R"([{"role":5,"content":"b"}])")), "'messages[0].role' must be");
    expect_chat_400(chat_with("messages", body_of(R"([{"role":"user","content":5}])")),
                    "'messages[0].content' must be a string or an array of content parts");
    expect_chat_400(chat_with("messages", body_of(R"([{"role":"user"}])")), "'messages[0].content' must be");
    expect_chat_400(chat_with("messages", body_of(R"([{"role":"user","content":null}])")),
                    "'messages[0].content' must be");
    expect_chat_400(chat_with("messages", body_of(R"([{"role":"user","content":[
                        {"type":"image_url","image_url":{"url":"http://x/y.png"}}]}])")),
                    "images are not supported");
    expect_chat_400(chat_with("messages", body_of(R"([{"role":"user","content":[{"type":"text"}]}])")),
                    "'messages[0].content[0].text' must be a string");
    expect_chat_400(chat_with("messages", body_of(R"([{"role":"user","content":["hi"]}])")),
                    "'messages[0].content[0]' must be an object");
    expect_chat_400(chat_with("messages", body_of(R"([{"role":"user","content":[{"type":"blob"}]}])")),
                    "'messages[0].content[0].type' must be 'text'");
    expect_chat_400(chat_with("messages", body_of(R"([{"role":"user","content":"q"},{"role":"tool","content":"r"}])")),
                    "'messages[1].tool_call_id' must be a non-empty string");
    expect_chat_400(chat_with("messages", body_of(R"([{"role":"tool","content":"r","tool_call_id":7}])")),
                    "'messages[0].tool_call_id' must be a string");
    expect_chat_400(chat_with("messages", body_of(R"([{"role":"user","content":"q"},{"role":"assistant"}])")),
                    "'messages[1]' (assistant) must have 'content' or 'tool_calls'");
    expect_chat_400(chat_with("messages", body_of(R"([{"role":"assistant","tool_calls":[
                        {"type":"function","function":{"name":"f","arguments":"{not json"}}]}])")),
                    "'messages[0].tool_calls[0].function.arguments' must be a JSON-encoded string");
    expect_chat_400(chat_with("messages", body_of(R"([{"role":"assistant","tool_calls":[
                        {"type":"function","function":{"arguments":"{}"}}]}])")),
                    "'messages[0].tool_calls[0].function.name' must be a non-empty string");
    expect_chat_400(chat_with("messages", body_of(R"([{"role":"assistant","tool_calls":{}}])")),
                    "'messages[0].tool_calls' must be an array");
    expect_chat_400(chat_with("messages", body_of(R"([{"role":"user","content":"x","tool_calls":[]}])")),
                    "'messages[0].tool_calls' is only allowed on assistant messages");

    expect_chat_400(chat_with("n", 2), "'n' must be 1");
    expect_chat_400(chat_with("n", "1"), "'n' must be an integer");
    expect_chat_400(chat_with("temperature", "hot"), "'temperature' must be a number");
    expect_chat_400(chat_with("temperature", 3), "'temperature' must be a number between 0 and 2");
    expect_chat_400(chat_with("temperature", -0.1), "'temperature' must be a number between 0 and 2");
    expect_chat_400(chat_with("top_p", 1.5), "'top_p' must be a number between 0 and 1");
    expect_chat_400(chat_with("min_p", true), "'min_p' must be a number");
    expect_chat_400(chat_with("top_k", -1), "'top_k' must be an integer between 0 and");
    expect_chat_400(chat_with("top_k", 1.5), "'top_k' must be an integer");
    expect_chat_400(chat_with("presence_penalty", 2.5), "'presence_penalty' must be a number between -2 and 2");
    expect_chat_400(chat_with("frequency_penalty", "x"), "'frequency_penalty' must be a number");
    expect_chat_400(chat_with("repeat_penalty", 0), "'repeat_penalty' must be a number greater than 0");
    expect_chat_400(chat_with("repeat_last_n", -2), "'repeat_last_n' must be an integer between -1 and");
    expect_chat_400(chat_with("seed", 1e10), "'seed' must be an integer between -1 and 4294967295");
    expect_chat_400(chat_with("seed", "7"), "'seed' must be an integer");
    expect_chat_400(chat_with("max_tokens", -5), "'max_tokens' must be a positive integer");
    expect_chat_400(chat_with("max_tokens", 0), "'max_tokens' must be a positive integer");
    expect_chat_400(chat_with("max_completion_tokens", "10"), "'max_completion_tokens' must be an integer");
    expect_chat_400(chat_with("stop", 5), "'stop' must be a string or an array of strings");
    expect_chat_400(chat_with("stop", body_of(R"(["a",1])")), "'stop[1]' must be a string");
    expect_chat_400(chat_with("stop", json(std::vector<std::string>(17, "x"))), "'stop' may hold at most 16 strings");
    expect_chat_400(chat_with("stream", "yes"), "'stream' must be a boolean");
    expect_chat_400(chat_with("stream_options", 1), "'stream_options' must be an object");
    expect_chat_400(chat_with("stream_options", body_of(R"({"include_usage":1})")),
                    "'stream_options.include_usage' must be a boolean");
    expect_chat_400(chat_with("model", 5), "'model' must be a string");
    expect_chat_400(chat_with("parallel_tool_calls", "no"), "'parallel_tool_calls' must be a boolean");

    expect_chat_400(chat_with("tools", body_of(R"({"type":"function"})")), "'tools' must be an array");
    expect_chat_400(chat_with("tools", body_of(R"([5])")), "'tools[0]' must be an object");
    expect_chat_400(chat_with("tools", body_of(R"([{"type":"function","function":{"description":"d"}}])")),
                    "'tools[0].function.name' must be a non-empty string");
    expect_chat_400(chat_with("tools", body_of(R"([{"type":"function"}])")), "'tools[0].function' must be an object");
    expect_chat_400(chat_with("tools", body_of(R"([{"type":"retrieval","function":{"name":"f"}}])")),
                    "'tools[0].type' must be 'function'");
    expect_chat_400(chat_with("tools", body_of(R"([{"type":"function","function":{"name":"f","parameters":[]}}])")),
                    "'tools[0].function.parameters' must be an object");
    expect_chat_400(chat_with("tools", body_of(R"([{"type":"function","function":{"name":"f"}},
                                                 {"type":"function","function":{"name":"f"}}])")),
                    "duplicate tool name 'f'");
    expect_chat_400(chat_with("tool_choice", "sometimes"), "'tool_choice' must be one of none, auto, required");
    expect_chat_400(chat_with("tool_choice", "required"), "no 'tools' were given");
    {
        auto b = chat_with("tools", body_of(R"([{"type":"function","function":{"name":"a"}}])"));
        b["tool_choice"] = body_of(R"({"type":"function","function":{"name":"zzz"}})");
        expect_chat_400(b, "'tool_choice.function.name' names 'zzz', which is not in 'tools'");
    }
    expect_chat_400(chat_with("functions", json::array({json::object()})), "'functions'");
    expect_chat_400(chat_with("response_format", "json"), "'response_format' must be an object");
    expect_chat_400(chat_with("response_format", body_of(R"({"type":"xml"})")),
                    "'response_format.type' must be one of text, json_object, json_schema");
    expect_chat_400(chat_with("response_format", body_of(R"({"type":"json_schema","json_schema":{"name":"x"}})")),
                    "'response_format.json_schema.schema' must be an object");
    expect_chat_400(chat_with("chat_template_kwargs", body_of(R"({"enable_thinking":"true"})")),
                    "'chat_template_kwargs.enable_thinking' must be a boolean");
    expect_chat_400(chat_with("chat_template_kwargs", "x"), "'chat_template_kwargs' must be an object");
    expect_chat_400(chat_with("reasoning_effort", 3), "'reasoning_effort' must be a string");
}

TEST(OpenAiParse, Completion) {
    auto r = parse_completion_request(body_of(
        R"({"model":"m","prompt":"Once","max_tokens":8,"stop":"\n","stream":true,"temperature":0,"echo":false})"));
    EXPECT_EQ(r.prompt, "Once");
    EXPECT_EQ(r.max_tokens, std::optional<int>(8));
    EXPECT_EQ(r.stop, std::vector<std::string>{"\n"});
    EXPECT_TRUE(r.stream);
    EXPECT_FLOAT_EQ(*r.sampling.temperature, 0.0f);
    EXPECT_EQ(parse_completion_request(body_of(R"({"prompt":["one"]})")).prompt, "one");
    EXPECT_FALSE(parse_completion_request(body_of(R"({"prompt":"x"})")).max_tokens.has_value());

    auto bad = [](const char* body, const std::string& needle) {
        expect_400(parse_completion_request, json::parse(body), needle);
    };
    bad(R"({"model":"m"})", "'prompt' must be a non-empty string");
    bad(R"({"prompt":""})", "'prompt' must be a non-empty string");
    bad(R"({"prompt":5})", "'prompt' must be a non-empty string");
    bad(R"({"prompt":[1,2,3]})", "token ids is not supported");
    bad(R"({"prompt":["a","b"]})", "batches of prompts are not supported");
    bad(R"({"prompt":"x","echo":true})", "'echo' is not supported");
    bad(R"({"prompt":"x","suffix":"y"})", "'suffix' is not supported");
    bad(R"({"prompt":"x","best_of":3})", "'best_of' must be 1");
    bad(R"({"prompt":"x","logprobs":2})", "'logprobs' is not supported");
    bad(R"({"prompt":"x","n":3})", "'n' must be 1");
    bad(R"({"prompt":"x","max_tokens":-1})", "'max_tokens' must be a positive integer");
    bad(R"({"prompt":"x","top_p":"a"})", "'top_p' must be a number");
}

TEST(OpenAiSampling, AppliesOverridesOnDefaults) {
    common_params_sampling defaults;
    defaults.temp = 0.7f;
    defaults.top_k = 33;
    sampling_options o;
    o.temperature = 0.0f;
    o.top_p = 0.5f;
    o.repeat_penalty = 1.2f;
    o.repeat_last_n = 128;
    o.presence_penalty = 0.3f;
    o.frequency_penalty = 0.4f;
    o.min_p = 0.01f;
    o.seed = 7;
    auto p = to_sampling_params(o, defaults);
    EXPECT_FLOAT_EQ(p.temp, 0.0f);
    EXPECT_EQ(p.top_k, 33);  // not overridden
    EXPECT_FLOAT_EQ(p.top_p, 0.5f);
    EXPECT_FLOAT_EQ(p.min_p, 0.01f);
    EXPECT_FLOAT_EQ(p.penalty_repeat, 1.2f);
    EXPECT_EQ(p.penalty_last_n, 128);
    EXPECT_FLOAT_EQ(p.penalty_present, 0.3f);
    EXPECT_FLOAT_EQ(p.penalty_freq, 0.4f);
    EXPECT_EQ(p.seed, 7u);

    sampling_options bad;
    bad.temperature = 2.5f;
    EXPECT_THROW(to_sampling_params(bad, defaults), request_error);
    bad = {};
    bad.top_k = -3;
    EXPECT_THROW(to_sampling_params(bad, defaults), request_error);
}

TEST(OpenAiFormat, ChatCompletionWithToolCalls) {
    common_chat_msg msg;
    msg.role = "assistant";
    msg.reasoning_content = "need weather";
    msg.tool_calls.push_back({"get_weather", R"({"city":"Paris"})", "call_abc"});
    auto j = chat_completion_json("chatcmpl-1", "m", 123, msg, "stop", {10, 5, 4}, timings_info{6, 4, 12.0, 5, 50.0});
    EXPECT_EQ(j["id"], "chatcmpl-1");
    EXPECT_EQ(j["object"], "chat.completion");
    EXPECT_EQ(j["created"], 123);
    EXPECT_EQ(j["model"], "m");
    const auto& c = j["choices"][0];
    EXPECT_EQ(c["index"], 0);
    EXPECT_EQ(c["finish_reason"], "tool_calls");
    EXPECT_EQ(c["message"]["role"], "assistant");
    EXPECT_TRUE(c["message"]["content"].is_null());
    EXPECT_EQ(c["message"]["reasoning_content"], "need weather");
    const auto& tc = c["message"]["tool_calls"][0];
    EXPECT_EQ(tc["id"], "call_abc");
    EXPECT_EQ(tc["type"], "function");
    EXPECT_EQ(tc["function"]["name"], "get_weather");
    EXPECT_EQ(tc["function"]["arguments"], R"({"city":"Paris"})");
    EXPECT_EQ(j["usage"]["prompt_tokens"], 10);
    EXPECT_EQ(j["usage"]["completion_tokens"], 5);
    EXPECT_EQ(j["usage"]["total_tokens"], 15);
    EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
    EXPECT_EQ(j["timings"]["cache_n"], 4);
    EXPECT_EQ(j["timings"]["prompt_n"], 6);
    EXPECT_DOUBLE_EQ(j["timings"]["prompt_per_token_ms"].get<double>(), 2.0);
    EXPECT_DOUBLE_EQ(j["timings"]["predicted_per_second"].get<double>(), 100.0);
    EXPECT_DOUBLE_EQ(j["timings"]["predicted_per_token_ms"].get<double>(), 10.0);

    // Length-limited replies keep "length" even with tool calls; plain replies have string content.
    EXPECT_EQ(chat_completion_json("i", "m", 0, msg, "length", {})["choices"][0]["finish_reason"], "length");
    common_chat_msg plain;
    plain.role = "assistant";
    auto p = chat_completion_json("i", "m", 0, plain, "stop", {});
    EXPECT_EQ(p["choices"][0]["message"]["content"], "");
    EXPECT_FALSE(p["choices"][0]["message"].contains("reasoning_content"));
    EXPECT_FALSE(p["choices"][0]["message"].contains("tool_calls"));
    EXPECT_FALSE(p.contains("timings"));
    EXPECT_EQ(chat_finish_reason(msg, false), "tool_calls");
    EXPECT_EQ(chat_finish_reason(plain, false), "stop");
    EXPECT_EQ(chat_finish_reason(plain, true), "length");
}

TEST(OpenAiFormat, ChatChunks) {
    std::vector<common_chat_msg_diff> diffs(3);
    diffs[0].reasoning_content_delta = "hm";
    diffs[1].tool_call_index = 0;
    diffs[1].tool_call_delta = {"get_weather", "{\"ci", "call_x"};
    diffs[2].tool_call_index = 0;
    diffs[2].tool_call_delta.arguments = "ty\":\"Paris\"}";
    auto chunks = chat_chunk_json("chatcmpl-1", "m", 5, diffs, true);
    ASSERT_EQ(chunks.size(), 4u);
    for (const auto& c : chunks) {
        EXPECT_EQ(c["object"], "chat.completion.chunk");
        EXPECT_EQ(c["id"], "chatcmpl-1");
        EXPECT_EQ(c["choices"][0]["index"], 0);
        EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null());
    }
    EXPECT_EQ(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    EXPECT_TRUE(chunks[0]["choices"][0]["delta"]["content"].is_null());
    EXPECT_EQ(chunks[1]["choices"][0]["delta"]["reasoning_content"], "hm");
    const auto& first = chunks[2]["choices"][0]["delta"]["tool_calls"][0];
    EXPECT_EQ(first["index"], 0);
    EXPECT_EQ(first["id"], "call_x");
    EXPECT_EQ(first["type"], "function");
    EXPECT_EQ(first["function"]["name"], "get_weather");
    EXPECT_EQ(first["function"]["arguments"], "{\"ci");
    const auto& next = chunks[3]["choices"][0]["delta"]["tool_calls"][0];
    EXPECT_EQ(next["index"], 0);
    EXPECT_FALSE(next.contains("id"));
    EXPECT_FALSE(next["function"].contains("name"));
    EXPECT_EQ(next["function"]["arguments"], "ty\":\"Paris\"}");

    // Later pushes carry no role chunk; an empty diff list yields no chunks.
    EXPECT_TRUE(chat_chunk_json("c", "m", 5, {}, false).empty());
    common_chat_msg_diff content;
    content.content_delta = "Hello";
    auto later = chat_chunk_json("c", "m", 5, {content}, false);
    ASSERT_EQ(later.size(), 1u);
    EXPECT_EQ(later[0]["choices"][0]["delta"], json::parse(R"({"content":"Hello"})"));

    common_chat_msg final_msg;
    final_msg.tool_calls.push_back({"get_weather", "{}", "call_x"});
    auto fin = chat_final_chunk_json("c", "m", 5, final_msg, "stop");
    EXPECT_EQ(fin["object"], "chat.completion.chunk");
    EXPECT_EQ(fin["choices"][0]["finish_reason"], "tool_calls");
    EXPECT_TRUE(fin["choices"][0]["delta"].empty());
    EXPECT_FALSE(fin.contains("timings"));
    auto len = chat_final_chunk_json("c", "m", 5, common_chat_msg(), "length", timings_info{});
    EXPECT_EQ(len["choices"][0]["finish_reason"], "length");
    EXPECT_TRUE(len["timings"].is_object());

    auto usage = chat_usage_chunk_json("c", "m", 5, {100, 20, 80}, timings_info{20, 80, 10.0, 20, 40.0});
    EXPECT_EQ(usage["object"], "chat.completion.chunk");
    EXPECT_TRUE(usage["choices"].is_array());
    EXPECT_TRUE(usage["choices"].empty());
    EXPECT_EQ(usage["usage"]["total_tokens"], 120);
    EXPECT_EQ(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 80);
    EXPECT_EQ(usage["timings"]["cache_n"], 80);
    EXPECT_EQ(usage["timings"]["predicted_n"], 20);
    for (const char* key : {"cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second",
                            "predicted_n", "predicted_ms", "predicted_per_token_ms", "predicted_per_second"}) {
        EXPECT_TRUE(usage["timings"].contains(key)) << key;
    }
}

TEST(OpenAiFormat, CompletionsAndModels) {
    auto j = completion_json("cmpl-1", "m", 9, "text", "length", {3, 2, 0});
    EXPECT_EQ(j["object"], "text_completion");
    EXPECT_EQ(j["choices"][0]["text"], "text");
    EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
    EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
    EXPECT_EQ(j["usage"]["total_tokens"], 5);

    auto c = completion_chunk_json("cmpl-1", "m", 9, "te");
    EXPECT_EQ(c["object"], "text_completion");
    EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null());
    EXPECT_EQ(completion_chunk_json("cmpl-1", "m", 9, "", "stop")["choices"][0]["finish_reason"], "stop");
    auto u = completion_usage_chunk_json("cmpl-1", "m", 9, {3, 2, 1});
    EXPECT_TRUE(u["choices"].empty());
    EXPECT_EQ(u["usage"]["prompt_tokens_details"]["cached_tokens"], 1);

    auto models = models_list_json("qwen", 77, "keepwarm", json{{"n_ctx", 4096}});
    EXPECT_EQ(models["object"], "list");
    EXPECT_EQ(models["data"][0]["id"], "qwen");
    EXPECT_EQ(models["data"][0]["object"], "model");
    EXPECT_EQ(models["data"][0]["created"], 77);
    EXPECT_EQ(models["data"][0]["owned_by"], "keepwarm");
    EXPECT_EQ(models["data"][0]["meta"]["n_ctx"], 4096);
    EXPECT_FALSE(models_list_json("qwen", 77, "keepwarm")["data"][0].contains("meta"));
    EXPECT_EQ(model_json("qwen", 77, "keepwarm", json{{"n_ctx", 4096}}), models["data"][0])
        << "GET /v1/models/{id} answers the object the list holds";
    // Issue 33: the context one request may hold, where clients read it.
    const json card = model_json("qwen", 77, "keepwarm", json{{"n_ctx", 65536}, {"n_ctx_slot", 32768}});
    EXPECT_EQ(card["context_length"], 32768);
    EXPECT_EQ(card["max_model_len"], 32768);
    EXPECT_FALSE(models["data"][0].contains("context_length"));
}

TEST(OpenAiFormat, Ids) {
    auto a = gen_chat_completion_id();
    EXPECT_EQ(a.rfind("chatcmpl-", 0), 0u);
    EXPECT_EQ(a.size(), 9u + 32u);
    EXPECT_NE(a, gen_chat_completion_id());
    EXPECT_EQ(gen_completion_id().rfind("cmpl-", 0), 0u);
    EXPECT_EQ(random_id("x-").size(), 34u);
    EXPECT_EQ(gen_tool_call_id().rfind("call_", 0), 0u);
}

TEST(OpenAiSampling, LogitBiasAndIgnoreEos) {
    json body = minimal_chat();
    body["logit_bias"] = {{"15", 2.5}, {"42", -100}};
    body["ignore_eos"] = true;
    const chat_request req = parse_chat_request(body);
    ASSERT_EQ(req.sampling.logit_bias.size(), 2u);
    const common_params_sampling p = to_sampling_params(req.sampling, common_params_sampling{});
    ASSERT_EQ(p.logit_bias.size(), 2u);
    EXPECT_EQ(p.logit_bias[0].token, 15);
    EXPECT_FLOAT_EQ(p.logit_bias[0].bias, 2.5f);
    EXPECT_EQ(p.logit_bias[1].token, 42);
    EXPECT_TRUE(std::isinf(p.logit_bias[1].bias) && p.logit_bias[1].bias < 0) << "-100 bans the token";
    EXPECT_TRUE(p.ignore_eos);

    for (const char* bad : {R"({"x": 1})", R"({"-3": 1})", R"({"7": 101})", R"({"7": "a"})", R"([1, 2])"}) {
        json b = minimal_chat();
        b["logit_bias"] = json::parse(bad);
        expect_chat_400(b, "logit_bias");
    }
    json b = minimal_chat();
    b["ignore_eos"] = "yes";
    expect_chat_400(b, "ignore_eos");
}

TEST(OpenAiParse, PromptCacheKeyMarksTheWholePrompt) {
    EXPECT_FALSE(parse_chat_request(minimal_chat()).hint.has_value());
    auto r = parse_chat_request(chat_with("prompt_cache_key", "conversation-7"));
    EXPECT_EQ(r.prompt_cache_key, "conversation-7");
    ASSERT_TRUE(r.hint.has_value());
    EXPECT_GE(r.hint->messages, r.messages.size());
    EXPECT_EQ(r.hint->ttl, std::chrono::seconds(600));
    json day = chat_with("prompt_cache_key", "k");
    day["prompt_cache_retention"] = "24h";
    EXPECT_EQ(parse_chat_request(day).hint->ttl, std::chrono::hours(24));
    // Retention without a key asks for nothing; an empty key is no key.
    EXPECT_FALSE(parse_chat_request(chat_with("prompt_cache_retention", "in_memory")).hint.has_value());
    EXPECT_FALSE(parse_chat_request(chat_with("prompt_cache_key", "")).hint.has_value());
    expect_chat_400(chat_with("prompt_cache_key", 7), "prompt_cache_key");
    expect_chat_400(chat_with("prompt_cache_key", std::string(1025, 'k')), "prompt_cache_key");
    expect_chat_400(chat_with("prompt_cache_retention", "forever"), "prompt_cache_retention");
}

// Issue 39 (F5): 5,000 tools were rendered for 144 s before the context check refused them. The count is checked
// before any tool is read: these tools would each be a 400 of their own (parameters not an object) if they were.
TEST(openai_api, tools_and_messages_are_counted_before_they_are_read) {
    json body = minimal_chat();
    body["tools"] = json::array();
    for (int i = 0; i < 5000; ++i) {
        body["tools"].push_back({{"type", "function"}, {"function", {{"name", std::to_string(i)}, {"parameters", 5}}}});
    }
    expect_chat_400(body, "'tools' holds 5000 tools; keepwarm's request limit max_tools is 1024");
    body = minimal_chat();
    for (size_t i = 0; i < default_request_limits.max_messages; ++i) body["messages"].push_back(7);
    expect_chat_400(body, "'messages' holds 10001 messages; keepwarm's request limit max_messages is 10000");
    body = minimal_chat();
    body["messages"][0]["content"] = json::array();
    for (size_t i = 0; i <= default_request_limits.max_content_parts; ++i) {
        body["messages"][0]["content"].push_back({{"type", "text"}, {"text", "x"}});
    }
    expect_chat_400(body, "the request holds 20001 content parts; keepwarm's request limit max_content_parts is 20000");
    // Tool calls count as parts: tiny calls by the hundred thousand fit in the bytes allowed.
    body = minimal_chat();
    json calls = json::array();
    for (size_t i = 0; i <= default_request_limits.max_content_parts; ++i) calls.push_back(i);
    body["messages"].push_back({{"role", "assistant"}, {"tool_calls", calls}});
    expect_chat_400(body, "the request holds 20001 content parts; keepwarm's request limit max_content_parts is 20000");
}

// Issue 36: llama-server's per-request speculative.n_max (flat key) reaches the request; 0 turns drafting off, and its
// companions n_min and p_min are checked. Chat Completions and Completions both read it.
TEST(OpenAiParse, SpeculativeNMax) {
    EXPECT_FALSE(parse_chat_request(minimal_chat()).draft_max.has_value()) << "absent: the server's --draft-max";
    EXPECT_EQ(parse_chat_request(chat_with("speculative.n_max", 0)).draft_max, 0);
    EXPECT_EQ(parse_chat_request(chat_with("speculative.n_max", 8)).draft_max, 8);
    EXPECT_EQ(parse_chat_request(chat_with("speculative.n_max", 1024)).draft_max, 1024);
    EXPECT_EQ(parse_chat_request(chat_with("speculative.n_max", 4.0)).draft_max, 4);
    EXPECT_FALSE(parse_chat_request(chat_with("speculative.n_max", nullptr)).draft_max.has_value()) << "null: absent";
    json both = chat_with("speculative.n_max", 6);
    both["speculative.n_min"] = 2;
    both["speculative.p_min"] = 0.75;
    EXPECT_EQ(parse_chat_request(both).draft_max, 6);
    EXPECT_FALSE(parse_chat_request(chat_with("speculative.n_min", 3)).draft_max.has_value());
    // A nested object is not llama-server's spelling: ignored like any unknown field.
    EXPECT_FALSE(parse_chat_request(chat_with("speculative", json{{"n_max", 0}})).draft_max.has_value());

    expect_chat_400(chat_with("speculative.n_max", -1), "'speculative.n_max' must be an integer between 0 and 1024");
    expect_chat_400(chat_with("speculative.n_max", 1025), "'speculative.n_max' must be an integer between 0 and 1024");
    expect_chat_400(chat_with("speculative.n_max", 1e30), "'speculative.n_max' must be an integer");
    expect_chat_400(chat_with("speculative.n_max", 2.5), "'speculative.n_max' must be an integer");
    expect_chat_400(chat_with("speculative.n_max", "8"), "'speculative.n_max' must be an integer");
    expect_chat_400(chat_with("speculative.n_max", json::array({8})), "'speculative.n_max' must be an integer");
    expect_chat_400(chat_with("speculative.n_min", -3), "'speculative.n_min' must be an integer between 0 and 1024");
    expect_chat_400(chat_with("speculative.n_min", true), "'speculative.n_min' must be an integer");
    expect_chat_400(chat_with("speculative.p_min", 1.5), "'speculative.p_min' must be a number between 0 and 1");
    expect_chat_400(chat_with("speculative.p_min", "0.5"), "'speculative.p_min' must be a number");

    const auto completion = [](const char* extra) {
        return parse_completion_request(json::parse(std::string(R"({"model":"m","prompt":"hi")") + extra + "}"));
    };
    EXPECT_EQ(completion(R"(,"speculative.n_max":0)").draft_max, 0);
    EXPECT_FALSE(completion("").draft_max.has_value());
    expect_400(parse_completion_request, json::parse(R"({"prompt":"hi","speculative.n_max":2000})"),
               "'speculative.n_max' must be an integer between 0 and 1024");
}

// llama-server shows draft_n and draft_n_accepted in timings only when the request verified drafts.
TEST(OpenAiFormat, TimingsShowDraftsOnlyWhenThereWere) {
    timings_info t;
    t.predicted_n = 50;
    const json without = timings_json(t);
    EXPECT_FALSE(without.contains("draft_n"));
    EXPECT_FALSE(without.contains("draft_n_accepted"));
    t.draft_n = 112;
    t.draft_n_accepted = 40;
    const json with_drafts = timings_json(t);
    EXPECT_EQ(with_drafts["draft_n"], 112);
    EXPECT_EQ(with_drafts["draft_n_accepted"], 40);
    EXPECT_EQ(with_drafts["predicted_n"], 50);
    t.draft_n_accepted = 0;
    EXPECT_EQ(timings_json(t)["draft_n_accepted"], 0) << "none accepted is still said when drafts were verified";
    // Every API that carries timings writes them with timings_json: the chat completion and its last chunk too.
    EXPECT_EQ(chat_completion_json("c", "m", 1, common_chat_msg{}, "stop", {}, t)["timings"]["draft_n"], 112);
    EXPECT_EQ(completion_json("c", "m", 1, "x", "stop", {}, t)["timings"]["draft_n"], 112);
}

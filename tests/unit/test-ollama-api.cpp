// Unit tests for Ollama request parsing/validation and response/stream-line JSON (src/api/ollama-api.*).
#include <gtest/gtest.h>

#include <chrono>

#include "api/ollama-api.h"
#include "api/request-limits.h"
#include "base/request-error.h"

using keepwarm::chat_request;
using namespace keepwarm;
using namespace keepwarm::api::ollama;
using keepwarm::request_error;
using json = keepwarm::api::ollama::json;

namespace {

json minimal_chat() {
    return json::parse(R"({"model":"llama3","messages":[{"role":"user","content":"hi"}]})");
}

json chat_with(const std::string& key, const json& value) {
    json b = minimal_chat();
    b[key] = value;
    return b;
}

json chat_with_options(const json& options) {
    return chat_with("options", options);
}

json minimal_generate() {
    return json::parse(R"({"model":"llama3","prompt":"why is the sky blue?"})");
}

json generate_with(const std::string& key, const json& value) {
    json b = minimal_generate();
    b[key] = value;
    return b;
}

// Runs `parse` and checks that it fails with a 400 whose message contains `needle`.
template <typename F>
void expect_400(F parse, const json& body, const std::string& needle) {
    try {
        parse(body);
        ADD_FAILURE() << "expected a 400 for " << body.dump();
    } catch (const request_error& e) {
        EXPECT_EQ(e.status, 400);
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
            << "message '" << e.what() << "' lacks '" << needle << "' for " << body.dump();
    } catch (const std::exception& e) {
        ADD_FAILURE() << "expected request_error, got " << e.what() << " for " << body.dump();
    }
}

void expect_chat_400(const json& body, const std::string& needle) {
    expect_400(parse_chat_request, body, needle);
}

void expect_generate_400(const json& body, const std::string& needle) {
    expect_400(parse_generate_request, body, needle);
}

metrics sample_metrics() {
    return {.total_ns = 5'000'000,
            .load_ns = 1'250'000,
            .prompt_eval_ns = 2'000'000,
            .eval_ns = 1'500'000,
            .prompt_tokens = 120,
            .cached_tokens = 100,
            .generated_tokens = 7,
            .cache = {.device = 60, .ram = 30, .disk = 10, .checkpoint_pos = -1}};
}

}  // namespace

TEST(OllamaParse, MinimalChatDefaults) {
    const chat_request r = parse_chat_request(minimal_chat());
    EXPECT_EQ(r.api, "ollama");
    EXPECT_EQ(r.model, "llama3");
    ASSERT_EQ(r.messages.size(), 1u);
    EXPECT_EQ(r.messages[0].role, "user");
    EXPECT_EQ(r.messages[0].content, "hi");
    EXPECT_TRUE(r.stream) << "Ollama streams unless told not to";
    EXPECT_FALSE(r.max_tokens.has_value());
    EXPECT_FALSE(r.requested_context.has_value());
    EXPECT_FALSE(r.enable_thinking.has_value());
    EXPECT_TRUE(r.json_schema.empty());
    EXPECT_TRUE(r.tools.empty());
    EXPECT_EQ(parse_chat_request(chat_with("stream", false)).stream, false);
}

TEST(OllamaParse, EmptyOrMissingMessagesAreALoadCall) {
    EXPECT_TRUE(parse_chat_request(chat_with("messages", json::array())).messages.empty());
    json b = minimal_chat();
    b.erase("messages");
    EXPECT_TRUE(parse_chat_request(b).messages.empty());
}

TEST(OllamaParse, ConversationWithToolCallsThinkingAndToolResults) {
    const json body = json::parse(R"({
        "model": "qwen3:8b",
        "messages": [
            {"role": "System", "content": "be brief"},
            {"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "content": "", "thinking": "need the tool",
             "tool_calls": [{"id": "call_1", "function": {"index": 0, "name": "get_weather",
                                                          "arguments": {"city": "Paris", "days": 2}}},
                            {"function": {"name": "get_time"}}]},
            {"role": "tool", "content": "18C", "tool_name": "get_weather", "tool_call_id": "call_1"}
        ]})");
    const chat_request r = parse_chat_request(body);
    ASSERT_EQ(r.messages.size(), 4u);
    EXPECT_EQ(r.messages[0].role, "system") << "roles are lowercased, as Ollama does";
    const common_chat_msg& assistant = r.messages[2];
    EXPECT_EQ(assistant.reasoning_content, "need the tool");
    ASSERT_EQ(assistant.tool_calls.size(), 2u);
    EXPECT_EQ(assistant.tool_calls[0].name, "get_weather");
    EXPECT_EQ(assistant.tool_calls[0].id, "call_1");
    EXPECT_EQ(json::parse(assistant.tool_calls[0].arguments), json::parse(R"({"city":"Paris","days":2})"));
    EXPECT_EQ(assistant.tool_calls[1].arguments, "{}") << "missing arguments are an empty object";
    EXPECT_EQ(r.messages[3].role, "tool");
    EXPECT_EQ(r.messages[3].tool_name, "get_weather");
    EXPECT_EQ(r.messages[3].tool_call_id, "call_1");
    EXPECT_EQ(r.messages[3].content, "18C");
}

TEST(OllamaParse, Tools) {
    const json tools = json::parse(R"([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather",
         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "ping"}}])");
    const chat_request r = parse_chat_request(chat_with("tools", tools));
    ASSERT_EQ(r.tools.size(), 2u);
    EXPECT_EQ(r.tools[0].name, "get_weather");
    EXPECT_EQ(r.tools[0].description, "Weather");
    EXPECT_EQ(json::parse(r.tools[0].parameters), tools[0]["function"]["parameters"]);
    EXPECT_EQ(json::parse(r.tools[1].parameters)["type"], "object");
    EXPECT_EQ(r.tool_choice, COMMON_CHAT_TOOL_CHOICE_AUTO) << "Ollama has no tool_choice";
}

TEST(OllamaParse, Format) {
    EXPECT_EQ(json::parse(parse_chat_request(chat_with("format", "json")).json_schema),
              json::parse(R"({"type":"object"})"));
    const json schema = json::parse(R"({"type":"object","properties":{"age":{"type":"integer"}},"required":["age"]})");
    EXPECT_EQ(json::parse(parse_chat_request(chat_with("format", schema)).json_schema), schema);
    EXPECT_TRUE(parse_chat_request(chat_with("format", "")).json_schema.empty());
}

TEST(OllamaParse, EveryOption) {
    const json options = json::parse(R"({
        "num_ctx": 32768, "num_predict": 64, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
        "seed": 42, "stop": ["\n\n", "", "END"], "repeat_penalty": 1.1, "repeat_last_n": 64,
        "presence_penalty": 0.25, "frequency_penalty": -0.5,
        "mirostat": 2, "num_gpu": 99, "typical_p": 0.7, "no_such_option": "ignored"})");
    const chat_request r = parse_chat_request(chat_with_options(options));
    EXPECT_EQ(r.requested_context, 32768) << "num_ctx is recorded, never applied";
    EXPECT_EQ(r.max_tokens, 64);
    EXPECT_FLOAT_EQ(*r.sampling.temperature, 0.5f);
    EXPECT_FLOAT_EQ(*r.sampling.top_p, 0.9f);
    EXPECT_EQ(r.sampling.top_k, 40);
    EXPECT_FLOAT_EQ(*r.sampling.min_p, 0.05f);
    EXPECT_EQ(r.sampling.seed, 42u);
    EXPECT_EQ(r.stop, (std::vector<std::string>{"\n\n", "END"}));
    EXPECT_FLOAT_EQ(*r.sampling.repeat_penalty, 1.1f);
    EXPECT_EQ(r.sampling.repeat_last_n, 64);
    EXPECT_FLOAT_EQ(*r.sampling.presence_penalty, 0.25f);
    EXPECT_FLOAT_EQ(*r.sampling.frequency_penalty, -0.5f);
}

TEST(OllamaParse, OptionSpecialValues) {
    EXPECT_FALSE(parse_chat_request(chat_with_options({{"num_predict", -1}})).max_tokens.has_value());
    EXPECT_FALSE(parse_chat_request(chat_with_options({{"num_predict", -2}})).max_tokens.has_value());
    EXPECT_EQ(parse_chat_request(chat_with_options({{"seed", -1}})).sampling.seed, LLAMA_DEFAULT_SEED);
    EXPECT_EQ(parse_chat_request(chat_with_options({{"num_ctx", 4096.0}})).requested_context, 4096)
        << "integral floats are integers (Go clients send float64)";
    EXPECT_EQ(parse_chat_request(chat_with_options({{"stop", "###"}})).stop, (std::vector<std::string>{"###"}));
    EXPECT_FALSE(parse_chat_request(chat_with("options", nullptr)).requested_context.has_value());
}

TEST(OllamaParse, ThinkForms) {
    EXPECT_EQ(parse_chat_request(chat_with("think", true)).enable_thinking, true);
    EXPECT_EQ(parse_chat_request(chat_with("think", false)).enable_thinking, false);
    for (const char* level : {"low", "medium", "high"}) {
        const chat_request r = parse_chat_request(chat_with("think", level));
        EXPECT_EQ(r.enable_thinking, true) << level;
        EXPECT_EQ(r.chat_template_kwargs.at("reasoning_effort"), json(level).dump()) << level;
    }
}

TEST(OllamaParse, KeepAliveIsAcceptedAndIgnored) {
    for (const json& v : {json("5m"), json(0), json(-1), json("24h")}) {
        EXPECT_NO_THROW(parse_chat_request(chat_with("keep_alive", v))) << v.dump();
    }
}

TEST(OllamaParse, BadChatInputNamesTheField) {
    json no_model = minimal_chat();
    no_model.erase("model");
    expect_chat_400(no_model, "'model' is required");
    expect_chat_400(chat_with("model", ""), "'model' is required");
    expect_chat_400(chat_with("model", 3), "'model' must be a string");
    expect_400(parse_chat_request, json::array(), "JSON object");
    expect_chat_400(chat_with("messages", "hi"), "'messages' must be an array");
    expect_chat_400(chat_with("messages", json::array({"hi"})), "'messages[0]' must be an object");
    expect_chat_400(chat_with("messages", json::parse(R"([{"role":"robot","content":"x"}])")), "'messages[0].role'");
    expect_chat_400(chat_with("messages", json::parse(R"([{"content":"x"}])")), "'messages[0].role'");
    expect_chat_400(chat_with("messages", json::parse(R"([{"role":"user","content":["x"]}])")),
                    "'messages[0].content' must be a string");
    expect_chat_400(chat_with("messages", json::parse(R"([{"role":"user","content":"x","images":["aGk="]}])")),
                    "'messages[0].images': images are not supported");
    expect_chat_400(chat_with("messages", json::parse(R"([{"role":"user","content":"x",
                                                           "tool_calls":[{"function":{"name":"f"}}]}])")),
                    "'messages[0].tool_calls' is only allowed on assistant messages");
    expect_chat_400(chat_with("messages", json::parse(R"([{"role":"assistant","tool_calls":{"function":{}}}])")),
                    "'messages[0].tool_calls' must be an array");
    expect_chat_400(chat_with("messages", json::parse(R"([{"role":"assistant","tool_calls":[{"name":"f"}]}])")),
                    "'messages[0].tool_calls[0].function' must be an object");
    expect_chat_400(chat_with("messages", json::parse(R"([{"role":"assistant","tool_calls":[{"function":{}}]}])")),
                    "'messages[0].tool_calls[0].function.name'");
    expect_chat_400(chat_with("messages", json::parse(R"([{"role":"assistant",
                        "tool_calls":[{"function":{"name":"f","arguments":"{\"a\":1}"}}]}])")),
                    "'messages[0].tool_calls[0].function.arguments' must be an object");
    expect_chat_400(chat_with("messages", json::parse(R"([{"role":"assistant","content":"x","thinking":1}])")),
                    "'messages[0].thinking' must be a string");
    expect_chat_400(chat_with("tools", json::object()), "'tools' must be an array");
    expect_chat_400(chat_with("tools", json::parse(R"([{"type":"retrieval","function":{"name":"f"}}])")),
                    "'tools[0].type'");
    expect_chat_400(chat_with("tools", json::parse(R"([{"type":"function"}])")), "'tools[0].function'");
    expect_chat_400(chat_with("tools", json::parse(R"([{"function":{"name":"f","parameters":"x"}}])")),
                    "'tools[0].function.parameters'");
    expect_chat_400(chat_with("tools", json::parse(R"([{"function":{"name":"f"}},{"function":{"name":"f"}}])")),
                    "duplicate tool name");
    expect_chat_400(chat_with("format", "xml"), "'format'");
    expect_chat_400(chat_with("format", 1), "'format'");
    expect_chat_400(chat_with("think", "extreme"), "'think'");
    expect_chat_400(chat_with("think", 1), "'think'");
    expect_chat_400(chat_with("stream", "yes"), "'stream' must be a boolean");
    expect_chat_400(chat_with("logprobs", true), "'logprobs' is not supported");
}

TEST(OllamaParse, BadOptionsNameTheOption) {
    expect_chat_400(chat_with("options", "fast"), "'options' must be an object");
    expect_chat_400(chat_with_options({{"num_ctx", 0}}), "'options.num_ctx'");
    expect_chat_400(chat_with_options({{"num_ctx", "big"}}), "'options.num_ctx' must be an integer");
    expect_chat_400(chat_with_options({{"num_predict", 1.5}}), "'options.num_predict' must be an integer");
    expect_chat_400(chat_with_options({{"num_predict", -3}}), "'options.num_predict'");
    expect_chat_400(chat_with_options({{"temperature", "hot"}}), "'options.temperature' must be a number");
    expect_chat_400(chat_with_options({{"temperature", 5}}), "'options.temperature' must be a number between 0 and 2");
    expect_chat_400(chat_with_options({{"top_p", 1.5}}), "'options.top_p'");
    expect_chat_400(chat_with_options({{"min_p", -0.1}}), "'options.min_p'");
    expect_chat_400(chat_with_options({{"top_k", -1}}), "'options.top_k'");
    expect_chat_400(chat_with_options({{"repeat_penalty", 0}}), "'options.repeat_penalty'");
    expect_chat_400(chat_with_options({{"repeat_last_n", -2}}), "'options.repeat_last_n'");
    expect_chat_400(chat_with_options({{"presence_penalty", 3}}), "'options.presence_penalty'");
    expect_chat_400(chat_with_options({{"frequency_penalty", -3}}), "'options.frequency_penalty'");
    expect_chat_400(chat_with_options({{"seed", 1e12}}), "'options.seed'");
    expect_chat_400(chat_with_options({{"seed", "x"}}), "'options.seed' must be an integer");
    expect_chat_400(chat_with_options({{"stop", 1}}), "'options.stop' must be an array of strings");
    expect_chat_400(chat_with_options({{"stop", json::array({"a", 2})}}), "'options.stop[1]' must be a string");
    json many = json::array();
    for (int i = 0; i < 17; i++) many.push_back(std::to_string(i));
    expect_chat_400(chat_with_options({{"stop", many}}), "at most 16");
}

TEST(OllamaParse, TemplatedGenerateIsAChat) {
    const generate_request g = parse_generate_request(generate_with("system", "be terse"));
    EXPECT_FALSE(g.raw);
    EXPECT_EQ(g.prompt, "why is the sky blue?");
    EXPECT_EQ(g.chat.api, "ollama");
    EXPECT_TRUE(g.chat.stream);
    ASSERT_EQ(g.chat.messages.size(), 2u);
    EXPECT_EQ(g.chat.messages[0].role, "system");
    EXPECT_EQ(g.chat.messages[0].content, "be terse");
    EXPECT_EQ(g.chat.messages[1].role, "user");
    EXPECT_EQ(g.chat.messages[1].content, "why is the sky blue?");
    EXPECT_EQ(parse_generate_request(minimal_generate()).chat.messages.size(), 1u);
}

TEST(OllamaParse, RawGenerateKeepsThePromptAsIs) {
    json b = generate_with("raw", true);
    b["options"] = {{"num_predict", 8}, {"num_ctx", 2048}};
    b["format"] = "json";
    b["stream"] = false;
    const generate_request g = parse_generate_request(b);
    EXPECT_TRUE(g.raw);
    EXPECT_EQ(g.prompt, "why is the sky blue?");
    EXPECT_TRUE(g.chat.messages.empty());
    EXPECT_EQ(g.chat.max_tokens, 8);
    EXPECT_EQ(g.chat.requested_context, 2048);
    EXPECT_FALSE(g.chat.json_schema.empty());
    EXPECT_FALSE(g.chat.stream);
}

TEST(OllamaParse, EmptyPromptIsALoadCall) {
    const generate_request g = parse_generate_request(json::parse(R"({"model":"llama3"})"));
    EXPECT_TRUE(g.prompt.empty());
    EXPECT_TRUE(g.chat.messages.empty());
    EXPECT_TRUE(parse_generate_request(generate_with("context", json::array())).chat.messages.size() == 1)
        << "an empty context is no context";
}

TEST(OllamaParse, BadGenerateInputNamesTheField) {
    expect_generate_400(generate_with("prompt", 1), "'prompt' must be a string");
    expect_generate_400(generate_with("suffix", "return x"), "'suffix' is not supported");
    expect_generate_400(generate_with("template", "{{ .Prompt }}"), "'template' is not supported");
    expect_generate_400(generate_with("context", json::array({1, 2, 3})), "'context' is not supported");
    expect_generate_400(generate_with("context", "abc"), "'context' must be an array");
    expect_generate_400(generate_with("images", json::array({"aGk="})), "'images': images are not supported");
    json raw_system = generate_with("raw", true);
    raw_system["system"] = "x";
    expect_generate_400(raw_system, "'system' cannot be used with raw");
    expect_generate_400(generate_with("raw", "yes"), "'raw' must be a boolean");
    expect_generate_400(generate_with("options", json{{"temperature", -1}}), "'options.temperature'");
    expect_generate_400(generate_with("think", "max"), "'think'");
}

TEST(OllamaParse, ShowNamesAModel) {
    EXPECT_EQ(parse_show_request(json{{"model", "qwen3:8b"}}), "qwen3:8b");
    EXPECT_EQ(parse_show_request(json{{"name", "qwen3"}}), "qwen3") << "the deprecated field";
    expect_400(parse_show_request, json::object(), "'model' is required");
    expect_400(parse_show_request, json{{"model", 1}}, "'model' must be a string");
}

TEST(OllamaFormat, CreatedAtIsRfc3339WithNanoseconds) {
    using namespace std::chrono;
    const sys_seconds second = sys_days{2024y / 5 / 1} + 12h + 34min + 56s;
    EXPECT_EQ(rfc3339(second + nanoseconds(123456789)), "2024-05-01T12:34:56.123456789Z");
    EXPECT_EQ(rfc3339(second + nanoseconds(120000000)), "2024-05-01T12:34:56.12Z") << "trailing zeros dropped, as Go";
    EXPECT_EQ(rfc3339(second + nanoseconds(1)), "2024-05-01T12:34:56.000000001Z");
    EXPECT_EQ(rfc3339(second), "2024-05-01T12:34:56Z");
}

TEST(OllamaFormat, DoneReason) {
    EXPECT_EQ(done_reason(false), "stop");
    EXPECT_EQ(done_reason(true), "length");
}

TEST(OllamaFormat, ToolCallsCarryObjectArguments) {
    const std::vector<common_chat_tool_call> calls = {{"get_weather", R"({"city":"Paris"})", "call_a"},
                                                      {"get_time", "{}", ""}};
    const json out = tool_calls_json(calls, 2);
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(out[0]["id"], "call_a");
    EXPECT_EQ(out[0]["function"]["index"], 2);
    EXPECT_EQ(out[0]["function"]["name"], "get_weather");
    EXPECT_TRUE(out[0]["function"]["arguments"].is_object());
    EXPECT_EQ(out[0]["function"]["arguments"]["city"], "Paris");
    EXPECT_FALSE(out[1].contains("id"));
    EXPECT_EQ(out[1]["function"]["index"], 3);
}

TEST(OllamaFormat, ChatResponseWithMetricsInNanoseconds) {
    common_chat_msg msg;
    msg.role = "assistant";
    msg.content = "Blue.";
    msg.reasoning_content = "Rayleigh";
    msg.tool_calls = {{"lookup", R"({"q":"sky"})", "call_1"}};
    const json r = chat_response_json("llama3", "2024-05-01T12:00:00Z", msg, "stop", sample_metrics());
    EXPECT_EQ(r["model"], "llama3");
    EXPECT_EQ(r["created_at"], "2024-05-01T12:00:00Z");
    EXPECT_EQ(r["message"]["role"], "assistant");
    EXPECT_EQ(r["message"]["content"], "Blue.");
    EXPECT_EQ(r["message"]["thinking"], "Rayleigh");
    EXPECT_EQ(r["message"]["tool_calls"][0]["function"]["arguments"]["q"], "sky");
    EXPECT_EQ(r["done"], true);
    EXPECT_EQ(r["done_reason"], "stop");
    EXPECT_EQ(r["total_duration"], 5'000'000);
    EXPECT_EQ(r["load_duration"], 1'250'000);
    EXPECT_EQ(r["prompt_eval_count"], 120) << "every prompt token, reused ones included";
    EXPECT_EQ(r["prompt_eval_cached_count"], 100);
    EXPECT_EQ(r["prompt_eval_duration"], 2'000'000);
    EXPECT_EQ(r["eval_count"], 7);
    EXPECT_EQ(r["eval_duration"], 1'500'000);
    EXPECT_EQ(r["prompt_eval_computed_count"], 20);
    EXPECT_EQ(r["prompt_eval_cached_device_count"], 60);
    EXPECT_EQ(r["prompt_eval_cached_ram_count"], 30);
    EXPECT_EQ(r["prompt_eval_cached_disk_count"], 10);
    EXPECT_EQ(r["prompt_eval_checkpoint_pos"], -1);

    common_chat_msg plain;
    plain.content = "Hi";
    const json p = chat_response_json("m", "t", plain, "length", sample_metrics());
    EXPECT_FALSE(p["message"].contains("thinking"));
    EXPECT_FALSE(p["message"].contains("tool_calls"));
    EXPECT_EQ(p["done_reason"], "length");
}

TEST(OllamaFormat, StreamLines) {
    const json text = chat_chunk_json("m", "t", "Hel", "");
    EXPECT_EQ(text["message"], json::parse(R"({"role":"assistant","content":"Hel"})"));
    EXPECT_EQ(text["done"], false);
    EXPECT_FALSE(text.contains("done_reason"));
    EXPECT_FALSE(text.contains("eval_count"));

    const std::vector<common_chat_tool_call> calls = {{"f", R"({"x":1})", "call_9"}};
    const json call = chat_chunk_json("m", "t", "", "hmm", calls, 1);
    EXPECT_EQ(call["message"]["thinking"], "hmm");
    EXPECT_EQ(call["message"]["content"], "");
    EXPECT_EQ(call["message"]["tool_calls"][0]["function"]["index"], 1);
    EXPECT_EQ(call["message"]["tool_calls"][0]["function"]["arguments"]["x"], 1);

    const json last = chat_final_chunk_json("m", "t", "stop", sample_metrics());
    EXPECT_EQ(last["message"], json::parse(R"({"role":"assistant","content":""})"));
    EXPECT_EQ(last["done"], true);
    EXPECT_EQ(last["done_reason"], "stop");
    EXPECT_EQ(last["eval_count"], 7);
    EXPECT_EQ(last["prompt_eval_cached_count"], 100);

    const std::string line = ndjson_line(json{{"message", {{"content", "two\nlines"}}}});
    EXPECT_EQ(line.back(), '\n');
    EXPECT_EQ(line.find('\n'), line.size() - 1) << "one object per line: newlines in text are escaped";
    EXPECT_EQ(json::parse(line)["message"]["content"], "two\nlines");
}

TEST(OllamaFormat, GenerateResponses) {
    const json whole = generate_response_json("m", "t", "Blue.", "", "stop", sample_metrics());
    EXPECT_EQ(whole["response"], "Blue.");
    EXPECT_FALSE(whole.contains("thinking"));
    EXPECT_FALSE(whole.contains("context")) << "keepwarm never hands out the deprecated context";
    EXPECT_EQ(whole["done"], true);
    EXPECT_EQ(whole["prompt_eval_count"], 120);
    const json chunk = generate_chunk_json("m", "t", "", "why");
    EXPECT_EQ(chunk["response"], "");
    EXPECT_EQ(chunk["thinking"], "why");
    EXPECT_EQ(chunk["done"], false);
    const json last = generate_final_chunk_json("m", "t", "length", sample_metrics());
    EXPECT_EQ(last["response"], "");
    EXPECT_EQ(last["done_reason"], "length");
    EXPECT_EQ(last["eval_duration"], 1'500'000);
}

TEST(OllamaFormat, MetricsFromTheNeutralNumbers) {
    const usage_info usage{.prompt_tokens = 120,
                           .completion_tokens = 7,
                           .cached_tokens = 100,
                           .cache = {.device = 60, .ram = 30, .disk = 10, .checkpoint_pos = 96}};
    const timings_info timings{.prompt_n = 20,
                               .cache_n = 100,
                               .prompt_ms = 2.0,
                               .predicted_n = 7,
                               .predicted_ms = 1.5,
                               .setup_ms = 1.2500004,
                               .queued_ms = 0.5,
                               .prepare_ms = 0.25};
    const metrics m = metrics_of(usage, timings, std::chrono::nanoseconds(5'000'001));
    EXPECT_EQ(m.total_ns, 5'000'001);
    EXPECT_EQ(m.load_ns, 1'250'000) << "setup time, rounded to the nanosecond";
    EXPECT_EQ(m.prompt_eval_ns, 2'000'000);
    EXPECT_EQ(m.eval_ns, 1'500'000);
    EXPECT_EQ(m.prompt_tokens, 120);
    EXPECT_EQ(m.cached_tokens, 100);
    EXPECT_EQ(m.generated_tokens, 7);
    EXPECT_EQ(m.cache.device, 60);
    EXPECT_EQ(m.cache.ram, 30);
    EXPECT_EQ(m.cache.disk, 10);
    EXPECT_EQ(m.cache.checkpoint_pos, 96);

    const json last = chat_final_chunk_json("m", "t", "stop", m);
    EXPECT_EQ(last["load_duration"], 1'250'000);
    EXPECT_EQ(last["prompt_eval_computed_count"], 20);
}

TEST(OllamaFormat, LoadAnswers) {
    const json chat = chat_load_json("llama3", "t");
    EXPECT_EQ(chat["done"], true);
    EXPECT_EQ(chat["done_reason"], "load");
    EXPECT_EQ(chat["message"]["role"], "assistant");
    EXPECT_FALSE(chat.contains("eval_count"));
    const json gen = generate_load_json("llama3", "t");
    EXPECT_EQ(gen["response"], "");
    EXPECT_EQ(gen["done_reason"], "load");
}

TEST(OllamaFormat, ErrorBody) {
    EXPECT_EQ(json::parse(error_body(400, "invalid_request_error", "'model' is required")),
              json::parse(R"({"error":"'model' is required"})"));
}

TEST(OllamaFormat, ModelNames) {
    EXPECT_EQ(tagged_name("tiny"), "tiny:latest");
    EXPECT_EQ(tagged_name("qwen3:8b"), "qwen3:8b");
    EXPECT_EQ(parameter_size(494'032'768), "494.03M");
    EXPECT_EQ(parameter_size(8'030'261'248), "8.0B");
    EXPECT_EQ(parameter_size(7'000'000'000), "7B");
    EXPECT_EQ(parameter_size(137'000), "137K");
    EXPECT_EQ(parameter_size(999), "999");
    EXPECT_EQ(quantization_level(LLAMA_FTYPE_MOSTLY_Q4_K_M), "Q4_K_M");
    EXPECT_EQ(quantization_level(LLAMA_FTYPE_MOSTLY_Q8_0), "Q8_0");
    EXPECT_EQ(quantization_level(LLAMA_FTYPE_MOSTLY_F16), "F16");
    EXPECT_EQ(quantization_level(LLAMA_FTYPE_ALL_F32), "F32");
    EXPECT_EQ(quantization_level(LLAMA_FTYPE_MOSTLY_Q2_K), "Q2_K");
    EXPECT_EQ(quantization_level(LLAMA_FTYPE_MOSTLY_Q6_K), "Q6_K");
    EXPECT_EQ(quantization_level(LLAMA_FTYPE_MOSTLY_IQ2_XXS), "IQ2_XXS");
    EXPECT_EQ(quantization_level(static_cast<llama_ftype>(LLAMA_FTYPE_MOSTLY_Q8_0 | LLAMA_FTYPE_GUESSED)), "Q8_0");
}

TEST(OllamaFormat, ModelListShowAndPs) {
    model_card card;
    card.name = "tiny:latest";
    card.architecture = "qwen3";
    card.parameter_size = "90.12M";
    card.quantization_level = "Q8_0";
    card.file_bytes = 170'000'000;
    card.digest = "0123abcd";
    card.modified_at = std::chrono::sys_days{std::chrono::year{2025} / 1 / 2};
    card.path = "/models/tiny.gguf";
    card.chat_template = "{{ messages }}";
    card.model_info = {{"general.architecture", "qwen3"}, {"qwen3.context_length", 40960}};
    card.capabilities = {"completion", "tools", "thinking"};
    card.context_length = 2048;
    card.memory_bytes = 200'000'000;
    card.vram_bytes = 0;

    const json tags = tags_json(card);
    ASSERT_EQ(tags["models"].size(), 1u);
    const json& listed = tags["models"][0];
    EXPECT_EQ(listed["name"], "tiny:latest");
    EXPECT_EQ(listed["model"], "tiny:latest");
    EXPECT_EQ(listed["modified_at"], "2025-01-02T00:00:00Z");
    EXPECT_EQ(listed["size"], 170'000'000);
    EXPECT_EQ(listed["digest"], "0123abcd");
    EXPECT_EQ(listed["details"], json::parse(R"({"parent_model":"","format":"gguf","family":"qwen3",
        "families":["qwen3"],"parameter_size":"90.12M","quantization_level":"Q8_0"})"));

    const json show = show_json(card);
    EXPECT_EQ(show["template"], "{{ messages }}");
    EXPECT_EQ(show["model_info"]["qwen3.context_length"], 40960);
    EXPECT_EQ(show["capabilities"], json::parse(R"(["completion","tools","thinking"])"));
    EXPECT_EQ(show["details"]["family"], "qwen3");
    EXPECT_NE(show["modelfile"].get<std::string>().find("FROM /models/tiny.gguf"), std::string::npos);
    EXPECT_EQ(show["parameters"], "num_ctx 2048");

    const json ps = ps_json(card, "9999-12-31T23:59:59Z");
    const json& loaded = ps["models"][0];
    EXPECT_EQ(loaded["name"], "tiny:latest");
    EXPECT_EQ(loaded["size"], 200'000'000);
    EXPECT_EQ(loaded["size_vram"], 0);
    EXPECT_EQ(loaded["context_length"], 2048);
    EXPECT_EQ(loaded["expires_at"], "9999-12-31T23:59:59Z");

    const json version = version_json("1.2.3");
    EXPECT_EQ(version["version"], compatible_version);
    EXPECT_EQ(version["keepwarm_version"], "1.2.3");
}

// Issue 39 (F5): /api/chat and /api/generate are bounded like the other APIs, before the body is converted.
TEST(ollama_api, chat_and_generate_are_bounded_before_conversion) {
    json body = minimal_chat();
    body["tools"] = json::array();
    for (int i = 0; i < 5000; ++i) body["tools"].push_back("not a tool");
    expect_400(parse_chat_request, body, "'tools' holds 5000 tools; keepwarm's request limit max_tools is 1024");
    body = minimal_chat();
    for (size_t i = 0; i < api::default_request_limits.max_messages; ++i) body["messages"].push_back(0);
    expect_400(parse_chat_request, body, "'messages' holds 10001 messages; keepwarm's request limit max_messages is");
    const json long_prompt = generate_with("prompt", std::string(api::default_request_limits.max_text_bytes + 1, 'p'));
    expect_400(parse_generate_request, long_prompt, "keepwarm's request limit max_text_bytes is 16777216");
}

// Issue 36: llama-server's speculative.n_max as one of Ollama's options, for chat and generate (raw too).
TEST(OllamaParse, SpeculativeNMaxOption) {
    EXPECT_FALSE(parse_chat_request(minimal_chat()).draft_max.has_value());
    EXPECT_EQ(parse_chat_request(chat_with_options({{"speculative.n_max", 0}})).draft_max, 0);
    EXPECT_EQ(parse_chat_request(chat_with_options({{"speculative.n_max", 7}, {"temperature", 0}})).draft_max, 7);
    json raw = generate_with("raw", true);
    raw["options"] = {{"speculative.n_max", 3}};
    EXPECT_EQ(parse_generate_request(raw).chat.draft_max, 3);
    EXPECT_FALSE(parse_chat_request(chat_with("speculative.n_max", 0)).draft_max.has_value())
        << "Ollama's options live under options; a top-level one is an unknown field, ignored as Ollama does";
    expect_chat_400(chat_with_options({{"speculative.n_max", -1}}),
                    "'options.speculative.n_max' must be an integer between 0 and 1024");
    expect_chat_400(chat_with_options({{"speculative.n_max", "4"}}), "'options.speculative.n_max' must be an integer");
    expect_chat_400(chat_with_options({{"speculative.p_min", 3}}),
                    "'options.speculative.p_min' must be a number between 0 and 1");
}

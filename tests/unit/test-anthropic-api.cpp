// Unit tests for the Anthropic Messages API edge (src/api/anthropic-api.*): request parsing into chat_request, bad
// input (each a 400 naming the field), and the message, usage, error and stream-event JSON.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "api/anthropic-api.h"
#include "api/request-limits.h"
#include "http/http-server.h"

using namespace keepwarm;
using namespace keepwarm::api;
using namespace keepwarm::api::anthropic;
using keepwarm::request_error;

namespace {

json minimal() {
    return json::parse(R"({"model":"claude-x","max_tokens":64,"messages":[{"role":"user","content":"hi"}]})");
}

json with(const std::string& key, const json& value) {
    json b = minimal();
    b[key] = value;
    return b;
}

json with_messages(const char* messages) {
    return with("messages", json::parse(messages));
}

void expect_400(const json& body, const std::string& needle, endpoint kind = endpoint::messages) {
    try {
        parse_messages_request(body, kind);
        ADD_FAILURE() << "expected a 400 for " << body.dump();
    } catch (const request_error& e) {
        EXPECT_EQ(e.status, 400);
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
            << "message '" << e.what() << "' lacks '" << needle << "' for " << body.dump();
    } catch (const std::exception& e) {
        ADD_FAILURE() << "expected request_error, got " << e.what() << " for " << body.dump();
    }
}

std::vector<std::string> names(const std::vector<stream_event>& events) {
    std::vector<std::string> out;
    for (const auto& e : events) out.push_back(e.name);
    return out;
}

common_chat_msg_diff content_diff(const std::string& text) {
    common_chat_msg_diff d;
    d.content_delta = text;
    return d;
}

common_chat_msg_diff reasoning_diff(const std::string& text) {
    common_chat_msg_diff d;
    d.reasoning_content_delta = text;
    return d;
}

common_chat_msg_diff tool_diff(size_t index, const std::string& id, const std::string& name, const std::string& args) {
    common_chat_msg_diff d;
    d.tool_call_index = index;
    d.tool_call_delta.id = id;
    d.tool_call_delta.name = name;
    d.tool_call_delta.arguments = args;
    return d;
}

// A request Claude Code 2.1.197 sent, as captured in tests/fixtures/claude-code/.
json claude_code_request(const std::string& name) {
    const auto file = std::filesystem::path(__FILE__).parent_path() / "../fixtures/claude-code" / (name + ".json");
    std::ifstream in(file);
    EXPECT_TRUE(in) << file;
    return json::parse(in)["body"];
}

}  // namespace

TEST(AnthropicParse, MinimalRequest) {
    chat_request r = parse_messages_request(minimal());
    EXPECT_EQ(r.api, "anthropic");
    EXPECT_EQ(r.model, "claude-x");
    EXPECT_EQ(r.max_tokens, 64);
    ASSERT_EQ(r.messages.size(), 1u);
    EXPECT_EQ(r.messages[0].role, "user");
    EXPECT_EQ(r.messages[0].content, "hi");
    EXPECT_FALSE(r.stream);
    EXPECT_TRUE(r.tools.empty());
    EXPECT_EQ(r.tool_choice, COMMON_CHAT_TOOL_CHOICE_AUTO);
    EXPECT_FALSE(r.parallel_tool_calls.has_value());
    EXPECT_EQ(r.enable_thinking, false);  // Anthropic thinks only when asked
    EXPECT_TRUE(r.json_schema.empty());
    EXPECT_TRUE(r.stop.empty());
}

TEST(AnthropicParse, SystemAsStringOrTextBlocks) {
    chat_request r = parse_messages_request(with("system", "be brief"));
    ASSERT_EQ(r.messages.size(), 2u);
    EXPECT_EQ(r.messages[0].role, "system");
    EXPECT_EQ(r.messages[0].content, "be brief");

    r = parse_messages_request(with("system", json::parse(R"([
        {"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.197.1c0;"},
        {"type":"text","text":"You are Claude Code.","cache_control":{"type":"ephemeral"}}])")));
    ASSERT_EQ(r.messages.size(), 2u);
    EXPECT_EQ(r.messages[0].role, "system");
    ASSERT_EQ(r.messages[0].content_parts.size(), 2u);
    EXPECT_EQ(r.messages[0].content_parts[1].text, "You are Claude Code.");

    // One block is plain content; an empty system adds no message.
    r = parse_messages_request(with("system", json::parse(R"([{"type":"text","text":"only"}])")));
    EXPECT_EQ(r.messages[0].content, "only");
    EXPECT_EQ(parse_messages_request(with("system", "")).messages.size(), 1u);
    EXPECT_EQ(parse_messages_request(with("system", json::array())).messages.size(), 1u);
}

TEST(AnthropicParse, SystemMessagesInsideTheConversation) {
    json body = with_messages(R"([
        {"role":"system","content":"first rules"},
        {"role":"user","content":"hi"},
        {"role":"system","content":[{"type":"text","text":"Available agent types: ..."}]}])");
    body["system"] = "top";
    chat_request r = parse_messages_request(body);
    ASSERT_EQ(r.messages.size(), 3u);
    EXPECT_EQ(r.messages[0].role, "system");
    ASSERT_EQ(r.messages[0].content_parts.size(), 2u);  // "top" then the leading system message
    EXPECT_EQ(r.messages[0].content_parts[0].text, "top");
    EXPECT_EQ(r.messages[0].content_parts[1].text, "first rules");
    EXPECT_EQ(r.messages[1].role, "user");
    // A later one becomes a user turn: most templates reject a system message after the first.
    EXPECT_EQ(r.messages[2].role, "user");
    EXPECT_EQ(r.messages[2].content, "Available agent types: ...");
}

TEST(AnthropicParse, UserBlocksSplitIntoUserAndToolMessages) {
    chat_request r = parse_messages_request(with_messages(R"([
        {"role":"user","content":"weather?"},
        {"role":"assistant","content":[
            {"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris","days":2}},
            {"type":"tool_use","id":"toolu_2","name":"get_time","input":{}}]},
        {"role":"user","content":[
            {"type":"tool_result","tool_use_id":"toolu_1","content":"sunny","cache_control":{"type":"ephemeral"}},
            {"type":"tool_result","tool_use_id":"toolu_2","is_error":true,
             "content":[{"type":"text","text":"clock"},{"type":"text","text":"broken"}]},
            {"type":"text","text":"<system-reminder>x</system-reminder>"},
            {"type":"text","text":"and tomorrow?"}]}])"));
    ASSERT_EQ(r.messages.size(), 5u);
    EXPECT_EQ(r.messages[0].role, "user");
    const common_chat_msg& assistant = r.messages[1];
    EXPECT_EQ(assistant.role, "assistant");
    ASSERT_EQ(assistant.tool_calls.size(), 2u);
    EXPECT_EQ(assistant.tool_calls[0].id, "toolu_1");
    EXPECT_EQ(assistant.tool_calls[0].name, "get_weather");
    EXPECT_EQ(json::parse(assistant.tool_calls[0].arguments), json::parse(R"({"city":"Paris","days":2})"));
    EXPECT_EQ(assistant.tool_calls[1].arguments, "{}");

    EXPECT_EQ(r.messages[2].role, "tool");
    EXPECT_EQ(r.messages[2].tool_call_id, "toolu_1");
    EXPECT_EQ(r.messages[2].tool_name, "get_weather");
    EXPECT_EQ(r.messages[2].content, "sunny");
    EXPECT_EQ(r.messages[3].role, "tool");
    EXPECT_EQ(r.messages[3].tool_name, "get_time");
    EXPECT_EQ(r.messages[3].content, "Error: clock\nbroken");
    EXPECT_EQ(r.messages[4].role, "user");
    ASSERT_EQ(r.messages[4].content_parts.size(), 2u);
    EXPECT_EQ(r.messages[4].content_parts[1].text, "and tomorrow?");
}

TEST(AnthropicParse, AssistantThinkingTextAndPrefill) {
    chat_request r = parse_messages_request(with_messages(R"([
        {"role":"user","content":"q"},
        {"role":"assistant","content":[
            {"type":"thinking","thinking":"let me see","signature":"sig"},
            {"type":"redacted_thinking","data":"EncryptedBlob=="},
            {"type":"text","text":"answer"}]},
        {"role":"user","content":"more"},
        {"role":"assistant","content":""}])"));
    ASSERT_EQ(r.messages.size(), 4u);
    EXPECT_EQ(r.messages[1].reasoning_content, "let me see");  // the redacted block is dropped
    EXPECT_EQ(r.messages[1].content, "answer");
    EXPECT_EQ(r.messages[3].role, "assistant");  // an empty final assistant turn is allowed
    EXPECT_EQ(r.messages[3].content, "");
}

TEST(AnthropicParse, ToolsAndToolChoice) {
    json body = minimal();
    body["tools"] = json::parse(R"([
        {"name":"get_weather","description":"Weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}}},
         "cache_control":{"type":"ephemeral"}},
        {"type":"custom","name":"mcp__files__read","input_schema":{"type":"object"}}])");
    chat_request r = parse_messages_request(body);
    ASSERT_EQ(r.tools.size(), 2u);
    EXPECT_EQ(r.tools[0].name, "get_weather");
    EXPECT_EQ(r.tools[0].description, "Weather");
    EXPECT_EQ(json::parse(r.tools[0].parameters)["properties"]["city"]["type"], "string");
    EXPECT_EQ(r.tools[1].name, "mcp__files__read");

    body["tool_choice"] = {{"type", "any"}};
    EXPECT_EQ(parse_messages_request(body).tool_choice, COMMON_CHAT_TOOL_CHOICE_REQUIRED);
    body["tool_choice"] = {{"type", "none"}};
    EXPECT_EQ(parse_messages_request(body).tool_choice, COMMON_CHAT_TOOL_CHOICE_NONE);
    body["tool_choice"] = {{"type", "auto"}, {"disable_parallel_tool_use", true}};
    r = parse_messages_request(body);
    EXPECT_EQ(r.tool_choice, COMMON_CHAT_TOOL_CHOICE_AUTO);
    EXPECT_EQ(r.parallel_tool_calls, false);
    body["tool_choice"] = {{"type", "tool"}, {"name", "mcp__files__read"}};
    r = parse_messages_request(body);
    EXPECT_EQ(r.tool_choice, COMMON_CHAT_TOOL_CHOICE_REQUIRED);
    ASSERT_EQ(r.tools.size(), 1u);  // narrowed to the named tool
    EXPECT_EQ(r.tools[0].name, "mcp__files__read");
}

TEST(AnthropicParse, SamplingStopAndStream) {
    json body = minimal();
    body["temperature"] = 0.5;
    body["top_p"] = 0.9;
    body["top_k"] = 40;
    body["stop_sequences"] = {"\n\nHuman:", "END"};
    body["stream"] = true;
    body["metadata"] = {{"user_id", "someone"}};
    chat_request r = parse_messages_request(body);
    EXPECT_FLOAT_EQ(*r.sampling.temperature, 0.5f);
    EXPECT_FLOAT_EQ(*r.sampling.top_p, 0.9f);
    EXPECT_EQ(r.sampling.top_k, 40);
    EXPECT_EQ(r.stop, (std::vector<std::string>{"\n\nHuman:", "END"}));
    EXPECT_TRUE(r.stream);
}

TEST(AnthropicParse, Thinking) {
    EXPECT_EQ(parse_messages_request(with("thinking", {{"type", "enabled"}, {"budget_tokens", 2048}})).enable_thinking,
              true);
    EXPECT_EQ(parse_messages_request(with("thinking", {{"type", "adaptive"}})).enable_thinking, true);
    EXPECT_EQ(parse_messages_request(with("thinking", {{"type", "disabled"}})).enable_thinking, false);
}

TEST(AnthropicParse, StructuredOutput) {
    const json schema = json::parse(R"({"type":"object","properties":{"title":{"type":"string"}}})");
    json body = with("output_config", {{"effort", "high"}, {"format", {{"type", "json_schema"}, {"schema", schema}}}});
    EXPECT_EQ(json::parse(parse_messages_request(body).json_schema), schema);
    body = with("output_format", {{"type", "json_schema"}, {"schema", schema}});
    EXPECT_EQ(json::parse(parse_messages_request(body).json_schema), schema);
    // Effort alone constrains nothing.
    EXPECT_TRUE(parse_messages_request(with("output_config", {{"effort", "high"}})).json_schema.empty());
}

TEST(AnthropicParse, CountTokensNeedsNoMaxTokens) {
    json body = minimal();
    body.erase("max_tokens");
    body["tools"] = json::parse(R"([{"name":"t","input_schema":{"type":"object"}}])");
    chat_request r = parse_messages_request(body, endpoint::count_tokens);
    EXPECT_EQ(r.messages.size(), 1u);
    EXPECT_EQ(r.tools.size(), 1u);
    expect_400(body, "'max_tokens' is required");
}

TEST(AnthropicParse, BadInputNamesTheField) {
    expect_400(json::array(), "JSON object");
    json no_model = minimal();
    no_model.erase("model");
    expect_400(no_model, "'model'");
    expect_400(with("max_tokens", 0), "'max_tokens'");
    expect_400(with("max_tokens", "many"), "'max_tokens' must be an integer");
    expect_400(with("messages", json::array()), "'messages' must be a non-empty array");
    expect_400(with_messages(R"([{"role":"tool","content":"x"}])"), "'messages[0].role'");
    expect_400(with_messages(R"([{"role":"user"}])"), "'messages[0].content'");
    expect_400(with_messages(R"([{"role":"user","content":""}])"), "'messages[0].content' must not be empty");
    expect_400(with_messages(R"([{"role":"user","content":[]}])"), "'messages[0].content' must not be empty");
    expect_400(with_messages(R"([{"role":"assistant","content":""},{"role":"user","content":"x"}])"),
               "'messages[0].content' must not be empty");
    expect_400(with_messages(R"([{"role":"user","content":[{"type":"image","source":{"type":"base64","data":"x"}}]}])"),
               "'messages[0].content[0]': image blocks are not supported");
    expect_400(with_messages(R"([{"role":"user","content":[{"type":"document","source":{}}]}])"),
               "'messages[0].content[0]': document blocks are not supported");
    expect_400(with_messages(R"([{"role":"user","content":[{"type":"tool_result","tool_use_id":"t",
                                 "content":[{"type":"image","source":{}}]}]}])"),
               "'messages[0].content[0].content[0]': image blocks");
    expect_400(with_messages(R"([{"role":"user","content":[{"type":"tool_result"}]}])"),
               "'messages[0].content[0].tool_use_id'");
    expect_400(with_messages(R"([{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":7}]}])"),
               "'messages[0].content[0].content'");
    expect_400(with_messages(R"([{"role":"user","content":[{"type":"tool_use","id":"a","name":"b","input":{}}]}])"),
               "belong in assistant messages");
    expect_400(with_messages(R"([{"role":"user","content":"x"},
                                 {"role":"assistant","content":[{"type":"tool_result","tool_use_id":"t"}]}])"),
               "belong in user messages");
    expect_400(with_messages(R"([{"role":"user","content":"x"},
                                 {"role":"assistant","content":[{"type":"tool_use","id":"a","name":"b","input":"{}"}]}])"),
               "'messages[1].content[0].input' must be an object");
    expect_400(with_messages(R"([{"role":"user","content":"x"},
                                 {"role":"assistant","content":[{"type":"tool_use","name":"b","input":{}}]}])"),
               "'messages[1].content[0].id'");
    expect_400(with_messages(R"([{"role":"user","content":[{"type":"server_tool_use"}]}])"),
               "'messages[0].content[0].type': 'server_tool_use' blocks are not supported");
    expect_400(with_messages(R"([{"role":"user","content":[{"text":"no type"}]}])"), "'messages[0].content[0].type'");
    expect_400(with_messages(R"([{"role":"user","content":[{"type":"text"}]}])"), "'messages[0].content[0].text'");

    expect_400(with("system", 5), "'system' must be a string or an array of text blocks");
    expect_400(with("system", json::parse(R"([{"type":"image"}])")), "'system[0].type' must be 'text'");

    expect_400(with("tools", json::object()), "'tools' must be an array");
    expect_400(with("tools", json::parse(R"([{"type":"web_search_20250305","name":"web_search","max_uses":5}])")),
               "'tools[0]' is Anthropic's server tool 'web_search_20250305'");
    expect_400(with("tools", json::parse(R"([{"name":"t"}])")), "'tools[0].input_schema' must be an object");
    expect_400(with("tools", json::parse(R"([{"name":"t","input_schema":{"type":"array"}}])")),
               "'tools[0].input_schema.type' must be 'object'");
    expect_400(with("tools", json::parse(R"([{"name":"bad name","input_schema":{}}])")), "'tools[0].name'");
    expect_400(with("tools", json::parse(R"([{"name":"t","input_schema":{}},{"name":"t","input_schema":{}}])")),
               "duplicate tool name 't'");

    expect_400(with("tool_choice", "auto"), "'tool_choice' must be an object");
    expect_400(with("tool_choice", {{"type", "required"}}), "'tool_choice.type' must be one of");
    expect_400(with("tool_choice", {{"type", "any"}}), "no 'tools' were given");
    json named = with("tools", json::parse(R"([{"name":"t","input_schema":{}}])"));
    named["tool_choice"] = {{"type", "tool"}, {"name", "u"}};
    expect_400(named, "'tool_choice.name' names 'u'");
    named["tool_choice"] = {{"type", "tool"}};
    expect_400(named, "'tool_choice.name'");
    named["tool_choice"] = {{"type", "auto"}, {"disable_parallel_tool_use", "yes"}};
    expect_400(named, "'tool_choice.disable_parallel_tool_use' must be a boolean");

    expect_400(with("stop_sequences", "END"), "'stop_sequences' must be an array");
    expect_400(with("stop_sequences", {"a", ""}), "'stop_sequences[1]' must be a non-empty string");
    expect_400(with("temperature", 1.5), "'temperature' must be a number between 0 and 1");
    expect_400(with("top_p", "high"), "'top_p'");
    expect_400(with("top_k", -1), "'top_k'");
    expect_400(with("stream", "yes"), "'stream' must be a boolean");

    expect_400(with("thinking", true), "'thinking' must be an object");
    expect_400(with("thinking", {{"type", "enabled"}}), "'thinking.budget_tokens' must be a positive integer");
    expect_400(with("thinking", {{"type", "on"}}), "'thinking.type' must be one of");

    expect_400(with("output_config", "json"), "'output_config' must be an object");
    expect_400(with("output_config", {{"format", {{"type", "json_object"}}}}),
               "'output_config.format.type' must be 'json_schema'");
    expect_400(with("output_format", {{"type", "json_schema"}}), "'output_format.schema' must be an object");
}

TEST(AnthropicParse, ClaudeCodeRequests) {
    // Its session title: no tools, a JSON-schema answer, no thinking.
    chat_request title = parse_messages_request(claude_code_request("title"));
    EXPECT_TRUE(title.tools.empty());
    EXPECT_EQ(json::parse(title.json_schema)["required"], json::array({"title"}));
    EXPECT_EQ(title.enable_thinking, false);
    ASSERT_EQ(title.messages[0].role, "system");
    EXPECT_EQ(title.messages[0].content_parts[0].text.rfind("x-anthropic-billing-header: cc_version=2.1.197.", 0), 0u);

    // The main turn: 25 tools, adaptive thinking, and a system message after the first user message.
    chat_request turn = parse_messages_request(claude_code_request("main-turn"));
    EXPECT_EQ(turn.tools.size(), 25u);
    EXPECT_EQ(turn.enable_thinking, true);
    EXPECT_TRUE(turn.stream);
    ASSERT_EQ(turn.messages.size(), 3u);
    EXPECT_EQ(turn.messages[0].role, "system");
    EXPECT_EQ(turn.messages[1].role, "user");
    EXPECT_EQ(turn.messages[2].role, "user");
    EXPECT_EQ(turn.messages[2].content.rfind("Available agent types", 0), 0u);

    // After a max_tokens stop: the cut answer and a request to resume.
    chat_request resumed = parse_messages_request(claude_code_request("max-tokens-continuation"));
    ASSERT_EQ(resumed.messages.size(), 5u);
    EXPECT_EQ(resumed.messages[3].role, "assistant");
    EXPECT_EQ(resumed.messages[4].content.rfind("Output token limit hit.", 0), 0u);
}

TEST(AnthropicFormat, ErrorBodiesFollowTheStatus) {
    const json body = json::parse(error_body(400, "invalid_request_error", "bad field"));
    EXPECT_EQ(body, json::parse(R"({"type":"error","error":{"type":"invalid_request_error","message":"bad field"}})"));
    // Claude Code compacts its conversation when it reads Anthropic's wording of a prompt over the context.
    const json too_long = json::parse(
        error_body(400, "exceed_context_size_error", "the prompt has 18756 tokens but the context holds 16384 tokens"));
    EXPECT_EQ(too_long["error"]["type"], "invalid_request_error");
    EXPECT_EQ(too_long["error"]["message"],
              "prompt is too long: 18756 tokens > 16384 maximum (the prompt has 18756 tokens but the context holds "
              "16384 tokens)");
    EXPECT_EQ(context_error_message("too long"), "prompt is too long: too long");
    EXPECT_EQ(error_type_for_status(401), "authentication_error");
    EXPECT_EQ(error_type_for_status(403), "permission_error");
    EXPECT_EQ(error_type_for_status(404), "not_found_error");
    EXPECT_EQ(error_type_for_status(405), "invalid_request_error");
    EXPECT_EQ(error_type_for_status(413), "request_too_large");
    EXPECT_EQ(error_type_for_status(429), "rate_limit_error");
    EXPECT_EQ(error_type_for_status(500), "api_error");
    EXPECT_EQ(error_type_for_status(503), "overloaded_error");
    EXPECT_EQ(error_type_for_status(529), "overloaded_error");
}

TEST(AnthropicFormat, IdsAndStopReasons) {
    EXPECT_EQ(gen_message_id().rfind("msg_", 0), 0u);
    EXPECT_EQ(tool_use_id("call_abc123"), "toolu_abc123");
    EXPECT_EQ(tool_use_id("functions.get_weather:0"), "functions.get_weather:0");

    common_chat_msg msg;
    msg.content = "hi";
    EXPECT_EQ(stop_reason(msg, false), "end_turn");
    EXPECT_EQ(stop_reason(msg, true), "max_tokens");
    msg.tool_calls.push_back({"get_weather", R"({"city":"Paris"})", "call_1"});
    EXPECT_EQ(stop_reason(msg, false), "tool_use");
    EXPECT_EQ(stop_reason(msg, true), "max_tokens");
}

TEST(AnthropicFormat, MessageWithAllBlockKindsAndUsage) {
    common_chat_msg msg;
    msg.reasoning_content = "thought";
    msg.content = "answer";
    msg.tool_calls.push_back({"get_weather", R"({"city":"Paris"})", "call_X1"});
    msg.tool_calls.push_back({"get_time", "", "call_X2"});
    const usage_info usage{
        .prompt_tokens = 100, .completion_tokens = 7, .cached_tokens = 80, .cache = {.device = 60, .ram = 20}};
    timings_info timings;
    timings.cache_n = 80;
    timings.prompt_n = 20;
    timings.cache = usage.cache;
    timings.setup_ms = 1.5;
    const json m = message_json("msg_1", "claude-x", msg, "tool_use", usage, timings);
    EXPECT_EQ(m["id"], "msg_1");
    EXPECT_EQ(m["type"], "message");
    EXPECT_EQ(m["role"], "assistant");
    EXPECT_EQ(m["model"], "claude-x");
    EXPECT_EQ(m["stop_reason"], "tool_use");
    EXPECT_TRUE(m["stop_sequence"].is_null());
    EXPECT_EQ(m["content"], json::parse(R"([
        {"type":"thinking","thinking":"thought","signature":""},
        {"type":"text","text":"answer"},
        {"type":"tool_use","id":"toolu_X1","name":"get_weather","input":{"city":"Paris"}},
        {"type":"tool_use","id":"toolu_X2","name":"get_time","input":{}}])"));
    // Reused tokens are cache reads, computed ones cache writes: the three add up to the prompt.
    EXPECT_EQ(m["usage"], json::parse(R"({"input_tokens":0,"cache_creation_input_tokens":20,
                                           "cache_read_input_tokens":80,"output_tokens":7})"));
    EXPECT_EQ(m["timings"]["cache_device_n"], 60);
    EXPECT_EQ(m["timings"]["cache_ram_n"], 20);
    EXPECT_EQ(m["timings"]["setup_ms"], 1.5);

    common_chat_msg empty;
    EXPECT_EQ(message_json("msg_2", "m", empty, "end_turn", usage)["content"], json::array());
    EXPECT_FALSE(message_json("msg_2", "m", empty, "end_turn", usage).contains("timings"));
    EXPECT_EQ(count_tokens_json(42), json::parse(R"({"input_tokens":42})"));
}

TEST(AnthropicStream, EventsOpenAndCloseBlocksInIndexOrder) {
    message_stream s("msg_1", "claude-x");
    const stream_event start = s.start(120);
    EXPECT_EQ(start.name, "message_start");
    EXPECT_EQ(start.data["message"]["id"], "msg_1");
    EXPECT_EQ(start.data["message"]["model"], "claude-x");
    EXPECT_EQ(start.data["message"]["content"], json::array());
    EXPECT_TRUE(start.data["message"]["stop_reason"].is_null());
    // The split into reused and computed is known only at the end; until then the prompt counts as written.
    EXPECT_EQ(start.data["message"]["usage"], json::parse(R"({"input_tokens":0,"cache_creation_input_tokens":120,
                                                               "cache_read_input_tokens":0,"output_tokens":0})"));

    std::vector<stream_event> events = s.push({reasoning_diff("hm"), reasoning_diff("m")});
    EXPECT_EQ(names(events),
              (std::vector<std::string>{"content_block_start", "content_block_delta", "content_block_delta"}));
    EXPECT_EQ(events[0].data["index"], 0);
    EXPECT_EQ(events[0].data["content_block"], json::parse(R"({"type":"thinking","thinking":"","signature":""})"));
    EXPECT_EQ(events[2].data["delta"], json::parse(R"({"type":"thinking_delta","thinking":"m"})"));

    events = s.push({content_diff("Hello")});
    EXPECT_EQ(names(events), (std::vector<std::string>{"content_block_delta", "content_block_stop",
                                                       "content_block_start", "content_block_delta"}));
    EXPECT_EQ(events[0].data["delta"], json::parse(R"({"type":"signature_delta","signature":""})"));
    EXPECT_EQ(events[0].data["index"], 0);
    EXPECT_EQ(events[1].data["index"], 0);
    EXPECT_EQ(events[2].data["index"], 1);
    EXPECT_EQ(events[2].data["content_block"], json::parse(R"({"type":"text","text":""})"));
    EXPECT_EQ(events[3].data["delta"], json::parse(R"({"type":"text_delta","text":"Hello"})"));

    // A tool call ends the text block at once, but its own block starts only once its arguments begin: its name may
    // still grow until then.
    events = s.push({tool_diff(0, "call_A", "get_wea", "")});
    EXPECT_EQ(names(events), (std::vector<std::string>{"content_block_stop"}));
    EXPECT_EQ(events[0].data["index"], 1);
    events = s.push({tool_diff(0, "call_A", "get_weather", ""), tool_diff(0, "", "", R"({"city":)")});
    EXPECT_EQ(names(events), (std::vector<std::string>{"content_block_start", "content_block_delta"}));
    EXPECT_EQ(events[0].data["index"], 2);
    EXPECT_EQ(events[0].data["content_block"],
              json::parse(R"({"type":"tool_use","id":"toolu_A","name":"get_weather","input":{}})"));
    EXPECT_EQ(events[1].data["delta"], json::parse(R"({"type":"input_json_delta","partial_json":"{\"city\":"})"));

    // A second call without arguments yet closes the first; at the end it still gets its block.
    events = s.push({tool_diff(0, "", "", R"("Paris"})"), tool_diff(1, "call_B", "get_time", "")});
    EXPECT_EQ(names(events), (std::vector<std::string>{"content_block_delta", "content_block_stop"}));
    EXPECT_EQ(events[1].data["index"], 2);
    const usage_info usage{.prompt_tokens = 120, .completion_tokens = 9, .cached_tokens = 100};
    events = s.finish("tool_use", usage, timings_info{});
    EXPECT_EQ(names(events),
              (std::vector<std::string>{"content_block_start", "content_block_stop", "message_delta", "message_stop"}));
    EXPECT_EQ(events[0].data["index"], 3);
    EXPECT_EQ(events[0].data["content_block"]["name"], "get_time");
    EXPECT_EQ(events[1].data["index"], 3);
    EXPECT_EQ(events[2].data["delta"], json::parse(R"({"stop_reason":"tool_use","stop_sequence":null})"));
    EXPECT_EQ(events[2].data["usage"], json::parse(R"({"input_tokens":0,"cache_creation_input_tokens":20,
                                                       "cache_read_input_tokens":100,"output_tokens":9})"));
    EXPECT_TRUE(events[2].data.contains("timings"));
    EXPECT_EQ(events[3].data, json::parse(R"({"type":"message_stop"})"));
}

TEST(AnthropicStream, EmptyAnswerAndWireFormat) {
    message_stream s("msg_1", "m");
    EXPECT_TRUE(s.push({}).empty());
    const auto events = s.finish("end_turn", usage_info{});
    EXPECT_EQ(names(events), (std::vector<std::string>{"message_delta", "message_stop"}));
    EXPECT_EQ(to_sse(events[1]), "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    EXPECT_EQ(to_sse(ping_event()), "event: ping\ndata: {\"type\":\"ping\"}\n\n");
    EXPECT_EQ(
        to_sse(error_event("overloaded_error", "busy")),
        "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"busy\"}}\n\n");
}

// cache_control breakpoints: the hint reaches the end of the last marked message (tools and system: the system
// prompt; the request itself: everything), for the longest ttl asked.
TEST(AnthropicParse, CacheControlBreakpointsMarkAPrefix) {
    EXPECT_FALSE(parse_messages_request(minimal()).hint.has_value());

    json body = with_messages(R"([
        {"role":"user","content":[{"type":"text","text":"one"}]},
        {"role":"assistant","content":"two"},
        {"role":"user","content":[{"type":"text","text":"three","cache_control":{"type":"ephemeral"}}]},
        {"role":"assistant","content":"four"},
        {"role":"user","content":"five"}])");
    body["system"] = json::parse(R"([{"type":"text","text":"rules","cache_control":{"type":"ephemeral","ttl":"1h"}}])");
    chat_request r = parse_messages_request(body);
    ASSERT_TRUE(r.hint.has_value());
    ASSERT_EQ(r.messages.size(), 6u);
    EXPECT_EQ(r.hint->messages, 4u) << "system + the first three messages; 'four' starts what is not marked";
    EXPECT_EQ(r.hint->ttl, std::chrono::hours(1));

    // On the system prompt only: the prefix ends where the first message starts.
    json system_only = minimal();
    system_only["system"] = json::parse(R"([{"type":"text","text":"rules","cache_control":{"type":"ephemeral"}}])");
    r = parse_messages_request(system_only);
    ASSERT_TRUE(r.hint.has_value());
    EXPECT_EQ(r.hint->messages, 1u);
    EXPECT_EQ(r.hint->ttl, std::chrono::minutes(5));

    // On a tool without a system prompt: the same place, the first message.
    json tools = with("tools", json::parse(R"([{"name":"f","input_schema":{"type":"object"},
                                               "cache_control":{"type":"ephemeral"}}])"));
    r = parse_messages_request(tools);
    ASSERT_TRUE(r.hint.has_value());
    EXPECT_EQ(r.hint->messages, 0u);

    // A user turn split into a user and a tool message: the mark covers both.
    json split = with_messages(R"([
        {"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{}}]},
        {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"ok"},
                                  {"type":"text","text":"go on","cache_control":{"type":"ephemeral"}}]}])");
    r = parse_messages_request(split);
    ASSERT_EQ(r.messages.size(), 3u);
    EXPECT_EQ(r.hint->messages, 3u);

    // On the request itself (automatic caching): the whole prompt.
    r = parse_messages_request(with("cache_control", json::parse(R"({"type":"ephemeral"})")));
    ASSERT_TRUE(r.hint.has_value());
    EXPECT_GE(r.hint->messages, r.messages.size());

    expect_400(with("cache_control", "yes"), "cache_control");
    expect_400(with("cache_control", json::parse(R"({"type":"persistent"})")), "cache_control.type");
    expect_400(with_messages(R"([{"role":"user","content":[{"type":"text","text":"x",
                                  "cache_control":{"type":"ephemeral","ttl":"2d"}}]}])"),
               "messages[0].content[0].cache_control.ttl");
}

// A tool with defer_loading (Anthropic's tool search loads it on demand) is not offered: keepwarm has no tool search.
TEST(AnthropicParse, DeferredToolsAreNotOffered) {
    chat_request r = parse_messages_request(with("tools", json::parse(R"([
        {"name":"Read","input_schema":{"type":"object"}},
        {"name":"DeferredToolPlaceholder","description":"never call this tool","input_schema":{"type":"object"},
         "defer_loading":true}])")));
    ASSERT_EQ(r.tools.size(), 1u);
    EXPECT_EQ(r.tools[0].name, "Read");
    expect_400(with("tools", json::parse(R"([{"name":"f","input_schema":{"type":"object"},"defer_loading":"yes"}])")),
               "tools[0].defer_loading");
}

// Issue 39 (F5): counts and sizes are checked before the body is converted (nothing is rendered): the messages, the
// blocks (system blocks and those inside tool results included), the bytes of all text.
TEST(anthropic_api, messages_blocks_and_text_bytes_are_bounded_before_conversion) {
    json body = minimal();
    for (size_t i = 0; i < default_request_limits.max_messages; ++i) body["messages"].push_back(nullptr);
    expect_400(body, "'messages' holds 10001 messages; keepwarm's request limit max_messages is 10000");
    body = minimal();
    body["system"] = json::array({{{"type", "text"}, {"text", "rules"}}});
    json results = json::array();
    for (size_t i = 0; i < default_request_limits.max_content_parts; ++i)
        results.push_back({{"type", "text"}, {"text", "r"}});
    body["messages"][0]["content"] =
        json::array({{{"type", "tool_result"}, {"tool_use_id", "t"}, {"content", results}}});
    expect_400(body, "the request holds 20002 content parts; keepwarm's request limit max_content_parts is 20000");
    body = with("system", std::string(default_request_limits.max_text_bytes, 's'));
    expect_400(body, "keepwarm's request limit max_text_bytes is 16777216");
    body = minimal();
    body["tools"] = json::array();
    for (size_t i = 0; i <= default_request_limits.max_tools; ++i) body["tools"].push_back(i);
    expect_400(body, "'tools' holds 1025 tools; keepwarm's request limit max_tools is 1024", endpoint::count_tokens);
}

// Issue 36: llama-server's speculative.n_max on its Anthropic endpoint too; bad values are a 400 naming the field.
TEST(AnthropicParse, SpeculativeNMax) {
    EXPECT_FALSE(parse_messages_request(minimal(), endpoint::messages).draft_max.has_value());
    EXPECT_EQ(parse_messages_request(with("speculative.n_max", 0), endpoint::messages).draft_max, 0);
    EXPECT_EQ(parse_messages_request(with("speculative.n_max", 5), endpoint::messages).draft_max, 5);
    expect_400(with("speculative.n_max", 4096), "'speculative.n_max' must be an integer between 0 and 1024");
    expect_400(with("speculative.n_max", "off"), "'speculative.n_max' must be an integer");
    expect_400(with("speculative.p_min", 2), "'speculative.p_min' must be a number between 0 and 1");
}

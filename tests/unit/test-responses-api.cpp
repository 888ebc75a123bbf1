// The Responses API edge (src/api/responses-api.*): input items into the one chat_request (a Codex-shaped history
// renders as one conversation: reasoning, text and calls of a turn together, tool outputs after), bad input as a 400
// naming the field, and the response object and event sequence a client assembles.
#include <gtest/gtest.h>

#include "api/request-limits.h"
#include "api/responses-api.h"
#include "base/request-error.h"

using namespace keepwarm;
using namespace keepwarm::api::responses;

namespace {

parsed_request parse(const char* body) {
    return parse_request(json::parse(body));
}

void expect_400(const char* body, const std::string& needle) {
    try {
        parse(body);
        ADD_FAILURE() << "expected a 400 for " << body;
    } catch (const request_error& e) {
        EXPECT_EQ(e.status, 400);
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
}

common_chat_msg_diff text_delta(const std::string& text) {
    common_chat_msg_diff d;
    d.content_delta = text;
    return d;
}

common_chat_msg_diff reasoning_delta(const std::string& text) {
    common_chat_msg_diff d;
    d.reasoning_content_delta = text;
    return d;
}

common_chat_msg_diff call_delta(size_t index, const std::string& name, const std::string& id, const std::string& args) {
    common_chat_msg_diff d;
    d.tool_call_index = index;
    d.tool_call_delta.name = name;
    d.tool_call_delta.id = id;
    d.tool_call_delta.arguments = args;
    return d;
}

// The data objects of an SSE text, in order.
std::vector<json> events_of(const std::string& sse) {
    std::vector<json> out;
    size_t at = 0;
    while ((at = sse.find("data: ", at)) != std::string::npos) {
        const size_t end = sse.find("\n\n", at);
        out.push_back(json::parse(sse.substr(at + 6, end - at - 6)));
        at = end;
    }
    return out;
}

}  // namespace

TEST(responses_api, a_string_input_and_instructions_are_a_system_and_a_user_message) {
    const parsed_request r = parse(R"({"model":"gpt-5","instructions":"Be brief.","input":"Hello",
        "max_output_tokens":32,"temperature":0.2,"stream":true,"store":false,"prompt_cache_key":"codex-1"})");
    ASSERT_EQ(r.chat.messages.size(), 2u);
    EXPECT_EQ(r.chat.messages[0].role, "system");
    EXPECT_EQ(r.chat.messages[0].content, "Be brief.");
    EXPECT_EQ(r.chat.messages[1].role, "user");
    EXPECT_EQ(r.chat.messages[1].content, "Hello");
    EXPECT_EQ(r.chat.max_tokens, 32);
    EXPECT_FLOAT_EQ(*r.chat.sampling.temperature, 0.2f);
    EXPECT_TRUE(r.chat.stream);
    EXPECT_EQ(r.echo.prompt_cache_key, "codex-1");
    EXPECT_EQ(r.echo.instructions, "Be brief.");
}

// Codex's history: a turn's reasoning, its call, the call's output, then the next turn's reasoning and text.
TEST(responses_api, a_tool_round_trip_history_becomes_one_conversation) {
    const parsed_request r = parse(R"({"input":[
        {"type":"message","role":"developer","content":[{"type":"input_text","text":"rules"}]},
        {"role":"user","content":[{"type":"input_text","text":"list files"}]},
        {"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"use ls"}],
         "encrypted_content":"use ls"},
        {"type":"function_call","id":"fc_1","call_id":"call_1","name":"shell","arguments":"{\"cmd\":\"ls\"}"},
        {"type":"function_call_output","call_id":"call_1","output":"a.txt\nb.txt"},
        {"type":"reasoning","id":"rs_2","summary":[{"type":"summary_text","text":"two files"}]},
        {"type":"message","role":"assistant","content":[{"type":"output_text","text":"a.txt and b.txt"}]},
        {"role":"user","content":"thanks"}],
        "tools":[{"type":"function","name":"shell","description":"run","parameters":{"type":"object"}}],
        "tool_choice":"auto","reasoning":{"effort":"high","summary":"auto"}})");
    const auto& m = r.chat.messages;
    ASSERT_EQ(m.size(), 6u);
    EXPECT_EQ(m[0].role, "developer");
    EXPECT_EQ(m[1].content, "list files");
    EXPECT_EQ(m[2].role, "assistant");
    EXPECT_EQ(m[2].reasoning_content, "use ls");
    ASSERT_EQ(m[2].tool_calls.size(), 1u);
    EXPECT_EQ(m[2].tool_calls[0].id, "call_1");
    EXPECT_EQ(m[2].tool_calls[0].arguments, "{\"cmd\":\"ls\"}");
    EXPECT_EQ(m[3].role, "tool");
    EXPECT_EQ(m[3].tool_call_id, "call_1");
    EXPECT_EQ(m[3].content, "a.txt\nb.txt");
    EXPECT_EQ(m[4].role, "assistant");
    EXPECT_EQ(m[4].reasoning_content, "two files");  // the summary, when nothing else was carried back
    EXPECT_EQ(m[4].content, "a.txt and b.txt");
    EXPECT_EQ(m[5].content, "thanks");
    ASSERT_EQ(r.chat.tools.size(), 1u);
    EXPECT_EQ(r.chat.tools[0].name, "shell");
    EXPECT_EQ(r.chat.chat_template_kwargs.at("reasoning_effort"), "\"high\"");
    EXPECT_EQ(r.echo.tools[0]["name"], "shell");
}

// A request naming a previous response reads its stored conversation first, then its own input.
TEST(responses_api, a_continued_request_reads_the_stored_conversation_first) {
    const json stored = json::parse(R"([{"type":"message","role":"user","content":[{"type":"input_text","text":"a"}]},
        {"type":"message","id":"msg_1","role":"assistant","status":"completed",
         "content":[{"type":"output_text","text":"b","annotations":[]}]}])");
    const json body = continue_input(json::parse(R"({"input":"c","previous_response_id":"resp_1"})"), stored);
    EXPECT_EQ(body["input"].size(), 3u);
    const parsed_request r = parse_request(body);
    ASSERT_EQ(r.chat.messages.size(), 3u);
    EXPECT_EQ(r.chat.messages[1].role, "assistant");
    EXPECT_EQ(r.chat.messages[1].content, "b");
    EXPECT_EQ(r.chat.messages[2].content, "c");
    EXPECT_EQ(r.echo.previous_response_id, "resp_1");
    EXPECT_TRUE(r.echo.store);  // the API's default
    EXPECT_FALSE(parse(R"({"input":"x","store":false})").echo.store);
    EXPECT_EQ(input_items(json::parse(R"({"input":"hi"})"))[0]["content"][0]["text"], "hi");
}

// What Codex offers: function tools, a namespace of function tools, and web_search (which runs on OpenAI's servers).
TEST(responses_api, codex_tools_namespaces_flatten_and_hosted_tools_are_left_out) {
    const parsed_request r = parse(R"({"input":"x","tools":[
        {"type":"function","name":"exec_command","parameters":{"type":"object"}},
        {"type":"namespace","name":"multi_agent_v1","description":"sub-agents","tools":[
            {"type":"function","name":"spawn_agent","parameters":{"type":"object"}},
            {"type":"function","name":"close_agent"}]},
        {"type":"web_search","external_web_access":false}]})");
    std::vector<std::string> names;
    for (const auto& t : r.chat.tools) names.push_back(t.name);
    EXPECT_EQ(names, (std::vector<std::string>{"exec_command", "spawn_agent", "close_agent"}));
    EXPECT_EQ(r.echo.ignored_tools, (std::vector<std::string>{"web_search"}));
    EXPECT_EQ(r.echo.tools.size(), 3u);  // echoed as sent
    expect_400(R"({"input":"x","tools":[{"type":"namespace","name":"n","tools":[{"type":"namespace","tools":[]}]}]})",
               "'namespace' tools are not supported");
}

TEST(responses_api, choices_formats_and_effort_none) {
    parsed_request r = parse(R"({"input":"x","tools":[{"type":"function","name":"a"},{"type":"function","name":"b"}],
        "tool_choice":{"type":"function","name":"b"},"reasoning":{"effort":"none"},
        "text":{"format":{"type":"json_schema","name":"s","schema":{"type":"object"},"strict":true}}})");
    ASSERT_EQ(r.chat.tools.size(), 1u);
    EXPECT_EQ(r.chat.tools[0].name, "b");
    EXPECT_EQ(r.chat.tool_choice, COMMON_CHAT_TOOL_CHOICE_REQUIRED);
    EXPECT_EQ(r.chat.enable_thinking, false);
    EXPECT_EQ(json::parse(r.chat.json_schema), json::parse(R"({"type":"object"})"));
    r = parse(R"({"input":"x","tools":[{"type":"function","name":"a"}],"tool_choice":"none"})");
    EXPECT_EQ(r.chat.tool_choice, COMMON_CHAT_TOOL_CHOICE_NONE);
}

TEST(responses_api, bad_input_is_a_400_naming_the_field) {
    expect_400(R"({"model":"m"})", "'input' is required");
    expect_400(R"({"input":42})", "'input' must be a string or an array");
    expect_400(R"({"input":[]})", "at least one message");
    expect_400(R"({"input":[{"type":"message","role":"robot","content":"x"}]})", "'input[0].role'");
    expect_400(R"({"input":[{"role":"user","content":[{"type":"input_image","image_url":"http://x"}]}]})",
               "input_image is not supported");
    expect_400(R"({"input":[{"type":"item_reference","id":"x"}]})", "'item_reference' items are not supported");
    expect_400(R"({"input":[{"type":"function_call","name":"f","arguments":"{}"}]})", "'input[0].call_id'");
    expect_400(R"({"input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{not json"}]})",
               "'input[0].arguments'");
    expect_400(R"({"input":[{"type":"function_call_output","call_id":"c"}]})", "'input[0].output'");
    expect_400(R"({"input":"x","tools":[{"type":"custom","name":"apply_patch"}]})", "'custom' tools are not");
    expect_400(R"({"input":"x","tools":[{"type":"function","name":"a"},{"type":"function","name":"a"}]})",
               "duplicate tool name");
    expect_400(R"({"input":"x","tool_choice":"required"})", "no 'tools' were given");
    expect_400(R"({"input":"x","tools":[{"type":"function","name":"a"}],"tool_choice":{"type":"function","name":"z"}})",
               "not in 'tools'");
    expect_400(R"({"input":"x","previous_response_id":7})", "'previous_response_id' must be a string");
    expect_400(R"({"input":"x","max_output_tokens":0})", "'max_output_tokens'");
    expect_400(R"({"input":"x","reasoning":{"effort":"extreme"}})", "'reasoning.effort'");
    expect_400(R"({"input":"x","text":{"format":{"type":"json_schema"}}})", "'text.format.schema'");
    expect_400(R"({"input":"x","temperature":"hot"})", "'temperature'");
}

TEST(responses_api, a_finished_message_is_reasoning_then_text_then_calls_and_usage_counts_the_cache) {
    common_chat_msg msg;
    msg.reasoning_content = "think";
    msg.content = "hello";
    msg.tool_calls.push_back({"shell", "{\"cmd\":\"ls\"}", "call_9"});
    const json out = output_json("resp_abc", msg);
    ASSERT_EQ(out.size(), 3u);
    EXPECT_EQ(out[0]["type"], "reasoning");
    EXPECT_EQ(out[0]["content"][0]["text"], "think");
    EXPECT_EQ(out[0]["encrypted_content"], "think");  // carried back by clients that store reasoning
    EXPECT_EQ(out[1]["type"], "message");
    EXPECT_EQ(out[1]["content"][0]["type"], "output_text");
    EXPECT_EQ(out[1]["content"][0]["text"], "hello");
    EXPECT_EQ(out[2]["type"], "function_call");
    EXPECT_EQ(out[2]["call_id"], "call_9");
    EXPECT_EQ(out[2]["name"], "shell");
    EXPECT_EQ(out[2]["id"], "fc_abc_2");

    usage_info usage{.prompt_tokens = 100, .completion_tokens = 7, .cached_tokens = 90, .cache = {}};
    const json u = usage_json(usage);
    EXPECT_EQ(u["input_tokens"], 100);
    EXPECT_EQ(u["input_tokens_details"]["cached_tokens"], 90);
    EXPECT_EQ(u["output_tokens"], 7);
    EXPECT_EQ(u["total_tokens"], 107);

    const json r = response_json("resp_abc", "m", 1, request_echo{}, "incomplete", output_json("resp_abc", msg, true),
                                 u, std::nullopt, "", true);
    EXPECT_EQ(r["object"], "response");
    EXPECT_EQ(r["incomplete_details"]["reason"], "max_output_tokens");
    EXPECT_EQ(r["output"][2]["status"], "incomplete");
}

// The events a client assembles: created, in_progress, then per item added / deltas / done, then completed; each
// with the next sequence number, and what the deltas add up to equal to the done events and the final response.
TEST(responses_api, the_event_stream_adds_up_to_the_response) {
    event_stream events("resp_x", "m", 1, request_echo{});
    std::string sse;
    const auto take = [&](const std::vector<stream_event>& batch) {
        for (const auto& e : batch) sse += events.to_sse(e);
    };
    take(events.start());
    take(events.push({reasoning_delta("th"), reasoning_delta("ink")}));
    take(events.push({text_delta("Hel"), text_delta("lo")}));
    take(events.push({call_delta(0, "sh", "call_1", "")}));  // the name may still grow
    take(events.push({call_delta(0, "shell", "call_1", "{\"cmd\":")}));
    take(events.push({call_delta(0, "", "", "\"ls\"}")}));
    take(events.push({call_delta(1, "read", "call_2", "{}")}));
    common_chat_msg final_msg;
    final_msg.reasoning_content = "think";
    final_msg.content = "Hello";
    final_msg.tool_calls = {{"shell", "{\"cmd\":\"ls\"}", "call_1"}, {"read", "{}", "call_2"}};
    take(events.finish(final_msg, status::completed, usage_info{.prompt_tokens = 5, .completion_tokens = 3}));

    const std::vector<json> data = events_of(sse);
    std::vector<std::string> types;
    for (size_t i = 0; i < data.size(); ++i) {
        EXPECT_EQ(data[i]["sequence_number"], static_cast<int>(i));
        types.push_back(data[i]["type"]);
    }
    const std::vector<std::string> expected = {"response.created",
                                               "response.in_progress",
                                               "response.output_item.added",
                                               "response.content_part.added",
                                               "response.reasoning_text.delta",
                                               "response.reasoning_text.delta",
                                               "response.reasoning_text.done",
                                               "response.content_part.done",
                                               "response.output_item.done",
                                               "response.output_item.added",
                                               "response.content_part.added",
                                               "response.output_text.delta",
                                               "response.output_text.delta",
                                               "response.output_text.done",
                                               "response.content_part.done",
                                               "response.output_item.done",
                                               "response.output_item.added",
                                               "response.function_call_arguments.delta",
                                               "response.function_call_arguments.delta",
                                               "response.function_call_arguments.done",
                                               "response.output_item.done",
                                               "response.output_item.added",
                                               "response.function_call_arguments.delta",
                                               "response.function_call_arguments.done",
                                               "response.output_item.done",
                                               "response.completed"};
    EXPECT_EQ(types, expected);

    EXPECT_EQ(data[2]["item"]["type"], "reasoning");
    EXPECT_EQ(data[8]["item"]["content"][0]["text"], "think");
    EXPECT_EQ(data[13]["text"], "Hello");
    EXPECT_EQ(data[16]["item"]["name"], "shell");  // added once the arguments began: the whole name
    EXPECT_EQ(data[16]["item"]["call_id"], "call_1");
    EXPECT_EQ(data[19]["arguments"], "{\"cmd\":\"ls\"}");
    EXPECT_EQ(data[20]["item"]["arguments"], "{\"cmd\":\"ls\"}");
    EXPECT_EQ(data[21]["output_index"], 3);
    const json& response = data.back()["response"];
    EXPECT_EQ(response["status"], "completed");
    ASSERT_EQ(response["output"].size(), 4u);
    EXPECT_EQ(response["output"][1]["content"][0]["text"], "Hello");
    EXPECT_EQ(response["output"][3]["name"], "read");
    EXPECT_EQ(response["usage"]["output_tokens"], 3);
}

TEST(responses_api, a_failed_generation_ends_the_stream_with_response_failed) {
    event_stream events("resp_x", "m", 1, request_echo{});
    std::string sse;
    for (const auto& e : events.start()) sse += events.to_sse(e);
    for (const auto& e : events.push({text_delta("par")})) sse += events.to_sse(e);
    for (const auto& e : events.fail("decode failed")) sse += events.to_sse(e);
    const std::vector<json> data = events_of(sse);
    EXPECT_EQ(data.back()["type"], "response.failed");
    EXPECT_EQ(data.back()["response"]["status"], "failed");
    EXPECT_EQ(data.back()["response"]["error"]["message"], "decode failed");
    EXPECT_EQ(data[data.size() - 2]["type"], "response.output_item.done");  // the open item closed first
}

// Issue 39: a tool output answers a call of the conversation (OpenAI answers 400 "No tool call found for function
// call output with call_id ..."); the call may come from the previous response's stored items.
TEST(responses_api, a_tool_output_for_a_call_that_does_not_exist_is_a_400) {
    expect_400(R"({"input":[{"role":"user","content":"hi"},
        {"type":"function_call_output","call_id":"call_nowhere","output":"x"}]})",
               "No tool call found for function call output with call_id call_nowhere ('input[1]')");
    const json stored = json::parse(R"([{"role":"user","content":"list"},
        {"type":"function_call","call_id":"call_1","name":"shell","arguments":"{}"}])");
    const json body = continue_input(
        json::parse(R"({"input":[{"type":"function_call_output","call_id":"call_1","output":"a.txt"}]})"), stored);
    EXPECT_EQ(parse_request(body).chat.messages.back().tool_call_id, "call_1");
    // A call_id of 10 KB is not sent back whole.
    const json hostile = {
        {"input",
         json::array({{{"type", "function_call_output"}, {"call_id", std::string(10000, 'c')}, {"output", "x"}}})}};
    try {
        parse_request(hostile);
        ADD_FAILURE() << "expected a 400";
    } catch (const request_error& e) {
        EXPECT_EQ(e.status, 400);
        EXPECT_NE(std::string(e.what()).find(std::string(max_shown_id_bytes, 'c') + "..."), std::string::npos);
        EXPECT_LT(std::string(e.what()).size(), 200u);
    }
}

// Issue 39: an unknown id's 404 (previous_response_id, GET /v1/responses/{id}) echoes at most 64 characters of it,
// and an id longer than any response id could be is a 400.
TEST(responses_api, ids_a_client_names_are_bounded_and_echoed_truncated) {
    const std::string long_id = "resp_" + std::string(10000, 'x');
    const request_error missing = response_not_found(long_id, true);
    EXPECT_EQ(missing.status, 404);
    EXPECT_EQ(std::string(missing.what()),
              "Previous response with id '" + long_id.substr(0, max_shown_id_bytes) + "...' not found.");
    EXPECT_EQ(std::string(response_not_found("resp_abc", false).what()), "Response with id 'resp_abc' not found.");
    EXPECT_NO_THROW(check_requested_id(std::string(max_requested_id_bytes, 'r'), "id"));
    try {
        check_requested_id(long_id, "previous_response_id");
        ADD_FAILURE() << "expected a 400";
    } catch (const request_error& e) {
        EXPECT_EQ(e.status, 400);
        EXPECT_NE(std::string(e.what()).find("'previous_response_id' is 10005 characters long"), std::string::npos);
    }
}

// Issue 39 (F5, F3): counts and bytes are checked before the input is converted, let alone rendered: a million
// items is refused for the count, and a 30 MiB reasoning item (which renders to a few tokens, but would be stored
// whole for previous_response_id) for the bytes.
TEST(responses_api, input_items_and_unrendered_bytes_are_bounded_before_conversion) {
    json body = {{"input", json::array()}};
    // Items that would each be a 400 if they were read: the count is checked first.
    for (size_t i = 0; i <= api::default_request_limits.max_input_items; ++i) body["input"].push_back(json(i));
    expect_400(body.dump().c_str(), "'input' holds 20001 items; keepwarm's request limit max_input_items is 20000");
    const json reasoning = {
        {"type", "reasoning"},
        {"summary", json::array()},
        {"content", json::array({{{"type", "reasoning_text"}, {"text", std::string(30u << 20, 'r')}}})}};
    const json big = {{"input", json::array({reasoning, {{"role", "user"}, {"content", "hi"}}})}};
    try {
        parse_request(big);
        ADD_FAILURE() << "expected a 400";
    } catch (const request_error& e) {
        EXPECT_EQ(e.status, 400);
        EXPECT_NE(std::string(e.what()).find("keepwarm's request limit max_text_bytes is 16777216"), std::string::npos)
            << e.what();
    }
}

// Issue 36: llama-server's speculative.n_max, read by the Responses parser as by Chat Completions'.
TEST(responses_api, speculative_n_max_is_read_and_checked) {
    EXPECT_FALSE(parse(R"({"input":"hi"})").chat.draft_max.has_value());
    EXPECT_EQ(parse(R"({"input":"hi","speculative.n_max":0})").chat.draft_max, 0);
    EXPECT_EQ(parse(R"({"input":"hi","speculative.n_max":16})").chat.draft_max, 16);
    expect_400(R"({"input":"hi","speculative.n_max":-5})", "'speculative.n_max' must be an integer between 0 and 1024");
    expect_400(R"({"input":"hi","speculative.n_max":{}})", "'speculative.n_max' must be an integer");
}

// Issue 14, items 3 and 10: the limits a request meets before it reaches the engine. Stop lists share one cap on all
// three APIs; a grammar's widest alternation is what the --max-grammar-alternatives bound counts.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "api/anthropic-api.h"
#include "api/ollama-api.h"
#include "api/openai-api.h"
#include "api/request-limits.h"
#include "api/responses-api.h"
#include "http/http-server.h"
#include "local/prompt-preparation.h"

using namespace keepwarm;
using json = nlohmann::ordered_json;

namespace {

json stops(size_t count, size_t length) {
    json list = json::array();
    for (size_t i = 0; i < count; ++i) list.push_back(std::string(length, 'a') + std::to_string(i));
    return list;
}

json messages() {
    return json::array({{{"role", "user"}, {"content", "hi"}}});
}

// The message of the 400 a parser throws for `body`, or "" when it accepts it.
template <typename Parse>
std::string rejection(Parse parse, const json& body) {
    try {
        parse(body);
    } catch (const request_error& e) {
        EXPECT_EQ(e.status, 400);
        return e.what();
    }
    return "";
}

}  // namespace

TEST(stop_limits, anthropic_stop_sequences_are_capped_like_openai_stop) {
    const auto parse = [](const json& b) { return api::anthropic::parse_messages_request(b); };
    json body = {{"model", "m"}, {"max_tokens", 4}, {"messages", messages()}};
    body["stop_sequences"] = stops(max_stop_strings, 1);
    EXPECT_EQ(rejection(parse, body), "");
    body["stop_sequences"] = stops(10000, 1);
    EXPECT_NE(rejection(parse, body).find("'stop_sequences' has 10000 strings"), std::string::npos);
    body["stop_sequences"] = stops(1, max_stop_bytes + 1);
    EXPECT_NE(rejection(parse, body).find("'stop_sequences[0]' is longer than"), std::string::npos);
}

TEST(stop_limits, openai_and_ollama_cap_the_length_of_each_stop_string) {
    const auto openai = [](const json& b) { return api::parse_chat_request(b); };
    json body = {{"messages", messages()}, {"stop", stops(1, max_stop_bytes + 1)}};
    EXPECT_NE(rejection(openai, body).find("'stop[0]' is longer than"), std::string::npos);
    body["stop"] = stops(max_stop_strings + 1, 1);
    EXPECT_NE(rejection(openai, body).find("'stop'"), std::string::npos);

    const auto ollama = [](const json& b) { return api::ollama::parse_chat_request(b); };
    json chat = {{"model", "m"}, {"messages", messages()}, {"options", {{"stop", stops(1, max_stop_bytes + 1)}}}};
    EXPECT_NE(rejection(ollama, chat).find("'options.stop[0]' is longer than"), std::string::npos);
    chat["options"]["stop"] = stops(max_stop_strings + 1, 1);
    EXPECT_NE(rejection(ollama, chat).find("'options.stop'"), std::string::npos);
}

TEST(grammar_limits, widest_alternation_counts_alternatives_outside_literals_and_classes) {
    EXPECT_EQ(widest_alternation(""), 1u);
    EXPECT_EQ(widest_alternation("root ::= \"a\" | \"b\" | \"c\"\nitem ::= \"x\" | \"y\"\n"), 3u);
    // '|' inside a string literal or a character class is not an alternative, escaped quotes included.
    EXPECT_EQ(widest_alternation("root ::= \"a|b\\\"|c\" [|\\]|] | \"d\"\n"), 2u);
    std::string big_enum = "root ::= ";
    for (int i = 0; i < 2000; ++i) big_enum += (i ? " | " : "") + std::string("\"v") + std::to_string(i) + "\"";
    EXPECT_EQ(widest_alternation(big_enum), 2000u);
}

// Issue 39 (F5): the shared counts and sizes are generous for real agents: a long agent session (25 tools, a few
// thousand messages, 2 MB of text) passes in every API, and each limit is inclusive.
TEST(chat_limits, a_long_agent_session_passes_every_api) {
    json tools = json::array();
    json anthropic_tools = json::array();
    for (int i = 0; i < 25; ++i) {
        const json schema = {{"type", "object"}, {"description", std::string(2000, 'd')}};
        tools.push_back(
            {{"type", "function"}, {"function", {{"name", "tool" + std::to_string(i)}, {"parameters", schema}}}});
        anthropic_tools.push_back({{"name", "tool" + std::to_string(i)}, {"input_schema", schema}});
    }
    json chat = {{"model", "m"}, {"max_tokens", 16}, {"messages", json::array()}, {"tools", tools}};
    json input = json::array();
    for (int i = 0; i < 3000; ++i) {
        const std::string text(700, 'a' + i % 26);
        chat["messages"].push_back({{"role", i % 2 ? "assistant" : "user"}, {"content", text}});
        input.push_back({{"role", i % 2 ? "assistant" : "user"}, {"content", text}});
    }
    EXPECT_EQ(api::parse_chat_request(chat).messages.size(), 3000u);
    EXPECT_EQ(api::ollama::parse_chat_request(chat).messages.size(), 3000u);
    chat["tools"] = anthropic_tools;
    EXPECT_EQ(api::anthropic::parse_messages_request(chat).tools.size(), 25u);
    EXPECT_EQ(api::responses::parse_request({{"input", input}}).chat.messages.size(), 3000u);

    const api::request_limits tight{
        .max_messages = 2, .max_input_items = 2, .max_tools = 1, .max_content_parts = 2, .max_text_bytes = 64};
    const json at_limits = {{"messages", json::array({{{"content", json::array({"a", "b"})}}, 1})},
                            {"tools", json::array({1})}};
    EXPECT_NO_THROW(api::check_request_limits(at_limits, "messages", tight));
    EXPECT_THROW(api::check_request_limits(at_limits, "messages", {.max_messages = 1}), request_error);
    const json items = {{"input", json::array({1, 2})}};
    EXPECT_NO_THROW(api::check_request_limits(items, "input", tight));
    EXPECT_THROW(api::check_request_limits(items, "input", {.max_input_items = 1}), request_error);
}

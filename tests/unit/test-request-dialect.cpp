// Telling a captured request body's API from its shape, and parsing it into the internal chat_request.
#include <gtest/gtest.h>

#include "api/request-dialect.h"
#include "http/http-server.h"

using keepwarm::api::detect_dialect;
using keepwarm::api::json;
using keepwarm::api::request_dialect;

TEST(RequestDialect, OpenAIChat) {
    const json body = json::parse(R"({"model": "m", "max_tokens": 64, "messages": [
        {"role": "system", "content": "be terse"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "ls", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}],
        "tools": [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]})");
    EXPECT_EQ(detect_dialect(body), request_dialect::openai_chat);
    const auto parsed = keepwarm::api::parse_any_chat_body(body);
    EXPECT_EQ(parsed.dialect, request_dialect::openai_chat);
    EXPECT_EQ(parsed.chat.api, "openai");
    ASSERT_EQ(parsed.chat.messages.size(), 4u);
    EXPECT_EQ(parsed.chat.messages[0].content, "be terse");
    ASSERT_EQ(parsed.chat.tools.size(), 1u);
}

TEST(RequestDialect, Anthropic) {
    EXPECT_EQ(detect_dialect(json::parse(R"({"model": "claude", "max_tokens": 64, "system": "be terse",
        "messages": [{"role": "user", "content": "hi"}]})")),
              request_dialect::anthropic_messages);
    EXPECT_EQ(detect_dialect(json::parse(R"({"model": "claude", "max_tokens": 64, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}]})")),
              request_dialect::anthropic_messages);
    EXPECT_EQ(detect_dialect(json::parse(R"({"model": "claude", "max_tokens": 64, "messages": [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "ls", "input": {}}]}]})")),
              request_dialect::anthropic_messages);
    EXPECT_EQ(detect_dialect(json::parse(R"({"model": "claude", "max_tokens": 64, "messages": [],
        "tools": [{"name": "ls", "input_schema": {"type": "object"}}]})")),
              request_dialect::anthropic_messages);
}

TEST(RequestDialect, Ollama) {
    EXPECT_EQ(detect_dialect(json::parse(R"({"model": "qwen3", "messages": [{"role": "user", "content": "hi"}],
        "options": {"num_ctx": 8192}})")),
              request_dialect::ollama_chat);
    EXPECT_EQ(detect_dialect(json::parse(R"({"model": "qwen3", "messages": [{"role": "user", "content": "hi"}],
        "think": false})")),
              request_dialect::ollama_chat);
    EXPECT_EQ(detect_dialect(json::parse(R"({"model": "qwen3", "messages": [{"role": "assistant", "content": "",
        "tool_calls": [{"function": {"name": "ls", "arguments": {"path": "."}}}]}]})")),
              request_dialect::ollama_chat);
    EXPECT_EQ(detect_dialect(json::parse(R"({"model": "qwen3", "prompt": "why is the sky blue?"})")),
              request_dialect::ollama_generate);
}

TEST(RequestDialect, BadOpenAIBodyIsA400NamingTheField) {
    try {
        keepwarm::api::parse_any_chat_body(json::parse(R"({"messages": [{"role": "wizard", "content": "hi"}]})"));
        FAIL() << "accepted an unknown role";
    } catch (const keepwarm::request_error& e) {
        EXPECT_EQ(e.status, 400);
        EXPECT_NE(std::string(e.what()).find("role"), std::string::npos) << e.what();
    }
}

TEST(RequestDialect, AnthropicAndOllamaBodiesParseIntoTheSameChat) {
    const auto anthropic = keepwarm::api::parse_any_chat_body(json::parse(R"({"model": "claude", "system": [
        {"type": "text", "text": "be terse"}], "messages": [{"role": "user", "content": "hi"}]})"));
    EXPECT_EQ(anthropic.dialect, request_dialect::anthropic_messages);
    EXPECT_EQ(anthropic.chat.api, "anthropic");
    const auto ollama = keepwarm::api::parse_any_chat_body(json::parse(R"({"model": "qwen3", "options": {},
        "messages": [{"role": "system", "content": "be terse"}, {"role": "user", "content": "hi"}]})"));
    EXPECT_EQ(ollama.dialect, request_dialect::ollama_chat);
    EXPECT_EQ(ollama.chat.api, "ollama");
    for (const auto* parsed : {&anthropic, &ollama}) {
        ASSERT_EQ(parsed->chat.messages.size(), 2u);
        EXPECT_EQ(parsed->chat.messages[0].role, "system");
        EXPECT_EQ(parsed->chat.messages[0].content, "be terse");
        EXPECT_EQ(parsed->chat.messages[1].content, "hi");
    }
    const auto generate =
        keepwarm::api::parse_any_chat_body(json::parse(R"({"model": "qwen3", "system": "s", "prompt": "why?"})"));
    EXPECT_EQ(generate.dialect, request_dialect::ollama_generate);
    ASSERT_EQ(generate.chat.messages.size(), 2u);
    EXPECT_EQ(generate.chat.messages[1].content, "why?");
    EXPECT_THROW(
        keepwarm::api::parse_any_chat_body(json::parse(R"({"model": "qwen3", "prompt": "raw text", "raw": true})")),
        keepwarm::request_error);
}

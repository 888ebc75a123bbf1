// See request-dialect.h.
#include "api/request-dialect.h"

#include <string_view>

#include "api/anthropic-api.h"
#include "api/ollama-api.h"
#include "base/request-error.h"

namespace keepwarm::api {

namespace {

bool has_object(const json& body, const char* key) {
    return body.contains(key) && body[key].is_object();
}

bool any_message(const json& body, bool (*pred)(const json& message)) {
    if (!body.contains("messages") || !body["messages"].is_array()) return false;
    for (const json& m : body["messages"])
        if (m.is_object() && pred(m)) return true;
    return false;
}

bool anthropic_message(const json& message) {
    if (!message.contains("content") || !message["content"].is_array()) return false;
    for (const json& block : message["content"]) {
        if (!block.is_object()) continue;
        if (block.contains("cache_control")) return true;
        const std::string type = block.value("type", "");
        for (const std::string_view only : {"tool_use", "tool_result", "thinking", "redacted_thinking", "document"})
            if (type == only) return true;
    }
    return false;
}

bool ollama_message(const json& message) {
    if (message.contains("images") || (message.contains("thinking") && message["thinking"].is_string())) return true;
    if (!message.contains("tool_calls") || !message["tool_calls"].is_array()) return false;
    for (const json& call : message["tool_calls"]) {
        if (call.is_object() && has_object(call, "function") && has_object(call["function"], "arguments")) return true;
    }
    return false;
}

bool anthropic_tools(const json& body) {
    if (!body.contains("tools") || !body["tools"].is_array()) return false;
    for (const json& tool : body["tools"])
        if (tool.is_object() && tool.contains("input_schema")) return true;
    return false;
}

}  // namespace

const char* dialect_name(request_dialect dialect) {
    switch (dialect) {
        case request_dialect::openai_chat:
            return "openai chat";
        case request_dialect::anthropic_messages:
            return "anthropic messages";
        case request_dialect::ollama_chat:
            return "ollama chat";
        case request_dialect::ollama_generate:
            return "ollama generate";
    }
    return "openai chat";
}

request_dialect detect_dialect(const json& body) {
    if (!body.is_object()) return request_dialect::openai_chat;
    if (!body.contains("messages") && body.contains("prompt") && body["prompt"].is_string())
        return request_dialect::ollama_generate;
    if (body.contains("anthropic_version") || body.contains("system") || body.contains("stop_sequences") ||
        has_object(body, "thinking") || anthropic_tools(body) || any_message(body, anthropic_message))
        return request_dialect::anthropic_messages;
    if (body.contains("options") || body.contains("format") || body.contains("think") || body.contains("keep_alive") ||
        any_message(body, ollama_message))
        return request_dialect::ollama_chat;
    return request_dialect::openai_chat;
}

dialect_request parse_any_chat_body(const json& body) {
    dialect_request out;
    out.dialect = detect_dialect(body);
    switch (out.dialect) {
        case request_dialect::openai_chat:
            out.chat = parse_chat_request(body);
            out.chat.api = "openai";
            break;
        case request_dialect::anthropic_messages:
            out.chat = anthropic::parse_messages_request(body, anthropic::endpoint::count_tokens);
            out.chat.api = "anthropic";
            break;
        case request_dialect::ollama_chat:
            out.chat = ollama::parse_chat_request(body);
            out.chat.api = "ollama";
            break;
        case request_dialect::ollama_generate: {
            ollama::generate_request generate = ollama::parse_generate_request(body);
            if (generate.raw) {
                throw request_error(400,
                                    "this is a raw Ollama generate body: its prompt is not a chat, so there is "
                                    "no template to render it with");
            }
            out.chat = std::move(generate.chat);
            out.chat.api = "ollama";
            break;
        }
    }
    return out;
}

}  // namespace keepwarm::api

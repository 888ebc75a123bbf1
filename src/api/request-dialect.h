// Which API a captured request body was written for (OpenAI chat, Anthropic Messages, Ollama chat or generate),
// told from its shape alone, and its parse into the one internal chat_request, for tools that read bodies without
// a route (`keepwarm doctor`).
#pragma once

#include <nlohmann/json.hpp>

#include "api/openai-api.h"

namespace keepwarm::api {

enum class request_dialect { openai_chat, anthropic_messages, ollama_chat, ollama_generate };

// "openai chat", "anthropic messages", "ollama chat", "ollama generate".
const char* dialect_name(request_dialect dialect);

// From the body's fields, in this order:
//   - Ollama generate: a string `prompt` and no `messages` (/api/generate);
//   - Anthropic: `anthropic_version`, a top-level `system`, `stop_sequences`, a `thinking` object, tools with an
//     `input_schema`, or content blocks only Anthropic has (tool_use, tool_result, thinking, redacted_thinking,
//     document, `cache_control`). Plain text blocks with `max_tokens` are OpenAI's too and decide nothing;
//   - Ollama chat: `options`, `format`, `think`, `keep_alive`, or messages with `images`, a `thinking` string or
//     tool-call arguments as an object;
//   - else OpenAI chat (`messages` with role/content, optional `tools`, ...).
request_dialect detect_dialect(const json& body);

struct dialect_request {
    request_dialect dialect = request_dialect::openai_chat;
    chat_request chat;
};

// Detects the dialect and parses the body with that API's parser (an Anthropic body's max_tokens is optional here,
// as in count_tokens). Throws request_error(400) naming the problem when the body is not a valid request of its
// API, or is a raw Ollama generate body (a prompt, not a chat).
dialect_request parse_any_chat_body(const json& body);

}  // namespace keepwarm::api

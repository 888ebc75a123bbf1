// The Anthropic Messages API routes: POST /v1/messages (whole or streamed as Anthropic's server-sent events) and
// POST /v1/messages/count_tokens. Errors answer in Anthropic's error shape.
#pragma once

#include <functional>

#include "http/http-server.h"
#include "local/chat-generation.h"
#include "routes/server-context.h"

namespace keepwarm {

// Counts a parsed count_tokens request's prompt tokens (the policy applied as for counting). Throws request_error.
using token_counter = std::function<int(const http::request&, const chat_request&)>;

// Messages go to `open` (default: this server's engine); count_tokens to `count` (default: this server's template and
// tokenizer).
void register_anthropic_routes(http::http_server& server, server_context& ctx, generation_opener open = nullptr,
                               token_counter count = nullptr);

}  // namespace keepwarm

// The Anthropic Messages API routes: POST /v1/messages (whole or streamed as Anthropic's server-sent events) and
// POST /v1/messages/count_tokens. Errors answer in Anthropic's error shape.
#pragma once

#include "http/http-server.h"
#include "server/chat-generation.h"
#include "server/server-context.h"

namespace keepwarm {

// Messages go to `open` (default: this server's engine). Without a local engine (ctx.llm null: `keepwarm proxy`)
// count_tokens answers 501: counting needs the local model's template and tokenizer.
void register_anthropic_routes(http::http_server& server, server_context& ctx, generation_opener open = nullptr);

}  // namespace keepwarm

// The OpenAI-compatible generation routes: POST /v1/chat/completions and POST /v1/completions.
#pragma once

#include "http/http-server.h"
#include "server/chat-generation.h"
#include "server/server-context.h"

namespace keepwarm {

// Chat requests go to `open` (default: this server's engine). Without a local engine (ctx.llm null: `keepwarm proxy`)
// /v1/completions answers 501: a raw prompt is tokenized by the local model.
void register_openai_routes(http::http_server& server, server_context& ctx, generation_opener open = nullptr);

}  // namespace keepwarm

// The OpenAI-compatible generation routes: POST /v1/chat/completions and POST /v1/completions.
#pragma once

#include "http/http-server.h"
#include "local/chat-generation.h"
#include "routes/generation-relay.h"
#include "routes/server-context.h"

namespace keepwarm {

// Chat requests go to `open` (default: this server's engine), raw-prompt completions to `completion` (default: this
// server's engine; `keepwarm proxy` forwards them).
void register_openai_routes(http::http_server& server, server_context& ctx, generation_opener open = nullptr,
                            generation_handler completion = nullptr);

}  // namespace keepwarm

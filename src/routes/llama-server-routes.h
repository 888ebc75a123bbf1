// llama-server's native routes, for tools written against it: POST /completion (and its alias /completions) and
// POST /infill through the raw-completion path, answered in llama-server's own shapes (whole, or streamed as
// server-sent events without a closing [DONE]); POST /apply-template through the chat renderer. Errors are
// llama-server's {"error": {"code", "message", "type"}}.
// Threading: handlers run on their connection's thread.
#pragma once

#include "backend/frontend-context.h"
#include "backend/generation-source.h"
#include "chat/chat-renderer.h"
#include "http/http-server.h"

namespace keepwarm {

// `open`: the backend's raw completions (a local model's, local/raw-generation.h). `renderer`: the model's chat
// template for /apply-template; null where there is none (the route is then not registered).
void register_llama_server_routes(http::http_server& server, frontend_context& ctx, raw_generation_opener open,
                                  const chat_renderer* renderer);

}  // namespace keepwarm

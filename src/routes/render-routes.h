// vLLM's render routes, which llm-d's endpoint picker (its `token-producer`) and `keepwarm proxy` call for a
// request's prompt token ids without generating: POST /v1/chat/completions/render (a Chat Completions body; one
// vLLM GenerateRequest object back) and POST /v1/completions/render (a Completions body; an array of one). The ids
// are those the backend would give the same request's prompt, so they hash as the blocks it caches and publishes.
// Bodies and errors are those of the matching generation route (OpenAI's error shape).
// Threading: handlers run on their connection's thread.
#pragma once

#include "backend/frontend-context.h"
#include "backend/generation-source.h"
#include "http/http-server.h"

namespace keepwarm {

// `chat` and `raw`: the backend's prompt renderers (a local model's, local/chat-generation.h, local/raw-generation.h).
void register_render_routes(http::http_server& server, frontend_context& ctx, chat_prompt_renderer chat,
                            raw_prompt_renderer raw);

}  // namespace keepwarm

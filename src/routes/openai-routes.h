// The OpenAI-compatible generation routes: POST /v1/chat/completions, POST /v1/completions and the Responses API's
// POST /v1/responses (routes/responses-routes.h).
#pragma once

#include "backend/frontend-context.h"
#include "backend/generation-source.h"
#include "http/http-server.h"
#include "routes/generation-route.h"
#include "routes/response-store.h"

namespace keepwarm {

// Chat requests go to `open` (the backend's chat generations), raw-prompt completions to `completion`: on a local
// model openai_completions(), while `keepwarm proxy` forwards them (proxy/upstream-completion.h). The Responses API
// keeps its stored responses in `store`, which outlives the server.
void register_openai_routes(http::http_server& server, frontend_context& ctx, generation_opener open,
                            generation_handler completion, response_store& store);

// A /v1/completions body as the raw completion it asks for (also what its render route tokenizes).
raw_completion openai_raw_completion(completion_request comp);

// /v1/completions through the raw-completion path: the body becomes a raw_completion, `open` applies the policy
// and generates, and the text comes back as OpenAI's completion (whole or streamed).
generation_handler openai_completions(raw_generation_opener open);

}  // namespace keepwarm

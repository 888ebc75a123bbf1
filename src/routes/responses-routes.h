// OpenAI's Responses API route, POST /v1/responses (and /responses), over a generation_source: what Codex speaks.
// Registered by register_openai_routes, so `keepwarm serve` and `keepwarm proxy` (any upstream dialect) both have it.
#pragma once

#include "backend/frontend-context.h"
#include "backend/generation-source.h"
#include "http/http-server.h"
#include "routes/response-store.h"

namespace keepwarm {

void register_responses_routes(http::http_server& server, frontend_context& ctx, generation_opener open,
                               response_store& store);

}  // namespace keepwarm

// The Anthropic Messages API routes: POST /v1/messages (whole or streamed as Anthropic's server-sent events) and
// POST /v1/messages/count_tokens. Errors answer in Anthropic's error shape.
#pragma once

#include <functional>

#include "backend/frontend-context.h"
#include "backend/generation-source.h"
#include "http/http-server.h"
#include "routes/generation-route.h"

namespace keepwarm {

// Messages go to `open` (the backend's chat generations); count_tokens to `count` (the local model's template and
// tokenizer, or the upstream the request would go to).
void register_anthropic_routes(http::http_server& server, frontend_context& ctx, generation_opener open,
                               token_counter count);

}  // namespace keepwarm

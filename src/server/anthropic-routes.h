// The Anthropic Messages API routes: POST /v1/messages (whole or streamed as Anthropic's server-sent events) and
// POST /v1/messages/count_tokens. Errors answer in Anthropic's error shape.
#pragma once

#include "http/http-server.h"
#include "server/server-context.h"

namespace keepwarm {

void register_anthropic_routes(http::http_server& server, server_context& ctx);

}  // namespace keepwarm

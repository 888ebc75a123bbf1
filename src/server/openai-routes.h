// The OpenAI-compatible generation routes: POST /v1/chat/completions and POST /v1/completions.
#pragma once

#include "http/http-server.h"
#include "server/server-context.h"

namespace keepwarm {

void register_openai_routes(http::http_server& server, server_context& ctx);

}  // namespace keepwarm

// llama-server's tokenizer routes, for clients and tests that need token ids: POST /tokenize, POST /detokenize.
#pragma once

#include "http/http-server.h"
#include "routes/server-context.h"

namespace keepwarm {

void register_tokenizer_routes(http::http_server& server, server_context& ctx);

}  // namespace keepwarm

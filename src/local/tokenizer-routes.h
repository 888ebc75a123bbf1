// llama-server's tokenizer routes, for clients and tests that need token ids: POST /tokenize, POST /detokenize.
#pragma once

#include "http/http-server.h"
#include "local/local-model.h"

namespace keepwarm {

void register_tokenizer_routes(http::http_server& server, local_model& model);

}  // namespace keepwarm

// The HTTP face of `keepwarm serve` with several models: the routes the router answers itself (the model listings of
// OpenAI, llama-server and Ollama, POST /models/load and /models/unload, /health, /metrics) and every other route,
// forwarded as it is to the server of the model the request names ("model" in a JSON body, else ?model=) and its
// answer relayed back piece by piece (SSE and NDJSON streams as they come). A client that goes away cancels the call
// to the model's server, which then cancels the generation.
// Threading: registered once before the server opens; handlers run on the connections' threads.
#pragma once

#include <string>

#include "http/http-server.h"
#include "router/model-router.h"

namespace keepwarm::router {

// What the routes take from the API layers, which the router does not include.
struct api_shapes {
    http::error_formatter openai;     // every route but the two below
    http::error_formatter anthropic;  // /v1/messages...
    http::error_formatter ollama;     // /api/...
    std::string ollama_version_json;  // GET /api/version's body
};

void register_router_routes(http::http_server& server, model_router& router, const api_shapes& shapes);

// The listings' JSON, for tests: OpenAI's /v1/models with llama-server's per-model status, and Ollama's /api/tags and
// /api/ps.
std::string models_list_json(const model_router& router);
std::string ollama_tags_json(const model_router& router, bool loaded_only);
std::string router_metrics_text(const model_router& router);

}  // namespace keepwarm::router

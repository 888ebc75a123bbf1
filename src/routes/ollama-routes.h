// The Ollama API: POST /api/chat, /api/generate and /api/show; GET /api/tags, /api/ps and /api/version; GET and
// HEAD / ("Ollama is running", which clients probe). Errors in Ollama's shape, {"error": "..."}.
#pragma once

#include <optional>
#include <string>

#include "api/ollama-api.h"
#include "backend/frontend-context.h"
#include "backend/generation-source.h"
#include "http/http-server.h"
#include "routes/generation-route.h"

namespace keepwarm {

// The generation routes, /api/version and the probes; any other path under /api/ is a 404 in Ollama's shape. Chat and
// templated generate requests go to `open`, raw ones (raw=true) to `open_raw`. `thinking_mode`: whether the model's
// chat template has one (a request asking for `think` without it is refused, as Ollama does); nullopt where it is not
// known here (`keepwarm proxy`: the upstream decides).
void register_ollama_routes(http::http_server& server, frontend_context& ctx, generation_opener open,
                            raw_generation_opener open_raw, std::optional<bool> thinking_mode);

// /api/tags, /api/show and /api/ps from a local model's card.
void register_ollama_model_routes(http::http_server& server, api::ollama::model_card card);
// The same routes through `keepwarm proxy`: /api/tags lists `model_id` alone; /api/show and /api/ps, which need the
// local model, answer 501.
void register_ollama_proxy_model_routes(http::http_server& server, const std::string& model_id);

}  // namespace keepwarm

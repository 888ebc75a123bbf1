// Routes that report on `keepwarm serve` rather than run the model: /health, /metrics, /v1/models (and
// /v1/models/{id}), /v1/policy, /v1/cache (the prefix cache: tiers, bytes, entries, hit/miss/eviction counts, and the
// prompt index), and llama-server's /slots and /props.
#pragma once

#include <string>

#include "http/http-server.h"
#include "local/local-model.h"
#include "routes/frontend-context.h"

namespace keepwarm {

void register_local_status_routes(http::http_server& server, frontend_context& front, local_model& model);

// Prometheus text exposition of the engine, prompt index and HTTP counters.
std::string render_metrics(const frontend_context& front, const local_model& model);

}  // namespace keepwarm

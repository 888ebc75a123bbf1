// Routes that report on the server rather than run the model: /health, /metrics, /v1/models, /v1/cache (the prefix
// cache: tiers, bytes, entries, hit/miss/eviction counts).
#pragma once

#include "http/http-server.h"
#include "routes/metrics-text.h"
#include "routes/server-context.h"

namespace keepwarm {

void register_status_routes(http::http_server& server, server_context& ctx);

// Prometheus text exposition of the engine and HTTP counters.
std::string render_metrics(const server_context& ctx);

// The API routes' counters (requests per API, 4xx answers, clients gone early): served by `keepwarm serve` and
// `keepwarm proxy` alike.
void write_http_metrics(metrics_text& out, const http_counters& c);

}  // namespace keepwarm

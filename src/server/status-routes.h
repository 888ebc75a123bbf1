// Routes that report on the server rather than run the model: /health, /metrics, /v1/models, /v1/cache (the prefix
// cache: tiers, bytes, entries, hit/miss/eviction counts).
#pragma once

#include "http/http-server.h"
#include "server/server-context.h"

namespace keepwarm {

void register_status_routes(http::http_server& server, server_context& ctx);

// Prometheus text exposition of the engine and HTTP counters.
std::string render_metrics(const server_context& ctx);

}  // namespace keepwarm

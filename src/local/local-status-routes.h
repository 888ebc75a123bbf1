// Routes that report on `keepwarm serve` rather than run the model: /health, /metrics, /v1/policy, /v1/cache (the
// prefix cache: tiers, bytes, entries, hit/miss/eviction counts, and the prompt index), and llama-server's /slots and
// /props.
#pragma once

#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/frontend-context.h"
#include "http/http-server.h"
#include "local/local-model.h"

namespace keepwarm {

void register_local_status_routes(http::http_server& server, frontend_context& front, local_model& model);

// What /v1/models says of the local model besides its name (its "meta": path, context sizes, slots, whether its
// weights are random), for routes/models-routes.h.
nlohmann::ordered_json local_model_meta(const local_model& model);

// What llama-server's throughput gauges (llamacpp:prompt_tokens_seconds, llamacpp:predicted_tokens_seconds) are
// measured from: the totals at the previous scrape. Guarded by mu.
struct llamacpp_scrape_window {
    std::mutex mu;
    uint64_t prompt_n = 0, prompt_us = 0;        // guarded by mu
    uint64_t predicted_n = 0, predicted_us = 0;  // guarded by mu
};

// Prometheus text exposition of the engine, prompt index and HTTP counters, and llama-server's llamacpp: families
// (their throughput gauges since the scrape `window` saw last, which this call moves on; null: since the start).
std::string render_metrics(const frontend_context& front, const local_model& model,
                           llamacpp_scrape_window* window = nullptr);

}  // namespace keepwarm

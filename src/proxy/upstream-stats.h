// What `keepwarm proxy` reports about itself and its upstreams: added_latency, the proxy's own share of each
// request's time to first token (a window of recent requests for percentiles, histograms of every request), and the
// text of GET /v1/cache and GET /metrics, made from one snapshot per upstream of what routing, health and the
// connection pool know.
// Threading: added_latency may be used from any thread (one mutex guards it); the renderers are pure functions.
#pragma once

#include <cstddef>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/metrics-text.h"
#include "proxy/kv-block-index.h"
#include "proxy/upstream-connections.h"
#include "proxy/upstream-dialects.h"
#include "proxy/upstream-router.h"

namespace keepwarm::proxy {

class added_latency {
public:
    // Percentiles cover the last `window` requests; the histograms every request since the start.
    explicit added_latency(size_t window = 65536);

    // One request: from receiving it to sending it upstream (forward), and from reading its first delta's bytes to
    // handing the delta to the route (first_delta), in milliseconds.
    void record(double forward_ms, double first_delta_ms);

    // /v1/cache's "overhead_ms": requests (every one recorded), window (how many the percentiles cover), and per
    // phase (forward, first_delta, total) {p50, p99, max}, or null before the first request.
    nlohmann::ordered_json summary() const;
    // The histogram family keepwarm_proxy_added_latency_seconds, one series per phase, in seconds.
    void write_metrics(metrics_text& out) const;

private:
    const size_t window_;
    mutable std::mutex mu_;
    std::vector<float> forward_, first_delta_;  // guarded by mu_: ring buffers of the last window_ requests
    size_t next_ = 0;                           // guarded by mu_: where the next request goes in the rings
    latency_histogram forward_hist_, first_delta_hist_, total_hist_;  // guarded by mu_
};

// What the proxy knows of one upstream at one moment.
struct upstream_snapshot {
    std::string url;
    upstream_dialect dialect = upstream_dialect::openai;
    std::string model;                // configured, else the one its health answer listed; empty: not known yet
    std::vector<std::string> models;  // every model it serves (upstream_pool::served_models)
    bool healthy = false;
    upstream_router::upstream_stats routing;
    upstream_connections::counts connections;
    std::string events;                 // its KV-events endpoint; empty: it publishes none (to the proxy)
    kv_block_index::upstream_stats kv;  // what its events told, when it has an endpoint
};

// GET /v1/cache on the proxy: per upstream its URL, dialect, model, the models it serves, health, requests, estimated
// prefix hits, in-flight load, prefix tree and connections; the proxy's added latency (`overhead`:
// added_latency::summary()); the routing options.
nlohmann::ordered_json cache_json(const std::vector<upstream_snapshot>& upstreams, nlohmann::ordered_json overhead,
                                  const router_options& routing);
// GET /metrics on the proxy: the same per upstream as counters and gauges labelled with its URL.
void write_upstream_metrics(metrics_text& out, const std::vector<upstream_snapshot>& upstreams);

}  // namespace keepwarm::proxy

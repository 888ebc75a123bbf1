// The upstream engines behind `keepwarm proxy`: their configuration, their health (polled with a call that never runs
// inference), the model each one serves, and the cache-aware router that picks one per request.
// Threading: every member function may be called from any thread; one mutex guards the router and what the health
// checks learned.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "http/http-client.h"
#include "proxy/upstream-dialects.h"
#include "proxy/upstream-router.h"

namespace keepwarm::proxy {

struct upstream_config {
    http::endpoint origin;
    upstream_dialect dialect = upstream_dialect::openai;
    std::string model;    // the one model sent to it; empty: the first one its health answer lists
    std::string api_key;  // sent in the header its API reads; empty: none

    // "URL[,dialect=openai|anthropic|ollama][,model=NAME][,key=KEY]". Throws std::invalid_argument naming the part.
    static upstream_config parse(const std::string& spec);
};

struct pool_options {
    router_options routing;
    std::chrono::milliseconds health_interval{1000};
    std::chrono::milliseconds health_timeout{2000};
};

class upstream_pool {
public:
    upstream_pool(std::vector<upstream_config> upstreams, pool_options options);
    ~upstream_pool();  // stops the health checks
    upstream_pool(const upstream_pool&) = delete;
    upstream_pool& operator=(const upstream_pool&) = delete;

    // Checks every upstream once, then keeps checking every health_interval on a thread of its own.
    void start_health_checks();

    // Where one request goes.
    struct route {
        size_t upstream = 0;
        const upstream_config* config = nullptr;
        std::string model;  // what to send as the model name
        size_t matched_blocks = 0;
    };
    // Picks an upstream (see upstream_router) among healthy ones not in `excluded` and counts the request in flight
    // there until release(); nullopt when none is left. `fallback_model` is sent when the upstream's model is unknown.
    std::optional<route> acquire(std::span<const uint64_t> blocks, const std::vector<size_t>& excluded,
                                 const std::string& fallback_model);
    void release(size_t upstream);
    // A call to it failed below HTTP: it is down until a health check sees it answer (its tree is forgotten then).
    void mark_down(size_t upstream);

    size_t size() const { return upstreams_.size(); }
    const router_options& routing() const { return options_.routing; }
    size_t healthy_count() const;
    // GET /v1/cache on the proxy: per upstream its URL, dialect, model, health, requests, estimated prefix hits,
    // in-flight load, and the size of its prefix tree.
    nlohmann::ordered_json cache_json() const;

private:
    void check_all();
    void health_loop();

    const std::vector<upstream_config> upstreams_;
    const pool_options options_;

    mutable std::mutex mu_;
    upstream_router router_;                  // guarded by mu_
    std::vector<std::string> listed_models_;  // guarded by mu_: what each health answer listed first
    bool stopping_ = false;                   // guarded by mu_
    std::condition_variable stop_cv_;
    std::thread health_thread_;
};

}  // namespace keepwarm::proxy

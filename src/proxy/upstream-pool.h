// The upstream engines behind `keepwarm proxy`: their configuration, their health (polled with a call that never runs
// inference), the model each one serves, and the cache-aware router that picks one per request.
// Threading: every member function may be called from any thread; one mutex guards the router and what the health
// checks learned.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
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
#include "routes/metrics-text.h"

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
    // Token texts the policy's forced logit biases name: resolved to each OpenAI-dialect upstream's token ids through
    // its POST /tokenize (keepwarm and llama-server have it) when a health check finds it up.
    std::vector<std::string> bias_texts;
    size_t max_idle_connections = 32;  // kept-alive connections per upstream
    // How long a request waits for its answer's first byte: minutes, because a cold prompt is prefilled before it
    // (30K tokens at a CPU's 50 tokens/s take 10 minutes); cutting a real answer costs more than waiting on a hung
    // upstream, which is named in the error and taken out of routing when this runs out.
    std::chrono::milliseconds first_byte_timeout{std::chrono::minutes(10)};
    // How long an answer that flows may pause between two pieces: a healthy upstream sends one per token, and its
    // longest pause is another request's prompt batch decoded between two of this one's tokens (2048 tokens at a
    // slow CPU's 20 tokens/s: about 100 s).
    std::chrono::milliseconds idle_timeout{std::chrono::minutes(2)};
    // Tenants: an upstream without a key of its own gets the client's key, so a keepwarm upstream with the same keys
    // file keeps the tenants apart too (its cache would otherwise be one, shared by every tenant of the proxy).
    bool forward_client_keys = false;
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
    // Where a request would go now, without sending it there (count_tokens): nothing is counted or remembered.
    std::optional<route> peek(std::span<const uint64_t> blocks, const std::string& fallback_model) const;
    // A call to it failed below HTTP or timed out: it is down until a health check sees it answer (its tree is
    // forgotten then). `why` goes into the log.
    void mark_down(size_t upstream, const std::string& why = "a call failed");

    // The key to send upstream for a client that authenticated with `client_key` (may be empty): the upstream's own,
    // else the client's when forward_client_keys, else none.
    std::string credential(size_t upstream, const std::string& client_key) const;

    // A connection to this upstream: an idle kept-alive one when there is one, else a new one.
    std::unique_ptr<http::client_connection> connection(size_t upstream);
    // A connection whose last response was read to its end waits for the upstream's next request (at most
    // max_idle_connections per upstream; idle ones are dropped when the upstream goes down).
    void keep_alive(size_t upstream, std::unique_ptr<http::client_connection> conn);

    // The token `text` is for this upstream's model; nullopt: unknown (another dialect, no /tokenize, not yet asked)
    // or not one token there.
    std::optional<int32_t> bias_token(size_t upstream, const std::string& text) const;

    // What the proxy added to one request's time to first token: from receiving it to sending it upstream, and from
    // reading the first delta's bytes to handing the delta to the route. The last 65536 requests are kept for the
    // percentiles in cache_json(); every request is counted in the histograms of write_metrics().
    void record_overhead(double forward_ms, double first_delta_ms);

    size_t size() const { return upstreams_.size(); }
    const upstream_config& config(size_t upstream) const { return upstreams_.at(upstream); }
    const router_options& routing() const { return options_.routing; }
    // What a request's connection to an upstream waits for (the pool's timeouts) and reads whole at most (an error
    // answer's body).
    http::client_options request_options() const;
    size_t healthy_count() const;
    // GET /v1/cache on the proxy: per upstream its URL, dialect, model, health, requests, estimated prefix hits,
    // in-flight load, and the size of its prefix tree.
    nlohmann::ordered_json cache_json() const;
    // GET /metrics on the proxy: the same per upstream (labelled with its URL), connections, and the proxy's own
    // share of time to first token as histograms (phase forward, first_delta, total).
    void write_metrics(metrics_text& out) const;

private:
    void check_all();
    void health_loop();
    route route_for(const upstream_router::decision& d, const std::string& fallback_model) const;  // holds mu_
    // Asks upstream `i` for the token of each bias text; -1 for a text that is not one token. Empty when it cannot say.
    // The bias texts' token ids at upstream i (an empty map: they cannot be bound there); nullopt after a failure
    // that may pass, to be asked again. Health-check thread only.
    std::optional<std::map<std::string, int32_t>> resolve_bias_tokens(size_t i, const http::client_options& client);

    const std::vector<upstream_config> upstreams_;
    const pool_options options_;

    mutable std::mutex mu_;
    upstream_router router_;                  // guarded by mu_
    std::vector<std::string> listed_models_;  // guarded by mu_: what each health answer listed first
    struct connection_pool {
        std::vector<std::unique_ptr<http::client_connection>> idle;
        uint64_t opened = 0;  // connections made for requests (not counting health checks)
        uint64_t reused = 0;  // requests sent on a kept-alive connection
    };
    std::vector<connection_pool> connections_;  // guarded by mu_
    struct overhead_samples {
        std::vector<float> forward, first_delta;  // ring buffers
        size_t next = 0;
        latency_histogram forward_hist, first_delta_hist,
            total_hist;  // every request since the start (and their count)
    };
    overhead_samples overhead_;  // guarded by mu_
    // guarded by mu_: per upstream, bias text -> token (-1: not one token); nullopt until asked while it was up
    std::vector<std::optional<std::map<std::string, int32_t>>> bias_tokens_;
    std::vector<int> bias_retries_;  // health-check thread only: failed attempts in a row, per upstream
    bool stopping_ = false;          // guarded by mu_
    std::condition_variable stop_cv_;
    std::thread health_thread_;
};

}  // namespace keepwarm::proxy

// The upstream engines behind `keepwarm proxy`, as the request path sees them: one object that composes the parts,
// each with one job, its own lock and its own tests:
//   upstream_router       where a request goes (cache-aware, pure; upstream-router.h)
//   kv_block_index        which token blocks the upstreams that publish KV events hold (pure; kv-block-index.h),
//                         fed by kv_event_subscriber's thread (kv-event-subscriber.h)
//   upstream_health       the checker thread and each upstream's up/down state (upstream-health.h)
//   upstream_connections  the kept-alive idle connections per upstream (upstream-connections.h)
//   bias_tokens           the policy's bias texts as each upstream's token ids (upstream-bias-tokens.h)
//   added_latency         the proxy's own share of time to first token (upstream-stats.h, with the /v1/cache and
//                         /metrics text)
// The health checks drive the others: an upstream found down is taken out of routing and loses its idle connections
// and its bias tokens; one found up is routed to again (its prefix tree starts empty) and asked for its bias tokens.
// Threading: every member function may be called from any thread. router_mu_ guards the router and the block index
// (one decision reads both); the other parts
// guard themselves. Lock order: the health lock, then any other (the health hook takes them under it); the pool
// never calls into upstream_health while it holds router_mu_.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/metrics-text.h"
#include "http/http-client.h"
#include "proxy/kv-block-index.h"
#include "proxy/kv-event-subscriber.h"
#include "proxy/upstream-bias-tokens.h"
#include "proxy/upstream-config.h"
#include "proxy/upstream-connections.h"
#include "proxy/upstream-dialects.h"
#include "proxy/upstream-health.h"
#include "proxy/upstream-router.h"
#include "proxy/upstream-stats.h"

namespace keepwarm::proxy {

struct pool_options {
    router_options routing;
    std::chrono::milliseconds health_interval{1000};
    std::chrono::milliseconds health_timeout{2000};
    int health_failures = 3;  // checks in a row that must fail before an upstream that answered is down
    // Token texts the policy's forced logit biases name: resolved to each OpenAI-dialect upstream's token ids through
    // its POST /tokenize (keepwarm and llama-server have it) when a health check finds it up.
    std::vector<std::string> bias_texts;
    size_t max_idle_connections = 32;  // kept-alive connections per upstream
    // How long a request waits for its answer's first byte: minutes, because a cold prompt is prefilled before it
    // (30K tokens at a CPU's 50 tokens/s take 10 minutes); cutting a real answer costs more than waiting on a hung
    // upstream, which is named in the error and taken out of routing when this runs out.
    std::chrono::milliseconds first_byte_timeout{std::chrono::minutes(10)};
    // How long an answer that flows may pause between two deltas: a healthy upstream sends one per token, and its
    // longest pause is another request's prompt batch decoded between two of this one's tokens (2048 tokens at a
    // slow CPU's 20 tokens/s: about 100 s). Before the first delta, first_byte_timeout counts from sending the
    // request. Bytes that carry no content (SSE keep-alive comments, empty events, a byte a second) are not progress:
    // an upstream that sends only those is cut off at the same time as one that sends nothing.
    std::chrono::milliseconds idle_timeout{std::chrono::minutes(2)};
    // How long a request whose client takes the answer whole (not streamed) may wait for all of it: a cold prefill
    // (first_byte_timeout) and a long answer after it. A streamed answer has no such bound: its client sees it grow.
    std::chrono::milliseconds answer_timeout{std::chrono::minutes(30)};
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

    // Checks every upstream once, then keeps checking every health_interval on a thread of its own; subscribes to
    // the KV events of the upstreams that publish them (their `events`), on another.
    void start_health_checks();

    // Where one request goes.
    struct route {
        size_t upstream = 0;
        const upstream_config* config = nullptr;
        std::string model;  // what to send as the model name
        size_t matched_blocks = 0;
    };
    // Picks an upstream (see upstream_router) among healthy ones not in `excluded` that serve `model` (the request's
    // name after the policy: see upstreams_not_serving; when no upstream serves it, among all) and counts the request
    // in flight there until release(); nullopt when none is left. `key`: the request's routing_key() (0: none).
    // The model sent is `model` when the upstream serves it, else its spec's model=, else the first it lists, else
    // `model`.
    // `tokens`: the prompt's token ids as the upstreams tokenize it (prompt_tokens()); given, and some upstream's KV
    // events say it holds a prefix of them, the request goes by those (upstream_router::choose_held) instead.
    std::optional<route> acquire(std::span<const uint64_t> blocks, const std::vector<size_t>& excluded,
                                 const std::string& model, uint64_t key = 0, std::span<const int32_t> tokens = {});
    void release(size_t upstream);
    // Where a request would go now, without sending it there (count_tokens): nothing is counted or remembered.
    std::optional<route> peek(std::span<const uint64_t> blocks, const std::string& model, uint64_t key = 0) const;
    // A call to it failed below HTTP or timed out: it is down until a health check sees it answer (its tree is
    // forgotten then). `why` goes into the log.
    void mark_down(size_t upstream, const std::string& why = "a call failed");

    // Whether some upstream publishes KV events and is in step with the proxy now: only then is a request worth
    // tokenizing for routing.
    bool routes_by_events() const;
    // The prompt's token ids as an upstream in step renders and tokenizes it for `model`: the ids its KV events hold
    // a prefix of. One call to its POST /v1/chat/completions/render (vLLM's route, keepwarm serve's: the ids it
    // computes itself, the model's own for answers that come back as history), else two, POST /apply-template then
    // POST /tokenize (llama-server). Empty when no such upstream answers (routing then infers). Never throws.
    std::vector<int32_t> prompt_tokens(const chat_request& chat, const std::string& model,
                                       const std::string& client_key) const;

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
    // The pool's options as configured (the answer timeouts a request's progress is held to).
    const pool_options& options() const { return options_; }
    size_t healthy_count() const;
    // The models upstream i serves: its spec's model= (if any), then what its last health answer listed.
    std::vector<std::string> served_models(size_t upstream) const;
    // Every upstream's served_models(), each name once, in upstream order (the proxy's GET /v1/models).
    std::vector<std::string> all_models() const;
    // GET /v1/cache on the proxy: per upstream its URL, dialect, model, health, requests, estimated prefix hits,
    // in-flight load, the size of its prefix tree, and the models it serves.
    nlohmann::ordered_json cache_json() const;
    // GET /metrics on the proxy: the same per upstream (labelled with its URL), connections, and the proxy's own
    // share of time to first token as histograms (phase forward, first_delta, total).
    void write_metrics(metrics_text& out) const;

private:
    // The route for a decision; takes the health lock (for the listed model), so never called under router_mu_.
    route route_for(const upstream_router::decision& d, const std::string& model) const;
    // `excluded` and the upstreams that do not serve `model` (upstreams_not_serving); takes the health lock.
    std::vector<size_t> excluded_for(const std::vector<size_t>& excluded, const std::string& model) const;
    // What each part knows of every upstream now (taken part by part, not as one instant).
    std::vector<upstream_snapshot> snapshot() const;
    // How many of `tokens`' blocks each upstream's events say it holds (0 for those without); caller holds router_mu_.
    std::vector<size_t> held_blocks(std::span<const int32_t> tokens) const;
    // What a health check or a failed call said, passed on to routing, connections and bias tokens (under the
    // health lock).
    void on_health(const health_event& e);

    const std::vector<upstream_config> upstreams_;
    const pool_options options_;

    mutable std::mutex router_mu_;
    upstream_router router_;      // guarded by router_mu_
    kv_block_index block_index_;  // guarded by router_mu_
    upstream_connections connections_;
    // prompt_tokens()' calls (render, or apply-template and tokenize), on connections of their own: their timeouts
    // are short, a request's are long. Mutable: a pool of connections, thread-safe, not the pool's state.
    mutable upstream_connections routing_connections_;
    bias_tokens bias_tokens_;
    // Per upstream: it answered the render route with 404, 405 or 501 (llama-server has none), so prompt_tokens goes
    // straight to the two calls; asked again once a health check has found it down (it may come back as another
    // server).
    std::unique_ptr<std::atomic<bool>[]> without_render_;
    added_latency latency_;
    upstream_health health_;          // destroyed before the parts its hooks reach, so its thread stops first
    kv_event_subscriber subscriber_;  // last: destroyed first, its thread stopped before the index goes
};

}  // namespace keepwarm::proxy

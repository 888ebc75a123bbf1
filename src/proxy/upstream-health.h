// Whether each upstream engine behind `keepwarm proxy` is up: a checker thread asks every upstream each interval with
// a call that never runs inference (GET /v1/models, or /api/tags for Ollama) and keeps what its answer listed (its
// models, bounded as parse_listing says, and its running instance). An upstream that has answered goes down only after
// `failures_to_down` checks in a row fail (one late answer from a busy upstream must not turn every request away, when
// it is the only one); one never seen up is down at its first failed check. A call on the request path that fails below
// HTTP marks an upstream down at once, until a check sees it answer again. Whoever builds it learns of every check and
// change through two hooks; the pool passes them on to routing, idle connections and bias tokens. Threading: every
// member function may be called from any thread. One mutex (mu_) guards the up/down state, and hooks.on_state runs
// under it, so that what it is told keeps the order of the changes; on_state must not call back into this object (lock
// order: this mutex, then whatever on_state takes). hooks.after_up runs on the checking thread with no lock held.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "http/http-client.h"
#include "proxy/upstream-config.h"

namespace keepwarm::proxy {

struct health_options {
    std::chrono::milliseconds interval{1000};  // between two rounds of checks
    std::chrono::milliseconds timeout{2000};   // for each check's connect, request and answer
    int failures_to_down = 3;                  // checks in a row that must fail before an upstream that was up is down
};

// What a check or a failed call said of one upstream.
struct health_event {
    size_t upstream = 0;
    bool up = false;
    std::string instance;  // the running instance its answer named; empty: not known (and always when down)
    bool checked = true;   // a health check said so; false: a call on the request path failed (mark_down)
};

struct health_hooks {
    // After every check of an upstream and every mark_down, under the health lock: cheap, no I/O.
    std::function<void(const health_event&)> on_state;
    // After a check found an upstream up, on the checking thread, no lock held: the place for slower calls to it
    // (the bias tokens' POST /tokenize). `client` carries the checks' timeouts.
    std::function<void(size_t upstream, const http::client_options& client)> after_up;
};

class upstream_health {
public:
    // `upstreams` must outlive this object. Each upstream counts as up until a check or mark_down says otherwise.
    upstream_health(const std::vector<upstream_config>& upstreams, health_options options, health_hooks hooks = {});
    ~upstream_health();  // stops the checker thread; a check under way finishes first (each call is bounded by timeout)
    upstream_health(const upstream_health&) = delete;
    upstream_health& operator=(const upstream_health&) = delete;

    // Checks every upstream once on the calling thread, then keeps checking every interval on a thread of its own.
    // Call at most once.
    void start();
    // One round: checks every upstream once, on the calling thread.
    void check_now();
    // A call to it failed below HTTP or timed out: down until a check sees it answer. `why` goes into the log.
    void mark_down(size_t upstream, const std::string& why);

    bool up(size_t upstream) const;
    size_t up_count() const;
    // The first model its health answer listed, from the last check that found it up with one; empty: none yet.
    std::string listed_model(size_t upstream) const;
    // Every model its health answer listed (in its order), from the last check that found it up with at least one.
    std::vector<std::string> listed_models(size_t upstream) const;
    // The client options every check (and after_up's calls) use: the timeouts, and answers of at most 1 MiB.
    http::client_options client_options() const;

private:
    void loop();

    const std::vector<upstream_config>& upstreams_;
    const health_options options_;
    const health_hooks hooks_;

    mutable std::mutex mu_;
    std::vector<bool> up_;                               // guarded by mu_
    std::vector<std::string> listed_models_;             // guarded by mu_: the first model each listed
    std::vector<std::vector<std::string>> model_lists_;  // guarded by mu_: every model each listed
    std::vector<int> failed_checks_;  // guarded by mu_: checks failed in a row since the last one answered
    std::vector<bool> seen_up_;       // guarded by mu_: a check has found it up at least once
    bool stopping_ = false;           // guarded by mu_
    std::condition_variable stop_cv_;
    std::thread thread_;
};

}  // namespace keepwarm::proxy

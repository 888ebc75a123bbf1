// Which model's server answers a request, and when models load and unload: a model that a request names is loaded on
// demand (its server started), and when --models-max are loaded the least recently used one that has no request in
// flight and is not pinned is unloaded to make room (its server stopped with SIGTERM, which writes its prefix cache to
// its disk tier, so that loading it again restores its conversations). A request waits, in a bounded queue, while its
// model loads or while every loaded model is busy; other models keep serving meanwhile (no lock is held while a
// server starts or stops). While a request waits for room, the model that must make it takes no new requests, so a
// model that is never idle cannot keep another out. A server that exits on its own leaves its model unloaded; its next
// request starts it again. Idle models unload after their idle time (--models-idle-seconds, or a request's keep_alive).
// With a memory budget (--models-memory), a model loads only when the footprints of the loaded (and loading, and
// unloading) models and its own fit in it too: idle models are unloaded, least recently used first, until they do; a
// model whose footprint alone is over the budget is refused (503, naming both sizes), never queued.
// Threading: every public function may be called from any thread; acquire() and the unloads block the caller while a
// server starts or stops, never holding mu_.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "http/http-client.h"
#include "router/child-process.h"
#include "router/keep-alive.h"
#include "router/model-set.h"

namespace keepwarm::router {

enum class model_state { unloaded, loading, loaded, unloading };
const char* state_name(model_state s);
// "1.5 GiB (1610612736 bytes)", "512.0 MiB (536870912 bytes)": a footprint or budget in messages.
std::string bytes_text(uint64_t bytes);

struct router_options {
    int models_max = 4;  // loaded (and loading) models at most; 0: no limit
    // Bytes the loaded (and loading, unloading) models' footprints (model_entry::footprint_bytes) may take in all;
    // 0: no byte budget, only models_max.
    uint64_t memory_budget = 0;
    int queue_limit = 64;  // requests waiting for a model, in all; one more is refused (503)
    bool autoload = true;  // false: a request for a model that is not loaded is refused; only load() loads
    std::chrono::milliseconds idle_unload{0};                          // 0: never
    std::chrono::milliseconds wait_timeout{std::chrono::minutes(10)};  // the longest a request waits for its model
    std::chrono::milliseconds stop_grace{std::chrono::seconds(30)};    // SIGTERM to SIGKILL
    bool housekeeping_thread = true;  // false (tests): idle unloads only through unload_expired()
};

// One model as the listings show it.
struct model_status {
    size_t index = 0;
    model_state state = model_state::unloaded;
    int in_flight = 0;
    bool pinned = false;
    std::string url;  // its server's, while loaded
    int pid = 0;
    std::chrono::system_clock::time_point loaded_at{};
    // When it unloads if no request comes (loaded, idle time set, not pinned); nullopt: not by idleness.
    std::optional<std::chrono::system_clock::time_point> expires_at;
};

struct router_counters {
    uint64_t loads = 0;          // servers started and listening
    uint64_t load_failures = 0;  // servers that exited or timed out before they listened
    uint64_t unloads = 0;        // servers stopped by the router (to make room, idle, asked, keep_alive 0)
    uint64_t crashes = 0;        // servers that exited on their own while loaded
    uint64_t queue_refused = 0;  // requests refused because the queue was full
    uint64_t wait_timeouts = 0;  // requests that waited past wait_timeout
    double load_seconds = 0;     // time spent starting servers, in all
    int waiting = 0;             // requests waiting now
    int loaded = 0;              // models loaded or loading now
    uint64_t memory_in_use = 0;  // the footprints of the models loaded, loading or unloading now
};

class model_router {
public:
    // A request's hold on a loaded model: counted in flight (never unloaded under it) until destroyed.
    class lease {
    public:
        lease(lease&& other) noexcept;
        lease& operator=(lease&&) = delete;
        lease(const lease&) = delete;
        ~lease();
        const http::endpoint& origin() const { return origin_; }
        size_t model() const { return model_; }
        // What the request's keep_alive says about the model, applied when the request is done.
        void set_keep_alive(const keep_alive& k) { keep_alive_ = k; }

    private:
        friend class model_router;
        lease(model_router* router, size_t model, http::endpoint origin)
            : router_(router), model_(model), origin_(std::move(origin)) {}
        model_router* router_;
        size_t model_;
        http::endpoint origin_;
        std::optional<keep_alive> keep_alive_;
    };

    model_router(model_set models, child_launcher& launcher, router_options options);
    ~model_router();  // stop_all()
    model_router(const model_router&) = delete;
    model_router& operator=(const model_router&) = delete;

    const model_set& models() const { return models_; }
    const router_options& options() const { return options_; }

    // Waits until `model` is loaded and may take the request, loading it (and unloading another to make room) as
    // needed. Throws request_error: 503 when the queue is full, autoload is off and the model is not loaded, the wait
    // timed out, its server failed to start, or the router is stopping.
    lease acquire(size_t model);
    // POST /models/load: loads `model` if it is not loaded (unloading another to make room). Throws as acquire().
    void load(size_t model);
    // POST /models/unload: unloads `model` now if no request is in flight, else once the last one is done. Returns
    // false if it was not loaded.
    bool unload(size_t model);
    // Unloads the loaded models whose idle time has passed at `now`; the housekeeping thread calls it every second.
    void unload_expired(std::chrono::steady_clock::time_point now);
    // Loads the models whose table says `load = true`, one after the other; a failure is logged.
    void load_at_start();
    // Stops every server (each writes its cache) and refuses requests from now on; waits for them.
    void stop_all();

    std::vector<model_status> snapshot() const;
    router_counters counters() const;

private:
    struct slot {
        model_state state = model_state::unloaded;
        std::unique_ptr<model_child> child;
        uint64_t generation = 0;  // of the server started last; an exit callback of an older one is ignored
        int in_flight = 0;
        // A request waits for room that only this model's unload can make: it takes no new request until its last
        // one ends and it is unloaded (else a model that is never idle would keep the waiting one out for good).
        bool draining = false;
        bool unload_when_idle = false;             // keep_alive 0 or /models/unload with requests in flight
        std::optional<keep_alive> keep_alive_set;  // the last request's keep_alive, over the defaults
        std::chrono::steady_clock::time_point last_used{};
        std::chrono::system_clock::time_point loaded_at{};
    };

    void release(size_t model, const std::optional<keep_alive>& k);
    // Starts `model`'s server; called and returns with `lk` held, released meanwhile. Throws request_error 503.
    void start_locked(std::unique_lock<std::mutex>& lk, size_t model);
    // Stops `model`'s server; called and returns with `lk` held, released meanwhile.
    void stop_locked(std::unique_lock<std::mutex>& lk, size_t model, const char* why);
    // The loaded model to unload for room: least recently used, none in flight, not pinned; nullopt if none.
    std::optional<size_t> victim_locked() const;
    // No loaded model is idle: marks the least recently used unpinned one draining, unless one already is.
    void drain_one_locked();
    // A request stopped waiting for room (it loaded its model, failed or timed out); the last one ends the draining.
    void stop_waiting_for_room_locked();
    // Room to start `model`: under models_max, and its footprint fits in the memory budget beside the others'.
    bool has_room_locked(size_t model) const;
    // Throws request_error 503 if `model`'s footprint alone is over the memory budget: it can never load.
    void check_fits_budget(size_t model) const;
    uint64_t memory_in_use_locked() const;
    bool pinned_locked(size_t model) const;
    std::optional<std::chrono::milliseconds> idle_time_locked(size_t model) const;
    void on_child_exit(size_t model, uint64_t generation, const std::string& how);
    void housekeeping();

    const model_set models_;
    child_launcher& launcher_;
    const router_options options_;

    mutable std::mutex mu_;
    std::condition_variable changed_;  // a state changed, a request ended, a server exited: waiters look again
    std::vector<slot> slots_;          // guarded by mu_, one per model
    router_counters counters_;         // guarded by mu_
    bool stopping_ = false;            // guarded by mu_
    int room_waiters_ = 0;             // guarded by mu_: requests waiting for a loaded model to make room
    std::vector<std::unique_ptr<model_child>> exited_;  // guarded by mu_: servers that exited, destroyed later
    std::thread housekeeper_;
};

}  // namespace keepwarm::router

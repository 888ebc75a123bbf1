// See model-router.h.
#include "router/model-router.h"

#include <algorithm>
#include <cstdio>

#include "base/logger.h"
#include "base/request-error.h"

namespace keepwarm::router {

std::string bytes_text(uint64_t bytes) {
    char buf[64];
    if (bytes >= (uint64_t{1} << 30)) {
        std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(bytes) / static_cast<double>(uint64_t{1} << 30));
    } else {
        std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / static_cast<double>(uint64_t{1} << 20));
    }
    return std::string(buf) + " (" + std::to_string(bytes) + " bytes)";
}

const char* state_name(model_state s) {
    switch (s) {
        case model_state::unloaded:
            return "unloaded";
        case model_state::loading:
            return "loading";
        case model_state::loaded:
            return "loaded";
        case model_state::unloading:
            return "unloading";
    }
    return "unloaded";
}

model_router::lease::lease(lease&& other) noexcept
    : router_(std::exchange(other.router_, nullptr)),
      model_(other.model_),
      origin_(std::move(other.origin_)),
      keep_alive_(other.keep_alive_) {}

model_router::lease::~lease() {
    if (router_) router_->release(model_, keep_alive_);
}

model_router::model_router(model_set models, child_launcher& launcher, router_options options)
    : models_(std::move(models)), launcher_(launcher), options_(options), slots_(models_.size()) {
    if (options_.housekeeping_thread) housekeeper_ = std::thread([this] { housekeeping(); });
}

model_router::~model_router() {
    stop_all();
}

model_router::lease model_router::acquire(size_t model) {
    const auto deadline = std::chrono::steady_clock::now() + options_.wait_timeout;
    std::unique_lock lk(mu_);
    bool queued = false;
    struct queue_place {  // counted in counters_.waiting while the request waits
        bool& queued;
        int& waiting;
        ~queue_place() {
            if (queued) --waiting;
        }
    } place{queued, counters_.waiting};
    bool waits_for_room = false;
    struct room_place {  // counted in room_waiters_ while the request waits for a model to make room
        model_router& router;
        bool& waits;
        ~room_place() {
            if (waits) router.stop_waiting_for_room_locked();
        }
    } room{*this, waits_for_room};
    const std::string& name = models_[model].name;
    const auto wait = [&] {
        if (!queued) {
            if (options_.queue_limit > 0 && counters_.waiting >= options_.queue_limit) {
                ++counters_.queue_refused;
                throw request_error(503,
                                    "too many requests are waiting for models (--models-queue " +
                                        std::to_string(options_.queue_limit) + "); try again soon",
                                    "unavailable_error", 1);
            }
            queued = true;
            ++counters_.waiting;
        }
        if (changed_.wait_until(lk, deadline) == std::cv_status::timeout &&
            std::chrono::steady_clock::now() >= deadline) {
            ++counters_.wait_timeouts;
            throw request_error(503,
                                "model '" + name + "' was not free to take the request within " +
                                    http::seconds_text(options_.wait_timeout),
                                "unavailable_error", 1);
        }
    };
    for (;;) {
        if (stopping_) throw request_error(503, "the server is shutting down", "unavailable_error");
        slot& s = slots_[model];
        switch (s.state) {
            case model_state::loaded:
                if (s.draining) {  // it makes room for a waiting request first; loaded again after
                    wait();
                    continue;
                }
                ++s.in_flight;
                s.last_used = std::chrono::steady_clock::now();
                return lease(this, model, s.child->origin());
            case model_state::loading:
            case model_state::unloading:
                wait();
                continue;
            case model_state::unloaded:
                if (!options_.autoload) {
                    throw request_error(503,
                                        "model '" + name +
                                            "' is not loaded and this server loads models only when asked "
                                            "(--no-models-autoload): POST /models/load first",
                                        "unavailable_error");
                }
                check_fits_budget(model);
                if (has_room_locked(model)) {
                    start_locked(lk, model);
                } else if (const std::optional<size_t> victim = victim_locked()) {
                    stop_locked(lk, *victim, "to make room");
                } else {
                    if (!waits_for_room) {
                        waits_for_room = true;
                        ++room_waiters_;
                    }
                    drain_one_locked();
                    wait();
                }
                continue;
        }
    }
}

void model_router::load(size_t model) {
    std::unique_lock lk(mu_);
    const auto deadline = std::chrono::steady_clock::now() + options_.wait_timeout;
    for (;;) {
        if (stopping_) throw request_error(503, "the server is shutting down", "unavailable_error");
        switch (slots_[model].state) {
            case model_state::loaded:
                return;
            case model_state::loading:
            case model_state::unloading:
                if (changed_.wait_until(lk, deadline) == std::cv_status::timeout) {
                    throw request_error(503, "model '" + models_[model].name + "' did not load in time",
                                        "unavailable_error");
                }
                continue;
            case model_state::unloaded:
                check_fits_budget(model);
                if (has_room_locked(model)) {
                    start_locked(lk, model);
                } else if (const std::optional<size_t> victim = victim_locked()) {
                    stop_locked(lk, *victim, "to make room");
                } else if (changed_.wait_until(lk, deadline) == std::cv_status::timeout) {
                    throw request_error(
                        503,
                        "no loaded model could be unloaded to make room for '" + models_[model].name +
                            "' (every one is busy or pinned; --models-max " + std::to_string(options_.models_max) +
                            (options_.memory_budget > 0 ? ", --models-memory " + bytes_text(options_.memory_budget)
                                                        : std::string()) +
                            ")",
                        "unavailable_error");
                }
                continue;
        }
    }
}

bool model_router::unload(size_t model) {
    std::unique_lock lk(mu_);
    slot& s = slots_[model];
    if (s.state != model_state::loaded) return s.state == model_state::loading || s.state == model_state::unloading;
    if (s.in_flight > 0) {
        s.unload_when_idle = true;
        return true;
    }
    stop_locked(lk, model, "as asked");
    return true;
}

void model_router::release(size_t model, const std::optional<keep_alive>& k) {
    std::unique_lock lk(mu_);
    slot& s = slots_[model];
    --s.in_flight;
    s.last_used = std::chrono::steady_clock::now();
    if (k) {
        s.keep_alive_set = k;
        s.unload_when_idle = k->what == keep_alive::kind::unload_now;
    }
    if (s.unload_when_idle && s.in_flight == 0 && s.state == model_state::loaded && !stopping_) {
        s.keep_alive_set.reset();  // keep_alive 0 is for that request; the next load starts from the defaults
        stop_locked(lk, model, "as keep_alive asked");
    }
    changed_.notify_all();
}

void model_router::start_locked(std::unique_lock<std::mutex>& lk, size_t model) {
    slot& s = slots_[model];
    s.state = model_state::loading;
    s.unload_when_idle = false;
    const uint64_t generation = ++s.generation;
    ++counters_.loaded;
    std::vector<std::unique_ptr<model_child>> exited = std::move(exited_);
    exited_.clear();
    lk.unlock();
    exited.clear();  // servers that exited on their own, destroyed here: never on their own reaper thread
    const model_entry& entry = models_[model];
    log::info("router", "loading model {} ({})", entry.name, entry.path);
    const auto started = std::chrono::steady_clock::now();
    std::unique_ptr<model_child> child;
    std::string failure;
    try {
        child = launcher_.launch(
            entry, [this, model, generation](const std::string& how) { on_child_exit(model, generation, how); });
    } catch (const std::exception& e) {
        failure = e.what();
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    lk.lock();
    if (!child) {
        s.state = model_state::unloaded;
        --counters_.loaded;
        ++counters_.load_failures;
        changed_.notify_all();
        log::error("router", "model {} failed to load: {}", entry.name, failure);
        throw request_error(503, "model '" + entry.name + "' failed to load: " + failure, "unavailable_error");
    }
    counters_.load_seconds += seconds;
    ++counters_.loads;
    if (stopping_ || s.generation != generation) {  // stop_all() ran meanwhile
        s.state = model_state::unloading;
        lk.unlock();
        child->stop(options_.stop_grace);
        child.reset();
        lk.lock();
        s.state = model_state::unloaded;
        --counters_.loaded;
        changed_.notify_all();
        throw request_error(503, "the server is shutting down", "unavailable_error");
    }
    s.child = std::move(child);
    s.state = model_state::loaded;
    s.last_used = std::chrono::steady_clock::now();
    s.loaded_at = std::chrono::system_clock::now();
    log::info("router", "model {} loaded in {} s, serving at {}", entry.name, log::fixed(seconds, 1),
              s.child->origin().url());
    changed_.notify_all();
}

void model_router::stop_locked(std::unique_lock<std::mutex>& lk, size_t model, const char* why) {
    slot& s = slots_[model];
    s.state = model_state::unloading;
    s.unload_when_idle = false;
    s.draining = false;
    std::unique_ptr<model_child> child = std::move(s.child);
    lk.unlock();
    log::info("router", "unloading model {} {} (its server writes its cache to disk)", models_[model].name, why);
    if (child) {
        child->stop(options_.stop_grace);
        child.reset();
    }
    lk.lock();
    s.state = model_state::unloaded;
    --counters_.loaded;
    ++counters_.unloads;
    changed_.notify_all();
}

void model_router::on_child_exit(size_t model, uint64_t generation, const std::string& how) {
    std::lock_guard lk(mu_);
    slot& s = slots_[model];
    if (s.generation != generation || s.state != model_state::loaded) return;  // a failed load or an old server
    log::error("router", "model {}'s server {}; it loads again on its next request", models_[model].name, how);
    exited_.push_back(std::move(s.child));
    s.state = model_state::unloaded;
    s.draining = false;
    --counters_.loaded;
    ++counters_.crashes;
    changed_.notify_all();
}

bool model_router::has_room_locked(size_t model) const {
    if (options_.models_max > 0 && counters_.loaded >= options_.models_max) return false;
    return options_.memory_budget == 0 ||
           memory_in_use_locked() + models_[model].footprint_bytes <= options_.memory_budget;
}

void model_router::check_fits_budget(size_t model) const {
    const model_entry& m = models_[model];
    if (options_.memory_budget == 0 || m.footprint_bytes <= options_.memory_budget) return;
    throw request_error(
        503,
        "model '" + m.name + "' needs " + bytes_text(m.footprint_bytes) +
            " for its weights, the KV cache of its context and slots and its RAM tier, but --models-memory is " +
            bytes_text(options_.memory_budget) +
            ": it can never load; raise --models-memory or give it a smaller ctx-size or cache-ram",
        "unavailable_error");
}

uint64_t model_router::memory_in_use_locked() const {
    uint64_t bytes = 0;
    for (size_t i = 0; i < slots_.size(); ++i) {
        if (slots_[i].state != model_state::unloaded) bytes += models_[i].footprint_bytes;
    }
    return bytes;
}

bool model_router::pinned_locked(size_t model) const {
    const slot& s = slots_[model];
    if (s.keep_alive_set) return s.keep_alive_set->what == keep_alive::kind::pinned;
    return models_[model].pinned;
}

std::optional<std::chrono::milliseconds> model_router::idle_time_locked(size_t model) const {
    if (pinned_locked(model)) return std::nullopt;
    const slot& s = slots_[model];
    if (s.keep_alive_set && s.keep_alive_set->what == keep_alive::kind::idle_for) return s.keep_alive_set->idle;
    if (options_.idle_unload.count() > 0) return options_.idle_unload;
    return std::nullopt;
}

std::optional<size_t> model_router::victim_locked() const {
    std::optional<size_t> victim;
    for (size_t i = 0; i < slots_.size(); ++i) {
        const slot& s = slots_[i];
        if (s.state != model_state::loaded || s.in_flight > 0 || pinned_locked(i)) continue;
        if (!victim || s.last_used < slots_[*victim].last_used) victim = i;
    }
    return victim;
}

void model_router::drain_one_locked() {
    std::optional<size_t> oldest;
    for (size_t i = 0; i < slots_.size(); ++i) {
        const slot& s = slots_[i];
        if (s.state != model_state::loaded || pinned_locked(i)) continue;
        if (s.draining) return;
        if (!oldest || s.last_used < slots_[*oldest].last_used) oldest = i;
    }
    if (oldest) {
        slots_[*oldest].draining = true;
        log::info("router", "model {} takes no new requests until its last one ends: another model waits for room",
                  models_[*oldest].name);
    }
}

void model_router::stop_waiting_for_room_locked() {
    if (--room_waiters_ > 0) return;
    for (slot& s : slots_) s.draining = false;  // nobody waits for room now: a draining model serves again
    changed_.notify_all();
}

void model_router::unload_expired(std::chrono::steady_clock::time_point now) {
    std::unique_lock lk(mu_);
    for (size_t i = 0; i < slots_.size(); ++i) {
        const slot& s = slots_[i];
        if (stopping_ || s.state != model_state::loaded || s.in_flight > 0) continue;
        const std::optional<std::chrono::milliseconds> idle = idle_time_locked(i);
        if (idle && now - s.last_used >= *idle) stop_locked(lk, i, "after its idle time");
    }
    std::vector<std::unique_ptr<model_child>> exited = std::move(exited_);
    exited_.clear();
    lk.unlock();
}

void model_router::load_at_start() {
    for (size_t i = 0; i < models_.size(); ++i) {
        if (!models_[i].load_at_start) continue;
        try {
            load(i);
        } catch (const std::exception& e) {
            log::error("router", "model {} (load = true) did not load: {}", models_[i].name, e.what());
        }
    }
}

void model_router::stop_all() {
    std::unique_lock lk(mu_);
    if (!stopping_) {
        stopping_ = true;
        changed_.notify_all();
    }
    lk.unlock();
    if (housekeeper_.joinable()) housekeeper_.join();
    lk.lock();
    // Every server at once: each writes its cache to its own disk tier, so they finish in the time of the slowest.
    std::vector<std::pair<size_t, std::unique_ptr<model_child>>> stopping;
    for (size_t i = 0; i < slots_.size(); ++i) {
        slot& s = slots_[i];
        if (s.state != model_state::loaded) continue;
        s.state = model_state::unloading;
        stopping.emplace_back(i, std::move(s.child));
    }
    std::vector<std::unique_ptr<model_child>> exited = std::move(exited_);
    exited_.clear();
    lk.unlock();
    std::vector<std::thread> stoppers;
    for (auto& [i, child] : stopping) {
        log::info("router", "stopping model {}'s server (it writes its cache to disk)", models_[i].name);
        stoppers.emplace_back([this, c = child.get()] { c->stop(options_.stop_grace); });
    }
    for (std::thread& t : stoppers) t.join();
    stopping.clear();
    exited.clear();
    lk.lock();
    for (slot& s : slots_) {
        if (s.state == model_state::unloading) {
            s.state = model_state::unloaded;
            --counters_.loaded;
            ++counters_.unloads;
        }
    }
    changed_.notify_all();
}

std::vector<model_status> model_router::snapshot() const {
    std::lock_guard lk(mu_);
    std::vector<model_status> out;
    const auto steady_now = std::chrono::steady_clock::now();
    const auto system_now = std::chrono::system_clock::now();
    for (size_t i = 0; i < slots_.size(); ++i) {
        const slot& s = slots_[i];
        model_status st;
        st.index = i;
        st.state = s.state;
        st.in_flight = s.in_flight;
        st.pinned = pinned_locked(i);
        if (s.state == model_state::loaded && s.child) {
            st.url = s.child->origin().url();
            st.pid = s.child->pid();
            st.loaded_at = s.loaded_at;
            if (const auto idle = idle_time_locked(i); idle && s.in_flight == 0) {
                st.expires_at = system_now + std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                                 s.last_used + *idle - steady_now);
            }
        }
        out.push_back(std::move(st));
    }
    return out;
}

router_counters model_router::counters() const {
    std::lock_guard lk(mu_);
    router_counters c = counters_;
    c.memory_in_use = memory_in_use_locked();
    return c;
}

void model_router::housekeeping() {
    std::unique_lock lk(mu_);
    while (!stopping_) {
        changed_.wait_for(lk, std::chrono::seconds(1));
        if (stopping_) break;
        lk.unlock();
        unload_expired(std::chrono::steady_clock::now());
        lk.lock();
    }
}

}  // namespace keepwarm::router

// See upstream-health.h.
#include "proxy/upstream-health.h"

#include <algorithm>
#include <cstdio>

#include "base/logger.h"

namespace keepwarm::proxy {

upstream_health::upstream_health(const std::vector<upstream_config>& upstreams, health_options options,
                                 health_hooks hooks)
    : upstreams_(upstreams),
      options_(options),
      hooks_(std::move(hooks)),
      up_(upstreams.size(), true),
      listed_models_(upstreams.size()) {}

upstream_health::~upstream_health() {
    {
        std::lock_guard lock(mu_);
        stopping_ = true;
    }
    stop_cv_.notify_all();
    if (thread_.joinable()) thread_.join();
}

void upstream_health::start() {
    check_now();
    thread_ = std::thread([this] { loop(); });
}

void upstream_health::loop() {
    std::unique_lock lock(mu_);
    while (!stop_cv_.wait_for(lock, options_.interval, [this] { return stopping_; })) {
        lock.unlock();
        check_now();
        lock.lock();
    }
}

http::client_options upstream_health::client_options() const {
    return {.connect_timeout = options_.timeout,
            .read_timeout = options_.timeout,
            .write_timeout = options_.timeout,
            .max_body_bytes = 1 << 20};
}

void upstream_health::check_now() {
    const http::client_options client = client_options();
    for (size_t i = 0; i < upstreams_.size(); i++) {
        const upstream_config& u = upstreams_[i];
        bool healthy = false;
        upstream_listing listing;
        try {
            http::header_list headers;
            if (!u.api_key.empty()) headers.emplace_back("authorization", "Bearer " + u.api_key);
            if (!u.api_key.empty()) headers.emplace_back("x-api-key", u.api_key);
            const http::fetched answer = http::fetch(u.origin, "GET", health_target(u.dialect), {}, headers, client);
            healthy = answer.status == 200;
            if (healthy) listing = parse_listing(u.dialect, answer.body);
        } catch (const std::exception&) {
            healthy = false;  // refused, reset or timed out: down
        }
        {
            std::lock_guard lock(mu_);
            if (up_[i] != healthy) {
                log::line(healthy ? log::level::info : log::level::warn, "proxy", "upstream {} is {}", u.origin.url(),
                          healthy ? "back (its prefix tree starts empty)" : "down");
            }
            up_[i] = healthy;
            if (healthy && !listing.model.empty()) listed_models_[i] = listing.model;
            if (hooks_.on_state) {
                hooks_.on_state({.upstream = i, .up = healthy, .instance = listing.instance, .checked = true});
            }
        }
        if (healthy && hooks_.after_up) hooks_.after_up(i, client);
    }
}

void upstream_health::mark_down(size_t upstream, const std::string& why) {
    std::lock_guard lock(mu_);
    if (up_.at(upstream)) {
        log::warn("proxy", "upstream {} is down ({}) until a health check sees it answer",
                  upstreams_[upstream].origin.url(), why);
    }
    up_[upstream] = false;
    if (hooks_.on_state) hooks_.on_state({.upstream = upstream, .up = false, .checked = false});
}

bool upstream_health::up(size_t upstream) const {
    std::lock_guard lock(mu_);
    return up_.at(upstream);
}

size_t upstream_health::up_count() const {
    std::lock_guard lock(mu_);
    return static_cast<size_t>(std::count(up_.begin(), up_.end(), true));
}

std::string upstream_health::listed_model(size_t upstream) const {
    std::lock_guard lock(mu_);
    return listed_models_.at(upstream);
}

}  // namespace keepwarm::proxy

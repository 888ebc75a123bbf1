// See upstream-health.h.
#include "proxy/upstream-health.h"

#include <algorithm>
#include <cstdio>

#include "base/logger.h"
#include "proxy/upstream-dialects.h"

namespace keepwarm::proxy {

upstream_health::upstream_health(const std::vector<upstream_config>& upstreams, health_options options,
                                 health_hooks hooks)
    : upstreams_(upstreams),
      options_(options),
      hooks_(std::move(hooks)),
      up_(upstreams.size(), true),
      listed_models_(upstreams.size()),
      model_lists_(upstreams.size()),
      failed_checks_(upstreams.size(), 0),
      seen_up_(upstreams.size(), false) {}

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
        std::string why;  // why the check failed
        upstream_listing listing;
        try {
            http::header_list headers;
            if (!u.api_key.empty()) headers.emplace_back("authorization", "Bearer " + u.api_key);
            if (!u.api_key.empty()) headers.emplace_back("x-api-key", u.api_key);
            const http::fetched answer = http::fetch(u.origin, "GET", health_target(u.dialect), {}, headers, client);
            healthy = answer.status == 200;
            if (healthy) {
                listing = parse_listing(u.dialect, answer.body);
            } else if (answer.status >= 300 && answer.status < 400) {
                why = redirect_message(answer.status, answer.headers, u.origin.url());
            } else {
                why = "it answered " + std::to_string(answer.status);
            }
        } catch (const std::exception& e) {
            why = e.what();  // refused, reset or timed out
        }
        {
            std::lock_guard lock(mu_);
            failed_checks_[i] = healthy ? 0 : failed_checks_[i] + 1;
            const bool was_up = up_[i];
            // One that has answered before keeps its place through a few missed checks; one never seen up does not.
            const bool up = healthy || (was_up && seen_up_[i] && failed_checks_[i] < options_.failures_to_down);
            if (healthy) seen_up_[i] = true;
            if (was_up != up) {
                log::line(up ? log::level::info : log::level::warn, "proxy", "upstream {} is {}{}", u.origin.url(),
                          up ? "back (its prefix tree starts empty)" : "down", up ? "" : ": " + why);
            } else if (up && !healthy) {
                log::info("proxy", "upstream {} missed a health check ({} of {} in a row before it is down): {}",
                          u.origin.url(), failed_checks_[i], options_.failures_to_down, why);
            }
            up_[i] = up;
            if (healthy && !listing.model.empty()) listed_models_[i] = listing.model;
            if (healthy && !listing.models.empty()) model_lists_[i] = std::move(listing.models);
            if (hooks_.on_state) {
                hooks_.on_state({.upstream = i, .up = up, .instance = listing.instance, .checked = true});
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

std::vector<std::string> upstream_health::listed_models(size_t upstream) const {
    std::lock_guard lock(mu_);
    return model_lists_.at(upstream);
}

}  // namespace keepwarm::proxy

// See upstream-pool.h.
#include "proxy/upstream-pool.h"

#include <cstdio>
#include <stdexcept>

namespace keepwarm::proxy {

using json = nlohmann::ordered_json;

upstream_config upstream_config::parse(const std::string& spec) {
    upstream_config config;
    size_t pos = spec.find(',');
    config.origin = http::endpoint::parse(spec.substr(0, pos));
    while (pos != std::string::npos) {
        const size_t next = spec.find(',', pos + 1);
        const std::string part = spec.substr(pos + 1, next == std::string::npos ? std::string::npos : next - pos - 1);
        pos = next;
        const size_t eq = part.find('=');
        const std::string key = part.substr(0, eq), value = eq == std::string::npos ? "" : part.substr(eq + 1);
        if (eq == std::string::npos || value.empty()) {
            throw std::invalid_argument("'" + part + "' in upstream '" + spec + "' is not KEY=VALUE");
        }
        if (key == "dialect") {
            config.dialect = parse_dialect(value);
        } else if (key == "model") {
            config.model = value;
        } else if (key == "key") {
            config.api_key = value;
        } else {
            throw std::invalid_argument("'" + key + "' in upstream '" + spec + "' is not one of dialect, model, key");
        }
    }
    return config;
}

upstream_pool::upstream_pool(std::vector<upstream_config> upstreams, pool_options options)
    : upstreams_(std::move(upstreams)),
      options_(options),
      router_(upstreams_.size(), options.routing),
      listed_models_(upstreams_.size()) {}

upstream_pool::~upstream_pool() {
    {
        std::lock_guard lock(mu_);
        stopping_ = true;
    }
    stop_cv_.notify_all();
    if (health_thread_.joinable()) health_thread_.join();
}

void upstream_pool::start_health_checks() {
    check_all();
    health_thread_ = std::thread([this] { health_loop(); });
}

void upstream_pool::health_loop() {
    std::unique_lock lock(mu_);
    while (!stop_cv_.wait_for(lock, options_.health_interval, [this] { return stopping_; })) {
        lock.unlock();
        check_all();
        lock.lock();
    }
}

void upstream_pool::check_all() {
    const http::client_options client{.connect_timeout = options_.health_timeout,
                                      .read_timeout = options_.health_timeout,
                                      .write_timeout = options_.health_timeout,
                                      .max_body_bytes = 1 << 20};
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
        std::lock_guard lock(mu_);
        const bool was_healthy = router_.stats(i).healthy;
        router_.set_health(i, healthy, listing.instance);
        if (healthy && !listing.model.empty()) listed_models_[i] = listing.model;
        if (was_healthy != healthy) {
            std::fprintf(stderr, "keepwarm proxy: upstream %s is %s\n", u.origin.url().c_str(),
                         healthy ? "back (its prefix tree starts empty)" : "down");
        }
    }
}

std::optional<upstream_pool::route> upstream_pool::acquire(std::span<const uint64_t> blocks,
                                                           const std::vector<size_t>& excluded,
                                                           const std::string& fallback_model) {
    std::lock_guard lock(mu_);
    const auto decision = router_.choose(blocks, excluded);
    if (!decision) return std::nullopt;
    router_.start(*decision, blocks);
    const upstream_config& config = upstreams_[decision->upstream];
    std::string model = !config.model.empty()                         ? config.model
                        : !listed_models_[decision->upstream].empty() ? listed_models_[decision->upstream]
                                                                      : fallback_model;
    return route{.upstream = decision->upstream,
                 .config = &config,
                 .model = std::move(model),
                 .matched_blocks = decision->matched_blocks};
}

void upstream_pool::release(size_t upstream) {
    std::lock_guard lock(mu_);
    router_.finish(upstream);
}

void upstream_pool::mark_down(size_t upstream) {
    std::lock_guard lock(mu_);
    if (router_.stats(upstream).healthy) {
        std::fprintf(stderr, "keepwarm proxy: upstream %s is down (a call failed)\n",
                     upstreams_[upstream].origin.url().c_str());
    }
    router_.set_health(upstream, false);
}

size_t upstream_pool::healthy_count() const {
    std::lock_guard lock(mu_);
    size_t n = 0;
    for (size_t i = 0; i < upstreams_.size(); i++) n += router_.stats(i).healthy ? 1 : 0;
    return n;
}

json upstream_pool::cache_json() const {
    std::lock_guard lock(mu_);
    json list = json::array();
    for (size_t i = 0; i < upstreams_.size(); i++) {
        const upstream_router::upstream_stats s = router_.stats(i);
        const upstream_config& u = upstreams_[i];
        list.push_back({{"url", u.origin.url()},
                        {"dialect", dialect_name(u.dialect)},
                        {"model", !u.model.empty() ? u.model : listed_models_[i]},
                        {"healthy", s.healthy},
                        {"requests", s.requests},
                        {"prefix_hits", s.prefix_hits},
                        {"matched_blocks", s.matched_blocks},
                        {"rebalanced", s.rebalanced},
                        {"in_flight", s.in_flight},
                        {"tree_blocks", s.tree_blocks},
                        {"forgotten", s.forgotten}});
    }
    const router_options& r = options_.routing;
    return {{"upstreams", std::move(list)},
            {"routing",
             {{"block_chars", r.block_chars},
              {"min_match_blocks", r.min_match_blocks},
              {"rebalance_margin", r.rebalance_margin},
              {"max_blocks_per_upstream", r.max_blocks_per_upstream}}}};
}

}  // namespace keepwarm::proxy

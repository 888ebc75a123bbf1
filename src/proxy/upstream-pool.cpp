// See upstream-pool.h.
#include "proxy/upstream-pool.h"

#include <algorithm>
#include <stdexcept>
#include "base/logger.h"
namespace keepwarm::proxy {

namespace {
std::vector<http::endpoint> origins_of(const std::vector<upstream_config>& upstreams) {
    std::vector<http::endpoint> origins;
    for (const upstream_config& u : upstreams) origins.push_back(u.origin);
    return origins;
}
}  // namespace

upstream_pool::upstream_pool(std::vector<upstream_config> upstreams, pool_options options)
    : upstreams_(std::move(upstreams)),
      options_(std::move(options)),
      router_(upstreams_.size(), options_.routing),
      connections_(origins_of(upstreams_), options_.max_idle_connections, request_options()),
      bias_tokens_(upstreams_, options_.bias_texts),
      health_(upstreams_,
              {.interval = options_.health_interval,
               .timeout = options_.health_timeout,
               .failures_to_down = options_.health_failures},
              {.on_state = [this](const health_event& e) { on_health(e); },
               .after_up = [this](size_t upstream,
                                  const http::client_options& client) { bias_tokens_.bind(upstream, client); }}) {}

upstream_pool::~upstream_pool() = default;

void upstream_pool::start_health_checks() {
    health_.start();
}

void upstream_pool::on_health(const health_event& e) {
    {
        std::lock_guard lock(router_mu_);
        router_.set_health(e.upstream, e.up, e.instance);
    }
    connections_.set_up(e.upstream, e.up);
    // A check that finds it down: it may come back with another model. A failed call says nothing of that.
    if (!e.up && e.checked) bias_tokens_.forget(e.upstream);
}

std::optional<int32_t> upstream_pool::bias_token(size_t upstream, const std::string& text) const {
    return bias_tokens_.lookup(upstream, text);
}

std::optional<upstream_pool::route> upstream_pool::acquire(std::span<const uint64_t> blocks,
                                                           const std::vector<size_t>& excluded,
                                                           const std::string& model, uint64_t key) {
    const std::vector<size_t> not_here = excluded_for(excluded, model);
    std::optional<upstream_router::decision> decision;
    {
        std::lock_guard lock(router_mu_);
        decision = router_.choose(blocks, not_here, key);
        if (!decision) return std::nullopt;
        router_.start(*decision, blocks, key);
    }
    return route_for(*decision, model);
}

std::optional<upstream_pool::route> upstream_pool::peek(std::span<const uint64_t> blocks, const std::string& model,
                                                        uint64_t key) const {
    const std::vector<size_t> not_here = excluded_for({}, model);
    std::optional<upstream_router::decision> decision;
    {
        std::lock_guard lock(router_mu_);
        decision = router_.choose(blocks, not_here, key);
    }
    if (!decision) return std::nullopt;
    return route_for(*decision, model);
}

std::vector<size_t> upstream_pool::excluded_for(const std::vector<size_t>& excluded, const std::string& model) const {
    std::vector<std::vector<std::string>> served(upstreams_.size());
    for (size_t i = 0; i < upstreams_.size(); i++) served[i] = served_models(i);
    std::vector<size_t> out = excluded;
    for (const size_t i : upstreams_not_serving(served, model)) {
        if (std::find(out.begin(), out.end(), i) == out.end()) out.push_back(i);
    }
    return out;
}

upstream_pool::route upstream_pool::route_for(const upstream_router::decision& d, const std::string& model) const {
    const upstream_config& config = upstreams_[d.upstream];
    const std::vector<std::string> served = served_models(d.upstream);
    std::string sent;
    if (!model.empty() && std::find(served.begin(), served.end(), model) != served.end()) sent = model;
    if (sent.empty()) sent = config.model;
    if (sent.empty()) sent = health_.listed_model(d.upstream);
    if (sent.empty()) sent = model;
    return route{
        .upstream = d.upstream, .config = &config, .model = std::move(sent), .matched_blocks = d.matched_blocks};
}

std::vector<std::string> upstream_pool::served_models(size_t upstream) const {
    std::vector<std::string> served;
    if (const std::string& configured = upstreams_.at(upstream).model; !configured.empty())
        served.push_back(configured);
    for (std::string& name : health_.listed_models(upstream)) {
        if (std::find(served.begin(), served.end(), name) == served.end()) served.push_back(std::move(name));
    }
    return served;
}

std::vector<std::string> upstream_pool::all_models() const {
    std::vector<std::string> all;
    for (size_t i = 0; i < upstreams_.size(); i++) {
        for (std::string& name : served_models(i)) {
            if (std::find(all.begin(), all.end(), name) == all.end()) all.push_back(std::move(name));
        }
    }
    return all;
}

std::string upstream_pool::credential(size_t upstream, const std::string& client_key) const {
    const upstream_config& u = upstreams_.at(upstream);
    if (!u.api_key.empty()) return u.api_key;
    return options_.forward_client_keys ? client_key : std::string();
}

void upstream_pool::release(size_t upstream) {
    std::lock_guard lock(router_mu_);
    router_.finish(upstream);
}

void upstream_pool::mark_down(size_t upstream, const std::string& why) {
    health_.mark_down(upstream, why);
}

std::unique_ptr<http::client_connection> upstream_pool::connection(size_t upstream) {
    return connections_.take(upstream);
}

void upstream_pool::keep_alive(size_t upstream, std::unique_ptr<http::client_connection> conn) {
    connections_.give_back(upstream, std::move(conn));
}

http::client_options upstream_pool::request_options() const {
    return {.first_byte_timeout = options_.first_byte_timeout,
            .read_timeout = options_.idle_timeout,
            .max_body_bytes = 1u << 20};  // read_body() reads only error answers whole
}

size_t upstream_pool::healthy_count() const {
    return health_.up_count();
}

void upstream_pool::record_overhead(double forward_ms, double first_delta_ms) {
    latency_.record(forward_ms, first_delta_ms);
}

std::vector<upstream_snapshot> upstream_pool::snapshot() const {
    std::vector<upstream_snapshot> out(upstreams_.size());
    for (size_t i = 0; i < upstreams_.size(); i++) {
        const upstream_config& u = upstreams_[i];
        out[i].url = u.origin.url();
        out[i].dialect = u.dialect;
        out[i].model = !u.model.empty() ? u.model : health_.listed_model(i);
        out[i].models = served_models(i);
        out[i].healthy = health_.up(i);
        out[i].connections = connections_.stats(i);
    }
    std::lock_guard lock(router_mu_);
    for (size_t i = 0; i < upstreams_.size(); i++) out[i].routing = router_.stats(i);
    return out;
}

nlohmann::ordered_json upstream_pool::cache_json() const {
    return proxy::cache_json(snapshot(), latency_.summary(), options_.routing);
}

void upstream_pool::write_metrics(metrics_text& out) const {
    write_upstream_metrics(out, snapshot());
    latency_.write_metrics(out);
}

}  // namespace keepwarm::proxy

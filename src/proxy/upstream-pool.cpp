// See upstream-pool.h.
#include "proxy/upstream-pool.h"

#include <algorithm>
#include <stdexcept>

#include "base/logger.h"

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
      listed_models_(upstreams_.size()),
      connections_(upstreams_.size()),
      bias_tokens_(upstreams_.size()),
      bias_retries_(upstreams_.size(), 0) {}

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
        bool ask_biases = false;
        {
            std::lock_guard lock(mu_);
            const bool was_healthy = router_.stats(i).healthy;
            router_.set_health(i, healthy, listing.instance);
            if (healthy && !listing.model.empty()) listed_models_[i] = listing.model;
            if (was_healthy != healthy) {
                log::line(healthy ? log::level::info : log::level::warn, "proxy", "upstream {} is {}", u.origin.url(),
                          healthy ? "back (its prefix tree starts empty)" : "down");
            }
            if (!healthy) {
                bias_tokens_[i].reset();  // it may come back with another model
                connections_[i].idle.clear();
            }
            ask_biases = healthy && !bias_tokens_[i] && !options_.bias_texts.empty();
        }
        if (ask_biases) {
            // A failure that may pass (timeout, 5xx) leaves the biases unbound until the next health check asks again.
            if (auto tokens = resolve_bias_tokens(i, client)) {
                std::lock_guard lock(mu_);
                bias_tokens_[i] = std::move(*tokens);
            }
        }
    }
}

std::optional<std::map<std::string, int32_t>> upstream_pool::resolve_bias_tokens(size_t i,
                                                                                 const http::client_options& client) {
    const upstream_config& u = upstreams_[i];
    const auto unbound = [&](const std::string& why) {
        log::warn("proxy", "upstream {}: forced logit biases are not applied there ({})", u.origin.url(), why);
        return std::map<std::string, int32_t>{};
    };
    const auto later = [&](const std::string& why) -> std::optional<std::map<std::string, int32_t>> {
        if (bias_retries_[i]++ == 0) {
            log::warn("proxy", "upstream {}: forced logit biases not bound yet ({}); asking again at each health check",
                      u.origin.url(), why);
        }
        return std::nullopt;
    };
    if (u.dialect != upstream_dialect::openai) return unbound(std::string(dialect_name(u.dialect)) + " dialect");
    http::header_list headers;
    if (!u.api_key.empty()) headers.emplace_back("authorization", "Bearer " + u.api_key);
    std::map<std::string, int32_t> tokens;
    for (const std::string& text : options_.bias_texts) {
        const json body = {{"content", text}, {"add_special", false}, {"parse_special", true}};
        http::fetched answer;
        try {
            answer = http::fetch(u.origin, "POST", "/tokenize", body.dump(), headers, client);
        } catch (const std::exception& e) {
            return later(std::string("POST /tokenize: ") + e.what());
        }
        if (answer.status >= 500 || answer.status == 429) {
            return later("POST /tokenize answered " + std::to_string(answer.status));
        }
        if (answer.status != 200) return unbound("POST /tokenize answered " + std::to_string(answer.status));
        try {
            const json ids = json::parse(answer.body).at("tokens");
            const bool one = ids.size() == 1 && ids[0].is_number_integer();
            tokens[text] = one ? ids[0].get<int32_t>() : -1;
            log::info("proxy", "upstream {}: logit_bias '{}' {}", u.origin.url(), text,
                      one ? "is token " + std::to_string(tokens[text])
                          : "is " + std::to_string(ids.size()) + " tokens of its model: not applied there");
        } catch (const std::exception& e) {
            return unbound(std::string("POST /tokenize answer: ") + e.what());
        }
    }
    bias_retries_[i] = 0;
    return tokens;
}

std::optional<int32_t> upstream_pool::bias_token(size_t upstream, const std::string& text) const {
    std::lock_guard lock(mu_);
    const auto& tokens = bias_tokens_.at(upstream);
    if (!tokens) return std::nullopt;
    const auto it = tokens->find(text);
    if (it == tokens->end() || it->second < 0) return std::nullopt;
    return it->second;
}

std::optional<upstream_pool::route> upstream_pool::acquire(std::span<const uint64_t> blocks,
                                                           const std::vector<size_t>& excluded,
                                                           const std::string& fallback_model) {
    std::lock_guard lock(mu_);
    const auto decision = router_.choose(blocks, excluded);
    if (!decision) return std::nullopt;
    router_.start(*decision, blocks);
    return route_for(*decision, fallback_model);
}

std::optional<upstream_pool::route> upstream_pool::peek(std::span<const uint64_t> blocks,
                                                        const std::string& fallback_model) const {
    std::lock_guard lock(mu_);
    const auto decision = router_.choose(blocks, {});
    if (!decision) return std::nullopt;
    return route_for(*decision, fallback_model);
}

upstream_pool::route upstream_pool::route_for(const upstream_router::decision& d,
                                              const std::string& fallback_model) const {
    const upstream_config& config = upstreams_[d.upstream];
    std::string model = !config.model.empty()                 ? config.model
                        : !listed_models_[d.upstream].empty() ? listed_models_[d.upstream]
                                                              : fallback_model;
    return route{
        .upstream = d.upstream, .config = &config, .model = std::move(model), .matched_blocks = d.matched_blocks};
}

std::string upstream_pool::credential(size_t upstream, const std::string& client_key) const {
    const upstream_config& u = upstreams_.at(upstream);
    if (!u.api_key.empty()) return u.api_key;
    return options_.forward_client_keys ? client_key : std::string();
}

void upstream_pool::release(size_t upstream) {
    std::lock_guard lock(mu_);
    router_.finish(upstream);
}

void upstream_pool::mark_down(size_t upstream, const std::string& why) {
    std::lock_guard lock(mu_);
    if (router_.stats(upstream).healthy) {
        log::warn("proxy", "upstream {} is down ({}) until a health check sees it answer",
                  upstreams_[upstream].origin.url(), why);
    }
    router_.set_health(upstream, false);
    connections_[upstream].idle.clear();
}

std::unique_ptr<http::client_connection> upstream_pool::connection(size_t upstream) {
    std::unique_ptr<http::client_connection> conn;
    {
        std::lock_guard lock(mu_);
        connection_pool& pool = connections_.at(upstream);
        if (!pool.idle.empty()) {
            conn = std::move(pool.idle.back());
            pool.idle.pop_back();
            pool.reused++;
            return conn;
        }
        pool.opened++;
    }
    return std::make_unique<http::client_connection>(upstreams_.at(upstream).origin, request_options());
}

http::client_options upstream_pool::request_options() const {
    return {.first_byte_timeout = options_.first_byte_timeout,
            .read_timeout = options_.idle_timeout,
            .max_body_bytes = 1u << 20};  // read_body() reads only error answers whole
}

void upstream_pool::keep_alive(size_t upstream, std::unique_ptr<http::client_connection> conn) {
    if (!conn || !conn->reusable()) return;
    std::unique_ptr<http::client_connection> dropped;  // closed outside the lock
    std::lock_guard lock(mu_);
    connection_pool& pool = connections_.at(upstream);
    if (!router_.stats(upstream).healthy || pool.idle.size() >= options_.max_idle_connections) {
        dropped = std::move(conn);
        return;
    }
    pool.idle.push_back(std::move(conn));
}

size_t upstream_pool::healthy_count() const {
    std::lock_guard lock(mu_);
    size_t n = 0;
    for (size_t i = 0; i < upstreams_.size(); i++) n += router_.stats(i).healthy ? 1 : 0;
    return n;
}

namespace {
constexpr size_t overhead_window = 65536;

json percentiles(std::vector<float> samples) {
    if (samples.empty()) return nullptr;
    std::sort(samples.begin(), samples.end());
    const auto at = [&](double p) {
        return samples[std::min(samples.size() - 1, static_cast<size_t>(p * static_cast<double>(samples.size())))];
    };
    return {{"p50", at(0.50)}, {"p99", at(0.99)}, {"max", samples.back()}};
}
}  // namespace

void upstream_pool::record_overhead(double forward_ms, double first_delta_ms) {
    std::lock_guard lock(mu_);
    overhead_samples& o = overhead_;
    if (o.forward.size() < overhead_window) {
        o.forward.push_back(static_cast<float>(forward_ms));
        o.first_delta.push_back(static_cast<float>(first_delta_ms));
    } else {
        o.forward[o.next] = static_cast<float>(forward_ms);
        o.first_delta[o.next] = static_cast<float>(first_delta_ms);
    }
    o.next = (o.next + 1) % overhead_window;
    o.forward_hist.record(forward_ms / 1000);
    o.first_delta_hist.record(first_delta_ms / 1000);
    o.total_hist.record((forward_ms + first_delta_ms) / 1000);
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
                        {"forgotten", s.forgotten},
                        {"connections",
                         {{"opened", connections_[i].opened},
                          {"reused", connections_[i].reused},
                          {"idle", connections_[i].idle.size()}}}});
    }
    const router_options& r = options_.routing;
    std::vector<float> total(overhead_.forward.size());
    for (size_t i = 0; i < total.size(); i++) total[i] = overhead_.forward[i] + overhead_.first_delta[i];
    return {{"upstreams", std::move(list)},
            {"overhead_ms",
             {{"requests", overhead_.total_hist.count()},
              {"window", overhead_.forward.size()},
              {"forward", percentiles(overhead_.forward)},
              {"first_delta", percentiles(overhead_.first_delta)},
              {"total", percentiles(std::move(total))}}},
            {"routing",
             {{"block_chars", r.block_chars},
              {"min_match_blocks", r.min_match_blocks},
              {"rebalance_margin", r.rebalance_margin},
              {"max_blocks_per_upstream", r.max_blocks_per_upstream}}}};
}

void upstream_pool::write_metrics(metrics_text& out) const {
    std::lock_guard lock(mu_);
    using labels = metrics_text::labels;
    const auto per_upstream = [&](const char* name, const char* type, const char* help, auto value) {
        out.family(name, type, help);
        for (size_t i = 0; i < upstreams_.size(); i++) {
            out.sample(name, static_cast<double>(value(i)), labels{{"upstream", upstreams_[i].origin.url()}});
        }
    };
    const auto stat = [this](auto member) { return [this, member](size_t i) { return router_.stats(i).*member; }; };
    using s = upstream_router::upstream_stats;
    per_upstream("keepwarm_proxy_upstream_up", "gauge", "1 while the upstream answers its health checks",
                 stat(&s::healthy));
    per_upstream("keepwarm_proxy_requests_total", "counter", "Requests sent to the upstream", stat(&s::requests));
    per_upstream("keepwarm_proxy_prefix_hits_total", "counter",
                 "Requests routed to the upstream because it was sent their prefix before", stat(&s::prefix_hits));
    per_upstream("keepwarm_proxy_rebalanced_total", "counter",
                 "Requests sent to the upstream although a longer prefix match was elsewhere (load won)",
                 stat(&s::rebalanced));
    per_upstream("keepwarm_proxy_in_flight", "gauge", "Requests the upstream is answering now", stat(&s::in_flight));
    per_upstream("keepwarm_proxy_prefix_tree_blocks", "gauge", "Blocks in the upstream's prefix tree",
                 stat(&s::tree_blocks));
    per_upstream("keepwarm_proxy_prefix_tree_forgotten_total", "counter",
                 "Times the upstream's prefix tree was dropped (it restarted or came back)", stat(&s::forgotten));
    per_upstream("keepwarm_proxy_connections_opened_total", "counter",
                 "Connections opened to the upstream for requests",
                 [this](size_t i) { return connections_[i].opened; });
    per_upstream("keepwarm_proxy_connections_reused_total", "counter",
                 "Requests sent on a kept-alive connection to the upstream",
                 [this](size_t i) { return connections_[i].reused; });
    per_upstream("keepwarm_proxy_connections_idle", "gauge",
                 "Kept-alive connections to the upstream waiting for a request",
                 [this](size_t i) { return connections_[i].idle.size(); });
    const char* added = "keepwarm_proxy_added_latency_seconds";
    out.family(added, "histogram",
               "What the proxy added to a request's time to first token: receiving it to sending it upstream "
               "(forward), reading the first delta to passing it on (first_delta), and both (total)");
    out.histogram(added, overhead_.forward_hist, labels{{"phase", "forward"}});
    out.histogram(added, overhead_.first_delta_hist, labels{{"phase", "first_delta"}});
    out.histogram(added, overhead_.total_hist, labels{{"phase", "total"}});
}

}  // namespace keepwarm::proxy

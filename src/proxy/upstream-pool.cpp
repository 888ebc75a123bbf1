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

std::vector<std::string> events_of(const std::vector<upstream_config>& upstreams) {
    std::vector<std::string> events;
    for (const upstream_config& u : upstreams) events.push_back(u.events);
    return events;
}
}  // namespace

upstream_pool::upstream_pool(std::vector<upstream_config> upstreams, pool_options options)
    : upstreams_(std::move(upstreams)),
      options_(std::move(options)),
      router_(upstreams_.size(), options_.routing),
      block_index_(upstreams_.size(), options_.routing.max_blocks_per_upstream),
      connections_(origins_of(upstreams_), options_.max_idle_connections, request_options()),
      routing_connections_(origins_of(upstreams_), options_.max_idle_connections,
                           {.read_timeout = std::chrono::seconds(30), .max_body_bytes = 64u << 20}),
      bias_tokens_(upstreams_, options_.bias_texts),
      without_render_(std::make_unique<std::atomic<bool>[]>(upstreams_.size())),
      health_(upstreams_,
              {.interval = options_.health_interval,
               .timeout = options_.health_timeout,
               .failures_to_down = options_.health_failures},
              {.on_state = [this](const health_event& e) { on_health(e); },
               .after_up = [this](size_t upstream,
                                  const http::client_options& client) { bias_tokens_.bind(upstream, client); }}),
      subscriber_(events_of(upstreams_), {.on_message =
                                              [this](size_t upstream, const kv_event_message& m) {
                                                  std::lock_guard lock(router_mu_);
                                                  return block_index_.apply(upstream, m);
                                              },
                                          .on_reconnect =
                                              [this](size_t upstream) {
                                                  std::lock_guard lock(router_mu_);
                                                  block_index_.reconnected(upstream);
                                              }}) {}

upstream_pool::~upstream_pool() = default;

void upstream_pool::start_health_checks() {
    health_.start();
    subscriber_.start();
}

void upstream_pool::on_health(const health_event& e) {
    {
        std::lock_guard lock(router_mu_);
        router_.set_health(e.upstream, e.up, e.instance);
    }
    connections_.set_up(e.upstream, e.up);
    routing_connections_.set_up(e.upstream, e.up);
    // A check that finds it down: it may come back with another model. A failed call says nothing of that.
    if (!e.up && e.checked) {
        bias_tokens_.forget(e.upstream);
        without_render_[e.upstream] = false;
    }
}

std::optional<int32_t> upstream_pool::bias_token(size_t upstream, const std::string& text) const {
    return bias_tokens_.lookup(upstream, text);
}

std::vector<size_t> upstream_pool::held_blocks(std::span<const int32_t> tokens) const {
    std::vector<size_t> held(upstreams_.size(), 0);
    if (tokens.empty()) return held;
    // Keys per block size (one, unless the upstreams were started with different --cache-block).
    std::vector<std::pair<uint32_t, std::vector<uint64_t>>> keys;
    for (size_t i = 0; i < upstreams_.size(); i++) {
        if (!block_index_.in_step(i)) continue;
        const uint32_t size = block_index_.block_size(i);
        auto it = std::find_if(keys.begin(), keys.end(), [&](const auto& k) { return k.first == size; });
        if (it == keys.end()) it = keys.insert(keys.end(), {size, token_block_keys(tokens, size)});
        held[i] = block_index_.held_blocks(i, it->second);
    }
    return held;
}

bool upstream_pool::routes_by_events() const {
    std::lock_guard lock(router_mu_);
    for (size_t i = 0; i < upstreams_.size(); i++) {
        if (block_index_.in_step(i)) return true;
    }
    return false;
}

std::vector<int32_t> upstream_pool::prompt_tokens(const chat_request& chat, const std::string& model,
                                                  const std::string& client_key) const {
    std::vector<size_t> candidates;
    {
        std::lock_guard lock(router_mu_);
        for (size_t i = 0; i < upstreams_.size(); i++) {
            if (block_index_.in_step(i) && upstreams_[i].dialect == upstream_dialect::openai) candidates.push_back(i);
        }
    }
    // As routing by model name: the upstreams that serve `model`, or all when none does (a client's label).
    const std::vector<size_t> not_serving = excluded_for({}, model);
    for (const size_t i : candidates) {
        if (std::find(not_serving.begin(), not_serving.end(), i) != not_serving.end()) continue;
        if (!health_.up(i)) continue;
        const upstream_config& u = upstreams_[i];
        try {
            // The model name this upstream would be sent for the request itself (a name it does not serve may be a
            // 404 where pinning is strict, which would read as a missing render route).
            const std::string sent_model = route_for({.upstream = i}, model).model;
            const upstream_call call = build_call(u.dialect, chat, sent_model, credential(i, client_key));
            // On kept-alive connections of their own (30 s timeouts): a fresh connection per call costs the upstream
            // a connection thread each time (the proxy's forward p50 went from 3.1-3.7 to 2.4-2.8 ms, docs/llm-d.md).
            const auto post = [&](std::string_view target, std::string_view body) {
                std::unique_ptr<http::client_connection> conn = routing_connections_.take(i);
                const http::client_response head = conn->send("POST", target, body, "application/json", call.headers);
                http::fetched answer{.status = head.status, .headers = head.headers, .body = conn->read_body()};
                routing_connections_.give_back(i, std::move(conn));
                return answer;
            };
            if (!without_render_[i]) {
                const http::fetched ids = post("/v1/chat/completions/render", call.body);
                if (ids.status == 200) {
                    return nlohmann::json::parse(ids.body).at("token_ids").get<std::vector<int32_t>>();
                }
                if (ids.status == 404 || ids.status == 405 || ids.status == 501) without_render_[i] = true;
            }
            const http::fetched rendered = post("/apply-template", call.body);
            if (rendered.status != 200) continue;
            const auto prompt = nlohmann::json::parse(rendered.body).at("prompt").get<std::string>();
            // As keepwarm tokenizes a chat's prompt: with the model's BOS and its special tokens parsed.
            const nlohmann::json ask{{"content", prompt}, {"add_special", true}, {"parse_special", true}};
            const http::fetched tokenized = post("/tokenize", ask.dump());
            if (tokenized.status != 200) continue;
            return nlohmann::json::parse(tokenized.body).at("tokens").get<std::vector<int32_t>>();
        } catch (const std::exception& e) {
            log::warn("proxy", "upstream {} could not tokenize a prompt for routing ({})", u.origin.url(), e.what());
        }
    }
    return {};
}

std::optional<upstream_pool::route> upstream_pool::acquire(std::span<const uint64_t> blocks,
                                                           const std::vector<size_t>& excluded,
                                                           const std::string& model, uint64_t key,
                                                           std::span<const int32_t> tokens) {
    const std::vector<size_t> not_here = excluded_for(excluded, model);
    std::optional<upstream_router::decision> decision;
    {
        std::lock_guard lock(router_mu_);
        if (!tokens.empty()) decision = router_.choose_held(held_blocks(tokens), not_here);
        if (!decision) decision = router_.choose(blocks, not_here, key);
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
        out[i].events = u.events;
    }
    std::lock_guard lock(router_mu_);
    for (size_t i = 0; i < upstreams_.size(); i++) {
        out[i].routing = router_.stats(i);
        out[i].kv = block_index_.stats(i);
    }
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

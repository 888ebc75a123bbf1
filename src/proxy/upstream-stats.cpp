// See upstream-stats.h.
#include "proxy/upstream-stats.h"

#include <algorithm>

namespace keepwarm::proxy {

using json = nlohmann::ordered_json;

namespace {

json percentiles(std::vector<float> samples) {
    if (samples.empty()) return nullptr;
    std::sort(samples.begin(), samples.end());
    const auto at = [&](double p) {
        return samples[std::min(samples.size() - 1, static_cast<size_t>(p * static_cast<double>(samples.size())))];
    };
    return {{"p50", at(0.50)}, {"p99", at(0.99)}, {"max", samples.back()}};
}

}  // namespace

added_latency::added_latency(size_t window) : window_(std::max<size_t>(window, 1)) {}

void added_latency::record(double forward_ms, double first_delta_ms) {
    std::lock_guard lock(mu_);
    if (forward_.size() < window_) {
        forward_.push_back(static_cast<float>(forward_ms));
        first_delta_.push_back(static_cast<float>(first_delta_ms));
    } else {
        forward_[next_] = static_cast<float>(forward_ms);
        first_delta_[next_] = static_cast<float>(first_delta_ms);
    }
    next_ = (next_ + 1) % window_;
    forward_hist_.record(forward_ms / 1000);
    first_delta_hist_.record(first_delta_ms / 1000);
    total_hist_.record((forward_ms + first_delta_ms) / 1000);
}

json added_latency::summary() const {
    std::vector<float> forward, first_delta;
    uint64_t requests = 0;
    {
        std::lock_guard lock(mu_);
        forward = forward_;
        first_delta = first_delta_;
        requests = total_hist_.count();
    }
    std::vector<float> total(forward.size());
    for (size_t i = 0; i < total.size(); i++) total[i] = forward[i] + first_delta[i];
    const size_t window = forward.size();
    return {{"requests", requests},
            {"window", window},
            {"forward", percentiles(std::move(forward))},
            {"first_delta", percentiles(std::move(first_delta))},
            {"total", percentiles(std::move(total))}};
}

void added_latency::write_metrics(metrics_text& out) const {
    std::lock_guard lock(mu_);
    using labels = metrics_text::labels;
    const char* added = "keepwarm_proxy_added_latency_seconds";
    out.family(added, "histogram",
               "What the proxy added to a request's time to first token: receiving it to sending it upstream "
               "(forward), reading the first delta to passing it on (first_delta), and both (total)");
    out.histogram(added, forward_hist_, labels{{"phase", "forward"}});
    out.histogram(added, first_delta_hist_, labels{{"phase", "first_delta"}});
    out.histogram(added, total_hist_, labels{{"phase", "total"}});
}

json cache_json(const std::vector<upstream_snapshot>& upstreams, json overhead, const router_options& routing) {
    json list = json::array();
    for (const upstream_snapshot& u : upstreams) {
        const upstream_router::upstream_stats& s = u.routing;
        list.push_back(
            {{"url", u.url},
             {"dialect", dialect_name(u.dialect)},
             {"model", u.model},
             {"models", u.models},
             {"healthy", u.healthy},
             {"requests", s.requests},
             {"prefix_hits", s.prefix_hits},
             {"matched_blocks", s.matched_blocks},
             {"rebalanced", s.rebalanced},
             {"keyed", s.keyed},
             {"in_flight", s.in_flight},
             {"tree_blocks", s.tree_blocks},
             {"forgotten", s.forgotten},
             {"connections",
              {{"opened", u.connections.opened}, {"reused", u.connections.reused}, {"idle", u.connections.idle}}}});
        if (u.events.empty()) {
            list.back()["kv_events"] = nullptr;
            continue;
        }
        json blocks = json::object();
        for (size_t m = 0; m < kv_medium_count; m++) blocks[kv_medium_name(static_cast<kv_medium>(m))] = u.kv.blocks[m];
        list.back()["kv_events"] = {{"endpoint", u.events},
                                    {"in_step", u.kv.in_step},
                                    {"blocks", std::move(blocks)},
                                    {"messages", u.kv.messages},
                                    {"events", u.kv.events},
                                    {"resyncs", u.kv.resyncs},
                                    {"orphan_blocks", u.kv.orphan_blocks},
                                    {"exact_hits", s.exact_hits},
                                    {"exact_blocks", s.exact_blocks}};
    }
    return {{"upstreams", std::move(list)},
            {"overhead_ms", std::move(overhead)},
            {"routing",
             {{"block_chars", routing.block_chars},
              {"min_match_blocks", routing.min_match_blocks},
              {"rebalance_margin", routing.rebalance_margin},
              {"max_blocks_per_upstream", routing.max_blocks_per_upstream}}}};
}

void write_upstream_metrics(metrics_text& out, const std::vector<upstream_snapshot>& upstreams) {
    const auto per_upstream = [&](const char* name, const char* type, const char* help, auto value) {
        out.family(name, type, help);
        for (const upstream_snapshot& u : upstreams) {
            out.sample(name, static_cast<double>(value(u)), metrics_text::labels{{"upstream", u.url}});
        }
    };
    using snap = const upstream_snapshot&;
    per_upstream("keepwarm_proxy_upstream_up", "gauge", "1 while the upstream answers its health checks",
                 [](snap u) { return u.healthy; });
    per_upstream("keepwarm_proxy_requests_total", "counter", "Requests sent to the upstream",
                 [](snap u) { return u.routing.requests; });
    per_upstream("keepwarm_proxy_prefix_hits_total", "counter",
                 "Requests routed to the upstream because it was sent their prefix before",
                 [](snap u) { return u.routing.prefix_hits; });
    per_upstream("keepwarm_proxy_keyed_total", "counter",
                 "Requests sent to the upstream because their prompt_cache_key's requests go there",
                 [](snap u) { return u.routing.keyed; });
    per_upstream("keepwarm_proxy_rebalanced_total", "counter",
                 "Requests sent to the upstream although a longer prefix match was elsewhere (load won)",
                 [](snap u) { return u.routing.rebalanced; });
    per_upstream("keepwarm_proxy_exact_hits_total", "counter",
                 "Requests routed to the upstream because its KV events say it holds a prefix of their tokens",
                 [](snap u) { return u.routing.exact_hits; });
    per_upstream("keepwarm_proxy_kv_events_in_step", "gauge",
                 "1 while the proxy's index of the upstream's KV events is in step with it (0: routing infers)",
                 [](snap u) { return u.kv.in_step; });
    per_upstream("keepwarm_proxy_kv_events_resyncs_total", "counter",
                 "Times the upstream's KV events fell out of step (a gap, a broken message, a restart, overflow)",
                 [](snap u) { return u.kv.resyncs; });
    per_upstream("keepwarm_proxy_in_flight", "gauge", "Requests the upstream is answering now",
                 [](snap u) { return u.routing.in_flight; });
    per_upstream("keepwarm_proxy_prefix_tree_blocks", "gauge", "Blocks in the upstream's prefix tree",
                 [](snap u) { return u.routing.tree_blocks; });
    per_upstream("keepwarm_proxy_prefix_tree_forgotten_total", "counter",
                 "Times the upstream's prefix tree was dropped (it restarted or came back)",
                 [](snap u) { return u.routing.forgotten; });
    per_upstream("keepwarm_proxy_connections_opened_total", "counter",
                 "Connections opened to the upstream for requests", [](snap u) { return u.connections.opened; });
    per_upstream("keepwarm_proxy_connections_reused_total", "counter",
                 "Requests sent on a kept-alive connection to the upstream",
                 [](snap u) { return u.connections.reused; });
    per_upstream("keepwarm_proxy_connections_idle", "gauge",
                 "Kept-alive connections to the upstream waiting for a request",
                 [](snap u) { return u.connections.idle; });
}

}  // namespace keepwarm::proxy

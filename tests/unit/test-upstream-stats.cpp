// What the proxy reports: added_latency's percentiles over a window of recent requests and its histograms of every
// request, and the /v1/cache JSON and /metrics text rendered from per-upstream snapshots.
#include "proxy/upstream-stats.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

using namespace keepwarm;
using json = nlohmann::ordered_json;

namespace {

bool has_line(const std::string& text, const std::string& line) {
    return text.find("\n" + line + "\n") != std::string::npos || text.rfind(line + "\n", 0) == 0;
}

proxy::upstream_snapshot snapshot(const std::string& url, bool healthy) {
    proxy::upstream_snapshot s{
        .url = url, .dialect = proxy::upstream_dialect::anthropic, .model = "m", .healthy = healthy};
    s.routing.requests = 7;
    s.routing.prefix_hits = 3;
    s.routing.matched_blocks = 12;
    s.routing.rebalanced = 1;
    s.routing.keyed = 4;
    s.routing.in_flight = 2;
    s.routing.tree_blocks = 40;
    s.routing.forgotten = 1;
    s.connections = {.opened = 5, .reused = 9, .idle = 4};
    s.routing.exact_hits = 6;
    s.routing.exact_blocks = 30;
    return s;
}

// An upstream that publishes KV events, as the proxy's index saw them.
proxy::upstream_snapshot with_events(proxy::upstream_snapshot s) {
    s.events = "tcp://a:5557";
    s.kv.in_step = true;
    s.kv.blocks = {3, 2, 1};
    s.kv.messages = 11;
    s.kv.events = 17;
    s.kv.resyncs = 2;
    return s;
}

}  // namespace

TEST(added_latency, before_the_first_request_there_are_no_percentiles) {
    proxy::added_latency latency;
    const json s = latency.summary();
    EXPECT_EQ(s["requests"], 0);
    EXPECT_EQ(s["window"], 0);
    EXPECT_TRUE(s["forward"].is_null());
    EXPECT_TRUE(s["first_delta"].is_null());
    EXPECT_TRUE(s["total"].is_null());
}

TEST(added_latency, percentiles_cover_each_phase_and_their_sum) {
    proxy::added_latency latency;
    for (int i = 1; i <= 100; ++i) latency.record(i, 2.0 * i);
    const json s = latency.summary();
    EXPECT_EQ(s["requests"], 100);
    EXPECT_EQ(s["window"], 100);
    EXPECT_EQ(s["forward"]["p50"], 51.0);
    EXPECT_EQ(s["forward"]["p99"], 100.0);
    EXPECT_EQ(s["forward"]["max"], 100.0);
    EXPECT_EQ(s["first_delta"]["max"], 200.0);
    EXPECT_EQ(s["total"]["p50"], 153.0);
    EXPECT_EQ(s["total"]["max"], 300.0);
}

TEST(added_latency, the_window_keeps_the_last_requests_and_the_histograms_every_one) {
    proxy::added_latency latency(4);
    for (int i = 0; i < 6; ++i) latency.record(2000, 0);  // two seconds each: past the histograms' last bound
    for (int i = 0; i < 4; ++i) latency.record(0.05, 0.05);
    const json s = latency.summary();
    EXPECT_EQ(s["requests"], 10);
    EXPECT_EQ(s["window"], 4);
    EXPECT_FLOAT_EQ(s["forward"]["max"].get<float>(), 0.05f);  // the slow ones left the window

    metrics_text out;
    latency.write_metrics(out);
    const std::string text = out.str();
    EXPECT_TRUE(has_line(text, "# TYPE keepwarm_proxy_added_latency_seconds histogram")) << text;
    EXPECT_TRUE(has_line(text, R"(keepwarm_proxy_added_latency_seconds_count{phase="forward"} 10)")) << text;
    EXPECT_TRUE(has_line(text, R"(keepwarm_proxy_added_latency_seconds_count{phase="first_delta"} 10)")) << text;
    EXPECT_TRUE(has_line(text, R"(keepwarm_proxy_added_latency_seconds_count{phase="total"} 10)")) << text;
    // 0.05 ms is 50 microseconds: in the first bucket; the six slow ones only in +Inf.
    EXPECT_TRUE(has_line(text, R"(keepwarm_proxy_added_latency_seconds_bucket{phase="forward",le="0.0001"} 4)"))
        << text;
    EXPECT_TRUE(has_line(text, R"(keepwarm_proxy_added_latency_seconds_bucket{phase="forward",le="1"} 4)")) << text;
    EXPECT_TRUE(has_line(text, R"(keepwarm_proxy_added_latency_seconds_bucket{phase="forward",le="+Inf"} 10)")) << text;
}

TEST(added_latency, records_from_many_threads_are_all_counted) {
    proxy::added_latency latency(64);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&] {
            for (int i = 0; i < 1000; ++i) latency.record(0.1, 0.2);
        });
    }
    for (std::thread& t : threads) t.join();
    const json s = latency.summary();
    EXPECT_EQ(s["requests"], 4000);
    EXPECT_EQ(s["window"], 64);
}

TEST(upstream_stats, cache_json_lists_each_upstream_the_latency_and_the_routing_options) {
    proxy::router_options routing;
    routing.block_chars = 128;
    const json cache =
        proxy::cache_json({snapshot("http://a:1", true), snapshot("http://b:2", false)}, {{"requests", 0}}, routing);
    ASSERT_EQ(cache["upstreams"].size(), 2u);
    const json& a = cache["upstreams"][0];
    EXPECT_EQ(a["url"], "http://a:1");
    EXPECT_EQ(a["dialect"], "anthropic");
    EXPECT_EQ(a["model"], "m");
    EXPECT_EQ(a["healthy"], true);
    EXPECT_EQ(a["requests"], 7);
    EXPECT_EQ(a["prefix_hits"], 3);
    EXPECT_EQ(a["matched_blocks"], 12);
    EXPECT_EQ(a["rebalanced"], 1);
    EXPECT_EQ(a["keyed"], 4);
    EXPECT_EQ(a["in_flight"], 2);
    EXPECT_EQ(a["tree_blocks"], 40);
    EXPECT_EQ(a["forgotten"], 1);
    EXPECT_EQ(a["connections"], json({{"opened", 5}, {"reused", 9}, {"idle", 4}}));
    EXPECT_EQ(cache["upstreams"][1]["healthy"], false);
    EXPECT_EQ(cache["overhead_ms"]["requests"], 0);
    EXPECT_EQ(cache["routing"]["block_chars"], 128);
    EXPECT_EQ(cache["routing"]["min_match_blocks"], routing.min_match_blocks);
    EXPECT_EQ(cache["routing"]["rebalance_margin"], routing.rebalance_margin);
    EXPECT_EQ(cache["routing"]["max_blocks_per_upstream"], routing.max_blocks_per_upstream);
}

TEST(upstream_stats, metrics_give_each_family_once_with_one_sample_per_upstream) {
    metrics_text out;
    proxy::write_upstream_metrics(out, {snapshot("http://a:1", true), snapshot("http://b:2", false)});
    const std::string text = out.str();
    const auto count = [&](const std::string& what) {
        size_t n = 0;
        for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) n++;
        return n;
    };
    EXPECT_EQ(count("# TYPE keepwarm_proxy_upstream_up gauge"), 1u);
    EXPECT_TRUE(has_line(text, R"(keepwarm_proxy_upstream_up{upstream="http://a:1"} 1)")) << text;
    EXPECT_TRUE(has_line(text, R"(keepwarm_proxy_upstream_up{upstream="http://b:2"} 0)")) << text;
    EXPECT_TRUE(has_line(text, R"(keepwarm_proxy_requests_total{upstream="http://a:1"} 7)")) << text;
    EXPECT_TRUE(has_line(text, R"(keepwarm_proxy_prefix_hits_total{upstream="http://a:1"} 3)")) << text;
    EXPECT_TRUE(has_line(text, R"(keepwarm_proxy_rebalanced_total{upstream="http://a:1"} 1)")) << text;
    EXPECT_TRUE(has_line(text, R"(keepwarm_proxy_keyed_total{upstream="http://a:1"} 4)")) << text;
    EXPECT_TRUE(has_line(text, R"(keepwarm_proxy_in_flight{upstream="http://a:1"} 2)")) << text;
    EXPECT_TRUE(has_line(text, R"(keepwarm_proxy_prefix_tree_blocks{upstream="http://a:1"} 40)")) << text;
    EXPECT_TRUE(has_line(text, R"(keepwarm_proxy_prefix_tree_forgotten_total{upstream="http://a:1"} 1)")) << text;
    EXPECT_TRUE(has_line(text, R"(keepwarm_proxy_connections_opened_total{upstream="http://b:2"} 5)")) << text;
    EXPECT_TRUE(has_line(text, R"(keepwarm_proxy_connections_reused_total{upstream="http://b:2"} 9)")) << text;
    EXPECT_TRUE(has_line(text, R"(keepwarm_proxy_connections_idle{upstream="http://b:2"} 4)")) << text;
    EXPECT_TRUE(has_line(text, R"(keepwarm_proxy_exact_hits_total{upstream="http://a:1"} 6)")) << text;
    EXPECT_TRUE(has_line(text, R"(keepwarm_proxy_kv_events_in_step{upstream="http://a:1"} 0)")) << text;
    EXPECT_EQ(count("# TYPE "), 14u);
}

TEST(upstream_stats, kv_events_per_upstream_where_it_publishes_them) {
    const json cache = proxy::cache_json({with_events(snapshot("http://a:1", true)), snapshot("http://b:2", true)},
                                         {{"requests", 0}}, {});
    const json& kv = cache["upstreams"][0]["kv_events"];
    EXPECT_EQ(kv["endpoint"], "tcp://a:5557");
    EXPECT_EQ(kv["in_step"], true);
    EXPECT_EQ(kv["blocks"], json({{"gpu", 3}, {"cpu", 2}, {"disk", 1}}));
    EXPECT_EQ(kv["messages"], 11);
    EXPECT_EQ(kv["resyncs"], 2);
    EXPECT_EQ(kv["exact_hits"], 6);
    EXPECT_EQ(kv["exact_blocks"], 30);
    EXPECT_TRUE(cache["upstreams"][1]["kv_events"].is_null());
    metrics_text out;
    proxy::write_upstream_metrics(out, {with_events(snapshot("http://a:1", true))});
    EXPECT_TRUE(has_line(out.str(), R"(keepwarm_proxy_kv_events_in_step{upstream="http://a:1"} 1)")) << out.str();
    EXPECT_TRUE(has_line(out.str(), R"(keepwarm_proxy_kv_events_resyncs_total{upstream="http://a:1"} 2)"));
}

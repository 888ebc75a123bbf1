// upstream_pool, the parts put together, against keepwarm's own http_server on 127.0.0.1 standing in for an upstream:
// what a health check learns reaches routing (an upstream found down gets no request, one that restarted loses its
// prefix tree), the idle connections and the bias tokens; a failed call takes an upstream out of routing without
// forgetting its bias tokens; the model sent is the configured one, else the listed one, else the client's; /v1/cache
// and /metrics show every part; the key sent upstream.
#include "proxy/upstream-pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "http/http-server.h"

using namespace keepwarm;
using namespace std::chrono_literals;

namespace {

// An OpenAI-dialect upstream: its health answer (status and listing) can change; /tokenize answers
// `tokenize_failures` times 503, then token 42; POST /echo answers its body.
class fake_upstream {
public:
    explicit fake_upstream(int tokenize_failures = 0) : tokenize_failures_(tokenize_failures) {
        http::server_options options;
        options.port = 0;
        server_ = std::make_unique<http::http_server>(options);
        server_->add_route("GET", "/v1/models", [this](const http::request&, http::response_writer& w) {
            std::lock_guard lock(mu_);
            w.send(status_, "application/json", listing_);
        });
        server_->add_route("POST", "/tokenize", [this](const http::request&, http::response_writer& w) {
            if (tokenize_calls++ < tokenize_failures_) {
                w.send(503, "application/json", R"({"error":"not now"})");
            } else {
                w.send(200, "application/json", R"({"tokens":[42]})");
            }
        });
        server_->add_route("POST", "/echo", [](const http::request& req, http::response_writer& w) {
            w.send(200, "text/plain", req.body);
        });
        server_->start();
    }
    std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }
    void answer(int status, std::string listing = R"({"object":"list","data":[{"id":"m"}]})") {
        std::lock_guard lock(mu_);
        status_ = status;
        listing_ = std::move(listing);
    }

    std::atomic<int> tokenize_calls{0};

private:
    int tokenize_failures_;
    std::mutex mu_;
    int status_ = 200;
    std::string listing_ = R"({"object":"list","data":[{"id":"m"}]})";
    std::unique_ptr<http::http_server> server_;
};

proxy::pool_options checking_every(std::chrono::milliseconds interval, std::vector<std::string> bias_texts = {}) {
    proxy::pool_options options;
    options.health_interval = interval;
    options.health_timeout = 1s;
    options.bias_texts = std::move(bias_texts);
    return options;
}

bool eventually(const auto& condition) {
    for (int i = 0; i < 3000; ++i) {  // a hang guard: 60 s
        if (condition()) return true;
        std::this_thread::sleep_for(20ms);
    }
    return condition();
}

// Gives a connection that carried one whole request back to the pool.
void keep_one_alive(proxy::upstream_pool& pool, size_t upstream) {
    auto conn = pool.connection(upstream);
    conn->send("POST", "/echo", "hi", "text/plain");
    ASSERT_EQ(conn->read_body(), "hi");
    pool.keep_alive(upstream, std::move(conn));
}

const std::vector<uint64_t> blocks = {1, 2, 3};

}  // namespace

TEST(upstream_pool, a_bias_token_is_asked_for_again_at_the_health_checks_after_a_failure_that_may_pass) {
    fake_upstream upstream(/*tokenize_failures=*/2);
    proxy::upstream_pool pool({proxy::upstream_config::parse(upstream.url())}, checking_every(20ms, {"<think>"}));
    pool.start_health_checks();
    ASSERT_TRUE(eventually([&] { return pool.bias_token(0, "<think>").has_value(); }))
        << "tokenize calls: " << upstream.tokenize_calls.load();
    EXPECT_EQ(*pool.bias_token(0, "<think>"), 42);
    EXPECT_EQ(upstream.tokenize_calls.load(), 3);
}

TEST(upstream_pool, an_upstream_a_check_finds_down_gets_no_request_and_loses_its_idle_connections_and_bias_tokens) {
    fake_upstream upstream;
    proxy::upstream_pool pool({proxy::upstream_config::parse(upstream.url())}, checking_every(20ms, {"<think>"}));
    pool.start_health_checks();
    EXPECT_EQ(pool.bias_token(0, "<think>"), 42);  // the first check, in start_health_checks(), bound it
    keep_one_alive(pool, 0);
    EXPECT_EQ(pool.cache_json()["upstreams"][0]["connections"]["idle"], 1);

    upstream.answer(503);
    ASSERT_TRUE(eventually([&] { return pool.healthy_count() == 0; }));
    EXPECT_FALSE(pool.acquire(blocks, {}, "client-model"));
    EXPECT_FALSE(pool.peek(blocks, "client-model"));
    EXPECT_EQ(pool.cache_json()["upstreams"][0]["connections"]["idle"], 0);
    EXPECT_EQ(pool.cache_json()["upstreams"][0]["healthy"], false);
    EXPECT_FALSE(pool.bias_token(0, "<think>"));

    upstream.answer(200);
    ASSERT_TRUE(eventually([&] { return pool.bias_token(0, "<think>").has_value(); }));
    EXPECT_EQ(upstream.tokenize_calls.load(), 2);  // asked again: it may have come back with another model
    EXPECT_EQ(pool.healthy_count(), 1u);
    EXPECT_TRUE(pool.acquire(blocks, {}, "client-model"));
}

TEST(upstream_pool, a_failed_call_takes_an_upstream_out_of_routing_and_keeps_its_bias_tokens) {
    fake_upstream upstream;
    proxy::upstream_pool pool(
        {proxy::upstream_config::parse(upstream.url()), proxy::upstream_config::parse(upstream.url())},
        checking_every(std::chrono::hours(1), {"<think>"}));
    pool.start_health_checks();
    keep_one_alive(pool, 0);
    pool.mark_down(0, "it timed out");
    EXPECT_EQ(pool.healthy_count(), 1u);
    for (int i = 0; i < 5; ++i) {
        const auto route = pool.acquire(blocks, {}, "client-model");
        ASSERT_TRUE(route);
        EXPECT_EQ(route->upstream, 1u);
        pool.release(route->upstream);
    }
    EXPECT_FALSE(pool.acquire(blocks, {1}, "client-model"));
    EXPECT_EQ(pool.cache_json()["upstreams"][0]["connections"]["idle"], 0);
    keep_one_alive(pool, 0);  // a request that was under way: its connection is not kept
    EXPECT_EQ(pool.cache_json()["upstreams"][0]["connections"]["idle"], 0);
    EXPECT_EQ(pool.bias_token(0, "<think>"), 42);  // a timeout says nothing of its model
}

TEST(upstream_pool, a_restarted_keepwarm_upstream_loses_its_prefix_tree) {
    fake_upstream upstream;
    upstream.answer(200, R"({"object":"list","data":[{"id":"q","owned_by":"keepwarm","created":1}]})");
    proxy::upstream_pool pool({proxy::upstream_config::parse(upstream.url())}, checking_every(20ms));
    pool.start_health_checks();
    const auto route = pool.acquire(blocks, {}, "client-model");
    ASSERT_TRUE(route);
    pool.release(route->upstream);
    EXPECT_EQ(pool.cache_json()["upstreams"][0]["tree_blocks"], 3);

    upstream.answer(200, R"({"object":"list","data":[{"id":"q","owned_by":"keepwarm","created":2}]})");
    ASSERT_TRUE(eventually([&] { return pool.cache_json()["upstreams"][0]["forgotten"] == 1; }));
    EXPECT_EQ(pool.cache_json()["upstreams"][0]["tree_blocks"], 0);
    EXPECT_EQ(pool.healthy_count(), 1u);
}

TEST(upstream_pool, the_model_sent_is_the_configured_one_else_the_listed_one_else_the_clients) {
    fake_upstream upstream;
    proxy::upstream_pool pool({proxy::upstream_config::parse(upstream.url() + ",model=configured"),
                               proxy::upstream_config::parse(upstream.url())},
                              checking_every(std::chrono::hours(1)));
    // Before any check nothing is listed.
    EXPECT_EQ(pool.acquire(blocks, {1}, "client-model")->model, "configured");
    EXPECT_EQ(pool.acquire(blocks, {0}, "client-model")->model, "client-model");
    EXPECT_EQ(pool.cache_json()["upstreams"][1]["model"], "");
    pool.start_health_checks();
    EXPECT_EQ(pool.acquire(blocks, {0}, "client-model")->model, "m");
    EXPECT_EQ(pool.cache_json()["upstreams"][1]["model"], "m");
    const auto peeked = pool.peek({}, "client-model");  // nothing counted: the least loaded is still upstream 0
    ASSERT_TRUE(peeked);
    EXPECT_EQ(peeked->config, &pool.config(peeked->upstream));
}

TEST(upstream_pool, a_request_goes_only_to_the_upstreams_that_serve_its_model_and_that_name_is_sent) {
    fake_upstream first, second;
    first.answer(200, R"({"object":"list","data":[{"id":"qwen"},{"id":"llama"}]})");
    second.answer(200, R"({"object":"list","data":[{"id":"mistral"}]})");
    proxy::upstream_pool pool(
        {proxy::upstream_config::parse(first.url()), proxy::upstream_config::parse(second.url() + ",model=configured")},
        checking_every(std::chrono::hours(1)));
    pool.start_health_checks();
    EXPECT_EQ(pool.served_models(0), (std::vector<std::string>{"qwen", "llama"}));
    EXPECT_EQ(pool.served_models(1), (std::vector<std::string>{"configured", "mistral"}));
    EXPECT_EQ(pool.all_models(), (std::vector<std::string>{"qwen", "llama", "configured", "mistral"}));
    for (int i = 0; i < 6; i++) {  // the least loaded would alternate: the model keeps each on its upstream
        const auto llama = pool.acquire(blocks, {}, "llama");
        ASSERT_TRUE(llama);
        EXPECT_EQ(llama->upstream, 0u);
        EXPECT_EQ(llama->model, "llama");
        const auto mistral = pool.acquire(blocks, {}, "mistral");
        ASSERT_TRUE(mistral);
        EXPECT_EQ(mistral->upstream, 1u);
        EXPECT_EQ(mistral->model, "mistral");  // the request's model, not the spec's
    }
    EXPECT_EQ(pool.acquire(blocks, {}, "configured")->upstream, 1u);
    EXPECT_EQ(pool.peek(blocks, "qwen")->upstream, 0u);
    // Its only upstream left out (failed over): nowhere else serves it.
    EXPECT_FALSE(pool.acquire(blocks, {0}, "qwen"));
    const auto cache = pool.cache_json();
    EXPECT_EQ(cache["upstreams"][0]["models"], nlohmann::ordered_json({"qwen", "llama"}));
    EXPECT_EQ(cache["upstreams"][1]["models"], nlohmann::ordered_json({"configured", "mistral"}));
}

TEST(upstream_pool, a_name_no_upstream_lists_goes_to_every_upstream_as_before) {
    fake_upstream first, second;
    first.answer(200, R"({"object":"list","data":[{"id":"qwen"}]})");
    second.answer(200, R"({"object":"list","data":[{"id":"llama"}]})");
    proxy::upstream_pool pool({proxy::upstream_config::parse(first.url()), proxy::upstream_config::parse(second.url())},
                              checking_every(std::chrono::hours(1)));
    pool.start_health_checks();
    std::vector<size_t> chosen;
    for (int i = 0; i < 4; i++) {
        const auto route = pool.acquire({}, {}, "claude-sonnet-4-5");  // no prefix, held: the least loaded alternates
        ASSERT_TRUE(route);
        chosen.push_back(route->upstream);
        EXPECT_EQ(route->model, route->upstream == 0 ? "qwen" : "llama");  // each upstream's own, as before
    }
    EXPECT_NE(std::count(chosen.begin(), chosen.end(), 0u), 0);
    EXPECT_NE(std::count(chosen.begin(), chosen.end(), 1u), 0);
}

TEST(upstream_pool, cache_json_and_metrics_show_routing_health_connections_and_added_latency) {
    fake_upstream upstream;
    proxy::upstream_pool pool({proxy::upstream_config::parse(upstream.url())}, checking_every(std::chrono::hours(1)));
    pool.start_health_checks();
    const auto route = pool.acquire(blocks, {}, "client-model");
    ASSERT_TRUE(route);
    keep_one_alive(pool, 0);
    pool.record_overhead(0.5, 0.25);

    const auto cache = pool.cache_json();
    const auto& u = cache["upstreams"][0];
    EXPECT_EQ(u["url"], upstream.url());
    EXPECT_EQ(u["dialect"], "openai");
    EXPECT_EQ(u["model"], "m");
    EXPECT_EQ(u["healthy"], true);
    EXPECT_EQ(u["requests"], 1);
    EXPECT_EQ(u["in_flight"], 1);
    EXPECT_EQ(u["connections"]["opened"], 1);
    EXPECT_EQ(u["connections"]["idle"], 1);
    EXPECT_EQ(cache["overhead_ms"]["requests"], 1);
    EXPECT_FLOAT_EQ(cache["overhead_ms"]["total"]["max"].get<float>(), 0.75f);
    EXPECT_EQ(cache["routing"]["block_chars"], pool.routing().block_chars);

    pool.release(route->upstream);
    metrics_text out;
    pool.write_metrics(out);
    const std::string text = out.str();
    const std::string label = "{upstream=\"" + upstream.url() + "\"}";
    EXPECT_NE(text.find("keepwarm_proxy_upstream_up" + label + " 1\n"), std::string::npos) << text;
    EXPECT_NE(text.find("keepwarm_proxy_in_flight" + label + " 0\n"), std::string::npos) << text;
    EXPECT_NE(text.find("keepwarm_proxy_connections_idle" + label + " 1\n"), std::string::npos) << text;
    EXPECT_NE(text.find("keepwarm_proxy_added_latency_seconds_count{phase=\"total\"} 1\n"), std::string::npos) << text;
}

TEST(upstream_pool, with_tenants_an_upstream_without_a_key_gets_the_clients_key) {
    // A keepwarm upstream with the same keys file then keeps the proxy's tenants apart in its own cache.
    const std::vector<proxy::upstream_config> upstreams = {
        proxy::upstream_config::parse("http://127.0.0.1:9"),
        proxy::upstream_config::parse("http://127.0.0.1:9,key=own-key")};
    proxy::pool_options tenants;
    tenants.forward_client_keys = true;
    proxy::upstream_pool forwarding(upstreams, tenants);
    EXPECT_EQ(forwarding.credential(0, "sk-alice-0123"), "sk-alice-0123");
    EXPECT_EQ(forwarding.credential(1, "sk-alice-0123"), "own-key");
    proxy::upstream_pool plain(upstreams, proxy::pool_options{});
    EXPECT_EQ(plain.credential(0, "sk-alice-0123"), "");
    EXPECT_EQ(plain.credential(1, "sk-alice-0123"), "own-key");
}

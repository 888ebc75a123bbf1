// upstream_pool's health checks against keepwarm's own http_server on 127.0.0.1 standing in for an upstream: the
// policy's forced logit biases are bound to the upstream's token ids through its POST /tokenize, asked again after a
// failure that may pass (5xx, 429, no answer) and not after a definite one (the upstream has no /tokenize).
#include "proxy/upstream-pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "http/http-server.h"

using namespace keepwarm;
using namespace std::chrono_literals;

namespace {

// An OpenAI-dialect upstream whose /tokenize answers `failures` times with `failure_status`, then with token 42.
class fake_upstream {
public:
    fake_upstream(int failures, int failure_status) : failures_(failures), failure_status_(failure_status) {
        http::server_options options;
        options.port = 0;
        server_ = std::make_unique<http::http_server>(options);
        server_->add_route("GET", "/v1/models", [](const http::request&, http::response_writer& w) {
            w.send(200, "application/json", R"({"object":"list","data":[{"id":"m"}]})");
        });
        server_->add_route("POST", "/tokenize", [this](const http::request&, http::response_writer& w) {
            if (calls++ < failures_) {
                w.send(failure_status_, "application/json", R"({"error":"not now"})");
            } else {
                w.send(200, "application/json", R"({"tokens":[42]})");
            }
        });
        server_->start();
    }
    std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }

    std::atomic<int> calls{0};

private:
    int failures_, failure_status_;
    std::unique_ptr<http::http_server> server_;
};

proxy::pool_options biases_for(const std::string& text) {
    proxy::pool_options options;
    options.health_interval = 20ms;
    options.bias_texts = {text};
    return options;
}

bool eventually(const auto& condition) {
    for (int i = 0; i < 250; ++i) {
        if (condition()) return true;
        std::this_thread::sleep_for(20ms);
    }
    return condition();
}

}  // namespace

TEST(upstream_pool, a_bias_token_is_asked_for_again_after_a_failure_that_may_pass) {
    fake_upstream upstream(/*failures=*/2, /*failure_status=*/503);
    proxy::upstream_pool pool({proxy::upstream_config::parse(upstream.url())}, biases_for("<think>"));
    pool.start_health_checks();
    ASSERT_TRUE(eventually([&] { return pool.bias_token(0, "<think>").has_value(); }))
        << "tokenize calls: " << upstream.calls.load();
    EXPECT_EQ(*pool.bias_token(0, "<think>"), 42);
    EXPECT_EQ(upstream.calls.load(), 3);
}

TEST(upstream_pool, a_bias_token_is_not_asked_for_again_where_there_is_no_tokenize) {
    fake_upstream upstream(/*failures=*/1000, /*failure_status=*/404);
    proxy::upstream_pool pool({proxy::upstream_config::parse(upstream.url())}, biases_for("<think>"));
    pool.start_health_checks();
    ASSERT_TRUE(eventually([&] { return upstream.calls.load() >= 1; }));
    std::this_thread::sleep_for(200ms);  // ten more health checks
    EXPECT_EQ(upstream.calls.load(), 1);
    EXPECT_FALSE(pool.bias_token(0, "<think>").has_value());
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

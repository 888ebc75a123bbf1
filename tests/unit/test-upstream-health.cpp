// upstream_health against keepwarm's own http_server on 127.0.0.1 standing in for upstreams: a check finds an upstream
// up or down by its health call (with its key, on its dialect's path), keeps the model its answer lists, tells the
// hooks every change in order (the instance a keepwarm upstream names, failed calls apart from checks), runs
// after_up without its lock, and its thread checks every interval and stops at once.
#include "proxy/upstream-health.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "http/http-server.h"
#include "proxy/upstream-dialects.h"

using namespace keepwarm;
using namespace std::chrono_literals;

namespace {

// An upstream whose health call answers `status` with `listing`, counting the calls; with `key`, only a request that
// carries it in both headers keepwarm's proxy sends is answered 200.
class fake_upstream {
public:
    explicit fake_upstream(std::string key = "") : key_(std::move(key)) {
        http::server_options options;
        options.port = 0;
        server_ = std::make_unique<http::http_server>(options);
        for (const char* path : {"/v1/models", "/api/tags"}) {
            server_->add_route("GET", path, [this, path](const http::request& req, http::response_writer& w) {
                calls++;
                last_path = path;
                if (!key_.empty() &&
                    (req.header("authorization") != "Bearer " + key_ || req.header("x-api-key") != key_)) {
                    w.send(401, "application/json", R"({"error":"no key"})");
                    return;
                }
                std::lock_guard lock(mu_);
                w.send(status_, "application/json", listing_);
            });
        }
        server_->start();
    }
    std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }
    void answer(int status, std::string listing) {
        std::lock_guard lock(mu_);
        status_ = status;
        listing_ = std::move(listing);
    }

    std::atomic<int> calls{0};
    std::atomic<const char*> last_path{nullptr};

private:
    std::string key_;
    std::mutex mu_;
    int status_ = 200;
    std::string listing_ = R"({"object":"list","data":[{"id":"m"}]})";
    std::unique_ptr<http::http_server> server_;
};

// Every event the on_state hook saw.
struct event_log {
    std::mutex mu;
    std::vector<proxy::health_event> events;
    proxy::health_hooks hooks() {
        return {.on_state = [this](const proxy::health_event& e) {
            std::lock_guard lock(mu);
            events.push_back(e);
        }};
    }
    std::vector<proxy::health_event> seen() {
        std::lock_guard lock(mu);
        return events;
    }
};

proxy::health_options quick() {
    return {.interval = 20ms, .timeout = 1s, .failures_to_down = 1};
}

// An origin nothing listens on: a server started and stopped again.
std::string closed_url() {
    http::server_options options;
    options.port = 0;
    http::http_server server(options);
    server.start();
    const std::string url = "http://127.0.0.1:" + std::to_string(server.port());
    server.stop();
    return url;
}

}  // namespace

TEST(upstream_health, a_check_finds_an_answering_upstream_up_and_keeps_the_model_it_lists) {
    fake_upstream upstream;
    const std::vector<proxy::upstream_config> upstreams = {proxy::upstream_config::parse(upstream.url())};
    event_log log;
    proxy::upstream_health health(upstreams, quick(), log.hooks());
    EXPECT_EQ(health.listed_model(0), "");
    health.check_now();
    EXPECT_TRUE(health.up(0));
    EXPECT_EQ(health.up_count(), 1u);
    EXPECT_EQ(health.listed_model(0), "m");
    ASSERT_EQ(log.seen().size(), 1u);
    EXPECT_TRUE(log.seen()[0].up);
    EXPECT_TRUE(log.seen()[0].checked);
    EXPECT_EQ(log.seen()[0].instance, "");  // not a keepwarm upstream: its "created" means nothing stable
}

TEST(upstream_health, a_refused_or_failing_health_call_is_down_and_the_listed_model_stays) {
    fake_upstream upstream;
    const std::vector<proxy::upstream_config> upstreams = {proxy::upstream_config::parse(upstream.url()),
                                                           proxy::upstream_config::parse(closed_url())};
    event_log log;
    proxy::upstream_health health(upstreams, quick(), log.hooks());
    health.check_now();
    EXPECT_TRUE(health.up(0));
    EXPECT_FALSE(health.up(1));
    EXPECT_EQ(health.up_count(), 1u);

    upstream.answer(503, R"({"error":"loading"})");
    health.check_now();
    EXPECT_FALSE(health.up(0));
    EXPECT_EQ(health.up_count(), 0u);
    EXPECT_EQ(health.listed_model(0), "m");  // what it served last, for /v1/cache

    const auto events = log.seen();
    ASSERT_EQ(events.size(), 4u);  // two rounds of two upstreams, in order
    EXPECT_EQ(events[0].upstream, 0u);
    EXPECT_EQ(events[1].upstream, 1u);
    EXPECT_FALSE(events[1].up);
    EXPECT_EQ(events[2].upstream, 0u);
    EXPECT_FALSE(events[2].up);
}

TEST(upstream_health, a_keepwarm_upstream_names_its_instance_so_a_restart_can_be_seen) {
    fake_upstream upstream;
    upstream.answer(200, R"({"object":"list","data":[{"id":"q","owned_by":"keepwarm","created":1700000000}]})");
    const std::vector<proxy::upstream_config> upstreams = {proxy::upstream_config::parse(upstream.url())};
    event_log log;
    proxy::upstream_health health(upstreams, quick(), log.hooks());
    health.check_now();
    upstream.answer(200, R"({"object":"list","data":[{"id":"q","owned_by":"keepwarm","created":1700000099}]})");
    health.check_now();
    const auto events = log.seen();
    ASSERT_EQ(events.size(), 2u);
    EXPECT_EQ(events[0].instance, "1700000000");
    EXPECT_EQ(events[1].instance, "1700000099");
    EXPECT_EQ(health.listed_model(0), "q");
}

TEST(upstream_health, an_upstream_with_a_key_is_asked_with_it_and_ollama_on_its_own_path) {
    fake_upstream keyed("sk-up"), ollama;
    ollama.answer(200, R"({"models":[{"name":"llama3:8b"}]})");
    const std::vector<proxy::upstream_config> upstreams = {
        proxy::upstream_config::parse(keyed.url() + ",key=sk-up"),
        proxy::upstream_config::parse(keyed.url()),  // the same upstream without the key: refused
        proxy::upstream_config::parse(ollama.url() + ",dialect=ollama")};
    proxy::upstream_health health(upstreams, quick());
    health.check_now();
    EXPECT_TRUE(health.up(0));
    EXPECT_FALSE(health.up(1));
    EXPECT_TRUE(health.up(2));
    EXPECT_STREQ(ollama.last_path.load(), "/api/tags");
    EXPECT_EQ(health.listed_model(2), "llama3:8b");
}

TEST(upstream_health, a_failed_call_keeps_an_upstream_down_until_a_check_sees_it_answer) {
    fake_upstream upstream;
    const std::vector<proxy::upstream_config> upstreams = {proxy::upstream_config::parse(upstream.url())};
    event_log log;
    proxy::upstream_health health(upstreams, quick(), log.hooks());
    health.check_now();
    health.mark_down(0, "it timed out");
    EXPECT_FALSE(health.up(0));
    EXPECT_EQ(health.up_count(), 0u);
    health.mark_down(0, "again");  // already down: still told, still down
    EXPECT_FALSE(health.up(0));
    health.check_now();
    EXPECT_TRUE(health.up(0));

    const auto events = log.seen();
    ASSERT_EQ(events.size(), 4u);
    EXPECT_TRUE(events[0].checked);
    EXPECT_FALSE(events[1].up);
    EXPECT_FALSE(events[1].checked);  // a failed call, not a check: the hooks tell them apart
    EXPECT_FALSE(events[2].checked);
    EXPECT_TRUE(events[3].up);
    EXPECT_TRUE(events[3].checked);
}

TEST(upstream_health, after_up_runs_for_upstreams_found_up_without_the_health_lock) {
    fake_upstream upstream;
    const std::vector<proxy::upstream_config> upstreams = {proxy::upstream_config::parse(upstream.url()),
                                                           proxy::upstream_config::parse(closed_url())};
    std::vector<size_t> called;
    bool could_read_state = false;
    proxy::upstream_health* self = nullptr;
    proxy::upstream_health health(upstreams, {.interval = 20ms, .timeout = 1500ms},
                                  {.after_up = [&](size_t i, const http::client_options& client) {
                                      called.push_back(i);
                                      EXPECT_EQ(client.read_timeout, 1500ms);
                                      // With the health lock held this would wait for ever; from another thread it must
                                      // answer at once.
                                      auto answer = std::async(std::launch::async, [&] { return self->up_count(); });
                                      could_read_state = answer.wait_for(2s) == std::future_status::ready;
                                      if (!could_read_state)
                                          std::abort();  // a deadlock: fail loudly instead of hanging the suite
                                  }});
    self = &health;
    health.check_now();
    EXPECT_EQ(called, std::vector<size_t>{0});
    EXPECT_TRUE(could_read_state);
}

TEST(upstream_health, the_checker_thread_checks_every_interval_and_stops_at_once) {
    fake_upstream upstream;
    const std::vector<proxy::upstream_config> upstreams = {proxy::upstream_config::parse(upstream.url())};
    {
        proxy::upstream_health health(upstreams, quick());
        health.start();
        EXPECT_GE(upstream.calls.load(), 1);  // start() checks once before it returns
        for (int i = 0; i < 3000 && upstream.calls.load() < 5; ++i) std::this_thread::sleep_for(20ms);
        EXPECT_GE(upstream.calls.load(), 5);
    }
    const int after_stop = upstream.calls.load();
    std::this_thread::sleep_for(100ms);
    EXPECT_EQ(upstream.calls.load(), after_stop);

    auto slow = std::make_unique<proxy::upstream_health>(
        upstreams, proxy::health_options{.interval = std::chrono::hours(1), .timeout = 1s});
    slow->start();
    const auto start = std::chrono::steady_clock::now();
    slow.reset();  // an hour's wait is cut short
    EXPECT_LT(std::chrono::steady_clock::now() - start, 60s);
}

TEST(upstream_health, an_upstream_that_answered_goes_down_only_after_several_failed_checks_in_a_row) {
    fake_upstream upstream;
    const std::vector<proxy::upstream_config> upstreams = {proxy::upstream_config::parse(upstream.url()),
                                                           proxy::upstream_config::parse(closed_url())};
    event_log log;
    proxy::upstream_health health(upstreams, {.interval = 20ms, .timeout = 1s, .failures_to_down = 3}, log.hooks());
    health.check_now();
    EXPECT_TRUE(health.up(0));
    EXPECT_FALSE(health.up(1));  // never seen up: down at its first failed check

    // One missed check (a busy upstream, a lost answer) leaves the only upstream in routing; so does a second.
    upstream.answer(503, R"({"error":"busy"})");
    health.check_now();
    EXPECT_TRUE(health.up(0));
    health.check_now();
    EXPECT_TRUE(health.up(0));
    // An answer in between starts the count again.
    upstream.answer(200, R"({"object":"list","data":[{"id":"m"}]})");
    health.check_now();
    upstream.answer(503, R"({"error":"busy"})");
    health.check_now();
    health.check_now();
    EXPECT_TRUE(health.up(0));
    health.check_now();  // the third in a row
    EXPECT_FALSE(health.up(0));
    EXPECT_EQ(health.up_count(), 0u);

    // One answer brings it back.
    upstream.answer(200, R"({"object":"list","data":[{"id":"m"}]})");
    health.check_now();
    EXPECT_TRUE(health.up(0));
    // The hooks heard "up" for the tolerated misses, so routing never lost it.
    const auto events = log.seen();
    ASSERT_EQ(events.size(), 16u);  // eight rounds of two upstreams
    for (size_t i = 0; i < 12; i += 2) EXPECT_TRUE(events[i].up) << i;
    EXPECT_FALSE(events[12].up);
    EXPECT_TRUE(events[14].up);
}

TEST(upstream_health, a_redirecting_upstream_is_down_with_the_redirect_named) {
    http::server_options options;
    options.port = 0;
    http::http_server server(options);
    server.add_route("GET", "/v1/models", [](const http::request&, http::response_writer& w) {
        w.send(301, "text/plain", "moved", {{"Location", "https://upstream.example/v1/models"}});
    });
    server.start();
    const std::vector<proxy::upstream_config> upstreams = {
        proxy::upstream_config::parse("http://127.0.0.1:" + std::to_string(server.port()))};
    proxy::upstream_health health(upstreams, quick());
    health.check_now();
    EXPECT_FALSE(health.up(0));
    const std::string message =
        proxy::redirect_message(301, {{"location", "https://upstream.example/v1/models\r\nx: y"}}, "http://u");
    EXPECT_EQ(message,
              "upstream http://u answered 301 redirect to https://upstream.example/v1/models??x: y; keepwarm does not "
              "follow redirects (give the upstream's final URL)");
}

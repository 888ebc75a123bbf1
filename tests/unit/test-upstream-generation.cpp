// upstream_generation, the proxy's backend, without the proxy's routes: against keepwarm's own http_server on
// 127.0.0.1 standing in for an OpenAI-dialect upstream that answers a scripted stream, answering through a fake
// response_writer. What the upstream sends comes back as deltas with its numbers and the connection is kept for the
// next request; the policy runs first (a ping never reaches an upstream, a strict pin refuses before one is asked);
// an upstream's error answer, its broken stream, no upstream up and a client that leaves each end as the routes need.
#include "proxy/upstream-generation.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "base/request-error.h"
#include "fake-response-writer.h"
#include "http/http-server.h"
#include "proxy/upstream-call.h"
#include "proxy/upstream-completion.h"

using namespace keepwarm;
using namespace std::chrono_literals;
using test_support::fake_writer;
using json = nlohmann::ordered_json;

namespace {

// How the fake upstream answers POST /v1/chat/completions.
enum class answer_kind {
    whole,      // the deltas, the usage and [DONE]
    error,      // `error_status` with an OpenAI error body, before any stream
    broken,     // the first delta, then the body ends without [DONE]
    stalls,     // the first delta, then keep-alive comments until its client goes (at most 5 s)
    truncated,  // the deltas, finish_reason "length", the usage and [DONE]
    pings,      // keep-alive comments only, until its client goes (at most 5 s)
    trickles,   // a one-letter delta every 50 ms until its client goes (at most 5 s)
    redirects,  // 302 to another URL
};

std::string sse(const json& data) {
    return "data: " + data.dump() + "\n\n";
}

json delta_chunk(const std::string& text) {
    return {{"id", "u1"},
            {"object", "chat.completion.chunk"},
            {"choices", json::array({{{"index", 0}, {"delta", {{"content", text}}}, {"finish_reason", nullptr}}})}};
}

class fake_upstream {
public:
    fake_upstream() {
        http::server_options options;
        options.port = 0;
        server_ = std::make_unique<http::http_server>(options);
        server_->add_route("GET", "/v1/models", [this](const http::request&, http::response_writer& w) {
            w.send(health_status.load(), "application/json", R"({"object":"list","data":[{"id":"up-model"}]})");
        });
        server_->add_route("POST", "/v1/chat/completions", [this](const http::request& req, http::response_writer& w) {
            {
                std::lock_guard lock(mu_);
                bodies_.push_back(json::parse(req.body));
            }
            answer(w);
        });
        // Raw completions: a whole JSON answer (whole), keep-alive comments only (pings), or a JSON body a byte at a
        // time (trickles).
        server_->add_route("POST", "/v1/completions", [this](const http::request&, http::response_writer& w) {
            if (kind.load() == answer_kind::whole) {
                w.send(200, "application/json", R"({"object":"text_completion","choices":[{"text":" there"}]})");
                return;
            }
            const bool pings = kind.load() == answer_kind::pings;
            if (!w.begin_stream(200, pings ? "text/event-stream" : "application/json", {})) return;
            for (int i = 0; i < 1200; ++i) {  // a minute, far past every limit the tests set
                std::this_thread::sleep_for(50ms);
                if (!w.write_chunk(pings ? ": ping\n\n" : " ")) return;
            }
            w.end_stream();
        });
        server_->start();
    }
    std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }
    std::vector<json> bodies() {
        std::lock_guard lock(mu_);
        return bodies_;
    }

    std::atomic<answer_kind> kind{answer_kind::whole};
    std::atomic<int> error_status{400};
    std::atomic<int> health_status{200};
    std::atomic<bool> saw_client_leave{false};

private:
    void answer(http::response_writer& w) {
        const answer_kind k = kind.load();
        if (k == answer_kind::error) {
            w.send(error_status.load(), "application/json",
                   R"({"error":{"message":"the upstream says no","type":"invalid_request_error"}})");
            return;
        }
        if (k == answer_kind::redirects) {
            w.send(302, "text/html", "<a href=\"http://elsewhere.example/v1\">moved</a>",
                   {{"Location", "http://elsewhere.example/v1/chat/completions"}});
            return;
        }
        if (!w.begin_stream(200, "text/event-stream", {})) return;
        if (k == answer_kind::pings || k == answer_kind::trickles) {
            for (int i = 0; i < 1200; ++i) {  // a minute, far past every limit the tests set
                std::this_thread::sleep_for(50ms);
                if (!w.write_chunk(k == answer_kind::pings ? ": ping\n\n" : sse(delta_chunk("a")))) {
                    saw_client_leave = true;
                    return;
                }
            }
            w.end_stream();
            return;
        }
        w.write_chunk(sse(delta_chunk("Hello")));
        if (k == answer_kind::broken) {
            w.end_stream();
            return;
        }
        if (k == answer_kind::stalls) {
            for (int i = 0; i < 3000; ++i) {  // a minute
                std::this_thread::sleep_for(20ms);
                if (!w.write_chunk(": waiting\n\n")) {
                    saw_client_leave = true;
                    return;
                }
            }
            w.end_stream();
            return;
        }
        w.write_chunk(sse(delta_chunk(" world")));
        json last = {
            {"id", "u1"},
            {"object", "chat.completion.chunk"},
            {"choices", json::array({{{"index", 0},
                                      {"delta", json::object()},
                                      {"finish_reason", k == answer_kind::truncated ? "length" : "stop"}}})},
            {"usage",
             {{"prompt_tokens", 12}, {"completion_tokens", 2}, {"prompt_tokens_details", {{"cached_tokens", 8}}}}}};
        w.write_chunk(sse(last));
        w.write_chunk("data: [DONE]\n\n");
        w.end_stream();
    }

    std::mutex mu_;
    std::vector<json> bodies_;
    std::unique_ptr<http::http_server> server_;
};

chat_request chat(const std::string& model, int max_tokens) {
    chat_request c;
    c.model = model;
    c.messages.push_back(common_chat_msg{.role = "user", .content = "Tell me about the sea."});
    c.max_tokens = max_tokens;
    return c;
}

// Every update of a source until the one that is done (nullopt: the client left), with the text of its deltas.
std::optional<generation_source::update> run_to_end(generation_source& source, std::string& text) {
    for (;;) {
        auto u = source.next();
        if (!u) return u;
        for (const auto& d : u->diffs) text += d.content_delta;
        if (u->done) return u;
    }
}

std::string header_of(const http::header_list& headers, const std::string& name) {
    for (const auto& [n, v] : headers) {
        if (n == name) return v;
    }
    return {};
}

// A port on 127.0.0.1 that refuses every connection: bound but never listening, and held while the object lives.
class refusing_port {
public:
    refusing_port() : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof addr;
        if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
            ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
            throw std::runtime_error("refusing_port: cannot bind a port");
        }
        port_ = ntohs(addr.sin_port);
    }
    ~refusing_port() { ::close(fd_); }
    refusing_port(const refusing_port&) = delete;
    refusing_port& operator=(const refusing_port&) = delete;
    std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

private:
    int fd_;
    int port_ = 0;
};

class upstream_generation_test : public ::testing::Test {
protected:
    upstream_generation_test() { use_pool({}); }

    // A pool of the one fake upstream with `options` (health checks: only the first, in start_health_checks()).
    void use_pool(proxy::pool_options options) {
        options.health_interval = std::chrono::hours(1);
        options.health_timeout = 2s;
        pool = std::make_unique<proxy::upstream_pool>(
            std::vector<proxy::upstream_config>{proxy::upstream_config::parse(upstream.url())}, options);
        pool->start_health_checks();
    }

    // Starts an upstream generation as the proxy's routes do.
    generation_source_ptr open(chat_request c, fake_writer& w) {
        return proxy::upstream_generations(front, *pool)(req, std::move(c), clock, w, "chatcmpl-test");
    }
    // The status of the request_error that opening `c` throws; 0 if it opens.
    int refusal(chat_request c, std::string* message = nullptr) {
        fake_writer w;
        try {
            open(std::move(c), w);
        } catch (const request_error& e) {
            if (message) *message = e.what();
            return e.status;
        }
        return 0;
    }
    json upstream_stats() const { return pool->cache_json()["upstreams"][0]; }

    fake_upstream upstream;
    std::unique_ptr<proxy::upstream_pool> pool;
    frontend_context front;
    http::request req;
    request_clock clock;
};

}  // namespace

TEST_F(upstream_generation_test, relays_the_stream_as_deltas_with_its_numbers_and_keeps_the_connection) {
    fake_writer w;
    generation_source_ptr source = open(chat("client-model", 16), w);
    std::string text;
    const auto last = run_to_end(*source, text);
    ASSERT_TRUE(last);
    EXPECT_EQ(last->reason, finish_reason::stop) << last->error;
    EXPECT_EQ(text, "Hello world");
    EXPECT_EQ(source->message().content, "Hello world");
    EXPECT_EQ(last->report.prompt_tokens, 12);
    EXPECT_EQ(last->report.reused_tokens, 8);
    EXPECT_EQ(last->report.computed_tokens, 4);
    EXPECT_EQ(header_of(source->response_headers(), "x-keepwarm-upstream"), upstream.url());

    // The upstream was asked once, streamed, with the model it lists and the client's messages.
    const std::vector<json> bodies = upstream.bodies();
    ASSERT_EQ(bodies.size(), 1u);
    EXPECT_EQ(bodies[0]["model"], "up-model");
    EXPECT_EQ(bodies[0]["stream"], true);
    EXPECT_EQ(bodies[0]["messages"][0]["content"], "Tell me about the sea.");
    EXPECT_EQ(bodies[0]["max_tokens"], 16);

    // Before the last update came back, the answer's connection went back to the pool and the router let go.
    EXPECT_EQ(upstream_stats()["connections"]["idle"], 1);
    EXPECT_EQ(upstream_stats()["in_flight"], 0);
    source.reset();
    EXPECT_EQ(upstream_stats()["connections"]["idle"], 1);
}

TEST_F(upstream_generation_test, an_answer_cut_at_its_limit_finishes_for_length) {
    upstream.kind = answer_kind::truncated;
    fake_writer w;
    generation_source_ptr source = open(chat("client-model", 2), w);
    std::string text;
    const auto last = run_to_end(*source, text);
    ASSERT_TRUE(last);
    EXPECT_EQ(last->reason, finish_reason::length);
    EXPECT_EQ(text, "Hello world");
}

TEST_F(upstream_generation_test, a_ping_the_policy_absorbs_never_reaches_an_upstream) {
    policy::policy_config config;
    config.source = "test";
    config.ping.enabled = true;
    config.ping.matchers.push_back({.max_tokens_at_most = 1});
    front.policy = std::make_unique<policy::request_policy>(std::move(config), "served");
    const std::string reply = front.policy->config().ping.reply;

    fake_writer w;
    generation_source_ptr source = open(chat("client-model", 1), w);
    std::string text;
    const auto last = run_to_end(*source, text);
    ASSERT_TRUE(last);
    EXPECT_EQ(last->reason, finish_reason::stop);
    EXPECT_EQ(text, reply);
    EXPECT_EQ(last->report.prompt_tokens, 0);
    EXPECT_NE(header_of(source->response_headers(), "x-keepwarm-policy").find("ping"), std::string::npos);
    EXPECT_TRUE(upstream.bodies().empty());
    EXPECT_EQ(upstream_stats()["requests"], 0);
}

TEST_F(upstream_generation_test, a_strict_pin_refuses_another_model_before_an_upstream_is_asked) {
    policy::policy_config config;
    config.source = "test";
    config.model.mode = policy::model_mode::strict;
    front.policy = std::make_unique<policy::request_policy>(std::move(config), "served");
    std::string message;
    EXPECT_EQ(refusal(chat("another-model", 8), &message), 404);
    EXPECT_NE(message.find("another-model"), std::string::npos) << message;
    EXPECT_TRUE(upstream.bodies().empty());
}

TEST_F(upstream_generation_test, an_upstream_4xx_is_passed_on_and_a_5xx_becomes_a_502) {
    upstream.kind = answer_kind::error;
    upstream.error_status = 400;
    std::string message;
    EXPECT_EQ(refusal(chat("client-model", 8), &message), 400);
    EXPECT_NE(message.find("the upstream says no"), std::string::npos) << message;

    upstream.error_status = 500;
    EXPECT_EQ(refusal(chat("client-model", 8), &message), 502);
    EXPECT_NE(message.find(upstream.url()), std::string::npos) << message;
    EXPECT_EQ(upstream_stats()["in_flight"], 0);  // the router let go of both
}

TEST_F(upstream_generation_test, no_upstream_up_is_a_503_that_says_how_many_are_down) {
    upstream.health_status = 503;
    proxy::pool_options options;
    options.health_interval = std::chrono::hours(1);
    options.health_timeout = 2s;
    pool = std::make_unique<proxy::upstream_pool>(
        std::vector<proxy::upstream_config>{proxy::upstream_config::parse(upstream.url())}, options);
    pool->start_health_checks();
    ASSERT_EQ(pool->healthy_count(), 0u);
    std::string message;
    EXPECT_EQ(refusal(chat("client-model", 8), &message), 503);
    EXPECT_NE(message.find("1 configured, 1 down"), std::string::npos) << message;
    EXPECT_TRUE(upstream.bodies().empty());
}

TEST_F(upstream_generation_test, a_stream_that_breaks_off_ends_with_an_error_and_takes_the_upstream_out_of_routing) {
    upstream.kind = answer_kind::broken;
    fake_writer w;
    generation_source_ptr source = open(chat("client-model", 16), w);
    std::string text;
    const auto last = run_to_end(*source, text);
    ASSERT_TRUE(last);
    EXPECT_EQ(last->reason, finish_reason::error);
    EXPECT_NE(last->error.find("upstream " + upstream.url()), std::string::npos) << last->error;
    EXPECT_EQ(text, "Hello");  // what came before the break was relayed
    EXPECT_EQ(pool->healthy_count(), 0u);
    EXPECT_EQ(upstream_stats()["connections"]["idle"], 0);  // a broken answer's connection is not reused
}

TEST_F(upstream_generation_test, a_client_that_leaves_cancels_the_upstream_call_and_is_counted) {
    upstream.kind = answer_kind::stalls;
    fake_writer w;
    generation_source_ptr source = open(chat("client-model", 16), w);
    const auto first = source->next();
    ASSERT_TRUE(first);
    ASSERT_FALSE(first->done);
    w.gone = true;
    const auto start = std::chrono::steady_clock::now();
    EXPECT_FALSE(source->next());
    EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);  // noticed at the client check, not the upstream's end
    EXPECT_EQ(front.http.disconnects.load(), 1u);
    source.reset();
    EXPECT_EQ(upstream_stats()["connections"]["idle"], 0);
    EXPECT_EQ(upstream_stats()["in_flight"], 0);
    for (int i = 0; i < 3000 && !upstream.saw_client_leave; ++i) std::this_thread::sleep_for(20ms);
    EXPECT_TRUE(upstream.saw_client_leave.load());  // the upstream's write failed: its call was closed
}

namespace {

chat_request streamed(chat_request c) {
    c.stream = true;
    return c;
}

// Short answer limits, so that a test sees them trip in well under the fake upstream's minute, and far above the
// 50 ms between its trickled deltas even on a busy machine.
proxy::pool_options short_limits() {
    proxy::pool_options options;
    options.first_byte_timeout = 1s;
    options.idle_timeout = 1s;
    options.answer_timeout = 2s;
    return options;
}

}  // namespace

TEST_F(upstream_generation_test, keep_alive_comments_are_not_progress_and_a_whole_answer_gets_a_504) {
    use_pool(short_limits());
    upstream.kind = answer_kind::pings;
    fake_writer w;
    generation_source_ptr source = open(chat("client-model", 16), w);
    const auto start = std::chrono::steady_clock::now();
    try {
        std::string text;
        run_to_end(*source, text);
        FAIL() << "an upstream that only pings held the request";
    } catch (const request_error& e) {
        EXPECT_EQ(e.status, 504);
        EXPECT_NE(std::string(e.what()).find("sent no content in 1 s"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("keep-alive comments are not progress"), std::string::npos) << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);  // the upstream would ping for a minute
    source.reset();
    EXPECT_EQ(upstream_stats()["in_flight"], 0);
    EXPECT_EQ(upstream_stats()["connections"]["idle"], 0);  // the call was cancelled, not kept

    // The upstream stays in routing (it answers; its checks decide), and the next request is served.
    EXPECT_EQ(pool->healthy_count(), 1u);
    upstream.kind = answer_kind::whole;
    generation_source_ptr next = open(chat("client-model", 16), w);
    std::string text;
    const auto last = run_to_end(*next, text);
    ASSERT_TRUE(last);
    EXPECT_EQ(last->reason, finish_reason::stop) << last->error;
    EXPECT_EQ(text, "Hello world");
}

TEST_F(upstream_generation_test, a_stream_that_goes_quiet_after_its_first_delta_ends_with_an_error) {
    use_pool(short_limits());
    upstream.kind = answer_kind::stalls;  // "Hello", then keep-alive comments
    fake_writer w;
    generation_source_ptr source = open(streamed(chat("client-model", 16)), w);
    std::string text;
    const auto start = std::chrono::steady_clock::now();
    const auto last = run_to_end(*source, text);
    ASSERT_TRUE(last);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);  // the upstream would wait for a minute
    EXPECT_EQ(last->reason, finish_reason::error);
    EXPECT_NE(last->error.find("sent no content for 1 s (--upstream-idle-timeout"), std::string::npos) << last->error;
    EXPECT_EQ(text, "Hello");
    EXPECT_EQ(upstream_stats()["in_flight"], 0);
    EXPECT_EQ(pool->healthy_count(), 1u);
}

TEST_F(upstream_generation_test, a_whole_answer_has_a_deadline_however_it_trickles_but_a_stream_does_not) {
    use_pool(short_limits());
    upstream.kind = answer_kind::trickles;  // a delta every 50 ms: progress, but never an end
    fake_writer w;
    generation_source_ptr source = open(chat("client-model", 16), w);
    std::string text;
    try {
        run_to_end(*source, text);
        FAIL() << "a trickling upstream held a whole answer";
    } catch (const request_error& e) {
        EXPECT_EQ(e.status, 504);
        EXPECT_NE(std::string(e.what()).find("did not finish its answer in 2 s (--answer-timeout)"), std::string::npos)
            << e.what();
    }
    EXPECT_FALSE(text.empty());

    // A streamed answer that makes progress goes on past answer_timeout: its client sees it grow.
    generation_source_ptr stream = open(streamed(chat("client-model", 16)), w);
    const auto start = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - start < 2500ms) {
        const auto u = stream->next();
        ASSERT_TRUE(u);
        ASSERT_FALSE(u->done) << u->error;
    }
}

TEST_F(upstream_generation_test, a_redirect_is_reported_as_one) {
    upstream.kind = answer_kind::redirects;
    std::string message;
    EXPECT_EQ(refusal(chat("client-model", 8), &message), 502);
    EXPECT_NE(message.find("answered 302 redirect to http://elsewhere.example/v1/chat/completions"), std::string::npos)
        << message;
    EXPECT_NE(message.find("does not follow redirects"), std::string::npos) << message;
    EXPECT_EQ(message.find("end event"), std::string::npos) << message;
    EXPECT_EQ(upstream_stats()["in_flight"], 0);
}

TEST_F(upstream_generation_test, a_raw_completion_is_held_to_the_same_limits) {
    use_pool(short_limits());
    req.body = R"({"prompt":"Once upon a time","max_tokens":8})";
    const generation_handler completions = proxy::upstream_completions(*pool);

    upstream.kind = answer_kind::pings;  // a stream of keep-alive comments only
    fake_writer streamed_client;
    auto start = std::chrono::steady_clock::now();
    completions(front, req, streamed_client, clock);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);  // the upstream would ping for a minute
    EXPECT_NE(streamed_client.body.find("sent no data in 1 s"), std::string::npos) << streamed_client.body;
    EXPECT_NE(streamed_client.body.find("data: [DONE]"), std::string::npos) << streamed_client.body;
    EXPECT_TRUE(streamed_client.ended);

    upstream.kind = answer_kind::trickles;  // a whole answer a byte at a time
    fake_writer whole_client;
    start = std::chrono::steady_clock::now();
    try {
        completions(front, req, whole_client, clock);
        FAIL() << "a trickling upstream held a whole completion";
    } catch (const request_error& e) {
        EXPECT_EQ(e.status, 504);
        EXPECT_NE(std::string(e.what()).find("did not finish its answer in 2 s"), std::string::npos) << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
    EXPECT_EQ(upstream_stats()["in_flight"], 0);
}

// The fail-over both paths share (upstream-call.h): a refused connection has reached no client, so the next upstream
// answers, and the one that refused is out of routing.
TEST_F(upstream_generation_test, an_upstream_that_refuses_is_marked_down_and_a_chat_goes_to_the_next) {
    refusing_port dead;
    proxy::pool_options options;
    options.health_interval = std::chrono::hours(1);
    // No health check: both count as up, and the first (equally loaded) is tried first.
    pool = std::make_unique<proxy::upstream_pool>(
        std::vector<proxy::upstream_config>{proxy::upstream_config::parse(dead.url()),
                                            proxy::upstream_config::parse(upstream.url())},
        options);
    fake_writer w;
    generation_source_ptr source = open(chat("client-model", 8), w);
    std::string text;
    const auto end = run_to_end(*source, text);
    ASSERT_TRUE(end);
    EXPECT_EQ(end->reason, finish_reason::stop);
    EXPECT_EQ(text, "Hello world");
    EXPECT_EQ(header_of(source->response_headers(), "x-keepwarm-upstream"), upstream.url());
    const json upstreams = pool->cache_json()["upstreams"];
    EXPECT_FALSE(upstreams[0]["healthy"].get<bool>());
    EXPECT_EQ(upstreams[0]["in_flight"], 0);  // released when it failed
    EXPECT_EQ(pool->healthy_count(), 1u);
    EXPECT_EQ(upstream.bodies().size(), 1u);
}

TEST_F(upstream_generation_test, an_upstream_that_refuses_is_marked_down_and_a_raw_completion_goes_to_the_next) {
    refusing_port dead;
    proxy::pool_options options;
    options.health_interval = std::chrono::hours(1);
    pool = std::make_unique<proxy::upstream_pool>(
        std::vector<proxy::upstream_config>{proxy::upstream_config::parse(dead.url()),
                                            proxy::upstream_config::parse(upstream.url())},
        options);
    req.body = R"({"prompt":"Once upon a time","max_tokens":8})";
    fake_writer w;
    proxy::upstream_completions (*pool)(front, req, w, clock);
    EXPECT_EQ(w.status, 200);
    EXPECT_NE(w.body.find(" there"), std::string::npos) << w.body;
    EXPECT_EQ(header_of(w.headers, "x-keepwarm-upstream"), upstream.url());
    const json upstreams = pool->cache_json()["upstreams"];
    EXPECT_FALSE(upstreams[0]["healthy"].get<bool>());
    EXPECT_EQ(upstreams[0]["in_flight"], 0);
    EXPECT_EQ(upstreams[1]["in_flight"], 0);
    EXPECT_EQ(pool->healthy_count(), 1u);
}

// With every upstream refusing, the request is refused as one no upstream could take, after each was tried once.
TEST_F(upstream_generation_test, when_every_upstream_refuses_the_request_is_a_503_that_says_they_failed) {
    refusing_port first, second;
    proxy::pool_options options;
    options.health_interval = std::chrono::hours(1);
    pool = std::make_unique<proxy::upstream_pool>(
        std::vector<proxy::upstream_config>{proxy::upstream_config::parse(first.url()),
                                            proxy::upstream_config::parse(second.url())},
        options);
    std::string message;
    EXPECT_EQ(refusal(chat("client-model", 8), &message), 503);
    EXPECT_NE(message.find("2 configured, 2 down, the others failed"), std::string::npos) << message;

    pool = std::make_unique<proxy::upstream_pool>(
        std::vector<proxy::upstream_config>{proxy::upstream_config::parse(first.url()),
                                            proxy::upstream_config::parse(second.url())},
        options);
    req.body = R"({"prompt":"Once upon a time","max_tokens":8})";
    fake_writer w;
    try {
        proxy::upstream_completions (*pool)(front, req, w, clock);
        FAIL() << "a raw completion went through with every upstream refusing";
    } catch (const request_error& e) {
        EXPECT_EQ(e.status, 503);
        EXPECT_NE(std::string(e.what()).find("2 configured, 2 down, the others failed"), std::string::npos) << e.what();
    }
}

// call_upstream's own contract: whatever ends a try, the upstream it counted in flight is let go.
TEST_F(upstream_generation_test, a_call_that_throws_while_building_its_request_leaves_no_upstream_counted) {
    const std::vector<uint64_t> blocks;
    EXPECT_THROW(proxy::call_upstream(
                     *pool, {.blocks = blocks, .model = "m"},
                     [](const proxy::upstream_pool::route&) -> proxy::upstream_call {
                         throw std::invalid_argument("cannot write this request");
                     },
                     "test"),
                 std::invalid_argument);
    EXPECT_EQ(upstream_stats()["in_flight"], 0);
    EXPECT_TRUE(upstream.bodies().empty());
}

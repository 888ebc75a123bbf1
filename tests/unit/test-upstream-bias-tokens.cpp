// bias_tokens against keepwarm's own http_server on 127.0.0.1 standing in for an upstream's POST /tokenize: a text that
// is one token is bound to its id (asked with the upstream's key), one that is several or an id that is no token id is
// not applied; a failure that may pass (5xx, 429, no answer) is asked again, a definite one (no /tokenize, another
// dialect, an answer that is not a token list) is not; forget() asks again.
#include "proxy/upstream-bias-tokens.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "http/http-server.h"

using namespace keepwarm;
using namespace std::chrono_literals;

namespace {

// An upstream whose /tokenize answers `failures` times with `failure_status`, then with `answer`.
class fake_tokenizer {
public:
    fake_tokenizer(int failures, int failure_status, std::string answer = R"({"tokens":[42]})")
        : failures_(failures), failure_status_(failure_status), answer_(std::move(answer)) {
        http::server_options options;
        options.port = 0;
        server_ = std::make_unique<http::http_server>(options);
        server_->add_route("POST", "/tokenize", [this](const http::request& req, http::response_writer& w) {
            {
                std::lock_guard lock(mu_);
                last_authorization_ = req.header("authorization");
                last_body_ = req.body;
            }
            if (calls++ < failures_) {
                w.send(failure_status_, "application/json", R"({"error":"not now"})");
            } else {
                w.send(200, "application/json", answer_);
            }
        });
        server_->start();
    }
    std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }
    std::string last_authorization() {
        std::lock_guard lock(mu_);
        return last_authorization_;
    }
    std::string last_body() {
        std::lock_guard lock(mu_);
        return last_body_;
    }

    std::atomic<int> calls{0};

private:
    int failures_, failure_status_;
    std::string answer_;
    std::mutex mu_;
    std::string last_authorization_, last_body_;
    std::unique_ptr<http::http_server> server_;
};

const http::client_options client{.connect_timeout = 1s, .read_timeout = 1s, .write_timeout = 1s};

}  // namespace

TEST(bias_tokens, a_text_that_is_one_token_is_bound_to_its_id_asked_with_the_upstreams_key) {
    fake_tokenizer upstream(0, 0);
    const std::vector<proxy::upstream_config> upstreams = {proxy::upstream_config::parse(upstream.url() + ",key=k1")};
    proxy::bias_tokens tokens(upstreams, {"<think>"});
    EXPECT_FALSE(tokens.known(0));
    EXPECT_FALSE(tokens.lookup(0, "<think>"));
    tokens.bind(0, client);
    EXPECT_TRUE(tokens.known(0));
    EXPECT_EQ(tokens.lookup(0, "<think>"), 42);
    EXPECT_FALSE(tokens.lookup(0, "</think>"));  // not a bias text
    EXPECT_EQ(upstream.last_authorization(), "Bearer k1");
    EXPECT_NE(upstream.last_body().find(R"("parse_special":true)"), std::string::npos) << upstream.last_body();
    tokens.bind(0, client);  // known: not asked again
    EXPECT_EQ(upstream.calls.load(), 1);
}

TEST(bias_tokens, a_failure_that_may_pass_is_asked_again) {
    for (const int status : {503, 429}) {
        fake_tokenizer upstream(2, status);
        const std::vector<proxy::upstream_config> upstreams = {proxy::upstream_config::parse(upstream.url())};
        proxy::bias_tokens tokens(upstreams, {"<think>"});
        tokens.bind(0, client);
        tokens.bind(0, client);
        EXPECT_FALSE(tokens.known(0)) << status;
        tokens.bind(0, client);
        EXPECT_EQ(tokens.lookup(0, "<think>"), 42) << status;
        EXPECT_EQ(upstream.calls.load(), 3) << status;
    }
}

TEST(bias_tokens, an_upstream_that_does_not_answer_is_asked_again) {
    http::server_options options;
    options.port = 0;
    auto gone = std::make_unique<http::http_server>(options);
    gone->start();
    const std::string url = "http://127.0.0.1:" + std::to_string(gone->port());
    gone.reset();
    const std::vector<proxy::upstream_config> upstreams = {proxy::upstream_config::parse(url)};
    proxy::bias_tokens tokens(upstreams, {"<think>"});
    tokens.bind(0, client);
    EXPECT_FALSE(tokens.known(0));
}

TEST(bias_tokens, a_definite_failure_is_not_asked_again) {
    fake_tokenizer upstream(1000, 404);
    const std::vector<proxy::upstream_config> upstreams = {proxy::upstream_config::parse(upstream.url())};
    proxy::bias_tokens tokens(upstreams, {"<think>"});
    tokens.bind(0, client);
    tokens.bind(0, client);
    EXPECT_TRUE(tokens.known(0));
    EXPECT_FALSE(tokens.lookup(0, "<think>"));
    EXPECT_EQ(upstream.calls.load(), 1);
}

TEST(bias_tokens, another_dialect_is_never_asked) {
    fake_tokenizer upstream(0, 0);
    const std::vector<proxy::upstream_config> upstreams = {
        proxy::upstream_config::parse(upstream.url() + ",dialect=anthropic"),
        proxy::upstream_config::parse(upstream.url() + ",dialect=ollama")};
    proxy::bias_tokens tokens(upstreams, {"<think>"});
    tokens.bind(0, client);
    tokens.bind(1, client);
    EXPECT_TRUE(tokens.known(0));
    EXPECT_TRUE(tokens.known(1));
    EXPECT_FALSE(tokens.lookup(0, "<think>"));
    EXPECT_EQ(upstream.calls.load(), 0);
}

TEST(bias_tokens, without_bias_texts_nothing_is_asked) {
    fake_tokenizer upstream(0, 0);
    const std::vector<proxy::upstream_config> upstreams = {proxy::upstream_config::parse(upstream.url())};
    proxy::bias_tokens tokens(upstreams, {});
    tokens.bind(0, client);
    EXPECT_EQ(upstream.calls.load(), 0);
}

TEST(bias_tokens, a_text_of_several_tokens_or_an_id_that_is_no_token_id_is_not_applied) {
    for (const char* answer :
         {R"({"tokens":[1,2]})", R"({"tokens":[]})", R"({"tokens":[-5]})", R"({"tokens":[4294967338]})",
          R"({"tokens":[18446744073709551615]})", R"({"tokens":["42"]})"}) {
        fake_tokenizer upstream(0, 0, answer);
        const std::vector<proxy::upstream_config> upstreams = {proxy::upstream_config::parse(upstream.url())};
        proxy::bias_tokens tokens(upstreams, {"<think>"});
        tokens.bind(0, client);
        EXPECT_TRUE(tokens.known(0)) << answer;
        EXPECT_FALSE(tokens.lookup(0, "<think>")) << answer;
    }
}

TEST(bias_tokens, an_answer_that_is_not_a_token_list_is_a_definite_failure) {
    for (const char* answer : {"not json", R"({"tokens":42})", R"({"tokens":{"a":1}})", R"({"ids":[42]})", "[[[[[["}) {
        fake_tokenizer upstream(0, 0, answer);
        const std::vector<proxy::upstream_config> upstreams = {proxy::upstream_config::parse(upstream.url())};
        proxy::bias_tokens tokens(upstreams, {"<think>"});
        tokens.bind(0, client);
        tokens.bind(0, client);
        EXPECT_TRUE(tokens.known(0)) << answer;
        EXPECT_FALSE(tokens.lookup(0, "<think>")) << answer;
        EXPECT_EQ(upstream.calls.load(), 1) << answer;
    }
}

TEST(bias_tokens, a_forgotten_upstream_is_asked_again) {
    fake_tokenizer upstream(0, 0);
    const std::vector<proxy::upstream_config> upstreams = {proxy::upstream_config::parse(upstream.url()),
                                                           proxy::upstream_config::parse(upstream.url())};
    proxy::bias_tokens tokens(upstreams, {"<think>", "</think>"});
    tokens.bind(0, client);
    tokens.bind(1, client);
    EXPECT_EQ(upstream.calls.load(), 4);  // one call per text and upstream
    tokens.forget(0);
    EXPECT_FALSE(tokens.known(0));
    EXPECT_FALSE(tokens.lookup(0, "<think>"));
    EXPECT_EQ(tokens.lookup(1, "<think>"), 42);  // the other upstream keeps its own
    tokens.bind(0, client);
    EXPECT_EQ(tokens.lookup(0, "</think>"), 42);
    EXPECT_EQ(upstream.calls.load(), 6);
}

// The local backend without HTTP sockets: chat_generation (policy, render, tokenize, submit, parse), the
// generation_relay (events, a client that left, cancelling), and the raw-completion path (the one policy call, then
// the engine) on a generated test model, answering through a fake response_writer.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/request-error.h"
#include "fake-response-writer.h"
#include "generated-models.h"
#include "local/chat-generation.h"
#include "local/generation-relay.h"
#include "local/local-model.h"
#include "local/prompt-preparation.h"
#include "local/raw-generation.h"
#include "routes/generation-route.h"
#include "routes/openai-routes.h"

using namespace keepwarm;
using namespace std::chrono_literals;

namespace {

using test_support::fake_writer;

constexpr const char* served = "tiny";

class local_generation_test : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        engine_options o;
        o.model_path = test_models::generated_model("unit-local-generation");
        o.context_size = 2048;
        o.slots = 2;
        o.threads = 1;
        model = std::make_unique<local_model>();
        model->model_path = o.model_path;
        model->llm = std::make_unique<engine>(o);
        model->renderer = std::make_unique<chat_renderer>(model->llm->model());
        model->tokenizer = std::make_unique<prompt_tokenizer>(model->llm->vocab());
        model->llm->start();
    }
    static void TearDownTestSuite() {
        model->llm->stop();
        model.reset();
    }

    // A frontend whose policy pins `served` strictly, caps replies at `cap` tokens and absorbs one-token pings.
    static std::unique_ptr<frontend_context> strict_frontend(int cap) {
        policy::policy_config config;
        config.source = "test";
        config.model.mode = policy::model_mode::strict;
        config.options.max_tokens_cap = cap;
        config.ping.enabled = true;
        config.ping.matchers.push_back({.max_tokens_at_most = 1});
        auto front = std::make_unique<frontend_context>();
        front->model_id = served;
        front->policy = std::make_unique<policy::request_policy>(std::move(config), served);
        return front;
    }

    static chat_request chat(const std::string& model_name, int max_tokens) {
        chat_request c;
        c.model = model_name;
        c.messages.push_back(common_chat_msg{.role = "user", .content = "Tell me about the sea."});
        c.max_tokens = max_tokens;
        c.sampling.temperature = 0;
        c.sampling.ignore_eos = true;  // random weights: the answer runs to its limit
        return c;
    }

    static raw_completion raw(const std::string& model_name, int max_tokens) {
        raw_completion r{.prompt = "Once upon a time, by the sea,", .grammar_field = "grammar"};
        r.params.model = model_name;
        r.params.max_tokens = max_tokens;
        r.params.sampling.temperature = 0;
        r.params.sampling.ignore_eos = true;
        return r;
    }

    // Every update of a source until the one that is done (or nullopt: the client left).
    static std::optional<generation_source::update> run_to_end(generation_source& source, std::string* text = nullptr) {
        for (;;) {
            auto u = source.next();
            if (!u) return u;
            for (const auto& d : u->diffs) {
                if (text) *text += d.content_delta;
            }
            if (u->done) return u;
        }
    }

    static inline std::unique_ptr<local_model> model;
};

TEST_F(local_generation_test, chat_generation_renders_submits_and_answers_within_the_limit) {
    frontend_context front;
    front.model_id = served;
    http::request req;
    fake_writer w;
    const request_clock clock;
    const uint64_t requests = model->llm->counters().requests.load();
    chat_generation gen(front, *model, req, chat(served, 4), clock, w, "chat-1");
    EXPECT_GT(gen.prompt_tokens(), 0);
    std::string text;
    const auto end = run_to_end(gen, &text);
    ASSERT_TRUE(end);
    EXPECT_EQ(end->reason, finish_reason::length);
    EXPECT_EQ(end->report.generated_tokens, 4);
    EXPECT_EQ(end->report.prompt_tokens, gen.prompt_tokens());
    EXPECT_EQ(gen.message().content, text);
    EXPECT_EQ(model->llm->counters().requests.load(), requests + 1);
    EXPECT_GT(end->report.setup_ms, 0) << "the clock started before the generation was opened";
}

TEST_F(local_generation_test, chat_generation_applies_the_policy_before_anything_runs) {
    auto front = strict_frontend(2);
    http::request req;
    fake_writer w;
    try {
        chat_generation refused(*front, *model, req, chat("gpt-4o", 8), {}, w, "chat-2");
        FAIL() << "a model strict pinning does not serve was generated";
    } catch (const request_error& e) {
        EXPECT_EQ(e.status, 404);
    }

    chat_generation capped(*front, *model, req, chat(served, 50), {}, w, "chat-3");
    EXPECT_EQ(capped.request().max_tokens, 2);
    const auto end = run_to_end(capped);
    ASSERT_TRUE(end);
    EXPECT_EQ(end->report.generated_tokens, 2);
    const auto& headers = capped.response_headers();
    ASSERT_EQ(headers.size(), 1u);
    EXPECT_EQ(headers[0].first, "x-keepwarm-policy");
    EXPECT_NE(headers[0].second.find("max-tokens-cap:2"), std::string::npos) << headers[0].second;
}

TEST_F(local_generation_test, an_absorbed_ping_is_answered_without_the_engine) {
    auto front = strict_frontend(8);
    http::request req;
    fake_writer w;
    const uint64_t requests = model->llm->counters().requests.load();
    chat_generation ping(*front, *model, req, chat(served, 1), {}, w, "ping-1");
    std::string text;
    const auto end = run_to_end(ping, &text);
    ASSERT_TRUE(end);
    EXPECT_EQ(text, "ok");
    EXPECT_EQ(ping.message().content, "ok");
    EXPECT_EQ(end->report.generated_tokens, 0);
    const auto again = ping.next();  // done again, without the text a second time
    ASSERT_TRUE(again);
    EXPECT_TRUE(again->done);
    EXPECT_TRUE(again->diffs.empty());
    EXPECT_EQ(model->llm->counters().requests.load(), requests);
}

TEST_F(local_generation_test, a_client_that_left_cancels_the_generation_and_is_counted) {
    frontend_context front;
    http::request req;
    fake_writer w;
    chat_generation gen(front, *model, req, chat(served, 200), {}, w, "chat-4");
    ASSERT_TRUE(gen.next());
    w.gone = true;
    const auto start = std::chrono::steady_clock::now();
    std::optional<generation_source::update> u;
    do {
        u = gen.next();
    } while (u && !u->done);
    EXPECT_FALSE(u) << "the relay noticed the client and stopped";  // else its 200 tokens would end it
    EXPECT_LT(std::chrono::steady_clock::now() - start, 60s);       // a hang guard
    EXPECT_EQ(front.http.disconnects.load(), 1u);
}

TEST_F(local_generation_test, the_relay_records_what_the_model_read_and_wrote) {
    frontend_context front;
    fake_writer w;
    const std::string prompt = "The lighthouse keeper counted the waves.";
    auto gen = std::make_shared<generation_request>();
    set_prompt(*model, *gen, prompt);
    gen->sampling.temp = 0;
    prepare_sampling(*model, *gen, "grammar");
    gen->max_tokens = 3;
    const size_t held = model->tokenizer->snapshot().tokens_held;
    model->llm->submit(gen);
    generation_relay relay(*gen, w, front, *model, "relay-1");
    std::optional<generation_event> ev;
    do {
        ev = relay.next();
        ASSERT_TRUE(ev);
    } while (!ev->done);
    EXPECT_FALSE(relay.cancel()) << "an ended generation has nothing to cancel";
    EXPECT_FALSE(gen->cancelled);
    if (model->tokenizer->indexed()) {
        EXPECT_GT(model->tokenizer->snapshot().tokens_held, held) << "the prompt and answer went into the index";
    }
}

TEST_F(local_generation_test, a_relay_destroyed_early_cancels_and_drains_its_generation) {
    frontend_context front;
    fake_writer w;
    auto gen = std::make_shared<generation_request>();
    set_prompt(*model, *gen, "A long voyage begins with");
    gen->sampling.temp = 0;
    gen->sampling.ignore_eos = true;
    prepare_sampling(*model, *gen, "grammar");
    gen->max_tokens = 500;
    model->llm->submit(gen);
    std::optional<generation_event> last;
    {
        generation_relay relay(*gen, w, front, *model, "relay-2");
        ASSERT_TRUE(relay.next());
        last = relay.cancel();
    }
    EXPECT_TRUE(gen->cancelled);
    ASSERT_TRUE(last) << "the final event came within the drain limit";
    EXPECT_TRUE(last->done);
    EXPECT_EQ(last->reason, finish_reason::cancelled);
    EXPECT_LT(last->stats.generated_tokens, 500);
    EXPECT_EQ(front.http.disconnects.load(), 0u) << "a cancel is not a client that left";
}

TEST_F(local_generation_test, a_raw_completion_goes_through_the_policy_then_the_engine) {
    auto front = strict_frontend(2);
    http::request req;
    fake_writer w;
    try {
        raw_generation refused(*front, *model, req, raw("gpt-4o", 8), {}, w, "raw-1");
        FAIL() << "a raw prompt skipped strict model pinning";
    } catch (const request_error& e) {
        EXPECT_EQ(e.status, 404);
    }

    // A one-token raw completion is not a ping: there is no chat reply to give it.
    const uint64_t requests = model->llm->counters().requests.load();
    raw_generation one(*front, *model, req, raw(served, 1), {}, w, "raw-2");
    ASSERT_TRUE(run_to_end(one));
    EXPECT_EQ(model->llm->counters().requests.load(), requests + 1);

    raw_generation capped(*front, *model, req, raw(served, 50), {}, w, "raw-3");
    EXPECT_EQ(capped.request().max_tokens, 2);
    EXPECT_GT(capped.prompt_tokens(), 0);
    std::string text;
    const auto end = run_to_end(capped, &text);
    ASSERT_TRUE(end);
    EXPECT_EQ(end->report.generated_tokens, 2);
    EXPECT_EQ(capped.message().content, text);
    ASSERT_FALSE(capped.response_headers().empty());
    EXPECT_NE(capped.response_headers()[0].second.find("max-tokens-cap:2"), std::string::npos);
}

TEST_F(local_generation_test, openai_completions_answers_a_raw_prompt_through_the_policy) {
    auto front = strict_frontend(2);
    const http::handler route = generation_route(*front, openai_completions(local_raw_generation(*front, *model)));
    http::request req;
    req.method = "POST";
    req.path = "/v1/completions";

    req.body = R"({"model": "gpt-4o", "prompt": "Once upon a time", "max_tokens": 8})";
    fake_writer refused;
    try {
        route(req, refused);
        FAIL() << "a raw completion skipped strict model pinning";
    } catch (const request_error& e) {
        EXPECT_EQ(e.status, 404);
    }
    EXPECT_EQ(front->http.client_errors.load(), 1u);

    req.body = R"({"model": "tiny", "prompt": "Once upon a time", "max_tokens": 50, "temperature": 0})";
    fake_writer whole;
    route(req, whole);
    EXPECT_EQ(whole.status, 200);
    EXPECT_NE(whole.header("x-keepwarm-policy").find("max-tokens-cap:2"), std::string::npos);
    const auto body = nlohmann::json::parse(whole.body);
    EXPECT_EQ(body["object"], "text_completion");
    EXPECT_LE(body["usage"]["completion_tokens"].get<int>(), 2);
    EXPECT_EQ(front->http.completions.load(), 2u);

    req.body = R"({"model": "tiny", "prompt": "Once upon a time", "max_tokens": 50, "stream": true,
                   "stream_options": {"include_usage": true}})";
    fake_writer streamed;
    route(req, streamed);
    EXPECT_EQ(streamed.status, 200);
    EXPECT_EQ(streamed.content_type, "text/event-stream");
    EXPECT_TRUE(streamed.ended);
    EXPECT_NE(streamed.header("x-keepwarm-policy").find("max-tokens-cap:2"), std::string::npos);
    EXPECT_NE(streamed.body.find("data: [DONE]"), std::string::npos);
    EXPECT_NE(streamed.body.find(R"("completion_tokens":)"), std::string::npos);
}

}  // namespace

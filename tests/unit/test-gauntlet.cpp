// `keepwarm bench gauntlet`: the generator (determinism, each killer on and off), the JSONL format and its errors,
// the conversation the replay keeps, the SSE reader, the usage fields and the gaps between a stream's tokens, the
// ideal prefill on small hand-checked cases (and on the tiny generated model), and the summary maths.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <regex>
#include <set>
#include <thread>

#include "bench/gauntlet-client.h"
#include "bench/gauntlet-conversation.h"
#include "bench/gauntlet-ideal.h"
#include "bench/gauntlet-launcher.h"
#include "bench/gauntlet-replay.h"
#include "bench/gauntlet-report.h"
#include "bench/gauntlet-workload.h"
#include "common.h"
#include "generated-models.h"
#include "http/http-server.h"

using namespace keepwarm::bench::gauntlet;

namespace {

generator_options small_options(const std::string& killers) {
    generator_options o;
    o.seed = 7;
    o.system_tokens = 300;
    o.tools = 26;
    o.agents = 2;
    o.turns = 4;
    o.tool_rounds = 1;
    o.answer_tokens = 16;
    o.tool_result_tokens = 50;
    o.killers = killer_set::parse(killers, 10);
    return o;
}

std::string system_text(const workload_line& line) {
    if (line.api == wire_api::anthropic) return line.body["system"].get<std::string>();
    return line.body["messages"][0]["content"].get<std::string>();
}

std::vector<workload_line> turns_of(const std::vector<workload_line>& lines) {
    std::vector<workload_line> out;
    for (const auto& l : lines) {
        if (!l.events.ping) out.push_back(l);
    }
    return out;
}

}  // namespace

TEST(GauntletGenerator, SameSeedSameFileOtherSeedOtherFile) {
    generator_options o = small_options("all");
    const std::string a = format_workload(generate_workload(o));
    EXPECT_EQ(a, format_workload(generate_workload(o)));
    o.seed = 8;
    EXPECT_NE(a, format_workload(generate_workload(o)));
}

TEST(GauntletGenerator, ShapeFollowsTheParameters) {
    const auto lines = turns_of(generate_workload(small_options("none")));
    // 2 agents x 4 turns x (1 user request + 1 tool round).
    ASSERT_EQ(lines.size(), 16u);
    const auto& first = lines[0];
    EXPECT_EQ(first.agent, "agent-1");
    EXPECT_EQ(first.body["tools"].size(), 26u);
    EXPECT_EQ(first.body["max_tokens"], 16);
    EXPECT_TRUE(first.tool_call.has_value());
    EXPECT_EQ(lines[1].tool_result_chars, 200u);
    EXPECT_TRUE(lines[1].body["messages"].empty());
    // ~300 tokens at 4 chars per token, plus the environment block.
    EXPECT_GE(system_text(first).size(), 1200u);
    EXPECT_LT(system_text(first).size(), 2400u);
    // All agents share the system prompt up to their environment block.
    const std::string s1 = system_text(first), s2 = system_text(lines[2]);
    EXPECT_EQ(lines[2].agent, "agent-2");
    EXPECT_EQ(s1.substr(0, s1.find("<env>")), s2.substr(0, s2.find("<env>")));
    EXPECT_NE(s1, s2);
}

TEST(GauntletGenerator, EveryKillerOnIsThere) {
    const auto all = generate_workload(small_options("all"));
    const auto lines = turns_of(all);
    const std::regex cch(
        "^x-anthropic-billing-header: cc_version=2\\.1\\.197\\.abc; cc_entrypoint=sdk-cli; "
        "cch=[0-9a-f]{5};\nrequest-id: [0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-a[0-9a-f]{3}-[0-9a-f]{12}\n");
    std::set<std::string> nonces, models, num_ctx;
    int cancels = 0, restarts = 0, continuations = 0;
    for (const auto& l : lines) {
        const std::string system = system_text(l);
        EXPECT_TRUE(std::regex_search(system, cch)) << system.substr(0, 200);
        EXPECT_TRUE(system.starts_with(l.injected_system_prefix));
        nonces.insert(l.injected_system_prefix);
        models.insert(l.body["model"].get<std::string>());
        num_ctx.insert(l.body["num_ctx"].dump());
        EXPECT_TRUE(l.strip_reasoning);
        EXPECT_EQ(l.body["thinking"]["type"], "enabled");
        if (l.events.cancel_after_chunks > 0) ++cancels;
        if (l.events.restart_before) ++restarts;
        if (l.body["messages"].empty() && l.tool_result_chars == 0) ++continuations;
    }
    EXPECT_EQ(nonces.size(), lines.size());  // a fresh nonce per request
    EXPECT_EQ(models.size(), 2u);
    EXPECT_EQ(num_ctx.size(), 2u);
    EXPECT_EQ(cancels, 2);  // one per agent
    EXPECT_EQ(continuations, 2);
    EXPECT_EQ(restarts, 1);
    int pings = 0;
    for (const auto& l : all) {
        if (!l.events.ping) continue;
        ++pings;
        EXPECT_EQ(l.body["max_tokens"], 1);
        EXPECT_DOUBLE_EQ(l.send_at_s, 10.0 * pings);
        EXPECT_FALSE(l.with_history);
    }
    EXPECT_GT(pings, 0);
}

TEST(GauntletGenerator, EachKillerAlone) {
    const auto none = turns_of(generate_workload(small_options("none")));
    for (const auto& l : none) {
        EXPECT_TRUE(l.injected_system_prefix.empty());
        EXPECT_TRUE(system_text(l).starts_with("You are an interactive"));
        EXPECT_FALSE(l.body.contains("num_ctx"));
        EXPECT_FALSE(l.body.contains("thinking"));
        EXPECT_FALSE(l.strip_reasoning);
        EXPECT_EQ(l.body["model"], "claude-sonnet-4-5");
        EXPECT_EQ(l.events.cancel_after_chunks, 0);
        EXPECT_FALSE(l.events.restart_before);
    }
    EXPECT_EQ(none.size(), generate_workload(small_options("none")).size());  // no pings

    const auto cch = turns_of(generate_workload(small_options("cch")));
    EXPECT_TRUE(system_text(cch[0]).starts_with("x-anthropic-billing-header:"));
    EXPECT_EQ(system_text(cch[0]).find("request-id:"), std::string::npos);
    const auto rid = turns_of(generate_workload(small_options("request-id")));
    EXPECT_TRUE(system_text(rid[0]).starts_with("request-id: "));
    const auto pings = generate_workload(small_options("ping"));
    EXPECT_GT(pings.size(), none.size());
    const auto restart = turns_of(generate_workload(small_options("restart")));
    EXPECT_EQ(std::count_if(restart.begin(), restart.end(), [](const auto& l) { return l.events.restart_before; }), 1);
    const auto cancel = turns_of(generate_workload(small_options("cancel")));
    EXPECT_EQ(cancel.size(), none.size() + 2);
    EXPECT_THROW(killer_set::parse("cch,bogus", 30), std::invalid_argument);
    EXPECT_EQ(killer_set::parse("model,num-ctx", 30).describe(), "model,num-ctx");
}

TEST(GauntletGenerator, OpenAiBodiesCarryTheSystemMessageAndUsage) {
    generator_options o = small_options("cch");
    o.api = wire_api::openai;
    const auto lines = generate_workload(o);
    EXPECT_EQ(lines[0].body["messages"][0]["role"], "system");
    EXPECT_EQ(lines[0].body["messages"][1]["role"], "user");
    EXPECT_EQ(lines[0].body["tools"][0]["type"], "function");
    EXPECT_EQ(lines[0].body["stream_options"]["include_usage"], true);
    EXPECT_EQ(lines[0].body["model"], "gpt-4o");
}

TEST(GauntletGenerator, SizesThePromptWithTheTokenCounter) {
    generator_options o = small_options("none");
    o.system_tokens = 2000;
    o.count_tokens = [](const std::string& text) { return text.size() / 2; };  // 2 chars per token
    const auto lines = generate_workload(o);
    const size_t chars = system_text(lines[0]).size();
    EXPECT_GE(chars, 4000u);
    EXPECT_LT(chars, 4800u);
}

TEST(GauntletWorkload, JsonlRoundTrip) {
    const auto lines = generate_workload(small_options("all"));
    const std::string text = format_workload(lines);
    const auto parsed = parse_workload("# a comment\n\n" + text);
    ASSERT_EQ(parsed.size(), lines.size());
    EXPECT_EQ(format_workload(parsed), text);
    EXPECT_EQ(parsed[0].line_number, 3u);
}

TEST(GauntletWorkload, BadLinesNameTheLine) {
    const std::string good = R"({"agent":"a","api":"openai","body":{"messages":[]}})";
    const auto error_of = [](const std::string& text) {
        try {
            parse_workload(text);
        } catch (const std::invalid_argument& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    EXPECT_EQ(error_of(good + "\n" + good + "\n{nope\n").substr(0, 22), "line 3: not valid JSON");
    EXPECT_EQ(error_of(good + "\n" + R"({"agent":"a","api":"ollama","body":{}})"),
              "line 2: 'api': unknown API 'ollama' (openai or anthropic)");
    EXPECT_EQ(error_of(R"({"api":"openai","body":{}})"), "line 1: 'agent' must be a non-empty string");
    EXPECT_EQ(error_of(R"({"agent":"a","api":"openai","body":{},"sned_at":1})"), "line 1: unknown field 'sned_at'");
    EXPECT_EQ(error_of(R"({"agent":"a","api":"openai","body":{},"events":{"cancel_after_chunks":-1}})"),
              "line 1: 'events.cancel_after_chunks' must be a non-negative integer");
    EXPECT_EQ(error_of(R"({"agent":"a","api":"openai","body":{},"events":{"explode":true}})"),
              "line 1: unknown event 'explode' (ping, cancel_after_chunks, restart_before)");
    EXPECT_EQ(error_of(R"({"agent":"a","api":"openai","body":[]})"), "line 1: 'body' must be a JSON object");
    EXPECT_EQ(error_of(R"({"agent":"a","api":"openai","body":{},"at":-2})"),
              "line 1: 'at' must be a number >= 0 (seconds)");
    EXPECT_EQ(error_of("\n# only a comment\n"), "the workload has no requests");
}

TEST(GauntletConversation, CarriesAnswersToolResultsAndContinuations) {
    workload_line first;
    first.agent = "a";
    first.api = wire_api::openai;
    first.strip_reasoning = true;
    first.injected_system_prefix = "request-id: 1\n";
    first.body = {{"model", "m"},
                  {"messages", json::array({json{{"role", "system"}, {"content", "request-id: 1\nBe brief."}},
                                            json{{"role", "user"}, {"content", "hi"}}})}};
    first.tool_call = json{{"name", "Read"}, {"arguments", {{"file_path", "/x"}}}};
    conversation c;
    auto b = c.next(first, 1);
    EXPECT_EQ(b.sent["messages"][0]["content"], "request-id: 1\nBe brief.");
    EXPECT_EQ(b.normalized["messages"][0]["content"], "Be brief.");
    c.answered(first, {"Looking.", "I should read it.", {}});

    workload_line result = first;
    result.injected_system_prefix = "request-id: 2\n";
    result.body["messages"] = json::array({json{{"role", "system"}, {"content", "request-id: 2\nBe brief."}}});
    result.tool_result_chars = 30;
    result.tool_call.reset();
    result.events.cancel_after_chunks = 2;
    b = c.next(result, 5);
    const json& sent = b.sent["messages"];
    ASSERT_EQ(sent.size(), 4u);  // system, user, assistant (scripted call), tool
    EXPECT_EQ(sent[2]["tool_calls"][0]["function"]["name"], "Read");
    EXPECT_EQ(sent[2]["tool_calls"][0]["function"]["arguments"], R"({"file_path":"/x"})");
    EXPECT_FALSE(sent[2].contains("reasoning_content"));                               // stripped in what is sent
    EXPECT_EQ(b.normalized["messages"][2]["reasoning_content"], "I should read it.");  // kept for the ideal
    EXPECT_EQ(sent[3]["role"], "tool");
    EXPECT_EQ(sent[3]["tool_call_id"], sent[2]["tool_calls"][0]["id"]);
    EXPECT_EQ(sent[3]["content"], synthetic_tool_result(30, 5));
    c.answered(result, {"The fi", "", {}});  // cut after two chunks

    workload_line cont = result;
    cont.tool_result_chars = 0;
    cont.events.cancel_after_chunks = 0;
    b = c.next(cont, 6);
    ASSERT_EQ(b.sent["messages"].size(), 5u);
    EXPECT_EQ(b.sent["messages"].back()["role"], "assistant");
    EXPECT_EQ(b.sent["messages"].back()["content"], "The fi");
    c.answered(cont, {"le is fine.", "", {}});
    EXPECT_EQ(c.messages().back()["content"], "The file is fine.");
    EXPECT_EQ(c.messages().size(), 4u);
}

TEST(GauntletConversation, AnthropicThinkingAndToolUse) {
    workload_line line;
    line.agent = "a";
    line.api = wire_api::anthropic;
    line.strip_reasoning = true;
    line.body = {{"system", "cch=abcde;\nSys"}, {"messages", json::array({json{{"role", "user"}, {"content", "go"}}})}};
    line.injected_system_prefix = "cch=abcde;\n";
    conversation c;
    auto b = c.next(line, 1);
    EXPECT_EQ(b.normalized["system"], "Sys");
    c.answered(line, {"ok", "hmm", {{"toolu_1", "Bash", R"({"command":"ls"})"}}});
    workload_line next = line;
    next.body["messages"] = json::array();
    next.tool_result_chars = 10;
    b = c.next(next, 2);
    const json& assistant = b.sent["messages"][1];
    ASSERT_EQ(assistant["content"].size(), 2u);  // thinking stripped: text + tool_use
    EXPECT_EQ(assistant["content"][1]["input"]["command"], "ls");
    EXPECT_EQ(b.normalized["messages"][1]["content"][0]["type"], "thinking");
    EXPECT_EQ(b.sent["messages"][2]["content"][0]["tool_use_id"], "toolu_1");
}

TEST(GauntletClient, SseReaderJoinsPieces) {
    sse_reader r;
    EXPECT_TRUE(r.feed("event: message_start\r\nda").empty());
    auto events = r.feed("ta: {\"a\":1}\r\n\r\n: keep-alive\n\ndata: x\ndata: y\n\ndata: [DONE]\n");
    ASSERT_EQ(events.size(), 2u);
    EXPECT_EQ(events[0].event, "message_start");
    EXPECT_EQ(events[0].data, "{\"a\":1}");
    EXPECT_EQ(events[1].data, "x\ny");
    events = r.feed("\n");
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].data, "[DONE]");
}

TEST(GauntletClient, ReadsKeepwarmAndLlamaServerNumbers) {
    prompt_numbers kw;
    read_openai_numbers(json::parse(R"({"usage":{"prompt_tokens":100,"prompt_tokens_details":{"cached_tokens":90}},
        "timings":{"cache_n":90,"prompt_n":10,"prompt_ms":12.5,"sampling_ms":30.5,"sampling_max_ms":20}})"),
                        kw);
    kw.complete();
    EXPECT_EQ(kw.prompt_tokens, 100);
    EXPECT_EQ(kw.reused_tokens, 90);
    EXPECT_EQ(kw.computed_tokens, 10);
    EXPECT_DOUBLE_EQ(kw.prompt_ms, 12.5);
    EXPECT_DOUBLE_EQ(kw.sampling_ms, 30.5);
    EXPECT_DOUBLE_EQ(kw.sampling_max_ms, 20);

    prompt_numbers ls;  // llama-server: timings only on the last chunk
    read_openai_numbers(json::parse(R"({"choices":[],"timings":{"cache_n":64,"prompt_n":36,"prompt_ms":40}})"), ls);
    ls.complete();
    EXPECT_EQ(ls.prompt_tokens, 100);
    EXPECT_EQ(ls.reused_tokens, 64);

    prompt_numbers an;
    read_anthropic_numbers(json::parse(R"({"type":"message_start","message":{"usage":{"input_tokens":0,
        "cache_read_input_tokens":0,"cache_creation_input_tokens":500}}})"),
                           an);
    EXPECT_EQ(an.reused_tokens, 0);
    read_anthropic_numbers(json::parse(R"({"type":"message_delta","usage":{"input_tokens":0,
        "cache_read_input_tokens":480,"cache_creation_input_tokens":20,"output_tokens":3}})"),
                           an);
    an.complete();
    EXPECT_EQ(an.prompt_tokens, 500);
    EXPECT_EQ(an.reused_tokens, 480);
    EXPECT_EQ(an.computed_tokens, 20);
}

// What a user watching a stream sees: the gap before each next token, as the chunks came off the socket.
TEST(GauntletClient, MeasuresTheGapsBetweenAStreamsTokens) {
    keepwarm::http::server_options options;
    options.port = 0;
    keepwarm::http::http_server server(options);
    server.add_route(
        "POST", "/v1/chat/completions", [](const keepwarm::http::request&, keepwarm::http::response_writer& out) {
            out.begin_stream(200, "text/event-stream");
            const auto event = [&](const std::string& data) { out.write_chunk("data: " + data + "\n\n"); };
            const auto token = [&](const std::string& text) {
                event(R"({"choices":[{"index":0,"delta":{"content":")" + text + R"("}}]})");
            };
            token("a");
            token("b");                                                    // written at once after the first
            std::this_thread::sleep_for(std::chrono::milliseconds(2000));  // e.g. another client's prompt chunk
            token("c");
            event(R"({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})");
            event("[DONE]");
            out.end_stream();
        });
    server.start();
    keepwarm::http::client_connection connection(
        keepwarm::http::endpoint::parse("http://127.0.0.1:" + std::to_string(server.port())));
    const request_result r =
        send_request(connection, wire_api::openai, json{{"messages", json::array()}}, /*cancel_after_chunks=*/0);
    server.stop();
    ASSERT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.answer.content, "abc");
    ASSERT_EQ(r.token_gaps_ms.size(), 2u);  // three tokens
    // Only a client thread held off the CPU for over a second on a busy machine could shrink the 2 s gap below this.
    EXPECT_GE(r.token_gaps_ms[1], 1000);
    EXPECT_LT(r.token_gaps_ms[0], r.token_gaps_ms[1]);
}

TEST(GauntletClient, TargetsParse) {
    const replay_target t = parse_target("ls=http://127.0.0.1:8081,api=openai");
    EXPECT_EQ(t.name, "ls");
    EXPECT_EQ(t.url, "http://127.0.0.1:8081");
    EXPECT_EQ(t.api, wire_api::openai);
    EXPECT_FALSE(parse_target("kw=http://localhost:8080").api.has_value());
    EXPECT_THROW(parse_target("http://localhost:8080"), std::invalid_argument);
    EXPECT_THROW(parse_target("kw=http://localhost:8080,api=ollama"), std::invalid_argument);
    EXPECT_THROW(parse_target("kw=http://localhost:8080,mode=x"), std::invalid_argument);
}

TEST(GauntletIdeal, TokenHistoryLongestSharedPrefix) {
    token_history h;
    const std::vector<llama_token> a = {1, 2, 3, 4};
    EXPECT_EQ(h.shared_prefix(a), 0u);
    h.add(a);
    EXPECT_EQ(h.shared_prefix(std::vector<llama_token>{1, 2, 3, 9}), 3u);
    EXPECT_EQ(h.shared_prefix(std::vector<llama_token>{1, 2}), 2u);
    EXPECT_EQ(h.shared_prefix(std::vector<llama_token>{7}), 0u);
    h.add({1, 2, 5, 6, 7});
    EXPECT_EQ(h.shared_prefix(std::vector<llama_token>{1, 2, 5, 6, 8}), 4u);
    EXPECT_EQ(h.shared_prefix(std::vector<llama_token>{1, 2, 3, 4, 5}), 4u);
}

TEST(GauntletIdeal, CountsWhatIsNewAfterNormalization) {
    const std::string model = keepwarm::test_models::generated_model("unit-gauntlet");
    ideal_prefill ideal(model);
    const json sys = {{"role", "system"}, {"content", "You are a careful assistant. Answer in one sentence."}};
    const json user1 = {{"role", "user"}, {"content", "What is a prefix cache?"}};
    const json body1 = {{"messages", json::array({sys, user1})}};
    const ideal_count c1 = ideal.add(body1, wire_api::openai, {"It keeps computed attention state.", "", {}});
    ASSERT_TRUE(c1.error.empty()) << c1.error;
    EXPECT_EQ(c1.new_tokens, c1.prompt_tokens);  // nothing before it

    // The same request again: only the last token (a perfect cache still computes one).
    const ideal_count again = ideal.add(body1, wire_api::openai, {});
    EXPECT_EQ(again.prompt_tokens, c1.prompt_tokens);
    EXPECT_EQ(again.new_tokens, 1u);

    // The next turn: the earlier prompt and its answer are known; what is new is the end of the answer's turn and
    // the new user message. Hand-check against the renders themselves.
    const json assistant = {{"role", "assistant"}, {"content", "It keeps computed attention state."}};
    const json user2 = {{"role", "user"}, {"content", "And when does it miss?"}};
    const json body2 = {{"messages", json::array({sys, user1, assistant, user2})}};
    const ideal_count c2 = ideal.add(body2, wire_api::openai, {});
    EXPECT_GT(c2.prompt_tokens, c1.prompt_tokens + 10);
    EXPECT_LT(c2.new_tokens, c2.prompt_tokens - c1.prompt_tokens);  // the answer's tokens were known
    EXPECT_GE(c2.new_tokens, 8u);  // "And when does it miss?" and the turn markers are not

    // A nonce at the start of the system prompt is not the ideal's problem: it is removed before counting.
    const json with_nonce = without_system_prefix(
        json{{"messages", json::array({json{{"role", "system"},
                                            {"content", "request-id: 42\n" + sys["content"].get<std::string>()}},
                                       user1})}},
        wire_api::openai, "request-id: 42\n");
    EXPECT_EQ(ideal.add(with_nonce, wire_api::openai, {}).new_tokens, 1u);

    const ideal_count bad = ideal.add(json{{"messages", "nope"}}, wire_api::openai, {});
    EXPECT_FALSE(bad.error.empty());
}

TEST(GauntletReport, PercentilesAndRatios) {
    EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 50), 2.5);
    std::vector<double> twenty;
    for (int i = 1; i <= 20; ++i) twenty.push_back(i);
    EXPECT_NEAR(percentile(twenty, 95), 19.05, 1e-9);
    EXPECT_DOUBLE_EQ(percentile({7}, 95), 7);
    EXPECT_TRUE(std::isnan(percentile({}, 50)));
    EXPECT_DOUBLE_EQ(ratio(1, 4), 0.25);
    EXPECT_TRUE(std::isnan(ratio(1, 0)));
}

TEST(GauntletReport, SummaryColdWarmIdealAndRatios) {
    const auto record = [](std::string agent, int n, double at, double ttft, int computed, int ideal,
                           double prompt_ms) {
        request_record r;
        r.agent = agent;
        r.agent_request = n;
        r.sent_at_s = at;
        r.ok = true;
        r.ttft_ms = ttft;
        r.prompt_tokens = 1000;
        r.computed_tokens = computed;
        r.reused_tokens = 1000 - computed;
        r.ideal_new_tokens = ideal;
        r.prompt_ms = prompt_ms;
        return r;
    };
    target_run kw{"kw", "", true, 0, 0, 1, "", {}};
    kw.requests = {record("a", 0, 0, 1000, 1000, 1000, 900), record("b", 0, 0.1, 500, 500, 400, 450),
                   record("a", 1, 2, 20, 20, 20, 10), record("b", 1, 2.1, 40, 40, 30, 30)};
    request_record ping;
    ping.ping = true;
    ping.agent_request = -1;
    ping.ok = false;
    ping.error = "HTTP 500";
    kw.requests.push_back(ping);
    kw.requests[0].token_gaps_ms = {10, 20, 30};
    kw.requests[3].token_gaps_ms = {40, 500};
    kw.requests[4].token_gaps_ms = {9000};  // a ping's: not a stream anybody watches
    kw.requests[0].sampling_ms = 100;
    kw.requests[0].sampling_max_ms = 60;
    kw.requests[1].sampling_ms = 5;
    kw.requests[1].sampling_max_ms = 2;
    target_run ls{"ls", "", true, 0, 1, 1, "", {}};
    ls.requests = {record("a", 0, 0, 800, 1000, 1000, 800), record("a", 1, 1, 400, 400, 20, 400)};

    const target_summary s = summarize("kw", {kw, ls});
    EXPECT_EQ(s.requests, 4);
    EXPECT_EQ(s.pings, 1);
    EXPECT_EQ(s.failures, 1);
    EXPECT_EQ(s.computed_tokens, 1560);
    EXPECT_EQ(s.ideal_tokens, 1450);
    EXPECT_NEAR(s.computed_over_ideal, 1560.0 / 1450, 1e-12);
    EXPECT_DOUBLE_EQ(s.cold_ttft_ms, 1000);  // the run's first request
    EXPECT_DOUBLE_EQ(s.warm_ttft_p50_ms, 30);
    EXPECT_DOUBLE_EQ(s.warm_ttft_p95_ms, 39);
    EXPECT_DOUBLE_EQ(s.prefill_ms, 1390);
    EXPECT_EQ(s.token_gaps, 5);
    EXPECT_DOUBLE_EQ(s.token_gap_p50_ms, 30);
    EXPECT_DOUBLE_EQ(s.token_gap_p90_ms, 316);  // 40 + 0.6 * 460
    EXPECT_DOUBLE_EQ(s.token_gap_max_ms, 500);
    EXPECT_EQ(s.sampling_reported, 2);
    EXPECT_DOUBLE_EQ(s.sampling_ms, 105);
    EXPECT_DOUBLE_EQ(s.sampling_max_ms, 60);
    const target_summary l = summarize("ls", {kw, ls});
    const auto ratios = compare_to({s, l}, "ls");
    ASSERT_EQ(ratios.size(), 1u);
    EXPECT_EQ(ratios[0].target, "kw");
    EXPECT_NEAR(ratios[0].prefill_time, 1390.0 / 1200, 1e-12);
    EXPECT_NEAR(ratios[0].computed_tokens, 1560.0 / 1400, 1e-12);
    EXPECT_NEAR(ratios[0].warm_p95_over_cold, (39.0 / 1000) / (400.0 / 800), 1e-12);
    EXPECT_TRUE(compare_to({s, l}, "nobody").empty());

    gauntlet_report report;
    report.runs = {kw, ls};
    report.summaries = {s, l};
    report.baseline = "ls";
    report.ratios = ratios;
    const std::string table = format_gauntlet_table(report);
    EXPECT_NE(table.find("kw / ls: total prefill time 1.158x"), std::string::npos) << table;
    EXPECT_NE(table.find("kw: gaps between a stream's tokens (5), p50 / p90 / p99 / max 30.0 / 316.0 / 481.6 / 500.0"),
              std::string::npos)
        << table;
    EXPECT_NE(table.find("kw: sampling (server-reported, 2 streams), 105 ms in all, the longest one token 60.0 ms"),
              std::string::npos)
        << table;
    EXPECT_EQ(table.find("ls: sampling"), std::string::npos) << "llama-server reports none";
    const json j = json::parse(format_gauntlet_json(report));
    EXPECT_EQ(j["targets"][0]["ideal_tokens"], 1450);
    EXPECT_EQ(j["runs"][0]["requests"].size(), 5u);
    EXPECT_EQ(j["targets"][0]["token_gap_max_ms"], 500);
    EXPECT_EQ(j["runs"][0]["requests"][3]["token_gap_max_ms"], 500);
    EXPECT_TRUE(j["runs"][0]["requests"][1]["token_gap_max_ms"].is_null());
    EXPECT_EQ(j["targets"][0]["sampling_ms"], 105);
    EXPECT_TRUE(j["targets"][1]["sampling_ms"].is_null());
    EXPECT_EQ(j["runs"][0]["requests"][0]["sampling_max_ms"], 60);
    EXPECT_TRUE(j["runs"][0]["requests"][2]["sampling_max_ms"].is_null());
    const std::string html = format_gauntlet_html(report);
    EXPECT_NE(html.find("<svg"), std::string::npos);
    EXPECT_NE(html.find("TTFT per request over time"), std::string::npos);
    EXPECT_NE(html.find("ideal 1450"), std::string::npos);
    EXPECT_EQ(html.find("<script"), std::string::npos);  // self-contained, no scripts
}

TEST(GauntletLauncher, SameModelContextSlotsAndThreadsForEveryServer) {
    launch_settings s;
    s.model = "/m.gguf";
    s.ctx_size = 65536;
    s.parallel = 2;
    s.threads = 2;
    s.keepwarm_binary = "/bin/keepwarm";
    s.policy_file = "/etc/policy.toml";
    s.llama_server_binary = "/bin/llama-server";
    const auto joined = [](const std::vector<std::string>& argv) {
        std::string out;
        for (const auto& a : argv) out += (out.empty() ? "" : " ") + a;
        return out;
    };
    EXPECT_EQ(joined(server_command(server_kind::keepwarm, s, 8080, "/c")),
              "/bin/keepwarm serve -m /m.gguf -c 65536 --parallel 2 --host 127.0.0.1 --port 8080 --cache-dir /c "
              "--max-connections-per-address 0 "
              "--policy /etc/policy.toml -t 2");
    EXPECT_EQ(joined(server_command(server_kind::keepwarm_off, s, 8080, "/c")),
              "/bin/keepwarm serve -m /m.gguf -c 65536 --parallel 2 --host 127.0.0.1 --port 8080 --cache-dir /c "
              "--max-connections-per-address 0 "
              "--no-policy --cache-ram 0 --cache-disk 0 --cache-parked 0 -t 2");
    EXPECT_EQ(joined(server_command(server_kind::llama_server, s, 8081, "/c")),
              "/bin/llama-server -m /m.gguf -c 65536 -np 2 --host 127.0.0.1 --port 8081 -t 2");
    EXPECT_EQ(parse_server_kind("keepwarm-off"), server_kind::keepwarm_off);
    EXPECT_THROW(parse_server_kind("ollama"), std::invalid_argument);
    EXPECT_THROW(find_llama_server("/nonexistent/llama-server", ""), std::runtime_error);
    EXPECT_NE(free_local_port(), 0);
}

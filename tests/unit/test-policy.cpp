// Unit tests for the policy layer (src/policy/policy.*, span-rules.*): model pinning, forced options, ping matchers,
// the built-in span rules on real samples, replace/drop/move, hostile input, and rules added while requests run.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "http/http-server.h"
#include "policy/policy-file.h"
#include "policy/policy.h"

using namespace keepwarm::policy;
using keepwarm::chat_request;
using keepwarm::request_error;

namespace {

common_chat_msg message(const std::string& role, const std::string& content) {
    common_chat_msg m;
    m.role = role;
    m.content = content;
    return m;
}

chat_request chat(std::vector<common_chat_msg> messages, const std::string& model = "qwen3") {
    chat_request c;
    c.model = model;
    c.messages = std::move(messages);
    return c;
}

chat_request simple_chat(const std::string& model = "qwen3") {
    return chat({message("system", "You are terse."), message("user", "hello")}, model);
}

request_policy policy_from(const std::string& toml, const std::string& served = "qwen3") {
    return request_policy(parse_policy(toml, "test.toml", served), served);
}

bool fired(const policy_outcome& o, const std::string& rule) {
    return std::find(o.fired.begin(), o.fired.end(), rule) != o.fired.end();
}

// The text a single built-in rule makes of `text` in a system prompt.
std::string rewrite(const std::string& builtin, std::string text) {
    const builtin_span* b = find_builtin_span(builtin);
    EXPECT_NE(b, nullptr) << builtin;
    span_rule rule(b->name, b->pattern, b->action, b->replacement, b->roles, span_origin::builtin);
    std::vector<std::string> moved;
    rule.apply(text, moved);
    return text;
}

const std::string billing_normalized = "x-anthropic-billing-header: cc_version=2.1.197; cc_entrypoint=cli;";

}  // namespace

// --- model pinning ---

TEST(PolicyModel, AnyModeServesEveryNameAndReportsIt) {
    request_policy p({}, "qwen3");
    chat_request c = simple_chat("claude-sonnet-4-5");
    const policy_outcome o = p.apply(c, {});
    EXPECT_EQ(o.fired, std::vector<std::string>{"model-alias:claude-sonnet-4-5->qwen3"});
    EXPECT_EQ(c.model, "claude-sonnet-4-5");  // responses keep the name asked for
    chat_request same = simple_chat("qwen3");
    EXPECT_TRUE(p.apply(same, {}).fired.empty());
    chat_request unnamed = simple_chat("");
    EXPECT_TRUE(p.apply(unnamed, {}).fired.empty());
}

TEST(PolicyModel, AliasesMapToTheServedModel) {
    request_policy p = policy_from("[model.aliases]\n\"claude-*\" = \"qwen3\"\n\"gpt-4o\" = \"qwen3\"\n");
    chat_request c = simple_chat("claude-haiku-4-5");
    EXPECT_TRUE(fired(p.apply(c, {}), "model-alias:claude-haiku-4-5->qwen3"));
    EXPECT_EQ(c.model, "qwen3");
    chat_request other = simple_chat("mistral");
    EXPECT_TRUE(fired(p.apply(other, {}), "model-alias:mistral->qwen3"));  // any mode: still served
}

TEST(PolicyModel, StrictModeRejectsUnknownNamesWith404) {
    request_policy p = policy_from("[model]\nmode = \"strict\"\naliases = { \"claude-*\" = \"qwen3\" }\n");
    chat_request unknown = simple_chat("llama3:70b");
    const chat_request before = unknown;
    try {
        p.apply(unknown, {});
        ADD_FAILURE() << "expected a 404";
    } catch (const request_error& e) {
        EXPECT_EQ(e.status, 404);
        EXPECT_EQ(e.type, "model_not_found");
        EXPECT_NE(std::string(e.what()).find("'llama3:70b' is not served here"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("'qwen3'"), std::string::npos) << e.what();
    }
    EXPECT_EQ(unknown.messages[0].content, before.messages[0].content);
    chat_request served = simple_chat("qwen3");
    EXPECT_NO_THROW(p.apply(served, {}));
    chat_request alias = simple_chat("claude-opus-4");
    EXPECT_NO_THROW(p.apply(alias, {}));
    EXPECT_EQ(alias.model, "qwen3");
    chat_request unnamed = simple_chat("");
    EXPECT_NO_THROW(p.apply(unnamed, {}));
    // Counting tokens is held to the same names.
    chat_request count = simple_chat("llama3:70b");
    EXPECT_THROW(p.apply(count, {}, policy_use::counting), request_error);
}

TEST(PolicyModel, RequestedContextIsReportedNeverApplied) {
    request_policy p({}, "qwen3");
    chat_request c = simple_chat();
    c.requested_context = 65536;
    EXPECT_EQ(p.apply(c, {}).fired, std::vector<std::string>{"num-ctx-ignored:65536"});
}

// --- forced options ---

TEST(PolicyOptions, MaxTokensCapAndDefault) {
    request_policy capped = policy_from("[options]\nmax_tokens_cap = 4096\n");
    chat_request big = simple_chat();
    big.max_tokens = 100000;
    EXPECT_TRUE(fired(capped.apply(big, {}), "max-tokens-cap:4096"));
    EXPECT_EQ(big.max_tokens, 4096);
    chat_request none = simple_chat();
    EXPECT_TRUE(fired(capped.apply(none, {}), "max-tokens-cap:4096"));
    EXPECT_EQ(none.max_tokens, 4096);
    chat_request small = simple_chat();
    small.max_tokens = 100;
    EXPECT_TRUE(capped.apply(small, {}).fired.empty());
    EXPECT_EQ(small.max_tokens, 100);

    request_policy both = policy_from("[options]\nmax_tokens_cap = 4096\nmax_tokens_default = 512\n");
    chat_request unset = simple_chat();
    const policy_outcome o = both.apply(unset, {});
    EXPECT_EQ(o.fired, std::vector<std::string>{"max-tokens-default:512"});
    EXPECT_EQ(unset.max_tokens, 512);
}

TEST(PolicyOptions, ThinkingToolChoiceAndSampling) {
    request_policy p = policy_from(R"(
[options]
thinking = false
tool_choice = "required"
temperature = 0.6
top_k = 20
seed = 7
)");
    chat_request c = simple_chat();
    c.enable_thinking = true;
    c.sampling.temperature = 1.5f;
    c.sampling.top_k = 20;  // already what is forced: not reported
    const policy_outcome o = p.apply(c, {});
    EXPECT_EQ(c.enable_thinking, false);
    EXPECT_FLOAT_EQ(*c.sampling.temperature, 0.6f);
    EXPECT_EQ(c.sampling.seed, 7u);
    EXPECT_TRUE(fired(o, "thinking:off"));
    EXPECT_TRUE(fired(o, "temperature:0.6"));
    EXPECT_TRUE(fired(o, "seed:7"));
    EXPECT_FALSE(fired(o, "top-k:20"));
    EXPECT_FALSE(fired(o, "tool-choice:required"));  // no tools: nothing to choose
    EXPECT_EQ(c.tool_choice, COMMON_CHAT_TOOL_CHOICE_AUTO);

    chat_request with_tools = simple_chat();
    with_tools.tools.push_back({"get_weather", "weather", R"({"type":"object","properties":{}})"});
    EXPECT_TRUE(fired(p.apply(with_tools, {}), "tool-choice:required"));
    EXPECT_EQ(with_tools.tool_choice, COMMON_CHAT_TOOL_CHOICE_REQUIRED);
}

TEST(PolicyOptions, ClientRulesOverrideTheGlobalOptionsInOrder) {
    request_policy p = policy_from(R"(
[options]
max_tokens_cap = 4096
thinking = true

[[client]]
client = "claude-cli"
max_tokens_cap = 1024

[[client]]
client = "claude-*"
model = "claude-haiku-*"
thinking = false

[[client]]
api = "ollama"
header = "x-batch"
temperature = 0
)");
    chat_request main_model = simple_chat("claude-sonnet-4");
    p.apply(main_model, {.client = "claude-cli"});
    EXPECT_EQ(main_model.max_tokens, 1024);
    EXPECT_EQ(main_model.enable_thinking, true);

    chat_request small_model = simple_chat("claude-haiku-4-5");
    p.apply(small_model, {.client = "claude-cli"});
    EXPECT_EQ(small_model.max_tokens, 1024);
    EXPECT_EQ(small_model.enable_thinking, false);

    chat_request other = simple_chat("claude-haiku-4-5");
    p.apply(other, {.client = "curl"});
    EXPECT_EQ(other.max_tokens, 4096);
    EXPECT_EQ(other.enable_thinking, true);

    const std::map<std::string, std::string> headers = {{"x-batch", "1"}};
    chat_request ollama = simple_chat();
    ollama.api = "ollama";
    p.apply(ollama, {.client = "ollama-js", .headers = &headers});
    EXPECT_FLOAT_EQ(ollama.sampling.temperature.value_or(-1), 0.0f);
    chat_request no_header = simple_chat();
    no_header.api = "ollama";
    p.apply(no_header, {.client = "ollama-js"});
    EXPECT_FALSE(no_header.sampling.temperature);
}

TEST(PolicyOptions, LogitBiasByTokenText) {
    request_policy p = policy_from(R"(
[options]
logit_bias = { "<|im_end|>" = 100, "Hello" = -100 }
[[client]]
client = "greeter"
logit_bias = { "Hello" = 50 }
)");
    // Before it is bound to a vocabulary, a bias has no token to act on.
    chat_request unbound = simple_chat();
    EXPECT_TRUE(p.apply(unbound, {}).fired.empty());

    const std::map<std::string, llama_token> vocab = {{"<|im_end|>", 7}, {"Hello", 9}};
    p.bind_vocab([&](const std::string& text) -> std::optional<llama_token> {
        auto it = vocab.find(text);
        return it == vocab.end() ? std::nullopt : std::optional(it->second);
    });
    chat_request c = simple_chat();
    c.sampling.logit_bias = {{9, 3.0f}, {11, 1.0f}};
    const policy_outcome o = p.apply(c, {});
    EXPECT_EQ(o.header_value(), "logit-bias:<|im_end|>=100; logit-bias:Hello=-100");
    ASSERT_EQ(c.sampling.logit_bias.size(), 3u);  // the client's bias on token 9 is replaced, token 11 kept
    EXPECT_EQ(c.sampling.logit_bias[0], (std::pair<llama_token, float>{11, 1.0f}));
    EXPECT_EQ(c.sampling.logit_bias[1], (std::pair<llama_token, float>{7, 100.0f}));
    EXPECT_EQ(c.sampling.logit_bias[2].first, 9);
    EXPECT_TRUE(std::isinf(c.sampling.logit_bias[2].second));  // -100 bans, as in a request

    chat_request greeter = simple_chat();
    p.apply(greeter, {.client = "greeter"});
    ASSERT_EQ(greeter.sampling.logit_bias.size(), 2u);
    EXPECT_EQ(greeter.sampling.logit_bias[1], (std::pair<llama_token, float>{9, 50.0f}));

    request_policy multi = policy_from("[options]\nlogit_bias = { \"</tool_call>\" = 10 }\n");
    try {
        multi.bind_vocab([](const std::string&) { return std::nullopt; });
        ADD_FAILURE() << "expected an error";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("'</tool_call>', which is not a single token"), std::string::npos)
            << e.what();
    }
}

// --- ping absorption ---

TEST(PolicyPing, DefaultMatcherIsOneTokenAFewWordsAndNoTools) {
    for (const request_policy& p : {policy_from(""), request_policy(builtin_policy("qwen3"), "qwen3")}) {
        chat_request ping = simple_chat();
        ping.max_tokens = 1;
        const policy_outcome o = p.apply(ping, {});
        EXPECT_TRUE(o.ping);
        EXPECT_EQ(o.ping_reply, "ok");
        EXPECT_EQ(o.fired, std::vector<std::string>{"ping-absorbed"});
        // Claude Code's quota check, as it sends it.
        chat_request quota = chat({message("user", "quota")}, "claude-haiku-4-5");
        quota.max_tokens = 1;
        EXPECT_TRUE(p.apply(quota, {}).ping);

        for (std::optional<int> max_tokens : {std::optional<int>(2), std::optional<int>()}) {
            chat_request real = simple_chat();
            real.max_tokens = max_tokens;
            EXPECT_FALSE(p.apply(real, {}).ping);
        }
        // A one-token request that means it: a classification with its text is generated.
        chat_request classify = chat({message("user", "Review: 'Great phone, bad battery.' Positive? yes/no")});
        classify.max_tokens = 1;
        EXPECT_FALSE(p.apply(classify, {}).ping);
        // A short prompt with tools is a real call too.
        chat_request with_tools = simple_chat();
        with_tools.max_tokens = 1;
        with_tools.tools.push_back({.name = "f", .description = "", .parameters = "{}"});
        EXPECT_FALSE(p.apply(with_tools, {}).ping);
        // Every role counts: a long system prompt makes it a real request.
        chat_request long_system = chat({message("system", std::string(40, 'x')), message("user", "hi")});
        long_system.max_tokens = 1;
        EXPECT_FALSE(p.apply(long_system, {}).ping);
        // Counting tokens is never a ping: the count is what the caller wants.
        chat_request count = simple_chat();
        count.max_tokens = 1;
        EXPECT_FALSE(p.apply(count, {}, policy_use::counting).ping);
    }
}

TEST(PolicyPing, ConfiguredMatchers) {
    request_policy p = policy_from(R"(
[ping]
reply = "pong"
[[ping.match]]
last_user_text = '^(ping|test)$'
[[ping.match]]
header = "x-health-check"
[[ping.match]]
client = "uptime-*"
max_tokens_at_most = 5
)");
    chat_request text = chat({message("user", "ping")});
    const policy_outcome o = p.apply(text, {});
    EXPECT_TRUE(o.ping);
    EXPECT_EQ(o.ping_reply, "pong");
    chat_request not_text = chat({message("user", "ping me the logs")});
    EXPECT_FALSE(p.apply(not_text, {}).ping);
    chat_request one_token = simple_chat();
    one_token.max_tokens = 1;  // the default matcher is replaced by the file's
    EXPECT_FALSE(p.apply(one_token, {}).ping);

    const std::map<std::string, std::string> headers = {{"x-health-check", "1"}};
    chat_request with_header = simple_chat();
    EXPECT_TRUE(p.apply(with_header, {.headers = &headers}).ping);

    chat_request uptime = simple_chat();
    uptime.max_tokens = 5;
    EXPECT_TRUE(p.apply(uptime, {.client = "uptime-kuma"}).ping);
    chat_request uptime_long = simple_chat();
    uptime_long.max_tokens = 50;  // both conditions of a table must hold
    EXPECT_FALSE(p.apply(uptime_long, {.client = "uptime-kuma"}).ping);
    chat_request other_client = simple_chat();
    other_client.max_tokens = 5;
    EXPECT_FALSE(p.apply(other_client, {.client = "claude-cli"}).ping);
}

TEST(PolicyPing, PingsSkipEveryOtherRule) {
    request_policy p = policy_from("[options]\nmax_tokens_cap = 9\n[[ping.match]]\nmax_tokens_at_most = 1\n");
    chat_request ping = chat({message("system", "id 123e4567-e89b-12d3-a456-426614174000"), message("user", "hi")});
    ping.max_tokens = 1;
    const policy_outcome o = p.apply(ping, {});
    EXPECT_TRUE(o.ping);
    EXPECT_EQ(o.fired, std::vector<std::string>{"ping-absorbed"});
    EXPECT_EQ(ping.max_tokens, 1);
}

TEST(PolicyPing, DisabledOrNoFile) {
    request_policy off = policy_from("[ping]\nenabled = false\n");
    request_policy none({}, "qwen3");
    for (request_policy* p : {&off, &none}) {
        chat_request c = simple_chat();
        c.max_tokens = 1;
        EXPECT_FALSE(p->apply(c, {}).ping);
    }
}

// --- built-in span rules on real samples ---

TEST(SpanBuiltins, ClaudeCodeBillingHeader) {
    // As Claude Code 2.1.197 writes it (see its tTn()): the cc_version suffix hashes the first user message, and cch
    // (firstParty only) hashes the request body.
    EXPECT_EQ(rewrite("claude-code-billing",
                      "x-anthropic-billing-header: cc_version=2.1.197.a1b; cc_entrypoint=cli; "
                      "cch=5f2e1;"),
              billing_normalized);
    EXPECT_EQ(rewrite("claude-code-billing",
                      "x-anthropic-billing-header: cc_version=2.1.197.0c3; cc_entrypoint=cli; "
                      "cch=00a91;"),
              billing_normalized);
    EXPECT_EQ(rewrite("claude-code-billing", "x-anthropic-billing-header: cc_version=2.1.197.fff; cc_entrypoint=cli;"),
              billing_normalized);
    // Every field after the entry point goes, known or not, up to the end of the line; the next line stays.
    EXPECT_EQ(rewrite("claude-code-billing",
                      "x-anthropic-billing-header: cc_version=2.1.197.a1b; cc_entrypoint=sdk-ts;"
                      " cch=12345; cc_workload=cron; cc_is_subagent=true;\nYou are Claude Code."),
              "x-anthropic-billing-header: cc_version=2.1.197; cc_entrypoint=sdk-ts;\nYou are Claude Code.");
    const std::string prose = "Mention the x-anthropic-billing-header only when asked.";
    EXPECT_EQ(rewrite("claude-code-billing", prose), prose);
}

// Claude Code 2.1.332 in first-party mode (_CLAUDE_CODE_ASSUME_FIRST_PARTY_BASE_URL=1), as in
// tests/fixtures/claude-code/first-party-turn-*.json: the cch nonce, a prompt id and turn counters change per request;
// its binary knows more fields (cc_prev_req, cc_prev_msg, ...) and a later version may add any. Every turn of every
// conversation of one installation and entry point gets the same line.
TEST(SpanBuiltins, ClaudeCodeFirstPartyBillingHeaderWithEveryVolatileField) {
    const std::string normalized = "x-anthropic-billing-header: cc_version=2.1.332; cc_entrypoint=sdk-cli;";
    for (const std::string line : {
             "x-anthropic-billing-header: cc_version=2.1.332.3e1; cc_entrypoint=sdk-cli; cch=9c0a7; "
             "cc_prompt_id=6fa459ea-ee8a-3ca4-894e-db77e160355e; cc_turn_origin=sdk; cc_prompt_index=0; "
             "cc_turn_index=0;",
             "x-anthropic-billing-header: cc_version=2.1.332.e07; cc_entrypoint=sdk-cli; cch=00d1f; "
             "cc_prompt_id=123e4567-e89b-12d3-a456-426614174000; cc_turn_origin=sdk; cc_prompt_index=0; "
             "cc_turn_index=2; cc_prev_req=req_011CVx; cc_prev_msg=msg_01Ab; cc_prev_prompt_index=0; "
             "cc_dispatch_entrypoint=sdk-cli;",
             "x-anthropic-billing-header: cc_version=2.1.332.a1b; cc_entrypoint=sdk-cli; cc_future_field=7f3e;",
             "x-anthropic-billing-header: cc_version=2.1.332; cc_entrypoint=sdk-cli;",
         }) {
        EXPECT_EQ(rewrite("claude-code-billing", line), normalized) << line;
        EXPECT_EQ(rewrite("claude-code-billing", line + "\nYou are Claude Code."),
                  normalized + "\nYou are Claude Code.")
            << line;
    }
    // System blocks joined without a line break (a proxy's upstream may get them so): the fields go, the text stays.
    EXPECT_EQ(rewrite("claude-code-billing",
                      "x-anthropic-billing-header: cc_version=2.1.332.e07; cc_entrypoint=cli; cch=00d1f; "
                      "cc_turn_index=2;You are a careful agent. Use key=value; pairs."),
              "x-anthropic-billing-header: cc_version=2.1.332; cc_entrypoint=cli;You are a careful agent. Use "
              "key=value; pairs.");
    // A header in a shape it does not know still becomes one constant line.
    EXPECT_EQ(rewrite("claude-code-billing", "x-anthropic-billing-header: cch=5f2e1; cc_x=1;"),
              rewrite("claude-code-billing", "x-anthropic-billing-header: cch=77777; cc_x=2;"));
}

TEST(SpanBuiltins, Uuids) {
    EXPECT_EQ(rewrite("uuid", "session 123e4567-e89b-12d3-a456-426614174000 started"),
              "session 00000000-0000-0000-0000-000000000000 started");
    EXPECT_EQ(rewrite("uuid", "request_id=F47AC10B-58CC-4372-A567-0E02B2C3D479;"),
              "request_id=00000000-0000-0000-0000-000000000000;");
    for (const std::string text : {"123e4567-e89b-12d3-a456-42661417400", "x123e4567-e89b-12d3-a456-426614174000",
                                   "123e4567-e89b-12d3-a456-4266141740001", "2026-06-30-12-34"}) {
        EXPECT_EQ(rewrite("uuid", text), text);
    }
}

TEST(SpanBuiltins, Timestamps) {
    const builtin_span* b = find_builtin_span("timestamp");
    span_rule rule(b->name, b->pattern, b->action, b->replacement, b->roles);
    for (const std::string stamp :
         {"2026-06-30T12:34:56Z", "2026-06-30T12:34:56.123+02:00", "2026-06-30 12:34", "2026-06-30T12:34:56,5-0700",
          "20260630T123456Z", "Tue, 30 Jun 2026 12:34:56 GMT", "Tue, 30 Jun 2026 12:34:56 +0200",
          "Tue Jun 30 12:34:56 UTC 2026", "Tue Jun  3 02:04:06 2026", "6/30/2026, 12:34:56 PM", "30/06/2026 12:34"}) {
        std::string text = "Now: " + stamp + ".";
        std::vector<std::string> moved;
        EXPECT_EQ(rule.apply(text, moved), 1) << stamp;
        EXPECT_EQ(text, "Now: .") << stamp;
        EXPECT_EQ(moved, std::vector<std::string>{stamp});
    }
    for (const std::string text : {"Today's date is 2026-06-30.", "version 2026.06.30", "12:34:56 elapsed"}) {
        EXPECT_EQ(rewrite("timestamp", text), text);
    }
}

// --- replace, drop, move ---

TEST(SpanRules, ReplaceDropMove) {
    std::vector<std::string> moved;
    span_rule replace("nonce", "nonce=[0-9a-f]+", span_action::replace, "nonce=0");
    std::string text = "a nonce=abc1 b nonce=ff c";
    EXPECT_EQ(replace.apply(text, moved), 2);
    EXPECT_EQ(text, "a nonce=0 b nonce=0 c");

    span_rule groups("kv", "(id)=([0-9]+)", span_action::replace, R"(\1=<\2 digits>)");
    text = "id=42";
    groups.apply(text, moved);
    EXPECT_EQ(text, "id=<42 digits>");

    span_rule drop("trace", " ?trace=[0-9]+", span_action::drop, "ignored");
    text = "call trace=123 done";
    EXPECT_EQ(drop.apply(text, moved), 1);
    EXPECT_EQ(text, "call done");
    EXPECT_TRUE(moved.empty());

    span_rule move("clock", "[0-9]{2}:[0-9]{2}", span_action::move, "<time>");
    text = "at 12:30 and 13:45";
    EXPECT_EQ(move.apply(text, moved), 2);
    EXPECT_EQ(text, "at <time> and <time>");
    EXPECT_EQ(moved, (std::vector<std::string>{"12:30", "13:45"}));

    EXPECT_THROW(span_rule("bad", "(a+)\\1", span_action::replace), std::invalid_argument);
    EXPECT_THROW(span_rule("bad", "(?=a)", span_action::replace), std::invalid_argument);
    EXPECT_THROW(span_rule("bad", "a?", span_action::replace), std::invalid_argument);
    EXPECT_THROW(span_rule("bad", "(a)", span_action::replace, "\\2"), std::invalid_argument);
}

TEST(SpanRules, MovedTextGoesToTheEndOfTheLastNonAssistantMessage) {
    span_rule_set rules({span_rule("clock", "time: [0-9:]+", span_action::move, "time: (see end)", role_system)});
    std::vector<common_chat_msg> messages = {message("system", "Be brief. time: 12:34:56. Tools follow."),
                                             message("user", "first"), message("assistant", "reply"),
                                             message("tool", "result"), message("assistant", "Continue")};
    const span_report report = rules.apply(messages);
    ASSERT_EQ(report.fired.size(), 1u);
    EXPECT_EQ(report.fired[0].rule, "clock");
    EXPECT_EQ(report.fired[0].matches, 1);
    EXPECT_EQ(messages[0].content, "Be brief. time: (see end). Tools follow.");
    EXPECT_EQ(messages[1].content, "first");
    EXPECT_EQ(messages[3].content, "result\n\n[moved from the system prompt: time: 12:34:56]");
    EXPECT_EQ(messages[4].content, "Continue");  // a trailing assistant message is continued, never noted

    // Content parts: the note joins the last part.
    std::vector<common_chat_msg> parts = {message("system", "time: 01:02"), message("user", "")};
    parts[1].content_parts = {{"text", "one"}, {"text", "two"}};
    rules.apply(parts);
    EXPECT_EQ(parts[1].content_parts[1].text, "two\n\n[moved from the system prompt: time: 01:02]");
    EXPECT_EQ(parts[1].content, "");
}

TEST(SpanRules, RolesContentPartsAndReasoning) {
    span_rule_set rules({span_rule("secret", "s3cr3t", span_action::replace, "***", role_user | role_assistant)});
    std::vector<common_chat_msg> messages = {message("system", "s3cr3t"), message("user", "a s3cr3t"),
                                             message("assistant", "")};
    messages[2].content_parts = {{"text", "s3cr3t"}};
    messages[2].reasoning_content = "thinking about s3cr3t";
    const span_report report = rules.apply(messages);
    EXPECT_EQ(messages[0].content, "s3cr3t");  // system is not among the rule's roles
    EXPECT_EQ(messages[1].content, "a ***");
    EXPECT_EQ(messages[2].content_parts[0].text, "***");
    EXPECT_EQ(messages[2].reasoning_content, "thinking about ***");
    ASSERT_EQ(report.fired.size(), 1u);
    EXPECT_EQ(report.fired[0].matches, 3);
}

TEST(SpanRules, RulesApplyInOrderAndOnlyWhereTheyMatch) {
    span_rule_set rules({span_rule("first", "abc", span_action::replace, "xyz"),
                         span_rule("second", "x", span_action::replace, "X"),
                         span_rule("never", "qqq", span_action::drop)});
    std::vector<common_chat_msg> messages = {message("user", "abc x")};
    const span_report report = rules.apply(messages);
    // "second" saw the text as the client sent it (it matched there), then ran on what "first" made of it.
    EXPECT_EQ(messages[0].content, "Xyz X");
    ASSERT_EQ(report.fired.size(), 2u);
    EXPECT_EQ(report.fired[0].rule, "first");
    EXPECT_EQ(report.fired[1].rule, "second");
    EXPECT_EQ(report.fired[1].matches, 2);
}

TEST(SpanRules, LongTextsComeBackTheSameEveryTurn) {
    // Long texts the rules found nothing in are remembered by hash: the same text again is left alone, a text that
    // differs from it by one span is still rewritten, and one the rules rewrote is rewritten every time.
    span_rule_set rules({span_rule("nonce", "nonce=[0-9a-f]+", span_action::replace, "nonce=0")});
    std::string clean;
    while (clean.size() < 20000) clean += "You are a coding agent. Never guess. ";
    const std::string dirty = clean + "nonce=abc123";
    for (int turn = 0; turn < 3; ++turn) {
        std::vector<common_chat_msg> messages = {message("system", clean), message("user", dirty),
                                                 message("user", clean + "nonce=ff")};
        const span_report report = rules.apply(messages);
        EXPECT_EQ(messages[0].content, clean) << turn;
        EXPECT_EQ(messages[1].content, clean + "nonce=0") << turn;
        EXPECT_EQ(messages[2].content, clean + "nonce=0") << turn;
        ASSERT_EQ(report.fired.size(), 1u) << turn;
        EXPECT_EQ(report.fired[0].matches, 2) << turn;
    }
}

TEST(SpanRules, HostileInputStaysLinear) {
    // Inputs that make backtracking engines take exponential (or quadratic) time: RE2 runs them in linear time.
    const std::string as(200000, 'a');
    const std::string digits(200000, '1');
    std::string dashes;
    for (int i = 0; i < 40000; i++) dashes += "1111-11-11 ";
    std::string hex;
    for (int i = 0; i < 25000; i++) hex += "aaaaaaaa-";
    const std::string billing_almost = [] {
        std::string s;
        // Almost the header (it has no ": " after its name), over and over.
        for (int i = 0; i < 5000; i++) s += "x-anthropic-billing-header cc_version=1.2.3.";
        return s;
    }();

    std::vector<span_rule> rules = {
        span_rule("nested", "(a+)+b", span_action::replace, "x"),
        span_rule("alternation", "(a|aa)+c", span_action::drop),
        span_rule("stars", "(x+x+)+y", span_action::drop),
        span_rule("digits", "([0-9]*)*z", span_action::drop),
    };
    for (const builtin_span& b : builtin_spans()) rules.emplace_back(b.name, b.pattern, b.action, b.replacement);
    span_rule_set set(rules);

    const auto start = std::chrono::steady_clock::now();
    for (const std::string* input :
         std::initializer_list<const std::string*>{&as, &digits, &dashes, &hex, &billing_almost}) {
        std::vector<common_chat_msg> messages = {message("system", *input), message("user", *input)};
        const span_report report = set.apply(messages);
        EXPECT_TRUE(report.fired.empty());
        EXPECT_EQ(messages[0].content, *input);
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // A hang guard far above linear work under the sanitizers on a busy machine; backtracking would take years.
    EXPECT_LT(seconds, 60.0) << "2 MB of hostile text through " << rules.size() << " rules";
}

// --- the policy as a whole ---

TEST(Policy, SpansFireInTheOutcome) {
    request_policy p = policy_from("");
    chat_request c = chat({message("system",
                                   "x-anthropic-billing-header: cc_version=2.1.197.a1b; cc_entrypoint=cli; "
                                   "cch=5f2e1;\nYou are Claude Code. Session "
                                   "123e4567-e89b-12d3-a456-426614174000. Now 2026-06-30T12:34:56Z."),
                           message("user", "Do it.")});
    const policy_outcome o = p.apply(c, {});
    EXPECT_EQ(o.header_value(), "span:claude-code-billing(replace); span:uuid(replace); span:timestamp(move)");
    EXPECT_EQ(c.messages[0].content,
              billing_normalized + "\nYou are Claude Code. Session 00000000-0000-0000-0000-000000000000. Now .");
    EXPECT_EQ(c.messages[1].content, "Do it.\n\n[moved from the system prompt: 2026-06-30T12:34:56Z]");

    // Two requests differing only in their nonces read the same up to the last message.
    chat_request next = chat({message("system",
                                      "x-anthropic-billing-header: cc_version=2.1.197.e0f; cc_entrypoint=cli; "
                                      "cch=9a0b1;\nYou are Claude Code. Session "
                                      "6fa459ea-ee8a-3ca4-894e-db77e160355e. Now 2026-06-30T12:35:02Z."),
                              message("user", "Do it.")});
    p.apply(next, {});
    EXPECT_EQ(next.messages[0].content, c.messages[0].content);
}

// A clock moved out of the system prompt goes to the end of the last message; in the next turn that message is
// history, and gets the same note back, so the history renders as the previous prompt did (and the cache holds it,
// with the answer after it): only the new note is new.
TEST(Policy, MovedNoteComesBackWithItsMessageInLaterTurns) {
    request_policy p = policy_from("");
    const auto system = [](const std::string& time) {
        return message("system", "You are terse. Current time: " + time);
    };
    chat_request one = chat({system("2026-12-06 11:42:17"), message("user", "Do it.")});
    p.apply(one, {.tenant = "alice"});
    EXPECT_EQ(one.messages[0].content, "You are terse. Current time: ");
    const std::string note1 = "\n\n[moved from the system prompt: 2026-12-06 11:42:17]";
    EXPECT_EQ(one.messages[1].content, "Do it." + note1);

    chat_request two = chat({system("2026-12-06 11:43:02"), message("user", "Do it."), message("assistant", "Done."),
                             message("user", "Next.")});
    p.apply(two, {.tenant = "alice"});
    EXPECT_EQ(two.messages[0].content, one.messages[0].content);
    EXPECT_EQ(two.messages[1].content, one.messages[1].content);  // the first turn's note, as it was cached
    EXPECT_EQ(two.messages[3].content, "Next.\n\n[moved from the system prompt: 2026-12-06 11:43:02]");

    chat_request three = chat({system("2026-12-06 11:44:40"), message("user", "Do it."), message("assistant", "Done."),
                               message("user", "Next."), message("assistant", "Ok."), message("user", "Last.")});
    p.apply(three, {.tenant = "alice"});
    EXPECT_EQ(three.messages[1].content, one.messages[1].content);
    EXPECT_EQ(three.messages[3].content, two.messages[3].content);
    EXPECT_EQ(three.messages[5].content, "Last.\n\n[moved from the system prompt: 2026-12-06 11:44:40]");

    // The same request again (a retry, or a cut answer continued) reads as it did the first time.
    chat_request retry = chat({system("2026-12-06 11:45:10"), message("user", "Do it."), message("assistant", "Done."),
                               message("user", "Next."), message("assistant", "Ok."), message("user", "Last.")});
    p.apply(retry, {.tenant = "alice"});
    EXPECT_EQ(retry.messages[5].content, three.messages[5].content);

    // Another tenant's conversation with the same words does not get alice's clock; nor does an edited history.
    chat_request other = chat({system("2026-12-06 11:50:00"), message("user", "Do it."), message("assistant", "Done."),
                               message("user", "Next.")});
    p.apply(other, {.tenant = "bob"});
    EXPECT_EQ(other.messages[1].content, "Do it.");
    chat_request edited = chat({message("system", "You are brief. Current time: 2026-12-06 11:51:00"),
                                message("user", "Do it."), message("assistant", "Done."), message("user", "Next.")});
    p.apply(edited, {.tenant = "alice"});
    EXPECT_EQ(edited.messages[1].content, "Do it.");
}

TEST(MovedNotes, BoundedOldestFirst) {
    moved_notes notes(2, 1000);
    const std::vector<common_chat_msg> msgs = {message("user", "a"), message("user", "b"), message("user", "c")};
    const auto keys = conversation_keys("", msgs);
    ASSERT_EQ(keys.size(), 3u);
    EXPECT_FALSE(XXH128_isEqual(keys[0], keys[1]));
    EXPECT_FALSE(XXH128_isEqual(keys[0], conversation_keys("t", msgs)[0]));
    notes.remember(keys[0], "x");
    notes.remember(keys[1], "y");
    notes.remember(keys[2], "z");
    EXPECT_EQ(notes.size(), 2u);
    EXPECT_FALSE(notes.find(keys[0]));
    EXPECT_EQ(notes.find(keys[2]), "z");
    notes.remember(keys[1], std::string(2000, 'n'));  // larger than the whole budget: not kept, the old one stays
    EXPECT_EQ(notes.find(keys[1]), "y");
    moved_notes small(100, 10);
    small.remember(keys[0], "12345678");
    small.remember(keys[1], "12345678");  // over the bytes: the oldest goes
    EXPECT_FALSE(small.find(keys[0]));
    EXPECT_TRUE(small.find(keys[1]));
}

// A restarted server (serve saves the notes beside the disk tier at shutdown, loads them at start-up) gives the next
// turn's history the note its first turn got, as the server before the restart did: without it, the history rendered
// without the note and the turn reused the cache only up to that message (the gauntlet's restart lost 1,300 tokens).
TEST(Policy, MovedNotesComeBackAfterARestart) {
    const auto dir = std::filesystem::temp_directory_path() / ("keepwarm-test-notes-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    const auto file = dir / "moved-notes.kwmn";
    const auto system = [](const std::string& time) {
        return message("system", "You are terse. Current time: " + time);
    };
    chat_request one = chat({system("2026-12-06 11:42:17"), message("user", "Do it.")});
    {
        request_policy before = policy_from("");
        before.apply(one, {.tenant = "alice"});
        before.moved_span_notes().save(file);
    }
    request_policy after = policy_from("");
    EXPECT_EQ(after.moved_span_notes().load(file), "");
    EXPECT_EQ(after.moved_span_notes().size(), 1u);
    chat_request two = chat({system("2026-12-06 11:43:02"), message("user", "Do it."), message("assistant", "Done."),
                             message("user", "Next.")});
    after.apply(two, {.tenant = "alice"});
    EXPECT_EQ(two.messages[1].content, one.messages[1].content);  // the first turn's note, as it was cached
    EXPECT_EQ(two.messages[3].content, "Next.\n\n[moved from the system prompt: 2026-12-06 11:43:02]");
    std::filesystem::remove_all(dir);
}

// A notes file is hostile input: a damaged, truncated or foreign one is ignored whole, saying why.
TEST(MovedNotes, ADamagedFileIsIgnored) {
    const auto dir = std::filesystem::temp_directory_path() / ("keepwarm-test-notes-bad-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    const auto file = dir / "notes.kwmn";
    const auto keys = conversation_keys("", {message("user", "a"), message("user", "b")});
    moved_notes notes;
    notes.remember(keys[0], "x");
    notes.remember(keys[1], "yz");
    notes.save(file);
    moved_notes back;
    EXPECT_EQ(back.load(file), "");
    EXPECT_EQ(back.find(keys[0]), "x");
    EXPECT_EQ(back.find(keys[1]), "yz");

    std::string bytes;
    {
        std::ifstream in(file, std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    const auto write = [&](const std::string& content) {
        std::ofstream(file, std::ios::binary | std::ios::trunc) << content;
    };
    const auto rejected = [&](const std::string& content) {
        write(content);
        moved_notes n;
        const std::string why = n.load(file);
        EXPECT_EQ(n.size(), 0u) << why;
        return why;
    };
    std::string flipped = bytes;
    flipped[flipped.size() - 12] ^= 1;  // in the last note
    EXPECT_EQ(rejected(flipped), "checksum mismatch");
    for (size_t cut : {size_t{0}, size_t{5}, size_t{20}, bytes.size() - 1}) {
        EXPECT_NE(rejected(bytes.substr(0, cut)), "") << cut;
    }
    EXPECT_NE(rejected(std::string(64, '\xff')), "");
    moved_notes tiny(1, 1);  // a file larger than its bounds could hold is not read
    write(bytes + std::string(4096, 'x'));
    EXPECT_NE(tiny.load(file), "");
    std::filesystem::remove(file);
    EXPECT_NE(back.load(file), "");  // missing
    std::filesystem::remove_all(dir);
}

TEST(Policy, HeaderValueIsPrintableAndBounded) {
    request_policy p({}, "qwen3");
    chat_request c = simple_chat("evil\r\nx-injected: 1;" + std::string(200, 'm'));
    const std::string header = p.apply(c, {}).header_value();
    EXPECT_EQ(header.find('\r'), std::string::npos);
    EXPECT_EQ(header.find('\n'), std::string::npos);
    EXPECT_EQ(header.find(';'), std::string::npos);  // ';' separates rules
    EXPECT_LT(header.size(), 100u);
    EXPECT_EQ(header.rfind("model-alias:evil??x-injected: 1?", 0), 0u) << header;
}

TEST(Policy, SpanRulesAddedWhileRequestsRun) {
    request_policy p({}, "qwen3");
    std::atomic<bool> stop{false};
    std::atomic<int> applied{0};
    std::thread reader([&] {
        while (!stop) {
            chat_request c = chat({message("system", "req-77f1 ok"), message("user", "hi")});
            p.apply(c, {});
            const std::string& s = c.messages[0].content;
            EXPECT_TRUE(s == "req-77f1 ok" || s == "req-0 ok") << s;
            applied++;
        }
    });
    for (int i = 0; i < 200; i++) {
        p.add_span_rule(span_rule("auto-req", "req-[0-9a-f]{4}", span_action::replace, "req-0", role_system,
                                  span_origin::automatic));
        EXPECT_TRUE(p.remove_span_rule("auto-req"));
    }
    p.add_span_rule(
        span_rule("auto-req", "req-[0-9a-f]{4}", span_action::replace, "req-0", role_system, span_origin::automatic));
    while (applied < 10) std::this_thread::yield();
    stop = true;
    reader.join();

    chat_request c = chat({message("system", "req-77f1 ok"), message("user", "hi")});
    EXPECT_EQ(p.apply(c, {}).fired, std::vector<std::string>{"span:auto-req(replace)"});
    EXPECT_EQ(c.messages[0].content, "req-0 ok");
    // Same name: replaced, not duplicated.
    p.add_span_rule(span_rule("auto-req", "ok", span_action::drop, "", role_system, span_origin::automatic));
    ASSERT_EQ(p.span_rules()->rules().size(), 1u);
    EXPECT_EQ(p.span_rules()->rules()[0].action(), span_action::drop);
    EXPECT_FALSE(p.remove_span_rule("nope"));
}

TEST(Policy, EffectivePolicyAsJson) {
    request_policy p = policy_from(R"(
[model]
mode = "strict"
aliases = { "claude-*" = "qwen3" }
[options]
max_tokens_cap = 100
temperature = 0.6
[[client]]
client = "claude-cli"
thinking = false
[spans]
uuid = false
timestamp = false
)");
    p.add_span_rule(span_rule("auto-1", "n=[0-9]+", span_action::replace, "n=0", all_roles, span_origin::automatic));
    const auto j = p.to_json();
    EXPECT_EQ(j["source"], "test.toml");
    EXPECT_EQ(j["served_model"], "qwen3");
    EXPECT_EQ(j["model"]["mode"], "strict");
    EXPECT_EQ(j["model"]["aliases"]["claude-*"], "qwen3");
    EXPECT_EQ(j["options"]["max_tokens_cap"], 100);
    EXPECT_EQ(j["options"]["temperature"], 0.6);  // as written, not as the float it is held in
    EXPECT_EQ(j["clients"][0]["match"]["client"], "claude-cli");
    EXPECT_EQ(j["clients"][0]["options"]["thinking"], false);
    EXPECT_EQ(j["ping"]["enabled"], true);
    EXPECT_EQ(j["ping"]["match"][0]["max_tokens_at_most"], 1);
    ASSERT_EQ(j["spans"].size(), 2u);
    EXPECT_EQ(j["spans"][0]["name"], "claude-code-billing");
    EXPECT_EQ(j["spans"][0]["origin"], "builtin");
    EXPECT_EQ(j["spans"][1]["name"], "auto-1");
    EXPECT_EQ(j["spans"][1]["origin"], "auto");
    EXPECT_EQ(j["spans"][1]["roles"].size(), 4u);
}

// Unit tests for reading the policy file (src/policy/policy-file.*): a complete file, the defaults, and every kind of
// mistake stopped with its line and column.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "policy/policy-file.h"

using namespace keepwarm::policy;

namespace {

policy_config parse(const std::string& text, const std::string& served = "qwen3") {
    return parse_policy(text, "test.toml", served);
}

// Parses `text` and checks that it fails at `line` with a message containing `needle`.
void expect_error(const std::string& text, int line, const std::string& needle) {
    try {
        parse(text);
        ADD_FAILURE() << "expected an error for:\n" << text;
    } catch (const policy_file_error& e) {
        EXPECT_EQ(e.line, line) << e.what();
        EXPECT_GT(e.column, 0) << e.what();
        const std::string message = e.what();
        EXPECT_EQ(message.rfind("test.toml:" + std::to_string(line) + ":", 0), 0u) << message;
        EXPECT_NE(message.find(needle), std::string::npos) << "'" << message << "' lacks '" << needle << "'";
    }
}

const span_rule* find_rule(const policy_config& c, const std::string& name) {
    for (const auto& r : c.spans) {
        if (r.name() == name) return &r;
    }
    return nullptr;
}

}  // namespace

TEST(PolicyFile, CompleteFile) {
    const policy_config c = parse(R"(
[model]
mode = "strict"
aliases = { "claude-*" = "qwen3", "gpt-4o" = "qwen3" }

[options]
max_tokens_cap = 4096
max_tokens_default = 1024
thinking = false
tool_choice = "required"
temperature = 0.6
top_p = 0.95
top_k = 20
min_p = 0
seed = 42
repeat_penalty = 1.1
repeat_last_n = 64
presence_penalty = 0.5
frequency_penalty = -0.5
logit_bias = { "<|im_end|>" = 100, "Hello" = -100 }

[[client]]
client = "claude-cli"
model = "claude-haiku-*"
max_tokens_cap = 512
thinking = true

[[client]]
api = "ollama"
header = "X-Batch"
temperature = 0.0

[ping]
reply = "pong"
[[ping.match]]
max_tokens_at_most = 2
[[ping.match]]
client = "uptime-*"
last_user_text = '^(ping|test)$'

[spans]
uuid = false
timestamp = "drop"
claude-code-billing = { action = "drop", roles = ["system", "user"] }
[[spans.rule]]
name = "trace-id"
pattern = 'trace=[0-9a-f]{16}'
replacement = "trace=0"
roles = ["system"]
[[spans.rule]]
name = "clock"
pattern = 'now: [0-9:]+'
action = "move"
)");
    EXPECT_EQ(c.source, "test.toml");
    EXPECT_EQ(c.model.mode, model_mode::strict);
    ASSERT_EQ(c.model.aliases.size(), 2u);
    EXPECT_EQ(c.model.aliases[0].pattern, "claude-*");
    EXPECT_EQ(c.model.aliases[0].target, "qwen3");

    EXPECT_EQ(c.options.max_tokens_cap, 4096);
    EXPECT_EQ(c.options.max_tokens_default, 1024);
    EXPECT_EQ(c.options.thinking, false);
    EXPECT_EQ(c.options.tool_choice, COMMON_CHAT_TOOL_CHOICE_REQUIRED);
    EXPECT_FLOAT_EQ(*c.options.sampling.temperature, 0.6f);
    EXPECT_FLOAT_EQ(*c.options.sampling.top_p, 0.95f);
    EXPECT_EQ(c.options.sampling.top_k, 20);
    EXPECT_FLOAT_EQ(*c.options.sampling.min_p, 0.0f);
    EXPECT_EQ(c.options.sampling.seed, 42u);
    EXPECT_FLOAT_EQ(*c.options.sampling.repeat_penalty, 1.1f);
    EXPECT_EQ(c.options.sampling.repeat_last_n, 64);
    EXPECT_FLOAT_EQ(*c.options.sampling.presence_penalty, 0.5f);
    EXPECT_FLOAT_EQ(*c.options.sampling.frequency_penalty, -0.5f);
    ASSERT_EQ(c.options.logit_bias.size(), 2u);
    EXPECT_EQ(c.options.logit_bias[0].text, "<|im_end|>");
    EXPECT_FLOAT_EQ(c.options.logit_bias[0].bias, 100.0f);
    EXPECT_EQ(c.options.logit_bias[1].text, "Hello");
    EXPECT_EQ(c.options.logit_bias[1].token, -1);  // bound to token ids once the model is loaded

    ASSERT_EQ(c.clients.size(), 2u);
    EXPECT_EQ(c.clients[0].match.client, "claude-cli");
    EXPECT_EQ(c.clients[0].match.model, "claude-haiku-*");
    EXPECT_EQ(c.clients[0].options.max_tokens_cap, 512);
    EXPECT_EQ(c.clients[0].options.thinking, true);
    EXPECT_EQ(c.clients[1].match.api, "ollama");
    EXPECT_EQ(c.clients[1].match.header, "x-batch");  // header names compare lowercase
    EXPECT_FLOAT_EQ(*c.clients[1].options.sampling.temperature, 0.0f);

    EXPECT_TRUE(c.ping.enabled);
    EXPECT_EQ(c.ping.reply, "pong");
    ASSERT_EQ(c.ping.matchers.size(), 2u);
    EXPECT_EQ(c.ping.matchers[0].max_tokens_at_most, 2);
    EXPECT_EQ(c.ping.matchers[1].client, "uptime-*");
    ASSERT_TRUE(c.ping.matchers[1].last_user_text);

    EXPECT_EQ(find_rule(c, "uuid"), nullptr);
    ASSERT_NE(find_rule(c, "timestamp"), nullptr);
    EXPECT_EQ(find_rule(c, "timestamp")->action(), span_action::drop);
    const span_rule* billing = find_rule(c, "claude-code-billing");
    ASSERT_NE(billing, nullptr);
    EXPECT_EQ(billing->action(), span_action::drop);
    EXPECT_EQ(billing->roles(), unsigned(role_system | role_user));
    EXPECT_EQ(billing->origin(), span_origin::builtin);
    ASSERT_EQ(c.spans.size(), 4u);  // two built-ins, then the file's rules in order
    EXPECT_EQ(c.spans[2].name(), "trace-id");
    EXPECT_EQ(c.spans[2].action(), span_action::replace);
    EXPECT_EQ(c.spans[2].replacement(), "trace=0");
    EXPECT_EQ(c.spans[2].roles(), unsigned(role_system));
    EXPECT_EQ(c.spans[2].origin(), span_origin::file);
    EXPECT_EQ(c.spans[3].name(), "clock");
    EXPECT_EQ(c.spans[3].action(), span_action::move);
    EXPECT_EQ(c.spans[3].roles(), unsigned(all_roles));
}

TEST(PolicyFile, EmptyFileTurnsOnTheDefaults) {
    const policy_config c = parse("");
    EXPECT_EQ(c.model.mode, model_mode::any);
    EXPECT_TRUE(c.ping.enabled);
    ASSERT_EQ(c.ping.matchers.size(), 1u);
    EXPECT_EQ(c.ping.matchers[0].max_tokens_at_most, 1);
    EXPECT_EQ(c.ping.matchers[0].prompt_chars_at_most, default_ping_prompt_chars);
    EXPECT_EQ(c.ping.matchers[0].tools, false);
    EXPECT_EQ(c.ping.reply, "ok");
    ASSERT_EQ(c.spans.size(), builtin_spans().size());
    for (size_t i = 0; i < c.spans.size(); i++) EXPECT_EQ(c.spans[i].name(), builtin_spans()[i].name);
    EXPECT_FALSE(c.options.max_tokens_cap);
    EXPECT_TRUE(c.clients.empty());
    EXPECT_EQ(c.detect.mode, detect_mode::automatic);  // as without a file
}

TEST(PolicyFile, TheBuiltInDefaultsAbsorbPingsKeepNoncesIdsAndClocksOutAndAdoptRulesForRandomIds) {
    const policy_config c = builtin_policy("qwen3");
    EXPECT_EQ(c.source, builtin_policy_source);
    EXPECT_EQ(c.model.mode, model_mode::any);
    EXPECT_TRUE(c.ping.enabled);
    ASSERT_EQ(c.ping.matchers.size(), 1u);
    const request_matcher expected = default_ping_matcher();
    EXPECT_EQ(c.ping.matchers[0].max_tokens_at_most, expected.max_tokens_at_most);
    EXPECT_EQ(c.ping.matchers[0].prompt_chars_at_most, expected.prompt_chars_at_most);
    EXPECT_EQ(c.ping.matchers[0].tools, expected.tools);
    // The billing header's volatile fields are replaced (the model has no use for them); uuids and date-times are
    // moved after the cached prefix, where the model still reads them.
    ASSERT_EQ(c.spans.size(), 3u);
    EXPECT_EQ(c.spans[0].name(), "claude-code-billing");
    EXPECT_EQ(c.spans[0].action(), span_action::replace);
    EXPECT_EQ(c.spans[1].name(), "uuid");
    EXPECT_EQ(c.spans[1].action(), span_action::move);
    EXPECT_EQ(c.spans[2].name(), "timestamp");
    EXPECT_EQ(c.spans[2].action(), span_action::move);
    for (const span_rule& rule : c.spans) EXPECT_EQ(rule.roles(), unsigned(role_system)) << rule.name();
    EXPECT_EQ(c.detect.mode, detect_mode::automatic);
    EXPECT_FALSE(c.options.max_tokens_cap);
    EXPECT_TRUE(c.clients.empty());
}

TEST(PolicyFile, PingMatchersTakeThePromptSizeAndWhetherThereAreTools) {
    const policy_config c = parse("[[ping.match]]\nprompt_chars_at_most = 10\ntools = true\n");
    ASSERT_EQ(c.ping.matchers.size(), 1u);
    EXPECT_EQ(c.ping.matchers[0].prompt_chars_at_most, 10);
    EXPECT_EQ(c.ping.matchers[0].tools, true);
    EXPECT_FALSE(c.ping.matchers[0].max_tokens_at_most);
    expect_error("[[ping.match]]\nprompt_chars_at_most = -1\n", 2, "'ping.match.prompt_chars_at_most' must be between");
    expect_error("[[ping.match]]\ntools = \"no\"\n", 2, "'ping.match.tools'");
}

TEST(PolicyFile, DetectModes) {
    EXPECT_EQ(parse("[detect]\nmode = \"off\"\n").detect.mode, detect_mode::off);
    const policy_config c = parse("[detect]\nmode = \"auto\"\nmax_auto_rules = 3\n");
    EXPECT_EQ(c.detect.mode, detect_mode::automatic);
    EXPECT_EQ(c.detect.max_auto_rules, 3u);
    EXPECT_STREQ(detect_mode_name(c.detect.mode), "auto");
    expect_error("[detect]\nmode = \"fix\"\n", 2, "'detect.mode' must be \"off\", \"report\" or \"auto\"");
    expect_error("[detect]\nmax_auto_rules = -1\n", 2, "'detect.max_auto_rules' must be between 0 and 1000");
    expect_error("[detect]\nmode = \"auto\"\nautomatic = true\n", 3, "unknown key 'automatic' in [detect]");
}

TEST(PolicyFile, SwitchesOffEverything) {
    const policy_config c = parse(R"(
[ping]
enabled = false
[spans]
claude-code-billing = false
uuid = false
timestamp = false
)");
    EXPECT_FALSE(c.ping.enabled);
    EXPECT_TRUE(c.spans.empty());
}

TEST(PolicyFile, BadTomlNamesItsLine) {
    expect_error("[model]\nmode = \"any\"\naliases = { \"a\" = \n", 3, "");
    expect_error("[options]\nmax_tokens_cap = 12\nthinking = nope\n", 3, "");
    expect_error("[ping]\nreply = \"ok\"\n[ping]\n", 3, "");
}

TEST(PolicyFile, UnknownKeysNameTheirLine) {
    expect_error("[model]\nmode = \"any\"\n\n[opions]\nthinking = true\n", 4, "unknown section 'opions'");
    expect_error("[options]\nthinking = true\nmax_token_cap = 10\n", 3, "unknown key 'max_token_cap' in [options]");
    expect_error("[model]\nstrict = true\n", 2, "unknown key 'strict' in [model]");
    expect_error("[[client]]\nclient = \"x\"\ncolour = \"blue\"\n", 3, "unknown key 'colour' in [[client]]");
    expect_error("[ping]\nenable = false\n", 2, "unknown key 'enable' in [ping]");
    expect_error("[[ping.match]]\nmax_tokens = 1\n", 2, "unknown key 'max_tokens' in [[ping.match]]");
    expect_error("[spans]\nuuid = true\nuuids = false\n", 3, "unknown key 'uuids' in [spans]");
    expect_error("[[spans.rule]]\nname = \"a\"\npattern = \"x\"\nflags = \"i\"\n", 4, "unknown key 'flags'");
    expect_error("[spans]\ntimestamp = { action = \"move\", where = \"end\" }\n", 2, "unknown key 'where'");
}

TEST(PolicyFile, InvalidRegexNamesItsLine) {
    // RE2 has no backreferences and no lookaround: such patterns are refused, not run slowly.
    expect_error("[[spans.rule]]\nname = \"backref\"\npattern = '(a+)\\1'\n", 3, "invalid pattern");
    expect_error("[spans]\n[[spans.rule]]\nname = \"look\"\n\npattern = 'foo(?=bar)'\n", 5, "invalid pattern");
    expect_error("[[spans.rule]]\nname = \"open\"\npattern = '(unclosed'\n", 3, "span rule 'open'");
    expect_error("[[spans.rule]]\nname = \"empty\"\npattern = 'x*'\n", 3, "matches the empty text");
    expect_error("[[spans.rule]]\nname = \"g\"\npattern = 'a(b)'\nreplacement = '\\2'\n", 4, "invalid replacement");
    expect_error("[[ping.match]]\nlast_user_text = '(?<=x)y'\n", 2, "not a pattern RE2 accepts");
}

TEST(PolicyFile, WrongValuesNameTheirLine) {
    expect_error("[model]\nmode = \"loose\"\n", 2, "'model.mode' must be \"any\" or \"strict\"");
    expect_error("[model.aliases]\n\"claude-*\" = \"llama\"\n", 2, "maps to 'llama', but this server serves 'qwen3'");
    expect_error("[options]\ntemperature = 3.5\n", 2, "'temperature' must be a number between 0 and 2");
    expect_error("[options]\ntop_p = \"high\"\n", 2, "'top_p' must be a number, not a string");
    expect_error("[options]\nmax_tokens_cap = 0\n", 2, "'max_tokens_cap' must be between 1");
    expect_error("[options]\nthinking = \"no\"\n", 2, "'thinking' must be true or false");
    expect_error("[options]\ntool_choice = \"always\"\n", 2, "'tool_choice' must be");
    expect_error("[options]\nseed = -2\n", 2, "'seed' must be between 0 and 4294967295");
    expect_error("[options]\nlogit_bias = { a = 1, b = 101 }\n", 2, "'logit_bias' values must be between -100 and 100");
    expect_error("[options]\nlogit_bias = [\"a\"]\n", 2, "'logit_bias' must be a table");
    expect_error("\n[[client]]\nthinking = false\n", 2, "needs at least one of client");
    expect_error("[[client]]\napi = \"grpc\"\n", 2, "'client.api' must be");
    expect_error("[ping]\nenabled = 1\n", 2, "'ping.enabled' must be true or false, not an integer");
    expect_error("[[ping.match]]\n", 1, "needs at least one condition");
    expect_error("[spans]\nuuid = \"scramble\"\n", 2, "'spans.uuid' must be true, false");
    expect_error("[spans]\ntimestamp = { roles = [\"narrator\"] }\n", 2, "'spans.timestamp.roles' holds system");
    expect_error("[[spans.rule]]\npattern = 'x'\n", 1, "needs a 'name'");
    expect_error("[[spans.rule]]\nname = \"x\"\n", 1, "needs a 'pattern'");
    expect_error("[[spans.rule]]\nname = \"has space\"\npattern = 'x'\n", 2, "must be letters, digits");
    expect_error("[[spans.rule]]\nname = \"uuid\"\npattern = 'x'\n", 1, "'uuid' is defined twice");
    expect_error("[[spans.rule]]\nname = \"a\"\npattern = 'x'\naction = \"shuffle\"\n", 4, "must be \"replace\"");
    expect_error("client = 3\n", 1, "'client' must be an array of tables");
}

TEST(PolicyFile, LoadsFromDiskAndReportsAMissingFile) {
    const auto path = std::filesystem::temp_directory_path() / "keepwarm-test-policy.toml";
    {
        std::ofstream out(path);
        out << "[model]\nmode = \"strict\"\n";
    }
    const policy_config c = load_policy_file(path.string(), "tiny");
    EXPECT_EQ(c.model.mode, model_mode::strict);
    EXPECT_EQ(c.source, path.string());
    std::filesystem::remove(path);
    EXPECT_THROW(load_policy_file(path.string(), "tiny"), std::runtime_error);
}

TEST(PolicyFile, TheExampleFileReads) {
    const auto example = std::filesystem::path(__FILE__).parent_path() / "../../etc/keepwarm-policy.toml";
    const policy_config c = load_policy_file(example.string(), "Qwen3-8B-Q4_K_M");
    EXPECT_EQ(c.model.mode, model_mode::any);
    EXPECT_EQ(c.options.max_tokens_cap, 16384);
    ASSERT_EQ(c.clients.size(), 1u);
    EXPECT_EQ(c.clients[0].match.model, "claude-haiku-*");
    EXPECT_TRUE(c.ping.enabled);
    EXPECT_EQ(c.spans.size(), builtin_spans().size());
}

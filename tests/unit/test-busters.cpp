// The cache-buster analysis: finding the short span that keeps a prompt from reusing a recent one, classifying it,
// suggesting a rule that matches it, and the detector's per-client bookkeeping.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <regex>
#include <string>
#include <vector>

#include "policy/busters.h"
#include "policy/prompt-diff.h"

using namespace keepwarm::policy;

namespace {

// Deterministic instruction-like text: words, punctuation and a newline every dozen words.
std::string filler(size_t chars, uint32_t seed = 7) {
    static const char* words[] = {"the",   "agent", "must",   "read",  "files", "before", "editing", "them,",
                                  "and",   "run",   "tests.", "Use",   "tools", "only",   "when",    "needed;",
                                  "never", "guess", "paths",  "write", "clear", "code",   "(small)", "steps"};
    std::string out;
    uint32_t x = seed;
    for (int n = 1; out.size() < chars; ++n) {
        x = x * 1664525u + 1013904223u;
        out += words[(x >> 16) % (sizeof words / sizeof *words)];
        out += n % 12 == 0 ? '\n' : ' ';
    }
    out.resize(chars);
    return out;
}

const std::string head = "<|im_start|>system\n";
const std::string body = filler(20000);
const std::string next_turn = "<|im_end|>\n<|im_start|>user\nand now the next question<|im_end|>\n";

// Checks the rule's pattern (RE2 syntax, written in the subset std::regex shares) against both prompts: its first
// match starts in the literal context just in front of the span and ends exactly where the span ends.
void expect_rule_matches_span(const std::string& earlier, const std::string& later, const volatile_span& span,
                              const suggested_rule& rule) {
    ASSERT_FALSE(rule.pattern.empty());
    const std::regex re(rule.pattern);
    for (const auto& [text, length] :
         {std::pair{&earlier, span.earlier_length}, std::pair{&later, span.later_length}}) {
        std::smatch m;
        ASSERT_TRUE(std::regex_search(*text, m, re)) << rule.pattern;
        const size_t start = m.position(0), end = start + m.length(0);
        EXPECT_LE(start, span.offset) << rule.pattern;
        EXPECT_LE(span.offset - start, 48u) << rule.pattern;
        EXPECT_EQ(end, span.offset + length) << rule.pattern << " matched '" << m.str(0) << "'";
    }
}

struct pair_of_prompts {
    std::string earlier, later;
};

// The same long system prompt with `a` / `b` in its first line, the later one extended by a new turn.
pair_of_prompts with_span(const std::string& line_a, const std::string& line_b) {
    return {head + line_a + "\n" + body, head + line_b + "\n" + body + next_turn};
}

}  // namespace

TEST(PromptDiff, CommonPrefixLengthAtEveryPositionAroundBlocks) {
    std::string a(2000, 'x');
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<char>('a' + i % 23);
    EXPECT_EQ(keepwarm::policy::common_prefix_length(a, a), a.size());
    EXPECT_EQ(keepwarm::policy::common_prefix_length(a, a.substr(0, 700)), 700u);
    EXPECT_EQ(keepwarm::policy::common_prefix_length("", a), 0u);
    for (size_t at : {size_t{0}, size_t{1}, size_t{255}, size_t{256}, size_t{257}, size_t{511}, size_t{1999}}) {
        std::string b = a;
        b[at] = '#';
        EXPECT_EQ(keepwarm::policy::common_prefix_length(a, b), at) << at;
        EXPECT_EQ(keepwarm::policy::common_prefix_length(b + "tail", a), at) << at;
    }
}

TEST(PromptDiff, NonceInLongPrefixIsAHexIdWithItsKeyAsContext) {
    const auto p = with_span("x-anthropic-billing-header: cc_version=2.1.197; cch=5f2e1; cc_entrypoint=cli",
                             "x-anthropic-billing-header: cc_version=2.1.197; cch=a03b9; cc_entrypoint=cli");
    const auto span = find_volatile_span(p.earlier, p.later);
    ASSERT_TRUE(span);
    EXPECT_EQ(span->kind, span_kind::hex_id);
    EXPECT_EQ(span->offset, p.earlier.find("5f2e1"));
    EXPECT_EQ(span->in_earlier(p.earlier), "5f2e1");
    EXPECT_EQ(span->in_later(p.later), "a03b9");
    EXPECT_GE(span->agreed_chars, body.size());
    EXPECT_TRUE(is_random_id(span->kind));

    const suggested_rule rule = suggest_rule(p.earlier, p.later, *span);
    EXPECT_EQ(rule.name, "cch-hex-id");
    EXPECT_EQ(rule.pattern, "cch=[0-9a-f]{5}");
    EXPECT_EQ(rule.action, "replace");
    EXPECT_EQ(rule.replacement, "cch=00000");
    expect_rule_matches_span(p.earlier, p.later, *span, rule);
    EXPECT_NE(rule.toml().find("[[spans.rule]]\nname = 'cch-hex-id'\npattern = 'cch=[0-9a-f]{5}'\naction = 'replace'\n"
                               "replacement = 'cch=00000'\n"),
              std::string::npos)
        << rule.toml();
}

TEST(PromptDiff, SpanIsTheWholeValueEvenWhereSomeCharsCoincide) {
    // '5' and '1' are the same in both: the span still covers the whole id.
    const auto p = with_span("billing: cch=5f2e1;", "billing: cch=5a3b1;");
    const auto span = find_volatile_span(p.earlier, p.later);
    ASSERT_TRUE(span);
    EXPECT_EQ(span->kind, span_kind::hex_id);
    EXPECT_EQ(span->in_earlier(p.earlier), "5f2e1");
    EXPECT_EQ(span->in_later(p.later), "5a3b1");
    EXPECT_EQ(span->first_difference, p.earlier.find("5f2e1") + 1);
}

TEST(PromptDiff, Uuid) {
    const auto p = with_span("request-id: 3f2a6c1e-8b4d-4e2a-9c7f-1d2e3f4a5b6c",
                             "request-id: 9e7d0b12-55aa-4c3b-8d9e-0f1a2b3c4d5e");
    const auto span = find_volatile_span(p.earlier, p.later);
    ASSERT_TRUE(span);
    EXPECT_EQ(span->kind, span_kind::uuid);
    EXPECT_EQ(span->in_earlier(p.earlier), "3f2a6c1e-8b4d-4e2a-9c7f-1d2e3f4a5b6c");
    const suggested_rule rule = suggest_rule(p.earlier, p.later, *span);
    EXPECT_EQ(rule.pattern, "request-id: [0-9a-f-]{36}");
    EXPECT_EQ(rule.replacement, "request-id: 00000000-0000-0000-0000-000000000000");
    EXPECT_EQ(rule.name, "request-id-uuid");
    expect_rule_matches_span(p.earlier, p.later, *span, rule);
}

TEST(PromptDiff, UppercaseHexKeepsItsCase) {
    const auto p = with_span("trace=0A1B2C3D4E", "trace=9F8E7D6C5B");
    const auto span = find_volatile_span(p.earlier, p.later);
    ASSERT_TRUE(span);
    EXPECT_EQ(span->kind, span_kind::hex_id);
    const suggested_rule rule = suggest_rule(p.earlier, p.later, *span);
    EXPECT_EQ(rule.pattern, "trace=[0-9A-F]{10}");
    expect_rule_matches_span(p.earlier, p.later, *span, rule);
}

TEST(PromptDiff, TimestampIsMovedNotReplaced) {
    const auto p = with_span("Current time: 2025-01-06T10:00:07Z (UTC)", "Current time: 2025-01-06T10:03:59Z (UTC)");
    const auto span = find_volatile_span(p.earlier, p.later);
    ASSERT_TRUE(span);
    EXPECT_EQ(span->kind, span_kind::timestamp);
    EXPECT_EQ(span->in_earlier(p.earlier), "2025-01-06T10:00:07Z");
    EXPECT_FALSE(is_random_id(span->kind));
    const suggested_rule rule = suggest_rule(p.earlier, p.later, *span);
    EXPECT_EQ(rule.pattern, "time: [0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z");
    EXPECT_EQ(rule.action, "move");
    EXPECT_TRUE(rule.replacement.empty());
    EXPECT_NE(rule.toml().find("\naction = 'move'\n"), std::string::npos) << rule.toml();
    EXPECT_EQ(rule.toml().find("replacement"), std::string::npos) << rule.toml();
    expect_rule_matches_span(p.earlier, p.later, *span, rule);
}

TEST(PromptDiff, DateAndClockTime) {
    const auto date = with_span("Today's date is 2025-01-06.", "Today's date is 2025-01-07.");
    auto span = find_volatile_span(date.earlier, date.later);
    ASSERT_TRUE(span);
    EXPECT_EQ(span->kind, span_kind::timestamp);
    EXPECT_EQ(span->in_later(date.later), "2025-01-07");
    expect_rule_matches_span(date.earlier, date.later, *span, suggest_rule(date.earlier, date.later, *span));

    const auto clock = with_span("It is 9:05 now", "It is 10:45 now");
    span = find_volatile_span(clock.earlier, clock.later);
    ASSERT_TRUE(span);
    EXPECT_EQ(span->kind, span_kind::timestamp);
    const suggested_rule rule = suggest_rule(clock.earlier, clock.later, *span);
    EXPECT_EQ(rule.pattern, "is [0-9]{1,2}:[0-9]{2}");
    expect_rule_matches_span(clock.earlier, clock.later, *span, rule);
}

TEST(PromptDiff, UnixTimeIsATimestamp) {
    const auto p = with_span("now=1736157607;", "now=1736157912;");
    const auto span = find_volatile_span(p.earlier, p.later);
    ASSERT_TRUE(span);
    EXPECT_EQ(span->kind, span_kind::timestamp);
    EXPECT_EQ(span->in_earlier(p.earlier), "1736157607");
}

TEST(PromptDiff, CounterIsANumber) {
    const auto p = with_span("Turn 12 of this session", "Turn 13 of this session");
    const auto span = find_volatile_span(p.earlier, p.later);
    ASSERT_TRUE(span);
    EXPECT_EQ(span->kind, span_kind::number);
    EXPECT_FALSE(is_random_id(span->kind));
    const suggested_rule rule = suggest_rule(p.earlier, p.later, *span);
    EXPECT_EQ(rule.pattern, "Turn [0-9]+");
    EXPECT_EQ(rule.action, "move");
    expect_rule_matches_span(p.earlier, p.later, *span, rule);
}

TEST(PromptDiff, VersionSuffixKeepsTheVersionAsContext) {
    const auto p = with_span("cc_version=2.1.197.d3f; cc_entrypoint=cli", "cc_version=2.1.197.a01; cc_entrypoint=cli");
    const auto span = find_volatile_span(p.earlier, p.later);
    ASSERT_TRUE(span);
    EXPECT_EQ(span->kind, span_kind::hex_id);
    const suggested_rule rule = suggest_rule(p.earlier, p.later, *span);
    EXPECT_EQ(rule.pattern, "cc_version=2\\.1\\.197\\.[0-9a-f]{3}");
    EXPECT_EQ(rule.name, "cc-version-hex-id");
    expect_rule_matches_span(p.earlier, p.later, *span, rule);
}

TEST(PromptDiff, Base64LikeIdOfHighEntropy) {
    const auto p = with_span("session: V1StGXR8_Z5jdHi6B-myT.", "session: Qm9vZ2xlX3Rlc3Q0aKZ2bW.");
    const auto span = find_volatile_span(p.earlier, p.later);
    ASSERT_TRUE(span);
    EXPECT_EQ(span->kind, span_kind::base64_id);
    EXPECT_TRUE(is_random_id(span->kind));
    const suggested_rule rule = suggest_rule(p.earlier, p.later, *span);
    EXPECT_EQ(rule.action, "replace");
    EXPECT_EQ(rule.pattern, "session: [A-Za-z0-9_-]{21,22}");
    expect_rule_matches_span(p.earlier, p.later, *span, rule);
}

TEST(PromptDiff, ProseEditIsProseNotARandomId) {
    const auto p = with_span("You are a helpful assistant. Be concise in every answer.",
                             "You are a helpful assistant. Be thorough in every answer.");
    const auto span = find_volatile_span(p.earlier, p.later);
    ASSERT_TRUE(span);
    EXPECT_EQ(span->kind, span_kind::prose);
    EXPECT_EQ(span->in_earlier(p.earlier), "concise");
    EXPECT_EQ(span->in_later(p.later), "thorough");
    EXPECT_FALSE(is_random_id(span->kind));
    const suggested_rule rule = suggest_rule(p.earlier, p.later, *span);
    EXPECT_EQ(rule.action, "move");
    // Prose has no shape: the rule covers the rest of the line from the key in front of the span.
    const std::regex re(rule.pattern);
    std::smatch m;
    ASSERT_TRUE(std::regex_search(p.earlier, m, re));
    EXPECT_EQ(m.str(0), "Be concise in every answer.");
    ASSERT_TRUE(std::regex_search(p.later, m, re));
    EXPECT_EQ(m.str(0), "Be thorough in every answer.");
}

// Two sessions of one client that differ at the user's own question, with the same long text after it (Claude Code
// sends reminders and a system message after the first question): another conversation, not a volatile span.
TEST(PromptDiff, DifferentQuestionsAreADifferentConversationNotASpan) {
    const std::string system = head + body + "<|im_end|>\n<|im_start|>user\n";
    const std::string after = "<|im_end|>\n<|im_start|>system\n" + filler(8000, 11) + "<|im_end|>\n";
    const std::string a = system + "Say hello" + after, b = system + "List the files here" + after;
    EXPECT_FALSE(find_volatile_span(a, b));
    const std::string c = system + "Fix the failing test in src/app.cpp, then run it" + after;
    EXPECT_FALSE(find_volatile_span(a, c));
    // A short token-like run in the same place is still one: an id, a number.
    const std::string d = system + "ticket 4f2e91" + after, e = system + "ticket 9c07a3" + after;
    const auto span = find_volatile_span(d, e);
    ASSERT_TRUE(span);
    EXPECT_EQ(span->kind, span_kind::hex_id);
}

TEST(CacheBusterDetector, AOneWordQuestionOfTheUserIsNotReported) {
    cache_buster_detector detector;
    std::vector<common_chat_msg> messages(3);
    messages[0].role = "system";
    messages[0].content = body;
    messages[1].role = "user";
    messages[2].role = "system";
    messages[2].content = filler(8000, 11);
    const auto render = [&] {
        return head + messages[0].content + "<|im_end|>\n<|im_start|>user\n" + messages[1].content +
               "<|im_end|>\n<|im_start|>system\n" + messages[2].content + "<|im_end|>\n";
    };
    messages[1].content = "hello";
    EXPECT_FALSE(detector.inspect({"claude-cli", "1", "anthropic"}, render(), messages, {}));
    messages[1].content = "thanks";
    EXPECT_FALSE(detector.inspect({"claude-cli", "2", "anthropic"}, render(), messages, {}));
    // The same word in the system prompt is the client's: reported.
    messages[0].content = "Be concise.\n" + body;
    detector.inspect({"claude-cli", "3", "anthropic"}, render(), messages, {});
    messages[0].content = "Be thorough.\n" + body;
    const auto report = detector.inspect({"claude-cli", "4", "anthropic"}, render(), messages, {});
    ASSERT_TRUE(report);
    EXPECT_EQ(report->kind, span_kind::prose);
    EXPECT_EQ(report->role, "system");
}

TEST(PromptDiff, ReorderedToolListIsOneBlock) {
    std::vector<std::string> tools;  // one line each, as Qwen's template writes them
    for (const char* name : {"read_file", "write_file", "list_dir", "run_tests", "search", "edit_file"}) {
        std::string description = filler(300, name[0]);
        std::replace(description.begin(), description.end(), '\n', ' ');
        tools.push_back(std::string("{\"type\": \"function\", \"function\": {\"name\": \"") + name +
                        "\", \"description\": \"" + description +
                        "\", \"parameters\": {\"type\": \"object\", \"properties\": {\"path\": {\"type\": "
                        "\"string\"}}}}}\n");
    }
    const auto prompt = [&](const std::vector<size_t>& order) {
        std::string out = head + "You are an agent.\n<tools>\n";
        for (const size_t i : order) out += tools[i];
        return out + "</tools>\n" + body;
    };
    const std::string earlier = prompt({0, 1, 2, 3, 4, 5}), later = prompt({0, 2, 1, 3, 4, 5}) + next_turn;
    const auto span = find_volatile_span(earlier, later);
    ASSERT_TRUE(span);
    EXPECT_EQ(span->kind, span_kind::reordered);
    EXPECT_EQ(span->offset, earlier.find(tools[1]));
    EXPECT_EQ(span->earlier_length, tools[1].size() + tools[2].size());
    EXPECT_EQ(span->in_later(later), tools[2] + tools[1]);
    EXPECT_FALSE(is_random_id(span->kind));
    const suggested_rule rule = suggest_rule(earlier, later, *span);
    EXPECT_TRUE(rule.pattern.empty());
    EXPECT_NE(rule.toml().find("2 lines in another order"), std::string::npos) << rule.toml();
}

TEST(PromptDiff, ShortReorderedLines) {
    const auto p = with_span("- alpha\n- beta\n- gamma", "- beta\n- alpha\n- gamma");
    const auto span = find_volatile_span(p.earlier, p.later);
    ASSERT_TRUE(span);
    EXPECT_EQ(span->kind, span_kind::reordered);
    EXPECT_EQ(span->in_earlier(p.earlier), "- alpha\n- beta\n");
}

TEST(PromptDiff, DifferentPromptsAreNotReported) {
    EXPECT_FALSE(find_volatile_span(head + filler(20000, 1), head + filler(20000, 2)));
    EXPECT_FALSE(find_volatile_span("hello", "world"));
}

TEST(PromptDiff, ExtensionsAreNotReported) {
    EXPECT_FALSE(find_volatile_span(head + body, head + body + next_turn));
    EXPECT_FALSE(find_volatile_span(head + body + next_turn, head + body));
    EXPECT_FALSE(find_volatile_span(head + body, head + body));
}

TEST(PromptDiff, EditNearTheEndIsNotACacheBuster) {
    // Only a short stretch agrees after the span: nothing long was lost.
    const std::string earlier =
        head + body + "<|im_start|>user\nfix the bug in main.cpp please, it crashes<|im_end|>\n";
    const std::string later = head + body + "<|im_start|>user\nfix the bug in util.cpp please, it crashes<|im_end|>\n";
    EXPECT_FALSE(find_volatile_span(earlier, later));
}

TEST(PromptDiff, SecondNonceIsBridged) {
    // Two nonces: the first is the span, the agreement after it bridges the second.
    const std::string earlier = head + "cch=5f2e1;\n" + body + "\nrequest 0001abcd\n" + body;
    const std::string later = head + "cch=a03b9;\n" + body + "\nrequest 9e8f7a6b\n" + body;
    const auto span = find_volatile_span(earlier, later);
    ASSERT_TRUE(span);
    EXPECT_EQ(span->in_earlier(earlier), "5f2e1");
    EXPECT_EQ(span->further_spans, 1);
    EXPECT_GE(span->agreed_chars, 2 * body.size());
}

TEST(PromptDiff, CostIsLinearOn200KBPrompts) {
    const std::string big = filler(200 * 1024, 3);
    const std::string earlier = head + "cch=5f2e1;\n" + big, later = head + "cch=a03b9;\n" + big + next_turn;
    // Repetitive text is the worst case for finding where two texts agree again.
    const std::string same(200 * 1024, 'a');
    const std::string rep_a = head + "x" + same, rep_b = head + "yz" + same;
    const auto start = std::chrono::steady_clock::now();
    const auto span = find_volatile_span(earlier, later);
    const auto rep = find_volatile_span(rep_a, rep_b);
    cache_buster_detector detector;
    for (int i = 0; i < 5; ++i) {
        detector.inspect({"agent", "r" + std::to_string(i), "openai"}, head + "n=" + std::to_string(i) + big, {}, {});
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    ASSERT_TRUE(span);
    EXPECT_EQ(span->kind, span_kind::hex_id);
    ASSERT_TRUE(rep);
    EXPECT_EQ(rep->offset, head.size());
    // Linear work here is a few milliseconds (under a second under the sanitizers on a busy machine); anything
    // quadratic in 200 KB would take minutes.
    EXPECT_LT(ms, 30000) << ms << " ms";
}

TEST(PromptDiff, MessageIndexOfAnOffset) {
    std::vector<common_chat_msg> messages(3);
    messages[0].role = "system";
    messages[0].content = "You are terse.";
    messages[1].role = "user";
    messages[1].content = "terse? say hi";
    messages[2].role = "assistant";
    messages[2].content = "hi";
    const std::string prompt =
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nterse? say hi<|im_end|>\n"
        "<|im_start|>assistant\nhi<|im_end|>\n";
    EXPECT_EQ(message_index_at(messages, prompt, 3), -1);
    EXPECT_EQ(message_index_at(messages, prompt, prompt.find("terse.")), 0);
    EXPECT_EQ(message_index_at(messages, prompt, prompt.find("say hi")), 1);
    EXPECT_EQ(message_index_at(messages, prompt, prompt.rfind("hi<")), 2);
}

TEST(PromptDiff, PrintableEscapesAndNeverCutsACharacter) {
    EXPECT_EQ(printable("a\nb\t\"c\""), "a\\nb\\t\\\"c\\\"");
    EXPECT_EQ(printable("abcdef", 3), "abc...");
    EXPECT_EQ(printable("ab\xc3\xa9z", 3), "ab...");
}

TEST(CacheBusterDetector, ReportsTheSpanWithItsCostAndCounts) {
    cache_buster_detector detector;
    std::vector<common_chat_msg> messages(2);
    messages[0].role = "system";
    messages[0].content = "x-anthropic-billing-header: cch=5f2e1;\n" + body;
    messages[1].role = "user";
    messages[1].content = "hello";
    const auto render = [&] {
        return head + messages[0].content + "<|im_end|>\n<|im_start|>user\n" + messages[1].content + "<|im_end|>\n";
    };
    const token_locator quarter = [](size_t c) { return static_cast<int>(c / 4); };

    EXPECT_FALSE(detector.inspect({"claude-cli", "req-1", "anthropic"}, render(), messages, quarter));
    messages[0].content = "x-anthropic-billing-header: cch=a03b9;\n" + body;
    auto report = detector.inspect({"claude-cli", "req-2", "anthropic"}, render(), messages, quarter);
    ASSERT_TRUE(report);
    EXPECT_EQ(report->origin.client, "claude-cli");
    EXPECT_EQ(report->kind, span_kind::hex_id);
    EXPECT_TRUE(report->looks_like_random_id());
    EXPECT_EQ(report->previous_text, "5f2e1");
    EXPECT_EQ(report->current_text, "a03b9");
    EXPECT_EQ(report->char_offset, render().find("a03b9"));
    EXPECT_EQ(report->token_offset, static_cast<int>(report->char_offset / 4));
    EXPECT_EQ(report->message_index, 0);
    EXPECT_EQ(report->role, "system");
    EXPECT_EQ(report->context_before.substr(report->context_before.size() - 4), "cch=");
    EXPECT_EQ(report->rule.pattern, "cch=[0-9a-f]{5}");

    // The cache reused up to the span: everything from it on was computed because of it.
    keepwarm::generation_report stats;
    stats.prompt_tokens = static_cast<int>(render().size() / 4);
    stats.reused_tokens = report->token_offset;
    stats.computed_tokens = stats.prompt_tokens - stats.reused_tokens;
    ASSERT_TRUE(detector.confirm(*report, stats));
    const auto reports = detector.reports();
    ASSERT_EQ(reports.size(), 1u);
    EXPECT_EQ(reports[0].cost_tokens, stats.prompt_tokens - report->token_offset);
    EXPECT_EQ(reports[0].prompt_tokens, stats.prompt_tokens);
    EXPECT_GT(reports[0].time, 0);

    // A third request with yet another nonce: counted under the same (client, pattern).
    messages[0].content = "x-anthropic-billing-header: cch=77c1d;\n" + body;
    report = detector.inspect({"claude-cli", "req-3", "anthropic"}, render(), messages, quarter);
    ASSERT_TRUE(report);
    ASSERT_TRUE(detector.confirm(*report, stats));
    const auto counts = detector.counts();
    ASSERT_EQ(counts.size(), 1u);
    EXPECT_EQ(counts[0].client, "claude-cli");
    EXPECT_EQ(counts[0].pattern, "cch=[0-9a-f]{5}");
    EXPECT_EQ(counts[0].count, 2u);
    EXPECT_EQ(detector.reports().front().origin.request_id, "req-3");
}

TEST(CacheBusterDetector, NoReportWhenTheCacheReusedPastTheSpan) {
    cache_buster_detector detector;
    detector.inspect({"a", "1", "openai"}, head + "id=5f2e1\n" + body, {}, {});
    auto report = detector.inspect({"a", "2", "openai"}, head + "id=a03b9\n" + body, {}, [](size_t) { return 7; });
    ASSERT_TRUE(report);
    keepwarm::generation_report stats;
    stats.prompt_tokens = 5000;
    stats.reused_tokens = 4000;  // another cached prompt had this one's span too
    stats.computed_tokens = 1000;
    EXPECT_FALSE(detector.confirm(*report, stats));
    EXPECT_TRUE(detector.reports().empty());
}

TEST(CacheBusterDetector, ReuseThatStopsInsideTheSpanStillCounts) {
    // Digits are tokens of their own: the cache keeps "12:3" of "12:34:56" -> "12:41:07" and stops inside the span.
    cache_buster_detector detector;
    detector.inspect({"a", "1", "openai"}, head + "now: 2026-06-30T12:34:56Z\n" + body, {}, {});
    const token_locator per_char = [](size_t c) { return static_cast<int>(c); };
    auto report = detector.inspect({"a", "2", "openai"}, head + "now: 2026-06-30T12:41:07Z\n" + body, {}, per_char);
    ASSERT_TRUE(report);
    EXPECT_EQ(report->token_end - report->token_offset, static_cast<int>(report->current_text.size()));
    keepwarm::generation_report stats;
    stats.prompt_tokens = 5000;
    stats.reused_tokens = report->token_end - 2;  // stopped at the span's last char
    stats.computed_tokens = stats.prompt_tokens - stats.reused_tokens;
    EXPECT_TRUE(detector.confirm(*report, stats));
    stats.reused_tokens = report->token_end;  // past it: the span cost nothing
    EXPECT_FALSE(detector.confirm(*report, stats));
}

TEST(CacheBusterDetector, ClientsAreComparedOnlyWithThemselves) {
    cache_buster_detector detector;
    detector.inspect({"a", "1", "openai"}, head + "id=5f2e1\n" + body, {}, {});
    EXPECT_FALSE(detector.inspect({"b", "2", "openai"}, head + "id=a03b9\n" + body, {}, {}));
    EXPECT_TRUE(detector.inspect({"a", "3", "openai"}, head + "id=a03b9\n" + body, {}, {}));
}

TEST(CacheBusterDetector, PromptThatExtendsARecentOneIsNotReported) {
    cache_buster_detector detector;
    detector.inspect({"a", "1", "openai"}, head + "id=5f2e1\n" + body, {}, {});
    detector.inspect({"a", "2", "openai"}, head + "id=a03b9\n" + body, {}, {});
    // Extends request 2, although it has a span against request 1.
    EXPECT_FALSE(detector.inspect({"a", "3", "openai"}, head + "id=a03b9\n" + body + next_turn, {}, {}));
}

TEST(CacheBusterDetector, MemoryIsBoundedLeastRecentClientFirst) {
    cache_buster_detector::options o;
    o.prompts_per_client = 2;
    o.max_clients = 3;
    cache_buster_detector detector(o);
    for (const char* client : {"c1", "c2", "c3", "c4"}) {
        detector.inspect({client, "1", "openai"}, head + "id=5f2e1\n" + body, {}, {});
    }
    // c1 was forgotten when c4 came; c4 still has its prompt.
    EXPECT_FALSE(detector.inspect({"c1", "2", "openai"}, head + "id=a03b9\n" + body, {}, {}));
    EXPECT_TRUE(detector.inspect({"c4", "2", "openai"}, head + "id=a03b9\n" + body, {}, {}));

    // Per client, only the last prompts_per_client are compared.
    cache_buster_detector one(o);
    one.inspect({"a", "1", "openai"}, head + "id=5f2e1\n" + body, {}, {});
    one.inspect({"a", "2", "openai"}, filler(5000, 11), {}, {});
    one.inspect({"a", "3", "openai"}, filler(5000, 12), {}, {});
    EXPECT_FALSE(one.inspect({"a", "4", "openai"}, head + "id=a03b9\n" + body, {}, {}));

    // A byte budget smaller than two prompts keeps only the newest.
    o.max_prompt_bytes = body.size() + 100;
    cache_buster_detector small(o);
    small.inspect({"a", "1", "openai"}, head + "id=5f2e1\n" + body, {}, {});
    small.inspect({"a", "2", "openai"}, head + "id=c0ffee\n" + body, {}, {});
    EXPECT_FALSE(small.inspect({"b", "1", "openai"}, head + "id=5f2e1\n" + body, {}, {}));
    EXPECT_FALSE(small.inspect({"a", "3", "openai"}, head + "id=a03b9\n" + body, {}, {}));
}

namespace {
// A system message with `line` in front of a long body, and a user message; the rendered prompt as Qwen's template
// would write it.
struct chat_with_line {
    std::vector<common_chat_msg> messages;
    std::string rendered;

    explicit chat_with_line(const std::string& line) : messages(2) {
        messages[0].role = "system";
        messages[0].content = "You are a coding agent.\n" + line + "\n" + body;
        messages[1].role = "user";
        messages[1].content = "hello";
        rendered = head + messages[0].content + "<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n";
    }
};

std::optional<cache_buster_report> report_between(const chat_with_line& a, const chat_with_line& b) {
    cache_buster_detector detector;
    detector.inspect({"agent", "1", "openai"}, a.rendered, a.messages, {});
    return detector.inspect({"agent", "2", "openai"}, b.rendered, b.messages, {});
}
}  // namespace

TEST(AutoSpanRule, ARandomIdBecomesAReplaceRuleForItsRole) {
    const chat_with_line a("session: 3f9a1c7e5b2d4f60a8c1e3b5d7f90a2c"), b("session: 9c0e2b4d6f81a3c5e7092b4d6f8a1c3e");
    const auto report = report_between(a, b);
    ASSERT_TRUE(report);
    ASSERT_EQ(report->kind, span_kind::hex_id);
    const auto rule = auto_span_rule(*report, b.messages);
    ASSERT_TRUE(rule);
    EXPECT_EQ(rule->name(), "auto-" + report->rule.name);
    EXPECT_EQ(rule->origin(), span_origin::automatic);
    EXPECT_EQ(rule->action(), span_action::replace);
    EXPECT_EQ(rule->roles(), static_cast<unsigned>(role_system));
    // It makes every later id the same text, so the prefix is the same again.
    std::string c = "You are a coding agent.\nsession: 0a1b2c3d4e5f60718293a4b5c6d7e8f9\n", d = b.messages[0].content;
    std::vector<std::string> moved;
    EXPECT_EQ(rule->apply(c, moved), 1);
    EXPECT_EQ(rule->apply(d, moved), 1);
    EXPECT_EQ(d.substr(0, c.size()), c);
    EXPECT_TRUE(moved.empty());
}

TEST(AutoSpanRule, DatesProseAndSpansOutsideTheMessagesAreOnlyReported) {
    // A date means something to the model: reported, never rewritten by itself.
    const chat_with_line a("Now: 2026-06-30T12:34:56Z"), b("Now: 2026-06-30T12:41:07Z");
    const auto dated = report_between(a, b);
    ASSERT_TRUE(dated);
    EXPECT_FALSE(dated->looks_like_random_id());
    EXPECT_FALSE(auto_span_rule(*dated, b.messages));

    // A random id whose message the report could not place (no messages given): nothing to check the rule on.
    const chat_with_line c("session: 3f9a1c7e5b2d4f60a8c1e3b5d7f90a2c"), d("session: 9c0e2b4d6f81a3c5e7092b4d6f8a1c3e");
    auto report = report_between(c, d);
    ASSERT_TRUE(report);
    EXPECT_FALSE(auto_span_rule(*report, {}));
    // ... or whose pattern does not match the message's text (the template wrote the context, not the client).
    report->rule.pattern = "<\\|im_start\\|>system\\nYou are a coding agent\\.\\nsession: [0-9a-f]{32}";
    EXPECT_FALSE(auto_span_rule(*report, d.messages));
}

TEST(CacheBusterDetector, TenantsSeeOnlyTheirOwnClientsAndText) {
    // The same client name under two tenants is two clients: bob's prompt is never compared with alice's, and
    // neither tenant's reports or counts show the other's.
    cache_buster_detector detector;
    detector.inspect({"agent", "1", "openai", "alice"}, head + "id=5f2e1\n" + body, {}, {});
    EXPECT_FALSE(detector.inspect({"agent", "2", "openai", "bob"}, head + "id=a03b9\n" + body, {}, {}));
    auto report = detector.inspect({"agent", "3", "openai", "alice"}, head + "id=c0ffe\n" + body, {}, {});
    ASSERT_TRUE(report);
    keepwarm::generation_report stats;
    stats.prompt_tokens = 5000;
    stats.computed_tokens = 4990;
    stats.reused_tokens = 10;
    ASSERT_TRUE(detector.confirm(*report, stats));
    ASSERT_EQ(detector.reports("alice").size(), 1u);
    EXPECT_EQ(detector.reports("alice").front().previous_text, "5f2e1");
    EXPECT_EQ(detector.counts("alice").size(), 1u);
    EXPECT_TRUE(detector.reports("bob").empty());
    EXPECT_TRUE(detector.counts("bob").empty());
    EXPECT_TRUE(detector.reports().empty());  // nor the shared tenant's
}

// Text analysis of two rendered prompts: where they part, whether they agree again after a short span (a nonce, an
// id, a clock, a reordered block), what that span looks like, and a policy rule that would remove it. Pure
// functions, linear in the prompts' length; shared by the cache-buster detector and `keepwarm doctor`.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chat.h"

namespace keepwarm::policy {

enum class span_kind { uuid, hex_id, base64_id, timestamp, number, reordered, prose };

// "uuid", "hex_id", "base64_id", "timestamp", "number", "reordered", "prose".
const char* span_kind_name(span_kind kind);
// A few words for people: "hex id", "reordered block", ...
const char* span_kind_description(span_kind kind);
// uuid, hex and base64-like ids of high entropy: a constant in their place takes nothing from what the model reads.
// Dates, numbers, prose and reorderings carry meaning.
bool is_random_id(span_kind kind);

struct diff_options {
    size_t max_span_chars = 256;  // a differing span up to this long (in either prompt) is short
    // After the span the prompts must agree on at least this many chars (a long prefix worth reusing) ...
    size_t min_agreed_chars = 1024;
    double min_agreed_share = 0.5;  // ... and on at least this share of what both have left after it.
    // A block of whole lines that the prompts hold in another order (e.g. a tool list), up to this long.
    size_t max_reordered_chars = 64 * 1024;
};

// How many chars both texts share from the start (the shorter length when one is a prefix of the other).
size_t common_prefix_length(std::string_view a, std::string_view b);

// A short span where two prompts differ while agreeing before it and, for long, after it. Offsets are chars of the
// rendered prompts; the span is widened to the whole value it lies in (an id, a date, a word) or, for a
// reordering, to whole lines.
struct volatile_span {
    size_t offset = 0;          // where it starts; the same in both prompts, which agree on everything before it
    size_t earlier_length = 0;  // its length in the earlier prompt
    size_t later_length = 0;    // ... and in the later one
    span_kind kind = span_kind::prose;
    size_t first_difference = 0;  // the first char that differs (offset <= first_difference)
    size_t agreed_chars = 0;      // chars both agree on after it (bridging further short spans, if any)
    int further_spans = 0;        // short spans bridged in that stretch

    std::string_view in_earlier(std::string_view earlier) const { return earlier.substr(offset, earlier_length); }
    std::string_view in_later(std::string_view later) const { return later.substr(offset, later_length); }
};

// The span that keeps `later` from reusing `earlier`'s prefix, when their first difference is short (or a block of
// reordered lines) and they agree again afterwards for long (see diff_options). nullopt when one extends the other,
// when they do not agree again soon enough for long enough (different prompts, an edit near the end), or when the
// difference is prose of more than one word (a different conversation: another question, not a volatile value).
std::optional<volatile_span> find_volatile_span(std::string_view earlier, std::string_view later,
                                                const diff_options& options = {});

// A rule in the policy file's syntax ([[spans.rule]]: name, pattern, action, replacement) that removes the span: an
// RE2 pattern made of the span's literal context (the key in front of it, e.g. "cch=" or "request-id: ", never
// across a line, so it lies in the message's own text that span rules read) and its generalized shape
// (`[0-9a-f]{5}`), which matches the span in both prompts and no text around it. Random ids are replaced by a
// constant of the same shape; dates, numbers and prose are moved to the end of the prompt (the model still reads
// them, after the reusable prefix); a reordering has no pattern (only the client can keep its order stable), and
// its rule is a TOML comment saying so.
struct suggested_rule {
    std::string name;         // e.g. "cch-hex-id"
    std::string pattern;      // RE2; empty for a reordering
    std::string action;       // "replace", "move", or "" (reordering)
    std::string replacement;  // with action "replace": RE2 rewrite text (a literal backslash is doubled)
    std::string note;         // why this action, for people

    std::string toml() const;      // a [[spans.rule]] table, ready to paste into the policy file
    std::string one_line() const;  // the same on one line, for the log
};

suggested_rule suggest_rule(std::string_view earlier, std::string_view later, const volatile_span& span);

// Where each message's text starts in the rendered prompt, found by its text in order: npos for a message without
// text; the first message whose text the template changed (not found after the one before) ends the vector.
std::vector<size_t> message_text_offsets(const std::vector<common_chat_msg>& messages, std::string_view prompt);

// The index of the message whose text starts last at or before `offset` in the rendered prompt (-1: before the
// first message's text, e.g. in the template's preamble). Messages are found by their text in order; a message
// whose text the template changed ends the search.
int message_index_at(const std::vector<common_chat_msg>& messages, std::string_view prompt, size_t offset);

// `text` for one log line or terminal line: newlines and control chars escaped, at most `max_chars` (with "...").
std::string printable(std::string_view text, size_t max_chars = 80);

}  // namespace keepwarm::policy

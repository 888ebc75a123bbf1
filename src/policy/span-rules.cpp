// See span-rules.h.
#include "policy/span-rules.h"

#include <re2/re2.h>
#include <re2/set.h>
#include <xxhash.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <unordered_set>

namespace keepwarm::policy {

namespace {

re2::RE2::Options regex_options() {
    re2::RE2::Options options;
    options.set_log_errors(false);  // a bad pattern is reported to whoever wrote it, with its line, not on stderr
    return options;
}

size_t next_char(const std::string& text, size_t pos) {
    pos++;
    while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) pos++;
    return pos;
}

const char* role_label(unsigned bit) {
    switch (bit) {
        case role_system:
            return "system prompt";
        case role_user:
            return "user message";
        case role_assistant:
            return "assistant message";
        default:
            return "tool result";
    }
}

}  // namespace

// The patterns of a rule set as one RE2::Set, index i being rule i.
struct span_prefilter {
    re2::RE2::Set set{regex_options(), re2::RE2::UNANCHORED};

    // Long texts the set found no rule in, by hash: an agent's system prompt and history come back on every turn and
    // are hashed (~30 GB/s) instead of scanned again (~1 GB/s).
    static constexpr size_t clean_min_bytes = 4096;
    static constexpr size_t clean_max_texts = 16384;  // then forgotten all at once
    struct hash_of_hash {
        size_t operator()(const XXH128_hash_t& h) const { return static_cast<size_t>(h.low64); }
    };
    struct same_hash {
        bool operator()(const XXH128_hash_t& a, const XXH128_hash_t& b) const { return XXH128_isEqual(a, b); }
    };
    std::mutex mu;
    std::unordered_set<XXH128_hash_t, hash_of_hash, same_hash> clean;

    // The rules that may match `text` into `candidates` (sorted); false when the set gave up (its DFA's memory).
    bool candidates_for(const std::string& text, std::vector<int>& candidates) {
        const bool long_text = text.size() >= clean_min_bytes;
        XXH128_hash_t h{};
        if (long_text) {
            h = XXH3_128bits(text.data(), text.size());
            std::lock_guard lock(mu);
            if (clean.count(h)) return true;
        }
        re2::RE2::Set::ErrorInfo error{};
        if (!set.Match(text, &candidates, &error) && error.kind != re2::RE2::Set::kNoError) return false;
        if (long_text && candidates.empty()) {
            std::lock_guard lock(mu);
            if (clean.size() >= clean_max_texts) clean.clear();
            clean.insert(h);
        }
        std::sort(candidates.begin(), candidates.end());
        return true;
    }
};

const char* span_action_name(span_action action) {
    switch (action) {
        case span_action::replace:
            return "replace";
        case span_action::drop:
            return "drop";
        case span_action::move:
            return "move";
    }
    return "?";
}

std::optional<span_action> parse_span_action(std::string_view name) {
    if (name == "replace") return span_action::replace;
    if (name == "drop") return span_action::drop;
    if (name == "move") return span_action::move;
    return std::nullopt;
}

unsigned role_bit(std::string_view role) {
    if (role == "system" || role == "developer") return role_system;
    if (role == "user") return role_user;
    if (role == "assistant") return role_assistant;
    if (role == "tool") return role_tool;
    return 0;
}

std::vector<std::string> role_names(unsigned roles) {
    std::vector<std::string> names;
    for (const auto& [bit, name] :
         {std::pair{role_system, "system"}, {role_user, "user"}, {role_assistant, "assistant"}, {role_tool, "tool"}}) {
        if (roles & bit) names.emplace_back(name);
    }
    return names;
}

const char* span_origin_name(span_origin origin) {
    switch (origin) {
        case span_origin::builtin:
            return "builtin";
        case span_origin::file:
            return "file";
        case span_origin::automatic:
            return "auto";
    }
    return "?";
}

span_rule::span_rule(std::string name, std::string_view pattern, span_action action, std::string replacement,
                     unsigned roles, span_origin origin)
    : name_(std::move(name)),
      pattern_(pattern),
      action_(action),
      replacement_(action == span_action::drop ? "" : std::move(replacement)),
      roles_(roles & all_roles),
      origin_(origin) {
    auto regex = std::make_shared<re2::RE2>(re2::StringPiece(pattern.data(), pattern.size()), regex_options());
    if (!regex->ok()) throw std::invalid_argument("invalid pattern: " + regex->error());
    // A rule that can match nothing at all would insert its replacement between every two characters.
    if (re2::RE2::FullMatch("", *regex)) throw std::invalid_argument("the pattern matches the empty text");
    std::string rewrite_error;
    if (!regex->CheckRewriteString(replacement_, &rewrite_error)) {
        throw std::invalid_argument("invalid replacement: " + rewrite_error);
    }
    if (roles_ == 0) throw std::invalid_argument("the rule reads no role");
    groups_ = 1 + re2::RE2::MaxSubmatch(replacement_);
    regex_ = std::move(regex);
}

int span_rule::apply(std::string& text, std::vector<std::string>& moved) const {
    const re2::StringPiece input(text);
    std::vector<re2::StringPiece> groups(groups_);
    std::string out;
    size_t copied = 0, from = 0;
    int matches = 0;
    while (from <= text.size() &&
           regex_->Match(input, from, text.size(), re2::RE2::UNANCHORED, groups.data(), groups_)) {
        const size_t start = groups[0].data() - text.data();
        const size_t end = start + groups[0].size();
        if (start == end) {  // an empty match changes nothing; look again from the next character
            if (start >= text.size()) break;
            from = next_char(text, start);
            continue;
        }
        out.append(text, copied, start - copied);
        if (action_ == span_action::move) moved.emplace_back(groups[0].data(), groups[0].size());
        if (action_ != span_action::drop) regex_->Rewrite(&out, replacement_, groups.data(), groups_);
        copied = from = end;
        matches++;
    }
    if (matches == 0) return 0;
    out.append(text, copied);
    text = std::move(out);
    return matches;
}

span_rule_set::span_rule_set(std::vector<span_rule> rules) : rules_(std::move(rules)) {
    if (rules_.empty()) return;
    prefilter_ = std::make_unique<span_prefilter>();
    for (const span_rule& rule : rules_) {
        roles_ |= rule.roles();
        std::string error;
        // Every pattern already compiled alone, so this only fails if RE2 runs out of its memory budget: then the
        // rules are simply tried one by one.
        if (prefilter_->set.Add(rule.pattern(), &error) < 0) {
            prefilter_.reset();
            return;
        }
    }
    if (!prefilter_->set.Compile()) prefilter_.reset();
}

span_rule_set::~span_rule_set() = default;

void span_rule_set::apply_to_text(std::string& text, unsigned role, std::vector<std::string>& moved,
                                  std::vector<int>& matches_per_rule) const {
    if (text.empty() || !(roles_ & role)) return;
    matches_per_rule.resize(rules_.size());
    std::vector<int> candidates;  // in the rules' order: they apply in it
    if (!prefilter_ || !prefilter_->candidates_for(text, candidates)) {
        candidates.resize(rules_.size());  // the prefilter gave up (DFA memory): try every rule
        for (size_t i = 0; i < rules_.size(); i++) candidates[i] = static_cast<int>(i);
    }
    for (const int i : candidates) {
        const span_rule& rule = rules_[i];
        if (rule.roles() & role) matches_per_rule[i] += rule.apply(text, moved);
    }
}

void append_note(common_chat_msg& msg, const std::string& note) {
    if (!msg.content_parts.empty()) {
        msg.content_parts.back().text += note;
    } else {
        msg.content += note;
    }
}

span_report span_rule_set::apply(std::vector<common_chat_msg>& messages, bool place_note) const {
    span_report report;
    if (rules_.empty()) return report;
    std::vector<int> matches(rules_.size());
    struct moved_span {
        unsigned role;
        std::string text;
    };
    std::vector<moved_span> moved_spans;
    std::vector<std::string> moved;
    for (common_chat_msg& msg : messages) {
        const unsigned role = role_bit(msg.role);
        apply_to_text(msg.content, role, moved, matches);
        for (auto& part : msg.content_parts) apply_to_text(part.text, role, moved, matches);
        apply_to_text(msg.reasoning_content, role, moved, matches);
        for (std::string& text : moved) moved_spans.push_back({role, std::move(text)});
        moved.clear();
    }
    for (size_t i = 0; i < rules_.size(); i++) {
        if (matches[i] > 0) report.fired.push_back({rules_[i].name(), rules_[i].action(), matches[i]});
    }
    if (moved_spans.empty()) return report;

    // The note goes after everything the next turn will repeat except this last message, so the cached prefix ends
    // at most one message earlier than without it (see docs/policy.md).
    auto target = std::find_if(messages.rbegin(), messages.rend(),
                               [](const common_chat_msg& m) { return role_bit(m.role) != role_assistant; });
    if (target == messages.rend()) return report;  // only assistant messages: nowhere safe to put the note
    for (const moved_span& span : moved_spans) {
        report.note += std::string(report.note.empty() ? "\n\n" : "\n") + "[moved from the " + role_label(span.role) +
                       ": " + span.text + "]";
    }
    report.note_message = static_cast<int>(messages.rend() - target) - 1;
    if (place_note) append_note(*target, report.note);
    return report;
}

const std::vector<builtin_span>& builtin_spans() {
    static const std::vector<builtin_span> spans = {
        {
            "claude-code-billing",
            "Claude Code's attribution line at the start of its system prompt: every field but the version and the "
            "entry point changes with the conversation or the request (cc_version's 3-hex suffix, cch, cc_prompt_id, "
            "cc_turn_index, cc_prev_req, ...): the line keeps those two and drops the rest, whatever fields it has",
            // As Claude Code 2.1.x writes it: "x-anthropic-billing-header: cc_version=2.1.332.a1b;
            // cc_entrypoint=sdk-cli;", in first-party mode followed by "cch=5f2e1; cc_prompt_id=<uuid>;
            // cc_turn_origin=sdk; cc_prompt_index=0; cc_turn_index=3;" and more. Every "key=value;" field after the
            // entry point goes, whatever its key: a field a later version adds cannot part two prompts again. Text
            // after the fields stays (a client may join the system blocks without a line break).
            R"(x-anthropic-billing-header: ?(?:cc_version=([0-9]+\.[0-9]+\.[0-9]+)[^;\n]*;)?)"
            R"((?: ?cc_entrypoint=([^;\n]*);)?(?: ?[A-Za-z][A-Za-z0-9_.-]*=[^;\n]*;)*)",
            span_action::replace,
            R"(x-anthropic-billing-header: cc_version=\1; cc_entrypoint=\2;)",
            role_system,
        },
        {
            "uuid",
            "UUIDs (8-4-4-4-12 hex digits), as request and session ids, in system prompts",
            R"(\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b)",
            span_action::replace,
            "00000000-0000-0000-0000-000000000000",
            role_system,
        },
        {
            "timestamp",
            "date-times (ISO 8601, RFC 2822, date(1), 6/30/2026 12:34) in system prompts, moved to the end; dates "
            "without a time of day are left alone",
            R"(\b[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:[.,][0-9]+)?)?)"
            R"((?:Z|[+-][0-9]{2}(?::?[0-9]{2})?)?)"
            R"(|\b[0-9]{8}T[0-9]{6}(?:Z|[+-][0-9]{4})?)"
            R"(|\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), [0-9]{1,2} (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) )"
            R"([0-9]{4} [0-9]{2}:[0-9]{2}(?::[0-9]{2})?(?: (?:[A-Z]{3,4}|[+-][0-9]{4}))?)"
            R"(|\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +[0-9]{1,2} )"
            R"([0-9]{2}:[0-9]{2}:[0-9]{2}(?: [A-Z]{2,5})? [0-9]{4})"
            R"(|\b[0-9]{1,2}/[0-9]{1,2}/[0-9]{2,4},? [0-9]{1,2}:[0-9]{2}(?::[0-9]{2})?(?: ?[AaPp][Mm])?)",
            span_action::move,
            "",
            role_system,
        },
    };
    return spans;
}

const builtin_span* find_builtin_span(std::string_view name) {
    for (const builtin_span& span : builtin_spans()) {
        if (name == span.name) return &span;
    }
    return nullptr;
}

}  // namespace keepwarm::policy

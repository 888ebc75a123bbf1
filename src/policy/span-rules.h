// Volatile-span rules: RE2 patterns over system and message text whose matches (a per-request nonce, an id, a clock)
// are replaced by a constant, dropped, or moved to the end of the prompt, so that they no longer end the cached
// prefix where they occur. RE2 matches in time linear in the text, whatever the pattern or the input.
// Threading: rules and rule sets are immutable once built and safe to share between request threads.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chat.h"

namespace re2 {
class RE2;
}  // namespace re2

namespace keepwarm::policy {

enum class span_action {
    replace,  // the match becomes the rule's replacement
    drop,     // the match is removed
    move,     // the match becomes the replacement (default: nothing) and its text goes to the end of the prompt
};

const char* span_action_name(span_action action);  // "replace", "drop", "move"
std::optional<span_action> parse_span_action(std::string_view name);

// Message roles a rule reads, as bits; "system" covers "developer".
enum role_bits : unsigned {
    role_system = 1,
    role_user = 2,
    role_assistant = 4,
    role_tool = 8,
    all_roles = 15,
};
// The bit of a role name (system, developer, user, assistant, tool); 0 for anything else.
unsigned role_bit(std::string_view role);
std::vector<std::string> role_names(unsigned roles);

// Where a rule came from: the built-in list, the policy file, or a detector adding it while the server runs.
enum class span_origin { builtin, file, automatic };
const char* span_origin_name(span_origin origin);

class span_rule {
public:
    // `replacement` is RE2 rewrite text: literal, with \0 (the whole match) .. \9 naming groups, and \\ for a
    // backslash; drop ignores it. Throws std::invalid_argument with RE2's reason when the pattern does not compile
    // (backreferences and lookaround are not RE2 syntax), matches the empty text, or the replacement names a group
    // the pattern lacks.
    span_rule(std::string name, std::string_view pattern, span_action action, std::string replacement = "",
              unsigned roles = all_roles, span_origin origin = span_origin::file);

    const std::string& name() const { return name_; }
    const std::string& pattern() const { return pattern_; }
    span_action action() const { return action_; }
    const std::string& replacement() const { return replacement_; }
    unsigned roles() const { return roles_; }
    span_origin origin() const { return origin_; }
    const re2::RE2& regex() const { return *regex_; }

    // Rewrites every non-overlapping match in `text`, leftmost first; the text of moved matches is appended to
    // `moved`. Returns how many matches it rewrote.
    int apply(std::string& text, std::vector<std::string>& moved) const;

private:
    std::string name_;
    std::string pattern_;
    span_action action_;
    std::string replacement_;
    unsigned roles_;
    span_origin origin_;
    int groups_ = 1;                         // \0 .. the highest group the replacement names
    std::shared_ptr<const re2::RE2> regex_;  // shared: rules are copied when a rule set is rebuilt
};

// What the span rules did to one request: per rule that changed something, how many matches.
struct span_report {
    struct entry {
        std::string rule;
        span_action action;
        int matches;
    };
    std::vector<entry> fired;  // in rule order
    // The lines of the moved matches ("\n\n[moved from the system prompt: TEXT]"), and the message they go to (the
    // last one that is not an assistant's); empty / -1 when nothing was moved or there is no such message.
    std::string note;
    int note_message = -1;
};

// Appends a moved-span note to the message's text (its last text part, or its content).
void append_note(common_chat_msg& msg, const std::string& note);

struct span_prefilter;

// The rules in force, in order. Built once and shared read-only (see request_policy for run-time additions).
class span_rule_set {
public:
    span_rule_set() = default;
    explicit span_rule_set(std::vector<span_rule> rules);
    ~span_rule_set();

    const std::vector<span_rule>& rules() const { return rules_; }
    bool empty() const { return rules_.empty(); }

    // Applies the rules to the content, content parts and reasoning of every message whose role they read. Matches
    // of `move` rules are appended, one line each, to the last message that is not an assistant's (a trailing
    // assistant message is being continued, and a note there would become part of the reply); with `place_note`
    // false the note is only returned in the report (request_policy places it, with the notes of earlier turns).
    span_report apply(std::vector<common_chat_msg>& messages, bool place_note = true) const;

    // One text as a message of role `role_bit` would have it rewritten; moved spans are collected in `moved`.
    void apply_to_text(std::string& text, unsigned role_bit, std::vector<std::string>& moved,
                       std::vector<int>& matches_per_rule) const;

private:
    std::vector<span_rule> rules_;
    unsigned roles_ = 0;  // union of the rules' roles: texts of other roles are not even scanned
    // All patterns at once: one linear pass over a text says which rules can match it, so a long system prompt is
    // scanned once, not once per rule.
    std::unique_ptr<span_prefilter> prefilter_;
};

// Built-in rules, each switched on or off by name in the policy file.
struct builtin_span {
    const char* name;
    const char* description;
    const char* pattern;
    span_action action;
    const char* replacement;
    unsigned roles;
};
const std::vector<builtin_span>& builtin_spans();  // claude-code-billing, uuid, timestamp
const builtin_span* find_builtin_span(std::string_view name);

}  // namespace keepwarm::policy

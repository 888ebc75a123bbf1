// Notices, per client, when a request misses the prefix cache because of a short span near the start of an otherwise
// identical long prefix (a nonce, an id, a clock, a reordered tool list), and keeps reports of it, each with the
// tokens it cost and a suggested policy rule, for GET /v1/cache/busters and the log.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "chat.h"
#include "chat/generation-report.h"
#include "llama.h"
#include "policy/prompt-diff.h"
#include "policy/span-rules.h"

namespace keepwarm::policy {

// Who sent a prompt, and through which request.
struct prompt_origin {
    std::string client;  // client_name() of the request
    std::string request_id;
    std::string api;     // "openai", "anthropic", "ollama"
    std::string tenant;  // the tenant of its API key: prompts are compared, and reports shown, within one tenant
};

struct cache_buster_report {
    prompt_origin origin;
    int64_t time = 0;  // unix seconds
    span_kind kind = span_kind::prose;
    size_t char_offset = 0;  // where the span starts; the client's earlier prompt and this one agree before it
    int token_offset = -1;   // the prompt token holding that char (-1: unknown)
    int token_end = -1;      // the token after the one holding the span's last char (-1: unknown)
    bool token_offset_estimated = false;  // a proxy without the upstream's tokenizer: where the upstream's reuse ended
    int message_index = -1;     // the message the span is in (-1: before the first message's text, or unknown)
    std::string role;           // that message's role
    std::string previous_text;  // the span in the client's earlier prompt
    std::string current_text;   // ... and in this one
    std::string context_before, context_after;  // a little of the shared text around it
    size_t agreed_chars = 0;                    // chars the two prompts agree on after the span
    int prompt_tokens = 0;
    int reused_tokens = 0;
    // Prompt tokens from the span on that were computed because the cache could not reuse past it.
    int cost_tokens = 0;
    suggested_rule rule;
    std::string adopted_rule;  // the span rule auto mode put in force because of this report; empty: none

    // What the policy's auto mode may replace by itself: a uuid, a hex or base64-like id of high entropy.
    bool looks_like_random_id() const { return is_random_id(kind); }
};

// Maps a char offset of a rendered prompt to the index of the prompt token holding that char.
using token_locator = std::function<int(size_t char_offset)>;

// A locator over a prompt's tokens (as tokenized from the rendered text, with the vocab's BOS when it adds one).
// The tokens must outlive the locator.
token_locator locate_tokens(const llama_vocab* vocab, std::span<const llama_token> tokens);

// Auto mode: the span rule a report of a random id becomes ("auto-" + the suggested rule's name, replace, the roles
// of the message the span is in, origin automatic), after checking that it rewrites the span in that message of the
// request (`messages`, as the policy left them). nullopt for anything else: a date, a number, prose, a reordering,
// a span outside the messages' text, a pattern that does not match there.
std::optional<span_rule> auto_span_rule(const cache_buster_report& report,
                                        const std::vector<common_chat_msg>& messages);

// Threading: every member may be called from any number of threads at once; prompts are compared outside the lock.
class cache_buster_detector {
public:
    struct options {
        diff_options diff;
        size_t prompts_per_client = 4;               // recent prompts each client's new prompt is compared with
        size_t max_clients = 64;                     // least recently seen clients are forgotten first
        size_t max_prompt_bytes = size_t{64} << 20;  // all remembered prompts together
        size_t max_reports = 64;
        size_t max_counts = 1024;  // (client, pattern) pairs counted
        bool log_prompts = false;  // the log line of a report quotes the span and the rule (prompt text)
    };

    struct pattern_count {
        std::string tenant;
        std::string client;
        std::string pattern;  // the suggested rule's pattern (its name where it has none)
        std::string rule_name;
        span_kind kind = span_kind::prose;
        uint64_t count = 0;
        uint64_t cost_tokens = 0;  // summed over the reports
        int64_t last_seen = 0;     // unix seconds
    };

    cache_buster_detector();
    explicit cache_buster_detector(options opts);

    // Compares a request's rendered prompt with the client's recent prompts, then remembers it. When a short span
    // near the start keeps it from extending the prompt it shares the most with, returns that span as a report still
    // missing the request's numbers (see confirm). `messages` locate the span's message; `locate` its token (may be
    // empty).
    std::optional<cache_buster_report> inspect(prompt_origin origin, std::string_view prompt,
                                               const std::vector<common_chat_msg>& messages,
                                               const token_locator& locate);

    // The request ended: keeps and logs the report (one line) if the cache did not reuse past the span and tokens
    // after it were computed. Returns whether it did.
    bool confirm(cache_buster_report report, const generation_report& stats);

    // A tenant's reports and counts: no tenant sees another's clients, ids or text.
    std::vector<cache_buster_report> reports(std::string_view tenant = {}) const;  // newest first
    std::vector<pattern_count> counts(std::string_view tenant = {}) const;         // most frequent first
    const options& settings() const { return opts_; }

private:
    struct client_history {
        std::deque<std::shared_ptr<const std::string>> prompts;  // oldest first
        uint64_t last_used = 0;
    };

    void remember(const std::string& client, std::shared_ptr<const std::string> prompt);  // caller holds mu_
    void count(const cache_buster_report& report);                                        // caller holds mu_

    const options opts_;
    mutable std::mutex mu_;
    std::unordered_map<std::string, client_history> clients_;  // guarded by mu_, by scoped_client()
    size_t prompt_bytes_ = 0;                                  // guarded by mu_
    uint64_t tick_ = 0;                                        // guarded by mu_
    std::deque<cache_buster_report> reports_;                  // guarded by mu_, newest first
    // guarded by mu_, by (scoped_client(), pattern)
    std::map<std::pair<std::string, std::string>, pattern_count> counts_;
};

}  // namespace keepwarm::policy

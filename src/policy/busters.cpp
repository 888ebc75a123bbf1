// See busters.h.
#include "policy/busters.h"

#include <algorithm>
#include <chrono>

#include "base/logger.h"

namespace keepwarm::policy {

namespace {
constexpr size_t context_chars = 40;  // shared text shown on each side of a span

// A client's name within its tenant: two tenants' clients of the same name are two clients.
std::string scoped_client(const prompt_origin& origin) {
    std::string scoped = origin.tenant;
    scoped += '\x1f';
    scoped += origin.client;
    return scoped;
}

int64_t unix_seconds() {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}
}  // namespace

token_locator locate_tokens(const llama_vocab* vocab, std::span<const llama_token> tokens) {
    return [vocab, tokens](size_t char_offset) {
        size_t i = 0;
        // The rendered text has no BOS when the vocab adds it.
        if (!tokens.empty() && llama_vocab_get_add_bos(vocab) && tokens[0] == llama_vocab_bos(vocab)) i = 1;
        size_t chars = 0;
        char buf[256];
        for (; i < tokens.size(); ++i) {
            const int n = llama_token_to_piece(vocab, tokens[i], buf, sizeof buf, 0, true);
            chars += static_cast<size_t>(std::max(n, 0));
            if (chars > char_offset) return static_cast<int>(i);
        }
        return static_cast<int>(tokens.size());
    };
}

std::optional<span_rule> auto_span_rule(const cache_buster_report& report,
                                        const std::vector<common_chat_msg>& messages) {
    const suggested_rule& suggested = report.rule;
    if (!report.looks_like_random_id() || suggested.pattern.empty() || suggested.action != "replace")
        return std::nullopt;
    if (report.message_index < 0 || static_cast<size_t>(report.message_index) >= messages.size()) return std::nullopt;
    const common_chat_msg& msg = messages[report.message_index];
    const unsigned role = role_bit(msg.role);
    if (role == 0) return std::nullopt;
    std::optional<span_rule> rule;
    try {
        rule.emplace("auto-" + suggested.name, suggested.pattern, span_action::replace, suggested.replacement, role,
                     span_origin::automatic);
    } catch (const std::invalid_argument&) {
        return std::nullopt;  // a suggestion RE2 refuses is only reported
    }
    // The rule must find the span where the report saw it; a pattern anchored on template text would not.
    std::vector<std::string> moved;
    const auto rewrites = [&](std::string text) {
        return text.find(report.current_text) != std::string::npos && rule->apply(text, moved) > 0 &&
               text.find(report.current_text) == std::string::npos;
    };
    bool found = rewrites(msg.content);
    for (const auto& part : msg.content_parts) found = found || rewrites(part.text);
    if (!found) return std::nullopt;
    return rule;
}

cache_buster_detector::cache_buster_detector() : cache_buster_detector(options{}) {}

cache_buster_detector::cache_buster_detector(options opts) : opts_(std::move(opts)) {}

std::optional<cache_buster_report> cache_buster_detector::inspect(prompt_origin origin, std::string_view prompt,
                                                                  const std::vector<common_chat_msg>& messages,
                                                                  const token_locator& locate) {
    std::deque<std::shared_ptr<const std::string>> earlier;
    {
        std::lock_guard lock(mu_);
        if (auto it = clients_.find(scoped_client(origin)); it != clients_.end()) earlier = it->second.prompts;
    }
    auto current = std::make_shared<const std::string>(prompt);

    // The prompt the cache would continue from is the one this one shares the most with; a span before that point
    // is no loss. A prompt that extends (or repeats) one of them leaves nothing to report.
    std::vector<size_t> shared(earlier.size());
    size_t deepest = 0;
    bool extends = false;
    for (size_t i = 0; i < earlier.size(); ++i) {
        shared[i] = common_prefix_length(*earlier[i], prompt);
        deepest = std::max(deepest, shared[i]);
        extends = extends || shared[i] == earlier[i]->size() || shared[i] == prompt.size();
    }
    std::optional<volatile_span> best;
    std::string_view best_earlier;
    for (size_t i = earlier.size(); i-- > 0 && !extends;) {  // newest first: it wins ties
        if (shared[i] != deepest) continue;
        auto span = find_volatile_span(*earlier[i], prompt, opts_.diff);
        if (span && (!best || span->agreed_chars > best->agreed_chars)) {
            best = span;
            best_earlier = *earlier[i];
        }
    }
    {
        std::lock_guard lock(mu_);
        remember(scoped_client(origin), std::move(current));
    }
    if (!best) return std::nullopt;

    const std::string_view before = best_earlier;  // kept alive by `earlier`
    cache_buster_report r;
    r.origin = std::move(origin);
    r.kind = best->kind;
    r.char_offset = best->offset;
    if (locate) {
        r.token_offset = locate(best->offset);
        r.token_end = locate(best->offset + std::max<size_t>(best->later_length, 1) - 1) + 1;
    }
    r.message_index = message_index_at(messages, prompt, best->offset);
    if (r.message_index >= 0) r.role = messages[r.message_index].role;
    // A word the user wrote differently is the user's own conversation, not a value the client made up.
    if (best->kind == span_kind::prose && r.role == "user") return std::nullopt;
    r.previous_text = best->in_earlier(before);
    r.current_text = best->in_later(prompt);
    const size_t from = best->offset - std::min(best->offset, context_chars);
    r.context_before = prompt.substr(from, best->offset - from);
    r.context_after = prompt.substr(best->offset + best->later_length, context_chars);
    r.agreed_chars = best->agreed_chars;
    r.rule = suggest_rule(before, prompt, *best);
    return r;
}

bool cache_buster_detector::confirm(cache_buster_report r, const generation_report& stats) {
    if (stats.prompt_tokens <= 0) return false;
    // The cache may reuse the first tokens of the span itself (digits are tokens of their own, say), or the tokenizer
    // may merge its first char with the text in front of it; reuse past the span's end means it cost nothing.
    const int reuse_limit = std::max(r.token_offset + 1, r.token_end - 1);
    if (r.token_offset >= 0 && stats.reused_tokens > reuse_limit) return false;
    const int from_span = r.token_offset >= 0 ? stats.prompt_tokens - r.token_offset : stats.prompt_tokens;
    r.cost_tokens = std::min(from_span, stats.computed_tokens);
    if (r.cost_tokens <= 0) return false;
    r.prompt_tokens = stats.prompt_tokens;
    r.reused_tokens = stats.reused_tokens;
    r.time = unix_seconds();

    std::string where = "char " + std::to_string(r.char_offset);
    if (r.message_index >= 0) where += ", message " + std::to_string(r.message_index) + " (" + r.role + ")";
    if (opts_.log_prompts) {
        log::info("policy",
                  "cache buster from client {} at token {}: {} \"{}\" where the previous prompt had \"{}\" ({}, {}) "
                  "costs {} tokens; suggested rule: {}",
                  r.origin.client, r.token_offset, span_kind_description(r.kind), printable(r.current_text, 60),
                  printable(r.previous_text, 60), where, r.origin.request_id, r.cost_tokens, r.rule.one_line());
    } else {
        // The span, its context and the suggested pattern are prompt text: GET /v1/cache/busters shows them to the
        // client's own tenant.
        log::info("policy", "cache buster from client {} at token {}: {} ({}, {}) costs {} tokens", r.origin.client,
                  r.token_offset, span_kind_description(r.kind), where, r.origin.request_id, r.cost_tokens);
    }

    std::lock_guard lock(mu_);
    count(r);
    reports_.push_front(std::move(r));
    if (reports_.size() > opts_.max_reports) reports_.pop_back();
    return true;
}

std::vector<cache_buster_report> cache_buster_detector::reports(std::string_view tenant) const {
    std::vector<cache_buster_report> out;
    std::lock_guard lock(mu_);
    for (const auto& r : reports_) {
        if (r.origin.tenant == tenant) out.push_back(r);
    }
    return out;
}

std::vector<cache_buster_detector::pattern_count> cache_buster_detector::counts(std::string_view tenant) const {
    std::vector<pattern_count> out;
    {
        std::lock_guard lock(mu_);
        for (const auto& [key, c] : counts_) {
            if (c.tenant == tenant) out.push_back(c);
        }
    }
    std::stable_sort(out.begin(), out.end(), [](const pattern_count& a, const pattern_count& b) {
        return a.count != b.count ? a.count > b.count : a.last_seen > b.last_seen;
    });
    return out;
}

void cache_buster_detector::remember(const std::string& client, std::shared_ptr<const std::string> prompt) {
    client_history& h = clients_[client];
    h.last_used = ++tick_;
    prompt_bytes_ += prompt->size();
    h.prompts.push_back(std::move(prompt));
    const auto drop_oldest = [this](client_history& hist) {
        prompt_bytes_ -= hist.prompts.front()->size();
        hist.prompts.pop_front();
    };
    while (h.prompts.size() > opts_.prompts_per_client) drop_oldest(h);
    // Over the budgets, the least recently seen clients go first; the newest prompt of this one stays.
    while (clients_.size() > opts_.max_clients || prompt_bytes_ > opts_.max_prompt_bytes) {
        auto lru = clients_.end();
        for (auto it = clients_.begin(); it != clients_.end(); ++it) {
            if (it->first != client && (lru == clients_.end() || it->second.last_used < lru->second.last_used))
                lru = it;
        }
        if (lru != clients_.end()) {
            while (!lru->second.prompts.empty()) drop_oldest(lru->second);
            clients_.erase(lru);
        } else if (h.prompts.size() > 1) {
            drop_oldest(h);
        } else {
            break;
        }
    }
}

void cache_buster_detector::count(const cache_buster_report& r) {
    const std::string pattern = r.rule.pattern.empty() ? r.rule.name : r.rule.pattern;
    auto key = std::pair{scoped_client(r.origin), pattern};
    auto it = counts_.find(key);
    if (it == counts_.end()) {
        if (counts_.size() >= opts_.max_counts) {
            auto oldest = std::min_element(counts_.begin(), counts_.end(), [](const auto& a, const auto& b) {
                return a.second.last_seen < b.second.last_seen;
            });
            counts_.erase(oldest);
        }
        it = counts_
                 .emplace(key, pattern_count{.tenant = r.origin.tenant,
                                             .client = r.origin.client,
                                             .pattern = pattern,
                                             .rule_name = r.rule.name,
                                             .kind = r.kind})
                 .first;
    }
    it->second.count++;
    it->second.cost_tokens += static_cast<uint64_t>(r.cost_tokens);
    it->second.last_seen = r.time;
}

}  // namespace keepwarm::policy

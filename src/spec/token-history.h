// A tenant's earlier token streams (finished conversations: prompts and answers), bounded in tokens and indexed by
// their k-grams, for the suffix drafter (spec/suffix-drafter.h) to look continuations up in. Streams are keyed by
// tenant: a lookup names its tenant and only ever sees that tenant's streams (an accepted draft is faster, so a draft
// from another tenant's text would be a timing oracle across tenants).
// Threading: not synchronized. One owner (the engine thread) adds, evicts and looks up; a caller that shares one
// across threads holds its own mutex around every call, and around every suffix_drafter that reads it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace keepwarm::spec {

// A token id as the model's vocabulary numbers it (llama_token), without depending on llama.h.
using token = std::int32_t;

// The k-gram key of `tokens[end - k, end)`: a hash, so two different k-grams may share one (lookups check the tokens).
std::uint64_t kgram_key(const token* end, std::size_t k);

struct token_history_options {
    std::size_t token_budget = std::size_t{1} << 20;  // tokens held over all tenants; the oldest streams go first
    // k: the k-gram a lookup starts from (>= 1). 1 drafts the most on recorded agent traffic (docs/speculative.md):
    // the longest match is found by comparing backwards from every occurrence of the last token anyway.
    std::size_t key_tokens = 1;
};

// Counters, first-class outputs rather than log lines.
struct token_history_stats {
    std::size_t streams = 0;           // streams held now
    std::size_t tokens = 0;            // tokens held now
    std::size_t streams_added = 0;     // over the history's life
    std::size_t streams_evicted = 0;   // over the history's life, to stay within the budget
    std::size_t tokens_truncated = 0;  // tokens cut from the front of streams longer than the budget
};

class token_history {
public:
    // Where a k-gram ends in one stream: the stream's serial (increasing over the history's life) and the offset just
    // past the k-gram's last token, so stream[offset] is the first token of its continuation.
    struct position {
        std::uint64_t serial;
        std::uint32_t offset;
    };

    explicit token_history(token_history_options options = {});

    // Adds a finished stream of `tenant` (a conversation's prompt and answer). Streams older than it go, oldest
    // first and whoever's they are, until the budget holds; a stream longer than the whole budget keeps its tail.
    // An empty stream, or one shorter than k + 1 tokens (nothing to draft from), is not kept.
    void add_stream(const std::string& tenant, std::span<const token> tokens);

    // Forgets every stream of `tenant`.
    void remove_tenant(const std::string& tenant);

    // Calls `visit(stream, position)` for the positions of `tenant`'s streams where the k-gram with key `key` ends
    // and at least one token follows, newest first, until `visit` returns false. The stream span is valid until the
    // next add_stream/remove_tenant.
    void visit_newest_first(const std::string& tenant, std::uint64_t key,
                            const std::function<bool(std::span<const token>, position)>& visit) const;

    std::size_t key_tokens() const { return options_.key_tokens; }
    std::size_t token_budget() const { return options_.token_budget; }
    const token_history_stats& stats() const { return stats_; }

private:
    struct stream {
        std::uint64_t serial;
        std::string tenant;
        std::vector<token> tokens;
    };
    // One tenant's index: k-gram key -> where it ends, oldest first (streams are added in serial order).
    using tenant_index = std::unordered_map<std::uint64_t, std::vector<position>>;

    void evict_oldest();

    token_history_options options_;
    void unindex(const stream& s);

    // Oldest first; streams_[i].serial == first_serial_ + i. A removed tenant's streams stay as empty tombstones
    // (no tokens, no index entries) until they reach the front.
    std::deque<stream> streams_;
    std::uint64_t first_serial_ = 0;
    std::uint64_t next_serial_ = 0;
    std::unordered_map<std::string, tenant_index> tenants_;
    token_history_stats stats_;
};

}  // namespace keepwarm::spec

// The draft source of speculative decoding: given the tokens of one request so far (its prompt, then its answer as it
// is accepted), proposes the most likely continuation from everything its tenant said before (token_history) and from
// the request itself. Like SuffixDecoding: find the places where the longest suffix of the tokens so far occurred
// before, and walk their continuations while enough of them agree, so a draft is as long as its support.
// Pure: no model, no engine; the caller verifies the draft with the model and appends what was accepted.
// Threading: not synchronized, like the token_history it reads (one owner, the engine thread, or the caller's mutex
// around both). It keeps a reference to that history, which must outlive it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "spec/token-history.h"

namespace keepwarm::spec {

struct suffix_draft_options {
    std::size_t max_match = 64;       // the longest suffix compared (tokens); longer agreement counts as this
    std::size_t max_candidates = 64;  // earlier occurrences examined per source (request, history), newest first
    // A continuation token is drafted while the occurrences that agree on it are at least this share of the
    // occurrences that matched the suffix (SuffixDecoding's frequency threshold).
    double min_share = 0.3;
    // At most this many draft tokens per matched suffix token, plus draft_offset (SuffixDecoding's
    // max_spec_factor and max_spec_offset): a short match is weak evidence of a long continuation.
    double draft_per_match = 2.0;
    std::size_t draft_offset = 0;
};

// One proposal, and how well it is supported.
struct suffix_draft {
    std::vector<token> tokens;     // empty: no draft
    std::size_t match_length = 0;  // tokens of suffix its occurrences share with the request
    std::size_t occurrences = 0;   // earlier places where that suffix occurred (within max_candidates per source)
    bool from_history = false;     // the first token's most recent supporting occurrence is in the history
};

class suffix_drafter {
public:
    // A drafter for one request of `tenant`; it reads only that tenant's streams of `history`.
    suffix_drafter(const token_history& history, std::string tenant, suffix_draft_options options = {});

    // Appends tokens of the request: the prompt first, then each token the model accepted.
    void append(std::span<const token> tokens);
    void append(token t) { append(std::span<const token>(&t, 1)); }

    // The most likely continuation of the tokens so far, at most `max_tokens` long (0: none).
    suffix_draft propose(std::size_t max_tokens) const;

    std::span<const token> tokens() const { return tokens_; }
    const std::string& tenant() const { return tenant_; }

private:
    const token_history& history_;
    std::string tenant_;
    suffix_draft_options options_;
    std::size_t k_;
    std::vector<token> tokens_;
    // k-gram key -> offsets just past its occurrences in tokens_ that have a token after them, oldest first.
    std::unordered_map<std::uint64_t, std::vector<std::uint32_t>> own_ends_;
};

}  // namespace keepwarm::spec

// See suffix-drafter.h. A proposal: the k-gram ending the tokens so far names the candidate occurrences (the
// request's own, then the history's, newest first); each is scored by how far back it agrees with the request; those
// with the longest agreement are the support, and the draft walks their continuations token by token, taking the
// most frequent (ties: the most recent) while its share of the support stays at least min_share.
#include "spec/suffix-drafter.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace keepwarm::spec {

namespace {

// One earlier occurrence of the request's last k tokens: the stream it is in and where its continuation starts.
struct occurrence {
    std::span<const token> stream;
    std::size_t end;
    bool own;  // in the request itself: its continuation may run on into the draft being built
    std::size_t match = 0;
};

// How many tokens before `end` in `stream` equal the last tokens of `tokens`, at most `limit`.
std::size_t agreement(std::span<const token> tokens, std::span<const token> stream, std::size_t end,
                      std::size_t limit) {
    limit = std::min({limit, end, tokens.size()});
    std::size_t n = 0;
    while (n < limit && stream[end - 1 - n] == tokens[tokens.size() - 1 - n]) ++n;
    return n;
}

}  // namespace

suffix_drafter::suffix_drafter(const token_history& history, std::string tenant, suffix_draft_options options)
    : history_(history), tenant_(std::move(tenant)), options_(options), k_(history.key_tokens()) {}

void suffix_drafter::append(std::span<const token> tokens) {
    for (const token t : tokens) {
        const std::size_t n = tokens_.size();
        // Offsets are 32 bits: a request beyond that (no context is) keeps drafting from what it had.
        if (n >= k_ && n < (std::size_t{1} << 31)) {
            own_ends_[kgram_key(tokens_.data() + n, k_)].push_back(static_cast<std::uint32_t>(n));
        }
        tokens_.push_back(t);
    }
}

suffix_draft suffix_drafter::propose(std::size_t max_tokens) const {
    suffix_draft draft;
    const std::size_t n = tokens_.size();
    if (max_tokens == 0 || n < k_) return draft;
    const std::uint64_t key = kgram_key(tokens_.data() + n, k_);
    const std::size_t limit = std::max(options_.max_match, k_);

    std::vector<occurrence> found;
    if (const auto own = own_ends_.find(key); own != own_ends_.end()) {
        const std::vector<std::uint32_t>& ends = own->second;
        for (auto e = ends.rbegin(); e != ends.rend() && found.size() < options_.max_candidates; ++e) {
            found.push_back({tokens_, *e, true});
        }
    }
    const std::size_t own_count = found.size();
    history_.visit_newest_first(tenant_, key, [&](std::span<const token> stream, token_history::position p) {
        found.push_back({stream, p.offset, false});
        return found.size() - own_count < options_.max_candidates;
    });

    std::size_t best = 0;
    for (occurrence& o : found) {
        o.match = agreement(tokens_, o.stream, o.end, limit);
        best = std::max(best, o.match);
    }
    if (best < k_) return draft;  // only keys that collided
    std::vector<const occurrence*> support;
    for (const occurrence& o : found) {
        if (o.match == best) support.push_back(&o);
    }

    const double sized =
        options_.draft_per_match * static_cast<double>(best) + static_cast<double>(options_.draft_offset);
    // Options are the caller's: a negative or NaN sizing drafts nothing rather than converting out of range.
    const std::size_t cap = sized > 0 ? std::min(max_tokens, static_cast<std::size_t>(std::min(sized, 1e9))) : 0;
    draft.match_length = best;
    draft.occurrences = support.size();
    const double needed = options_.min_share * static_cast<double>(support.size());

    std::vector<std::pair<token, std::size_t>> counts;  // next token -> occurrences agreeing, in order of first sight
    std::vector<const occurrence*> next;
    for (std::size_t d = 0; d < cap && !support.empty(); ++d) {
        const auto token_at = [&](const occurrence& o, token& out) {
            const std::size_t i = o.end + d;
            if (i < o.stream.size()) {
                out = o.stream[i];
                return true;
            }
            if (!o.own) return false;
            out = draft.tokens[i - n];  // the request repeating itself runs on into the draft
            return true;
        };
        counts.clear();
        for (const occurrence* o : support) {
            token t;
            if (!token_at(*o, t)) continue;
            auto c = std::find_if(counts.begin(), counts.end(), [&](const auto& tc) { return tc.first == t; });
            if (c == counts.end()) {
                counts.emplace_back(t, 1);
            } else {
                ++c->second;
            }
        }
        if (counts.empty()) break;
        const auto chosen = std::max_element(counts.begin(), counts.end(),
                                             [](const auto& a, const auto& b) { return a.second < b.second; });
        if (static_cast<double>(chosen->second) < needed) break;
        const token t = chosen->first;
        next.clear();
        for (const occurrence* o : support) {
            token u;
            if (token_at(*o, u) && u == t) next.push_back(o);
        }
        if (d == 0) draft.from_history = !next.front()->own;
        support.swap(next);
        draft.tokens.push_back(t);
    }
    return draft;
}

}  // namespace keepwarm::spec

// See prompt-tokenizer.h. The index is a radix tree: each node ends a run of tokens (its edge) and keeps, per
// token, the end of its text piece in the edge's text and whether the model generated it.
#include "api/prompt-tokenizer.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>

#include "common.h"

namespace keepwarm::api {

struct prompt_tokenizer::node {
    std::vector<llama_token> tokens;  // the edge from the parent
    std::string text;                 // the pieces of `tokens`, concatenated
    std::vector<uint32_t> ends;       // ends[i]: where tokens[i]'s piece ends in `text`
    std::vector<uint8_t> generated;   // 1: the model sampled tokens[i]
    node* parent = nullptr;
    std::vector<std::unique_ptr<node>> children;  // few per node: a branch is where two prompts diverge
    // Written by tokenize() under the shared lock, hence atomic; only eviction order depends on it.
    mutable std::atomic<uint64_t> last_used{0};

    void append(llama_token token, std::string_view piece, bool by_model) {
        tokens.push_back(token);
        text.append(piece);
        ends.push_back(static_cast<uint32_t>(text.size()));
        generated.push_back(by_model ? 1 : 0);
    }
};

// The deepest resume point a text walk found.
struct prompt_tokenizer::walk_result {
    const node* at = nullptr;  // node holding the resume token; nullptr: none found
    size_t count = 0;          // tokens of at's edge kept, the resume token being the last
    size_t bytes = 0;          // text covered by all kept tokens
    uint64_t used = 0;         // at's recency, to break ties between equally long matches
};

namespace {

size_t common_prefix(std::string_view a, std::string_view b) {
    const size_t n = std::min(a.size(), b.size());
    constexpr size_t block = 64;
    size_t i = 0;
    while (i + block <= n && std::memcmp(a.data() + i, b.data() + i, block) == 0) i += block;
    while (i < n && a[i] == b[i]) ++i;
    return i;
}

// Whether `outer`, placed anywhere that overlaps `inner` (other than exactly on it with the same text), agrees
// with it on the overlap: then an occurrence of `outer` in some text could swallow part of `inner`.
bool can_overlap(const std::string& outer, const std::string& inner) {
    const auto lo = -static_cast<std::ptrdiff_t>(outer.size()) + 1;
    const auto hi = static_cast<std::ptrdiff_t>(inner.size());
    for (std::ptrdiff_t d = lo; d < hi; ++d) {  // outer starts at inner + d
        if (d == 0 && outer == inner) continue;
        const std::ptrdiff_t from = std::max<std::ptrdiff_t>(0, d);
        const std::ptrdiff_t to = std::min<std::ptrdiff_t>(hi, d + static_cast<std::ptrdiff_t>(outer.size()));
        if (std::memcmp(inner.data() + from, outer.data() + (from - d), static_cast<size_t>(to - from)) == 0) {
            return true;
        }
    }
    return false;
}

}  // namespace

prompt_tokenizer::prompt_tokenizer(const llama_vocab* vocab) : prompt_tokenizer(vocab, options{}) {}

prompt_tokenizer::prompt_tokenizer(const llama_vocab* vocab, options opts)
    : vocab_(vocab), opts_(opts), root_(std::make_unique<node>()) {
    n_vocab_ = llama_vocab_n_tokens(vocab);
    add_bos_ = llama_vocab_get_add_bos(vocab);
    bos_ = llama_vocab_bos(vocab);
    // BPE tokenizes each fragment between special tokens on its own, and its pieces spell the text exactly. SPM
    // adds a space after every special token that the text lacks; UGM and WPM normalize; a trailing EOS is not
    // text. Those fall back to full tokenization (see the header).
    indexed_ = llama_vocab_type(vocab) == LLAMA_VOCAB_TYPE_BPE && !llama_vocab_get_add_eos(vocab);
    if (!indexed_) return;

    // llama.cpp cuts the text at every control, user-defined and unknown token's text, longest first, before
    // tokenizing the pieces in between. After such a token the rest tokenizes independently, provided the cut lands
    // in the same place whatever follows: no other special text (nor the token's own, shifted) may overlap it, and
    // lstrip/rstrip would move the cut into the neighbouring whitespace.
    struct special {
        llama_token id;
        std::string text;
        llama_token_attr attr;
    };
    std::vector<special> specials;
    for (llama_token id = 0; id < n_vocab_; ++id) {
        const llama_token_attr attr = llama_vocab_get_attr(vocab, id);
        if (!(attr & (LLAMA_TOKEN_ATTR_CONTROL | LLAMA_TOKEN_ATTR_USER_DEFINED | LLAMA_TOKEN_ATTR_UNKNOWN))) continue;
        std::string text = piece(id);
        if (!text.empty()) specials.push_back({id, std::move(text), attr});
    }
    safe_special_.assign(static_cast<size_t>(n_vocab_), false);
    for (const special& s : specials) {
        if (!(s.attr & (LLAMA_TOKEN_ATTR_CONTROL | LLAMA_TOKEN_ATTR_USER_DEFINED))) continue;
        if (s.attr & (LLAMA_TOKEN_ATTR_LSTRIP | LLAMA_TOKEN_ATTR_RSTRIP)) continue;
        // Shorter special texts are cut later, inside the fragments left around this one, so they cannot move it.
        const bool overlapped = std::any_of(specials.begin(), specials.end(), [&](const special& other) {
            return other.text.size() >= s.text.size() && can_overlap(other.text, s.text);
        });
        safe_special_[static_cast<size_t>(s.id)] = !overlapped;
    }
}

prompt_tokenizer::~prompt_tokenizer() {
    // Iteratively: a long-lived index can be deeper than the stack likes.
    std::vector<std::unique_ptr<node>> pending;
    pending.push_back(std::move(root_));
    while (!pending.empty()) {
        std::unique_ptr<node> n = std::move(pending.back());
        pending.pop_back();
        for (auto& c : n->children) pending.push_back(std::move(c));
    }
}

std::string prompt_tokenizer::piece(llama_token token) const {
    return common_token_to_piece(vocab_, token, /*special=*/true);
}

bool prompt_tokenizer::resume_after(const node& n, size_t i) const {
    return n.generated[i] != 0 || safe_special_[static_cast<size_t>(n.tokens[i])];
}

// Depth-first over every path whose pieces spell a prefix of `text`. Several children can match at one offset
// (" Hel" and " Hello" both prefix " Hello"), but a wrong one stops matching within a few tokens, so in practice
// this reads the text once. Each node is visited at most once, so it never costs more than the tree.
prompt_tokenizer::walk_result prompt_tokenizer::walk_text(std::string_view text) const {
    walk_result best;
    std::vector<std::pair<const node*, size_t>> pending;  // node, offset in `text` where its edge starts
    auto push_children = [&](const node& n, size_t offset) {
        for (const auto& c : n.children) {
            if (c->text.empty() || (offset < text.size() && c->text[0] == text[offset])) {
                pending.emplace_back(c.get(), offset);
            }
        }
    };
    push_children(*root_, 0);
    while (!pending.empty()) {
        const auto [n, offset] = pending.back();
        pending.pop_back();
        const size_t same = common_prefix(n->text, text.substr(offset));
        const size_t whole =
            static_cast<size_t>(std::upper_bound(n->ends.begin(), n->ends.end(), same) - n->ends.begin());
        for (size_t i = whole; i-- > 0;) {
            if (!resume_after(*n, i)) continue;
            const size_t bytes = offset + n->ends[i];
            const uint64_t used = n->last_used.load(std::memory_order_relaxed);
            if (!best.at || bytes > best.bytes || (bytes == best.bytes && used > best.used)) {
                best = {.at = n, .count = i + 1, .bytes = bytes, .used = used};
            }
            break;
        }
        if (whole == n->tokens.size()) push_children(*n, offset + n->text.size());
    }
    return best;
}

std::vector<llama_token> prompt_tokenizer::tokenize(const std::string& text) {
    lookups_.fetch_add(1, std::memory_order_relaxed);
    std::vector<llama_token> out;
    size_t resume_bytes = 0;
    if (indexed_) {
        std::shared_lock lock(mu_);
        const walk_result w = walk_text(text);
        if (w.at) {
            std::vector<const node*> chain;
            size_t kept = w.count;
            for (const node* n = w.at; n != root_.get(); n = n->parent) {
                chain.push_back(n);
                if (n != w.at) kept += n->tokens.size();
            }
            out.reserve((add_bos_ ? 1 : 0) + kept + 64);
            if (add_bos_) out.push_back(bos_);
            const uint64_t now = tick_.fetch_add(1, std::memory_order_relaxed) + 1;
            for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
                const node* n = *it;
                const size_t take = n == w.at ? w.count : n->tokens.size();
                out.insert(out.end(), n->tokens.begin(), n->tokens.begin() + static_cast<std::ptrdiff_t>(take));
                n->last_used.store(now, std::memory_order_relaxed);
            }
            resume_bytes = w.bytes;
            tokens_matched_.fetch_add(kept, std::memory_order_relaxed);
        }
    }
    if (out.empty()) {
        out = common_tokenize(vocab_, text, /*add_special=*/true, /*parse_special=*/true);
        tokens_tokenized_.fetch_add(out.size(), std::memory_order_relaxed);
        return out;
    }
    if (resume_bytes < text.size()) {
        const std::vector<llama_token> rest =
            common_tokenize(vocab_, text.substr(resume_bytes), /*add_special=*/false, /*parse_special=*/true);
        tokens_tokenized_.fetch_add(rest.size(), std::memory_order_relaxed);
        out.insert(out.end(), rest.begin(), rest.end());
    }
    return out;
}

size_t prompt_tokenizer::matched_tokens(std::span<const llama_token> path) const {
    const node* at = root_.get();
    size_t i = 0;
    while (i < path.size()) {
        const node* next = nullptr;
        for (const auto& c : at->children) {
            if (c->tokens.front() == path[i]) next = c.get();
        }
        if (!next) break;
        size_t k = 0;
        while (k < next->tokens.size() && i < path.size() && next->tokens[k] == path[i]) ++k, ++i;
        if (k < next->tokens.size()) break;
        at = next;
    }
    return i;
}

void prompt_tokenizer::record(std::span<const llama_token> prompt, std::span<const llama_token> generated) {
    if (!indexed_) return;
    // The index holds text, and BOS is not part of the rendered text: tokenize() adds it back.
    if (add_bos_ && !prompt.empty() && prompt.front() == bos_) prompt = prompt.subspan(1);
    std::vector<llama_token> path(prompt.begin(), prompt.end());
    path.insert(path.end(), generated.begin(), generated.end());
    if (path.empty()) return;
    if (std::any_of(path.begin(), path.end(), [&](llama_token t) { return t < 0 || t >= n_vocab_; })) return;

    // The pieces of what the index does not hold yet are looked up before taking the exclusive lock; usually that
    // is only the last turn.
    size_t known;
    {
        std::shared_lock lock(mu_);
        known = matched_tokens(path);
    }
    std::vector<std::string> pieces;
    pieces.reserve(path.size() - known);
    for (size_t i = known; i < path.size(); ++i) pieces.push_back(piece(path[i]));

    std::unique_lock lock(mu_);
    const uint64_t now = tick_.fetch_add(1, std::memory_order_relaxed) + 1;
    node* at = root_.get();
    size_t i = 0;
    while (i < path.size()) {
        auto slot = std::find_if(at->children.begin(), at->children.end(),
                                 [&](const std::unique_ptr<node>& c) { return c->tokens.front() == path[i]; });
        if (slot == at->children.end()) break;
        node* child = slot->get();
        size_t k = 0;
        while (k < child->tokens.size() && i + k < path.size() && child->tokens[k] == path[i + k]) {
            if (i + k >= prompt.size()) child->generated[k] = 1;
            ++k;
        }
        child->last_used.store(now, std::memory_order_relaxed);
        i += k;
        if (k < child->tokens.size()) {
            if (i == path.size()) break;  // the path ends inside this edge: nothing to add
            // Split the edge where the path leaves it: a new node takes the shared first k tokens.
            auto head = std::make_unique<node>();
            const uint32_t cut = child->ends[k - 1];
            const auto kk = static_cast<std::ptrdiff_t>(k);
            head->tokens.assign(child->tokens.begin(), child->tokens.begin() + kk);
            head->text = child->text.substr(0, cut);
            head->ends.assign(child->ends.begin(), child->ends.begin() + kk);
            head->generated.assign(child->generated.begin(), child->generated.begin() + kk);
            head->parent = at;
            head->last_used.store(now, std::memory_order_relaxed);
            child->tokens.erase(child->tokens.begin(), child->tokens.begin() + kk);
            child->text.erase(0, cut);
            child->ends.erase(child->ends.begin(), child->ends.begin() + kk);
            for (uint32_t& e : child->ends) e -= cut;
            child->generated.erase(child->generated.begin(), child->generated.begin() + kk);
            std::unique_ptr<node> tail = std::move(*slot);
            *slot = std::move(head);
            tail->parent = slot->get();
            slot->get()->children.push_back(std::move(tail));
            at = slot->get();
            break;
        }
        at = child;
    }
    if (i < path.size()) {
        // A leaf grows in place rather than getting a single child, so a conversation that only ever extends stays
        // one node.
        node* leaf = at;
        if (at == root_.get() || !at->children.empty()) {
            auto fresh = std::make_unique<node>();
            fresh->parent = at;
            leaf = fresh.get();
            at->children.push_back(std::move(fresh));
        }
        leaf->last_used.store(now, std::memory_order_relaxed);
        for (size_t j = i; j < path.size(); ++j) {
            // Another record() may have been evicted in between: pieces before `known` are looked up now.
            const std::string p = j >= known ? std::move(pieces[j - known]) : piece(path[j]);
            leaf->append(path[j], p, j >= prompt.size());
        }
        tokens_held_ += path.size() - i;
    }
    evict_to_budget();
}

void prompt_tokenizer::evict_to_budget() {
    while (tokens_held_ > opts_.token_budget) {
        // A full scan per eviction: the tree has a few nodes per cached conversation, and eviction is rare.
        node* victim = nullptr;
        uint64_t oldest = std::numeric_limits<uint64_t>::max();
        std::vector<node*> pending{root_.get()};
        while (!pending.empty()) {
            node* n = pending.back();
            pending.pop_back();
            if (n != root_.get() && n->children.empty()) {
                const uint64_t used = n->last_used.load(std::memory_order_relaxed);
                if (used < oldest) oldest = used, victim = n;
            }
            for (const auto& c : n->children) pending.push_back(c.get());
        }
        if (!victim) return;
        tokens_held_ -= victim->tokens.size();
        tokens_evicted_.fetch_add(victim->tokens.size(), std::memory_order_relaxed);
        node* parent = victim->parent;
        std::erase_if(parent->children, [&](const std::unique_ptr<node>& c) { return c.get() == victim; });
        if (parent == root_.get() || parent->children.size() != 1) continue;
        // The parent is no longer a branch: it absorbs its only child, so the walk stays one node per run.
        std::unique_ptr<node> only = std::move(parent->children.front());
        const auto base = static_cast<uint32_t>(parent->text.size());
        parent->tokens.insert(parent->tokens.end(), only->tokens.begin(), only->tokens.end());
        parent->text += only->text;
        for (const uint32_t e : only->ends) parent->ends.push_back(base + e);
        parent->generated.insert(parent->generated.end(), only->generated.begin(), only->generated.end());
        parent->last_used.store(std::max(parent->last_used.load(std::memory_order_relaxed),
                                         only->last_used.load(std::memory_order_relaxed)),
                                std::memory_order_relaxed);
        parent->children = std::move(only->children);
        for (const auto& c : parent->children) c->parent = parent;
    }
}

prompt_tokenizer::counters prompt_tokenizer::snapshot() const {
    counters c;
    c.lookups = lookups_.load(std::memory_order_relaxed);
    c.tokens_matched = tokens_matched_.load(std::memory_order_relaxed);
    c.tokens_tokenized = tokens_tokenized_.load(std::memory_order_relaxed);
    c.tokens_evicted = tokens_evicted_.load(std::memory_order_relaxed);
    std::shared_lock lock(mu_);
    c.tokens_held = tokens_held_;
    return c;
}

}  // namespace keepwarm::api

// See prompt-tokenizer.h. The index is a radix tree: each node ends a run of tokens (its edge) and keeps, per
// token, the end of its text piece in the edge's text and whether the model generated it.
#include "chat/prompt-tokenizer.h"

#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <optional>
#include <tuple>

#include "base/file-io.h"
#include "common.h"
#include "engine/text-stream.h"

namespace keepwarm {

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
    free_tree(std::move(root_));
}

void prompt_tokenizer::free_tree(std::unique_ptr<node> root) {
    // Iteratively: a long-lived index can be deeper than the stack likes.
    std::vector<std::unique_ptr<node>> pending;
    pending.push_back(std::move(root));
    while (!pending.empty()) {
        std::unique_ptr<node> n = std::move(pending.back());
        pending.pop_back();
        if (!n) continue;
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

// A path to insert: the prompt's tokens (BOS dropped), then the generated ones, and the text they spell.
struct prompt_tokenizer::path {
    std::vector<llama_token> tokens;
    size_t prompt_size = 0;           // tokens[0, prompt_size) are the prompt's
    std::string text;                 // the prompt text, then the generated tokens' texts
    std::vector<std::string> pieces;  // per generated token: its text (the model's piece, or what the client got)

    void add_generated(llama_token token, std::string piece) {
        tokens.push_back(token);
        text += piece;
        pieces.push_back(std::move(piece));
    }

    // The text of tokens[j] for a node that does not hold it yet: the vocab's piece for a prompt token, which must
    // spell the prompt text at `offset` (nullopt otherwise: the prompt is not what the text says).
    std::optional<std::string> text_of(const prompt_tokenizer& pt, size_t j, size_t offset) const {
        if (j >= prompt_size) return pieces[j - prompt_size];
        std::string p = pt.piece(tokens[j]);
        if (text.compare(offset, p.size(), p) != 0) return std::nullopt;
        return p;
    }
};

namespace {

// Whether the k-th token of `n` is tokens[j] of `p` with the same text (at `offset` in p.text).
bool same_token(const std::vector<llama_token>& tokens, const std::string& text, size_t j, size_t offset, const auto& n,
                size_t k) {
    if (n.tokens[k] != tokens[j]) return false;
    const uint32_t from = k ? n.ends[k - 1] : 0;
    return text.compare(offset, n.ends[k] - from, n.text, from, n.ends[k] - from) == 0;
}

uint32_t piece_size(const auto& n, size_t k) {
    return n.ends[k] - (k ? n.ends[k - 1] : 0);
}

}  // namespace

bool prompt_tokenizer::prompt_pieces_spell_text(const node& n) const {
    for (size_t k = 0; k < n.tokens.size(); ++k) {
        if (n.generated[k]) continue;  // a generated token's text may be what the client got (record_delivered)
        const std::string p = piece(n.tokens[k]);
        const uint32_t from = k ? n.ends[k - 1] : 0;
        if (p.size() != n.ends[k] - from || n.text.compare(from, p.size(), p) != 0) return false;
    }
    return true;
}

bool prompt_tokenizer::in_vocab(std::span<const llama_token> tokens) const {
    return std::all_of(tokens.begin(), tokens.end(), [&](llama_token t) { return t >= 0 && t < n_vocab_; });
}

prompt_tokenizer::node* prompt_tokenizer::child_along(const node& at, const path& p, size_t i, size_t offset) const {
    for (const auto& c : at.children) {
        if (same_token(p.tokens, p.text, i, offset, *c, 0)) return c.get();
    }
    return nullptr;
}

std::pair<size_t, size_t> prompt_tokenizer::matched_tokens(const path& p) const {
    const node* at = root_.get();
    size_t i = 0, offset = 0;
    while (i < p.tokens.size()) {
        node* next = child_along(*at, p, i, offset);
        if (!next) break;
        size_t k = 0;
        while (k < next->tokens.size() && i < p.tokens.size() && same_token(p.tokens, p.text, i, offset, *next, k)) {
            offset += piece_size(*next, k);
            ++k, ++i;
        }
        if (k < next->tokens.size()) break;
        at = next;
    }
    return {i, offset};
}

prompt_tokenizer::path prompt_tokenizer::prompt_path(std::string_view prompt_text,
                                                     std::span<const llama_token> prompt) const {
    // The index holds text, and BOS is not part of the rendered text: tokenize() adds it back.
    if (add_bos_ && !prompt.empty() && prompt.front() == bos_) prompt = prompt.subspan(1);
    path p;
    p.tokens.assign(prompt.begin(), prompt.end());
    p.prompt_size = p.tokens.size();
    p.text = prompt_text;
    return p;
}

void prompt_tokenizer::record(std::string_view prompt_text, std::span<const llama_token> prompt,
                              std::span<const llama_token> generated) {
    if (!indexed_ || !in_vocab(prompt) || !in_vocab(generated)) return;
    path p = prompt_path(prompt_text, prompt);
    for (const llama_token t : generated) p.add_generated(t, piece(t));
    insert(p);
}

bool prompt_tokenizer::record_delivered(std::string_view prompt_text, std::span<const llama_token> prompt,
                                        std::span<const llama_token> generated, std::string_view delivered,
                                        bool complete) {
    if (!indexed_ || !in_vocab(prompt) || !in_vocab(generated)) return false;
    // A final end of generation is not part of the answer: the template writes its own after the content.
    while (!generated.empty() && llama_vocab_is_eog(vocab_, generated.back()))
        generated = generated.first(generated.size() - 1);
    if (generated.empty()) return false;

    // What the client saw of each token, streamed: a UTF-8 character split across tokens shows with the token that
    // completes it, invalid bytes as U+FFFD. A special token may not have been shown at all.
    text_stream stream;
    std::vector<std::string> written, seen;
    for (const llama_token t : generated) {
        if (llama_vocab_get_attr(vocab_, t) &
            (LLAMA_TOKEN_ATTR_CONTROL | LLAMA_TOKEN_ATTR_USER_DEFINED | LLAMA_TOKEN_ATTR_UNKNOWN)) {
            return false;
        }
        written.push_back(piece(t));
        seen.push_back(stream.push(written.back()));
    }
    seen.back() += stream.finish();
    std::string all;
    for (const std::string& s : seen) all += s;

    // `delivered` must be `all` less whitespace at either end; for an answer cut short, less whitespace at the start
    // and anything after what was streamed.
    const auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
    std::optional<size_t> from;
    for (size_t lead = 0; lead <= all.size(); ++lead) {
        const auto rest = all.begin() + static_cast<std::ptrdiff_t>(std::min(all.size(), lead + delivered.size()));
        if (all.compare(lead, delivered.size(), delivered) == 0 && (!complete || std::all_of(rest, all.end(), space))) {
            from = lead;
            break;
        }
        if (lead == all.size() || !space(all[lead])) break;
    }
    if (!from) return false;

    // Each token keeps the part of `delivered` it produced; trimmed whitespace leaves its tokens without text. Of an
    // answer cut short, only the tokens the client got whole: the rest will not come back as they were.
    const size_t to = *from + delivered.size();
    path p = prompt_path(prompt_text, prompt);
    size_t start = 0;
    for (size_t j = 0; j < seen.size(); ++j) {
        const size_t end = start + seen[j].size();
        if (!complete && end > to) break;
        const size_t a = std::clamp(start, *from, to), b = std::clamp(end, *from, to);
        p.add_generated(generated[j], all.substr(a, b - a));
        start = end;
    }
    // A cut answer ends where the client's text does, not on a token that showed nothing (e.g. half a character).
    while (!complete && !p.pieces.empty() && p.pieces.back().empty()) {
        p.tokens.pop_back();
        p.pieces.pop_back();
    }
    if (p.pieces.empty()) return false;
    written.resize(p.pieces.size());
    if (p.pieces != written) answers_delivered_differently_.fetch_add(1, std::memory_order_relaxed);
    insert(p);
    return true;
}

void prompt_tokenizer::insert(const path& p) {
    if (p.tokens.empty()) return;
    // The pieces of what the index does not hold yet are looked up before taking the exclusive lock; usually that
    // is only the last turn. They must spell the prompt text: if not, the prompt is not this text's, and recording
    // it would make later walks return wrong tokens.
    size_t known, known_offset;
    {
        std::shared_lock lock(mu_);
        std::tie(known, known_offset) = matched_tokens(p);
    }
    std::vector<std::string> pieces;
    pieces.reserve(p.tokens.size() - known);
    for (size_t j = known, offset = known_offset; j < p.tokens.size(); ++j) {
        std::optional<std::string> t = p.text_of(*this, j, offset);
        if (!t) return;
        offset += t->size();
        pieces.push_back(std::move(*t));
    }

    std::unique_lock lock(mu_);
    const uint64_t now = tick_.fetch_add(1, std::memory_order_relaxed) + 1;
    node* at = root_.get();
    size_t i = 0, offset = 0;
    while (i < p.tokens.size()) {
        node* child = child_along(*at, p, i, offset);
        if (!child) break;
        size_t k = 0;
        while (k < child->tokens.size() && i + k < p.tokens.size() &&
               same_token(p.tokens, p.text, i + k, offset, *child, k)) {
            if (i + k >= p.prompt_size) child->generated[k] = 1;
            offset += piece_size(*child, k);
            ++k;
        }
        child->last_used.store(now, std::memory_order_relaxed);
        i += k;
        if (k < child->tokens.size()) {
            if (i == p.tokens.size()) break;  // the path ends inside this edge: nothing to add
            // Split the edge where the path leaves it: a new node takes the shared first k tokens.
            auto slot = std::find_if(at->children.begin(), at->children.end(),
                                     [&](const std::unique_ptr<node>& c) { return c.get() == child; });
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
            changes_.fetch_add(1, std::memory_order_relaxed);
            break;
        }
        at = child;
    }
    if (i < p.tokens.size()) {
        // Another record() may have been evicted in between: pieces before `known` are looked up now.
        std::vector<std::string> missing;
        for (size_t j = i, o = offset; j < known; ++j) {
            std::optional<std::string> t = p.text_of(*this, j, o);
            if (!t) return;
            o += t->size();
            missing.push_back(std::move(*t));
        }
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
        for (size_t j = i; j < p.tokens.size(); ++j) {
            const std::string& t = j < known ? missing[j - i] : pieces[j - known];
            leaf->append(p.tokens[j], t, j >= p.prompt_size);
        }
        tokens_held_ += p.tokens.size() - i;
        changes_.fetch_add(1, std::memory_order_relaxed);
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

// Saved index, version 1 (integers in the host's byte order, little-endian on every platform keepwarm builds for):
//   "KWPTIDX1", u32 version, u32 fingerprint length, fingerprint, u64 node count, then per node, parents before
//   children: u32 parent (0: the root, else 1 + its position in the file), u32 token count c (> 0), i32 tokens[c],
//   u32 ends[c], u8 generated[c], u32 text length, text; and last, u64 XXH3-64 of every byte before it.
namespace {

constexpr char index_magic[8] = {'K', 'W', 'P', 'T', 'I', 'D', 'X', '1'};
constexpr uint32_t index_version = 1;

template <typename T>
void put(std::string& out, const T& v) {
    out.append(reinterpret_cast<const char*>(&v), sizeof v);
}
template <typename T>
void put_all(std::string& out, const std::vector<T>& v) {
    out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// Reads what put() wrote; every read past the end fails instead.
class index_reader {
public:
    explicit index_reader(std::string_view in) : in_(in) {}
    template <typename T>
    bool get(T& v) {
        if (in_.size() - at_ < sizeof v) return false;
        std::memcpy(&v, in_.data() + at_, sizeof v);
        at_ += sizeof v;
        return true;
    }
    template <typename T>
    bool get_all(std::vector<T>& v, size_t n) {
        if ((in_.size() - at_) / sizeof(T) < n) return false;
        v.resize(n);
        if (n == 0) return true;  // an empty vector's data() may be null, which memcpy must not get even for 0 bytes
        std::memcpy(v.data(), in_.data() + at_, n * sizeof(T));
        at_ += n * sizeof(T);
        return true;
    }
    bool get_text(std::string& s, size_t n) {
        if (in_.size() - at_ < n) return false;
        s.assign(in_.substr(at_, n));
        at_ += n;
        return true;
    }
    bool done() const { return at_ == in_.size(); }

private:
    std::string_view in_;
    size_t at_ = 0;
};

}  // namespace

void prompt_tokenizer::save(const std::filesystem::path& file, std::string_view fingerprint) const {
    std::string out(index_magic, sizeof index_magic);
    put(out, index_version);
    put(out, static_cast<uint32_t>(fingerprint.size()));
    out.append(fingerprint);
    {
        std::shared_lock lock(mu_);
        std::vector<std::pair<const node*, uint32_t>> order;  // node, its parent's number
        std::vector<std::pair<const node*, uint32_t>> pending;
        for (const auto& c : root_->children) pending.emplace_back(c.get(), 0);
        while (!pending.empty()) {
            order.push_back(pending.back());
            pending.pop_back();
            const auto number = static_cast<uint32_t>(order.size());
            for (const auto& c : order.back().first->children) pending.emplace_back(c.get(), number);
        }
        put(out, static_cast<uint64_t>(order.size()));
        for (const auto& [n, parent] : order) {
            put(out, parent);
            put(out, static_cast<uint32_t>(n->tokens.size()));
            put_all(out, n->tokens);
            put_all(out, n->ends);
            put_all(out, n->generated);
            put(out, static_cast<uint32_t>(n->text.size()));
            out.append(n->text);
        }
    }
    put(out, static_cast<uint64_t>(XXH3_64bits(out.data(), out.size())));
    const auto bytes = std::span(reinterpret_cast<const uint8_t*>(out.data()), out.size());
    if (auto error = write_file_atomically(file, {bytes})) throw std::runtime_error(*error);
}

std::string prompt_tokenizer::load(const std::filesystem::path& file, std::string_view fingerprint) {
    std::ifstream f(file, std::ios::binary);
    if (!f) return "cannot open " + file.string();
    const std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (f.bad()) return "cannot read " + file.string();
    if (data.size() < sizeof index_magic + 8 ||
        data.compare(0, sizeof index_magic, index_magic, sizeof index_magic) != 0) {
        return "not a saved prompt index";
    }
    uint64_t checksum = 0;
    std::memcpy(&checksum, data.data() + data.size() - 8, 8);
    if (XXH3_64bits(data.data(), data.size() - 8) != checksum) return "checksum mismatch (truncated or damaged)";

    index_reader in(std::string_view(data).substr(sizeof index_magic, data.size() - sizeof index_magic - 8));
    uint32_t version = 0, fp_size = 0;
    std::string fp;
    if (!in.get(version) || version != index_version) return "format version " + std::to_string(version);
    if (!in.get(fp_size) || !in.get_text(fp, fp_size)) return "truncated header";
    if (fp != fingerprint) return "saved for another model (" + fp + ")";
    uint64_t count = 0;
    if (!in.get(count)) return "truncated header";

    auto root = std::make_unique<node>();
    std::vector<node*> numbered{root.get()};
    size_t held = 0;
    for (uint64_t i = 0; i < count; ++i) {
        uint32_t parent = 0, size = 0, text_size = 0;
        auto n = std::make_unique<node>();
        if (!in.get(parent) || !in.get(size) || !in.get_all(n->tokens, size) || !in.get_all(n->ends, size) ||
            !in.get_all(n->generated, size) || !in.get(text_size) || !in.get_text(n->text, text_size)) {
            return "node " + std::to_string(i) + " is cut short";
        }
        const bool consistent = parent < numbered.size() && size > 0 && in_vocab(n->tokens) &&
                                std::is_sorted(n->ends.begin(), n->ends.end()) && n->ends.back() == text_size &&
                                prompt_pieces_spell_text(*n);
        if (!consistent) return "node " + std::to_string(i) + " is inconsistent";
        n->parent = numbered[parent];
        numbered.push_back(n.get());
        held += size;
        n->parent->children.push_back(std::move(n));
    }
    if (!in.done()) return "unexpected bytes after the last node";

    std::unique_ptr<node> old;
    {
        std::unique_lock lock(mu_);
        old = std::exchange(root_, std::move(root));
        tokens_held_ = held;
        changes_.fetch_add(1, std::memory_order_relaxed);
        evict_to_budget();
    }
    free_tree(std::move(old));
    return {};
}

prompt_tokenizer::counters prompt_tokenizer::snapshot() const {
    counters c;
    c.lookups = lookups_.load(std::memory_order_relaxed);
    c.tokens_matched = tokens_matched_.load(std::memory_order_relaxed);
    c.tokens_tokenized = tokens_tokenized_.load(std::memory_order_relaxed);
    c.tokens_evicted = tokens_evicted_.load(std::memory_order_relaxed);
    c.answers_delivered_differently = answers_delivered_differently_.load(std::memory_order_relaxed);
    std::shared_lock lock(mu_);
    c.tokens_held = tokens_held_;
    return c;
}

}  // namespace keepwarm

// Tokenizes rendered prompts by reusing the token ids of text the model has recently seen or written, so that an
// agent's 40K-token prompt costs microseconds instead of a full tokenization, and the model's own generated ids
// come back unchanged when its answer returns as history (re-tokenizing that text can split it differently, and
// the KV cache, keyed by token ids, would miss from there on).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "llama.h"

namespace keepwarm::api {

// An index of recently used token sequences (a radix tree over token ids whose nodes also keep each token's text
// piece and whether the model generated it), walked by TEXT.
//
// tokenize(text) follows the longest path whose pieces spell a prefix of `text`, then keeps the matched tokens up
// to the last "resume point" and tokenizes only the text after it. Resume points:
//   - a special token (control or user-defined, e.g. <|im_start|>, <tool_call>): llama.cpp cuts the text at those
//     before any BPE merge, so what follows tokenizes the same on its own. Only tokens whose text cannot overlap
//     another special token's text are used, and none with lstrip/rstrip, or the cut could fall elsewhere;
//   - a token the model generated: its split is the one the KV cache holds, and the one we want back.
// Without generated tokens on the matched path the result is exactly common_tokenize(vocab, text, true, true).
// That guarantee is checked for BPE vocabs only (Qwen2, Qwen3.5, and the other BPE vocabs in llama.cpp's tree);
// for other vocab types (SPM prefixes a space after every special token, which the text does not contain; UGM,
// WPM, RWKV, ... normalize text) and for vocabs that append EOS, tokenize() always runs the full tokenization and
// record() does nothing (see indexed()).
//
// Bounded by a token budget: when it is exceeded, the least recently used leaves go first.
// Why not cache/prefix-tree.h: that tree is the engine's KV index, walked by token ids; this one is walked by text
// and keeps per-token pieces and flags that its edge splits and merges must carry along.
//
// Threading: every member may be called from any number of threads at once. tokenize() takes a shared lock only
// while it walks the index (the tokenization of the unmatched rest runs unlocked); record() takes the exclusive
// lock only to insert and evict. The vocab must outlive the tokenizer.
class prompt_tokenizer {
public:
    struct options {
        size_t token_budget = size_t{4} << 20;  // tokens kept in the index (~14 bytes each with their text)
    };

    struct counters {
        uint64_t lookups = 0;           // tokenize() calls
        uint64_t tokens_matched = 0;    // tokens taken from the index
        uint64_t tokens_tokenized = 0;  // tokens produced by running the vocab's tokenizer
        uint64_t tokens_evicted = 0;    // tokens dropped to stay within the budget
        size_t tokens_held = 0;         // tokens in the index now
    };

    explicit prompt_tokenizer(const llama_vocab* vocab);
    prompt_tokenizer(const llama_vocab* vocab, options opts);
    ~prompt_tokenizer();
    prompt_tokenizer(const prompt_tokenizer&) = delete;
    prompt_tokenizer& operator=(const prompt_tokenizer&) = delete;

    // `text` is a whole rendered prompt; the result is what the model gets, BOS included when the vocab adds one
    // (as common_tokenize with add_special and parse_special).
    std::vector<llama_token> tokenize(const std::string& text);

    // Adds prompt + generated as one path; `generated` tokens are flagged as the model's own. `prompt` should come
    // from tokenize() (or common_tokenize): prompt tokens are trusted to be the canonical tokenization of their text.
    // Token ids outside the vocab make the call a no-op.
    void record(std::span<const llama_token> prompt, std::span<const llama_token> generated);

    counters snapshot() const;
    // False when this vocab type cannot guarantee the result above: every tokenize() is a full tokenization.
    bool indexed() const { return indexed_; }

private:
    struct node;
    struct walk_result;

    std::string piece(llama_token token) const;
    bool resume_after(const node& n, size_t i) const;
    walk_result walk_text(std::string_view text) const;              // caller holds mu_ (shared)
    size_t matched_tokens(std::span<const llama_token> path) const;  // caller holds mu_ (shared)
    void evict_to_budget();                                          // caller holds mu_ (exclusive)

    const llama_vocab* vocab_;
    const options opts_;
    bool indexed_ = false;
    bool add_bos_ = false;
    llama_token bos_ = LLAMA_TOKEN_NULL;
    int32_t n_vocab_ = 0;
    std::vector<bool> safe_special_;  // per token id: text after it tokenizes independently (read-only after init)

    mutable std::shared_mutex mu_;
    std::unique_ptr<node> root_;  // guarded by mu_
    size_t tokens_held_ = 0;      // guarded by mu_

    mutable std::atomic<uint64_t> tick_{0};  // recency clock for eviction
    std::atomic<uint64_t> lookups_{0};
    std::atomic<uint64_t> tokens_matched_{0};
    std::atomic<uint64_t> tokens_tokenized_{0};
    std::atomic<uint64_t> tokens_evicted_{0};
};

}  // namespace keepwarm::api

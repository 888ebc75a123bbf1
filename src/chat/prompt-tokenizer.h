// Tokenizes rendered prompts by reusing the token ids of text the model has recently seen or written, so that an
// agent's 40K-token prompt costs microseconds instead of a full tokenization, and the model's own generated ids
// come back unchanged when its answer returns as history (re-tokenizing that text can split it differently, and
// the KV cache, keyed by token ids, would miss from there on).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "llama.h"

namespace keepwarm {

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
// A generated span can be held twice: under the text the model wrote, and under the text the client received when
// that differs (see record_delivered()). A node's pieces then spell the client's text while its tokens stay the
// model's, so the path is matched, and inserted, by token id AND text.
//
// Bounded by a token budget: when it is exceeded, the least recently used leaves go first. save()/load() carry the
// index across a restart, so an answer carried back after it still matches the KV cache restored from disk.
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
        // record_delivered() calls whose text differed from what the model wrote (trimmed, bytes replaced)
        uint64_t answers_delivered_differently = 0;
        size_t tokens_held = 0;  // tokens in the index now
    };

    explicit prompt_tokenizer(const llama_vocab* vocab);
    prompt_tokenizer(const llama_vocab* vocab, options opts);
    ~prompt_tokenizer();
    prompt_tokenizer(const prompt_tokenizer&) = delete;
    prompt_tokenizer& operator=(const prompt_tokenizer&) = delete;

    // `text` is a whole rendered prompt; the result is what the model gets, BOS included when the vocab adds one
    // (as common_tokenize with add_special and parse_special).
    std::vector<llama_token> tokenize(const std::string& text);

    // Adds prompt + generated as one path; `generated` tokens are flagged as the model's own. `prompt` must come from
    // tokenize(prompt_text) (or be common_tokenize's result for it): the text tells which of two paths with the same
    // token ids (the model's text and the client's, see record_delivered) the prompt followed. Token ids outside the
    // vocab, or prompt tokens whose pieces do not spell `prompt_text`, make the call a no-op.
    void record(std::string_view prompt_text, std::span<const llama_token> prompt,
                std::span<const llama_token> generated);

    // The answer as the client received it. A chat client gets the parsed content, which can differ from what the
    // model wrote: the output parser trims whitespace at both ends (the model wrote " Sure", the client got "Sure")
    // and the text stream replaces invalid UTF-8 by U+FFFD. When the client sends that text back in its history,
    // re-tokenizing it gives other ids than the KV cache holds. This adds prompt + generated once more, each token
    // under the part of `delivered` it produced (empty for trimmed whitespace), so the next prompt carries the model's
    // own tokens there. `complete` false: the client went away mid-answer and got only the start of it (which it may
    // send back to have it continued); then only the tokens it got whole are added. Returns false, recording nothing,
    // when `delivered` is not such a variant of the answer (e.g. reasoning or a tool call was split off) or the
    // answer holds special tokens other than a final end of generation.
    bool record_delivered(std::string_view prompt_text, std::span<const llama_token> prompt,
                          std::span<const llama_token> generated, std::string_view delivered, bool complete = true);

    // Writes the index to `file` atomically (temporary file, fsync, rename) with a checksum and `fingerprint` (which
    // should name the vocab). Throws std::runtime_error on an I/O error.
    void save(const std::filesystem::path& file, std::string_view fingerprint) const;
    // Replaces the index by the one saved in `file`. Returns an empty string on success, otherwise why the file was
    // ignored (missing, truncated, checksum, another fingerprint or format, inconsistent): the index is then left
    // as it was. Beyond the token budget, the least recently saved leaves are evicted.
    std::string load(const std::filesystem::path& file, std::string_view fingerprint);
    // Goes up whenever the index changes: whoever saves it compares this with the value it last saved.
    uint64_t changes() const { return changes_.load(std::memory_order_relaxed); }

    counters snapshot() const;
    // False when this vocab type cannot guarantee the result above: every tokenize() is a full tokenization.
    bool indexed() const { return indexed_; }

private:
    struct node;
    struct walk_result;
    struct path;

    std::string piece(llama_token token) const;
    bool resume_after(const node& n, size_t i) const;
    walk_result walk_text(std::string_view text) const;  // caller holds mu_ (shared)
    bool in_vocab(std::span<const llama_token> tokens) const;
    // Whether each token of `n` the model did not generate has its vocab piece as its text: a loaded index must not
    // change what a prompt tokenizes to (a generated token's text may be what the client got instead).
    bool prompt_pieces_spell_text(const node& n) const;
    path prompt_path(std::string_view prompt_text, std::span<const llama_token> prompt) const;  // no generated yet
    void insert(const path& p);                                                                 // takes mu_
    // Tokens of `p` the index holds as one path (by id and text), and the text they cover. Caller holds mu_.
    std::pair<size_t, size_t> matched_tokens(const path& p) const;
    node* child_along(const node& at, const path& p, size_t i, size_t offset) const;  // caller holds mu_
    void evict_to_budget();                                                           // caller holds mu_ (exclusive)
    static void free_tree(std::unique_ptr<node> root);

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
    std::atomic<uint64_t> answers_delivered_differently_{0};
    std::atomic<uint64_t> changes_{0};
};

}  // namespace keepwarm

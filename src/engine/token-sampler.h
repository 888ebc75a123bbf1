// A request's sampler: common_sampler, except that a lazy grammar waits for its trigger words here, in time that does
// not grow with the answer.
//
// llama.cpp's lazy grammar (a tool-call grammar under tool_choice "auto") appends every generated piece to a buffer
// and, at each token, searches the whole buffer for its trigger patterns with std::regex: the engine thread's cost per
// token grows with the answer (0.5 ms a token by 8K tokens of text), and a long answer without a tool call is
// quadratic. When every trigger is a word or a token (every tool-call format of the pinned llama.cpp but gpt-oss's
// regexes), a sampler without the grammar samples until a trigger, and each new piece is checked against the words in
// a window of the last bytes. When one completes, the lazy grammar is built: the window's tokens are replayed into it
// (its own search finds the same trigger in a buffer of a few tokens, and constrains from there as it would have),
// and it is checked from then on as a plain grammar is, after the same chain. Text in a thinking block does not
// trigger, as in common: a reasoning-budget sampler built as common builds its own follows the tokens, and only what
// common's grammar would have been given is checked.
//
// A grammar (plain, or lazy past its trigger) is checked here, not inside common_sampler, so that its pass over the
// vocabulary stops at a deadline: when the chain's pick does not fit the grammar, common checks every token of the
// vocabulary against it in one call (seconds for a 1,000-value enum on a 151K vocab, on the engine thread that serves
// every slot); here the same checks go in slices, and past the deadline the sample gives up. Same tokens as common:
// the chain alone picks, the grammar checks the pick, and only a misfit pays for the whole vocabulary, as there.
// Lazy grammars with regex triggers (gpt-oss) and grammars a reasoning budget gates stay inside common_sampler.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "llama-cpp.h"
#include "sampling.h"

namespace keepwarm {

class token_sampler {
public:
    // Samples as common_sampler_init(model, params) would, except that a grammar which does not parse throws
    // std::runtime_error("failed to parse grammar") before anything is allocated (common's own throw leaks the sampler
    // chain it made: 88 bytes a bad request), and a grammar naming an engine this build lacks (llguidance, which common
    // aborts on) is refused the same.
    token_sampler(const llama_model* model, const common_params_sampling& params);

    // common_sampler_sample and common_sampler_accept. LLAMA_TOKEN_NULL: a plain grammar's checks of the vocabulary
    // passed `deadline` and were given up (nothing was sampled; the request should end).
    llama_token sample(llama_context* ctx, int idx,
                       std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max());
    void accept(llama_token token);

    // Whether a lazy grammar still waits for its trigger here (false once it took over, or when there is none).
    bool waiting_for_trigger() const { return waiting_; }

private:
    // Feeds one token the grammar would have been given; true when it completes a trigger.
    bool completes_trigger(llama_token token);
    void hand_over();

    // The pick of `sampler_` (the chain alone) if it fits the plain grammar, else the chain's pick among the tokens
    // that fit, checked slice by slice until `deadline`.
    llama_token sample_under_grammar(llama_context* ctx, int idx, std::chrono::steady_clock::time_point deadline);

    const llama_vocab* vocab_;
    common_sampler_ptr sampler_;  // samples every token
    llama_sampler_ptr grammar_;   // the grammar checked here (null: none, a lazy one not triggered, or common holds it)
    std::vector<llama_token_data> candidates_;  // the whole vocabulary, for grammar_'s slices
    std::string lazy_grammar_;     // the lazy grammar whose triggers are watched here, built when one completes
    bool waiting_ = false;         // ... and not built yet
    llama_sampler_ptr reasoning_;  // follows thinking blocks as common's own would (null: common makes none)
    std::vector<std::string> words_;
    std::vector<llama_token> trigger_tokens_;
    size_t longest_word_ = 0;
    // The last pieces the grammar would have been given: at least the longest word's length less one byte before the
    // newest piece, in whole tokens (token, piece length).
    std::string window_;
    std::vector<std::pair<llama_token, size_t>> window_tokens_;
};

using token_sampler_ptr = std::unique_ptr<token_sampler>;

}  // namespace keepwarm

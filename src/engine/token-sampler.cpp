// See token-sampler.h.
#include "engine/token-sampler.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <stdexcept>

#include "common.h"
#include "reasoning-budget.h"

namespace keepwarm {

namespace {

// Whether the lazy grammar's triggers can be watched here: words (found anywhere, as common's escaped pattern is) and
// tokens. Regex patterns stay with llama.cpp.
bool watchable(const common_params_sampling& params) {
    if (!params.grammar_lazy || params.grammar_triggers.empty()) return false;
    return std::all_of(params.grammar_triggers.begin(), params.grammar_triggers.end(), [](const auto& t) {
        return t.type == COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN ||
               (t.type == COMMON_GRAMMAR_TRIGGER_TYPE_WORD && !t.value.empty());
    });
}

// The generation prompt's tokens that common_sampler_init feeds its reasoning-budget sampler (common/sampling.cpp:
// the prompt tokenized with special tokens, less a first token that only adds a leading space).
std::vector<llama_token> generation_prompt_tokens(const llama_vocab* vocab, const std::string& generation_prompt) {
    std::vector<llama_token> out;
    if (generation_prompt.empty()) return out;
    const std::vector<llama_token> tokens = common_tokenize(vocab, generation_prompt, false, true);
    for (size_t i = 0; i < tokens.size(); ++i) {
        const std::string piece = common_token_to_piece(vocab, tokens[i], true);
        const auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
        if (i == 0 && !piece.empty() && space(piece[0]) && !space(generation_prompt[0])) continue;
        out.push_back(tokens[i]);
    }
    return out;
}

common_sampler_ptr make_common_sampler(const llama_model* model, const common_params_sampling& params) {
    common_params_sampling copy = params;  // common_sampler_init may turn backend sampling off in its argument
    common_sampler_ptr sampler(common_sampler_init(model, copy));
    if (!sampler) throw std::runtime_error("could not initialize sampling");
    return sampler;
}

}  // namespace

token_sampler::token_sampler(const llama_model* model, const common_params_sampling& params)
    : vocab_(llama_model_get_vocab(model)) {
    const std::string& grammar = common_grammar_value(params.grammar);
    if (!grammar.empty()) {
        if (grammar.starts_with("%llguidance")) throw std::runtime_error("failed to parse grammar (llguidance)");
        // A lazy grammar parses as the plain one does: the probe decides whether common_sampler_init may throw.
        llama_sampler* probe = llama_sampler_init_grammar(vocab_, grammar.c_str(), "root");
        if (!probe) throw std::runtime_error("failed to parse grammar");
        llama_sampler_free(probe);
    }
    // As common_sampler_init decides whether to make a reasoning-budget sampler (which gates a grammar).
    const bool reasoning_budget =
        !params.reasoning_budget_start.empty() && !params.reasoning_budget_end.empty() &&
        (params.grammar_lazy || params.reasoning_budget_tokens >= 0 || params.reasoning_control);
    if (!grammar.empty() && !params.grammar_lazy && !reasoning_budget) {
        common_params_sampling chain_only = params;
        chain_only.grammar = {};
        sampler_ = make_common_sampler(model, chain_only);
        grammar_.reset(llama_sampler_init_grammar(vocab_, grammar.c_str(), "root"));
        if (!grammar_) throw std::runtime_error("failed to parse grammar");
        // As common: an output-format or tool-call grammar starts past what the template already put in the prompt.
        if (common_grammar_needs_prefill(params.grammar)) {
            for (const llama_token t : generation_prompt_tokens(vocab_, params.generation_prompt)) {
                llama_sampler_accept(grammar_.get(), t);
            }
        }
        return;
    }
    if (grammar.empty() || !watchable(params)) {
        sampler_ = make_common_sampler(model, params);
        return;
    }

    common_params_sampling unconstrained = params;
    unconstrained.grammar = {};
    unconstrained.grammar_lazy = false;
    unconstrained.grammar_triggers.clear();
    sampler_ = make_common_sampler(model, unconstrained);
    // Past the trigger, common's reasoning-budget sampler is idle or done (the trigger counts only there), and done it
    // passes everything: the grammar is then checked here as a plain one is, after the same chain.
    lazy_grammar_ = grammar;
    waiting_ = true;

    if (!params.reasoning_budget_start.empty() && !params.reasoning_budget_end.empty()) {
        // As common_sampler_init makes its own for a lazy grammar.
        reasoning_.reset(common_reasoning_budget_init(
            vocab_, {params.reasoning_budget_start}, params.reasoning_budget_end, params.reasoning_budget_forced,
            params.reasoning_budget_tokens < 0 ? INT_MAX : params.reasoning_budget_tokens));
        if (!reasoning_) throw std::runtime_error("could not initialize sampling (reasoning budget)");
        for (const llama_token t : generation_prompt_tokens(vocab_, params.generation_prompt)) {
            llama_sampler_accept(reasoning_.get(), t);
        }
    }
    for (const auto& t : params.grammar_triggers) {
        if (t.type == COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN) {
            trigger_tokens_.push_back(t.token);
        } else {
            words_.push_back(t.value);
            longest_word_ = std::max(longest_word_, t.value.size());
        }
    }
}

llama_token token_sampler::sample(llama_context* ctx, int idx, std::chrono::steady_clock::time_point deadline) {
    if (grammar_) return sample_under_grammar(ctx, idx, deadline);
    return common_sampler_sample(sampler_.get(), ctx, idx);
}

llama_token token_sampler::sample_under_grammar(llama_context* ctx, int idx,
                                                std::chrono::steady_clock::time_point deadline) {
    // common_sampler_sample's steps with the grammar apart: the chain picks; a pick that fits is the answer.
    const llama_token pick = common_sampler_sample(sampler_.get(), ctx, idx);
    llama_token_data single{pick, 1.0f, 0.0f};
    llama_token_data_array one{&single, 1, -1, false};
    llama_sampler_apply(grammar_.get(), &one);
    if (single.logit != -INFINITY) return pick;

    // Else the grammar rules out what does not fit, over the whole vocabulary, then the chain picks again. Each
    // token's check is independent of the others', so slices give what one call would.
    const float* logits = llama_get_logits_ith(ctx, idx);
    const auto n = static_cast<size_t>(llama_vocab_n_tokens(vocab_));
    candidates_.resize(n);
    for (size_t i = 0; i < n; ++i) candidates_[i] = {static_cast<llama_token>(i), logits[i], 0.0f};
    // A slice costs about 4% of a pass over a 151K vocabulary: the deadline is overrun by at most that.
    constexpr size_t slice = 6144;
    for (size_t at = 0; at < n; at += slice) {
        if (at > 0 && std::chrono::steady_clock::now() > deadline) return LLAMA_TOKEN_NULL;
        llama_token_data_array part{candidates_.data() + at, std::min(slice, n - at), -1, false};
        llama_sampler_apply(grammar_.get(), &part);
    }
    llama_token_data_array all{candidates_.data(), n, -1, false};
    llama_sampler_apply(common_sampler_get(sampler_.get()), &all);
    if (all.selected < 0) throw std::runtime_error("no token fits the grammar");  // common would abort here
    return all.data[all.selected].id;
}

void token_sampler::accept(llama_token token) {
    if (grammar_) llama_sampler_accept(grammar_.get(), token);  // before the chain, as common_sampler_accept does
    common_sampler_accept(sampler_.get(), token, true);
    if (!waiting_) return;
    // What common_sampler_accept gives the grammar: the token, unless a thinking block is open; at the block's end,
    // the end sequence.
    std::vector<llama_token> given;
    bool to_grammar = true;
    if (reasoning_) {
        const common_reasoning_budget_state before = common_reasoning_budget_get_state(reasoning_.get());
        to_grammar = before == REASONING_BUDGET_IDLE || before == REASONING_BUDGET_DONE;
        llama_sampler_accept(reasoning_.get(), token);
        if (!to_grammar && common_reasoning_budget_get_state(reasoning_.get()) == REASONING_BUDGET_DONE) {
            if (const llama_tokens* end = common_reasoning_budget_get_end_match(reasoning_.get())) given = *end;
        }
    }
    if (to_grammar) given.push_back(token);
    for (const llama_token t : given) {
        if (completes_trigger(t)) {
            hand_over();
            return;
        }
    }
}

bool token_sampler::completes_trigger(llama_token token) {
    if (std::find(trigger_tokens_.begin(), trigger_tokens_.end(), token) != trigger_tokens_.end()) {
        window_.clear();
        window_tokens_.assign(1, {token, 0});
        return true;
    }
    if (words_.empty()) return false;
    const std::string piece = common_token_to_piece(vocab_, token, true);
    const size_t before = window_.size();
    window_ += piece;
    window_tokens_.emplace_back(token, piece.size());
    for (const std::string& word : words_) {
        // Earlier text held no trigger: a new one ends in this piece.
        const size_t from = before >= word.size() - 1 ? before - (word.size() - 1) : 0;
        if (window_.find(word, from) != std::string::npos) return true;
    }
    size_t drop = 0;
    size_t dropped_bytes = 0;
    while (drop + 1 < window_tokens_.size() &&
           window_.size() - dropped_bytes - window_tokens_[drop].second >= longest_word_ - 1) {
        dropped_bytes += window_tokens_[drop].second;
        ++drop;
    }
    window_.erase(0, dropped_bytes);
    window_tokens_.erase(window_tokens_.begin(), window_tokens_.begin() + static_cast<std::ptrdiff_t>(drop));
    return false;
}

void token_sampler::hand_over() {
    // The lazy grammar as common builds it; its own search finds the trigger among these (it holds no other: each
    // token was checked) and replays from its first byte, a token's partial piece included.
    std::vector<std::string> patterns;
    for (const std::string& word : words_) patterns.push_back(regex_escape(word));
    std::vector<const char*> patterns_c;
    for (const std::string& p : patterns) patterns_c.push_back(p.c_str());
    grammar_.reset(llama_sampler_init_grammar_lazy_patterns(vocab_, lazy_grammar_.c_str(), "root", patterns_c.data(),
                                                            patterns_c.size(), trigger_tokens_.data(),
                                                            trigger_tokens_.size()));
    if (!grammar_) throw std::runtime_error("failed to parse grammar");
    for (const auto& [token, bytes] : window_tokens_) llama_sampler_accept(grammar_.get(), token);
    // The chain saw every token and goes on as it is (random generator, penalties, DRY).
    waiting_ = false;
    reasoning_.reset();
    window_.clear();
    window_tokens_.clear();
}

}  // namespace keepwarm

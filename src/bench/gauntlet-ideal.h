// The gauntlet's ideal prefill: how many prompt tokens a perfect prefix cache would compute for each request, from
// the requests with the killers the bench injected taken out (see gauntlet-conversation.h), rendered and tokenized
// the way keepwarm does (chat_renderer + prompt_tokenizer over the model's vocab).
// Threading: one thread at a time.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "bench/gauntlet-conversation.h"
#include "bench/gauntlet-workload.h"
#include "llama.h"

namespace keepwarm {
class chat_renderer;
class prompt_tokenizer;
}  // namespace keepwarm

namespace keepwarm::bench::gauntlet {

// Every token sequence a perfect cache would hold so far, and how much of a new prompt they cover.
class token_history {
public:
    // The longest prefix of `tokens` that is also a prefix of a sequence added before.
    size_t shared_prefix(std::span<const llama_token> tokens) const;
    void add(std::vector<llama_token> tokens);

private:
    std::vector<std::vector<llama_token>> seen_;
};

struct ideal_count {
    size_t prompt_tokens = 0;
    size_t new_tokens = 0;  // past the longest shared prefix; at least 1 (the last prompt token is always computed)
    std::string error;      // the body could not be rendered (then both counts are 0)
};

class ideal_prefill {
public:
    // Loads the model's vocab and chat template only (vocab_only). Throws std::runtime_error when it can't.
    explicit ideal_prefill(const std::string& model_path);
    ~ideal_prefill();
    ideal_prefill(const ideal_prefill&) = delete;
    ideal_prefill& operator=(const ideal_prefill&) = delete;

    // Counts one normalized request, then remembers its prompt, and its prompt followed by `answer` (rendered as
    // the continuation of an assistant message with that text and reasoning), for the requests after it.
    ideal_count add(const json& normalized_body, wire_api api, const assistant_answer& answer);
    // Tokens of a text, as the generator sizes its prompts (no BOS, specials as text).
    size_t count_tokens(const std::string& text) const;
    // A new, empty history (the next target starts from an empty server).
    void reset() { history_ = {}; }

private:
    struct model_handle;
    std::unique_ptr<model_handle> model_;
    std::unique_ptr<chat_renderer> renderer_;
    std::unique_ptr<prompt_tokenizer> tokenizer_;
    token_history history_;
};

}  // namespace keepwarm::bench::gauntlet

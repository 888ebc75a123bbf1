// See gauntlet-ideal.h.
#include "bench/gauntlet-ideal.h"

#include <algorithm>
#include <stdexcept>

#include "api/anthropic-api.h"
#include "api/openai-api.h"
#include "chat/chat-renderer.h"
#include "chat/prompt-tokenizer.h"
#include "common.h"
#include "engine/llama-runtime.h"
#include "http/http-server.h"
#include "llama-cpp.h"

namespace keepwarm::bench::gauntlet {

struct ideal_prefill::model_handle {
    llama_model_ptr model;
};

size_t token_history::shared_prefix(std::span<const llama_token> tokens) const {
    size_t best = 0;
    for (const auto& seen : seen_) {
        const size_t n = std::min(seen.size(), tokens.size());
        if (n <= best) continue;
        const auto mismatch = std::mismatch(tokens.begin(), tokens.begin() + static_cast<ptrdiff_t>(n), seen.begin());
        best = std::max(best, static_cast<size_t>(mismatch.first - tokens.begin()));
    }
    return best;
}

void token_history::add(std::vector<llama_token> tokens) {
    if (!tokens.empty()) seen_.push_back(std::move(tokens));
}

ideal_prefill::ideal_prefill(const std::string& model_path) : model_(std::make_unique<model_handle>()) {
    init_llama_runtime(false);
    llama_model_params params = llama_model_default_params();
    params.vocab_only = true;  // the tokenizer and the chat template are all the ideal needs
    model_->model.reset(llama_model_load_from_file(model_path.c_str(), params));
    if (!model_->model) throw std::runtime_error(model_path + ": failed to load the model's vocabulary");
    renderer_ = std::make_unique<chat_renderer>(model_->model.get());
    tokenizer_ = std::make_unique<prompt_tokenizer>(llama_model_get_vocab(model_->model.get()));
}

ideal_prefill::~ideal_prefill() = default;

size_t ideal_prefill::count_tokens(const std::string& text) const {
    return common_tokenize(llama_model_get_vocab(model_->model.get()), text, false, false).size();
}

ideal_count ideal_prefill::add(const json& normalized_body, wire_api api, const assistant_answer& answer) {
    ideal_count count;
    std::vector<llama_token> prompt;
    std::string prompt_text;
    chat_request request;
    try {
        request = api == wire_api::anthropic ? api::anthropic::parse_messages_request(normalized_body)
                                             : api::parse_chat_request(normalized_body);
        prompt_text = renderer_->render(request).prompt;
        prompt = tokenizer_->tokenize(prompt_text);
    } catch (const std::exception& e) {
        count.error = e.what();
        return count;
    }
    count.prompt_tokens = prompt.size();
    count.new_tokens = std::max<size_t>(1, prompt.size() - history_.shared_prefix(prompt));
    tokenizer_->record(prompt_text, prompt, {});
    history_.add(prompt);

    if (answer.content.empty() && answer.reasoning.empty()) return count;
    // The prompt followed by what was generated for it, two ways; the longest match wins. First the answer's text
    // right after the prompt, as the model wrote it (a client gets it with surrounding whitespace trimmed).
    if (answer.reasoning.empty()) {
        std::vector<llama_token> with_answer = prompt;
        const auto answer_tokens =
            common_tokenize(llama_model_get_vocab(model_->model.get()), answer.content, false, false);
        with_answer.insert(with_answer.end(), answer_tokens.begin(), answer_tokens.end());
        history_.add(std::move(with_answer));
    }
    // Then the same chat with the answer as a trailing assistant message, which the template renders as a
    // continuation (no end-of-turn after it), with its own markup of reasoning.
    if (!request.messages.empty() && request.messages.back().role == "assistant") {
        request.messages.back().content += answer.content;
        request.messages.back().reasoning_content += answer.reasoning;
        request.messages.back().tool_calls.clear();
    } else {
        common_chat_msg msg;
        msg.role = "assistant";
        msg.content = answer.content;
        msg.reasoning_content = answer.reasoning;
        request.messages.push_back(std::move(msg));
    }
    try {
        history_.add(tokenizer_->tokenize(renderer_->render(request).prompt));
    } catch (const std::exception&) {
        // A template that can't continue this answer: the next request's ideal then counts the answer as new.
    }
    return count;
}

}  // namespace keepwarm::bench::gauntlet

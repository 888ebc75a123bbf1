// See prompt-preparation.h.
#include "local/prompt-preparation.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "base/request-error.h"
#include "policy/busters.h"
#include "policy/prompt-diff.h"

namespace keepwarm {

void set_prompt(const local_model& model, generation_request& gen, std::string text) {
    gen.prompt = tokenize_prompt(model, text, gen.tenant);
    gen.prompt_text = std::move(text);
}

void set_cache_hint(const local_model& model, const chat_request& chat, generation_request& gen) {
    if (!chat.hint) return;
    gen.hint_ttl = chat.hint->ttl;
    gen.hinted_tokens = static_cast<int>(gen.prompt.size());
    if (chat.hint->messages >= chat.messages.size()) return;
    const std::vector<size_t> offsets = policy::message_text_offsets(chat.messages, gen.prompt_text);
    for (size_t i = chat.hint->messages; i < offsets.size(); ++i) {
        if (offsets[i] == std::string_view::npos) continue;
        gen.hinted_tokens = policy::locate_tokens(model.llm->vocab(), gen.prompt)(offsets[i]);
        return;
    }
}

namespace {
// What an operator changes when prompts do not fit (the first request of an agent, typically: 7K-13K tokens).
std::string context_advice(const local_model& model) {
    const engine_options& o = model.llm->options();
    return "; the server's context is " + std::to_string(o.context_size) + " tokens in " + std::to_string(o.slots) +
           " slots: start it with a larger -c/--ctx-size (slot size = ctx-size / --parallel) or fewer --parallel slots";
}

// request_error 400 when `bytes` of text (`what`: " bytes" or " bytes of message text") already make more tokens than
// one slot holds, whatever they say: tokenizing takes about 2 s per MB, rendering a chat seconds for tens of MB.
void refuse_text_that_cannot_fit(const local_model& model, size_t bytes, const char* what) {
    const int limit = model.llm->slot_context_size();
    if (const size_t at_least = model.llm->min_tokens_for_text(bytes); at_least >= static_cast<size_t>(limit)) {
        // Token counts first: the Anthropic API reads the first two numbers as "N tokens > M maximum".
        throw request_error(400,
                            "the prompt has at least " + std::to_string(at_least) + " tokens but the context holds " +
                                std::to_string(limit) + " tokens per request (it has " + std::to_string(bytes) + what +
                                ", and no token stands for more than " +
                                std::to_string(model.llm->longest_piece_bytes()) + ")" + context_advice(model),
                            "exceed_context_size_error");
    }
}
}  // namespace

std::vector<llama_token> tokenize_prompt(const local_model& model, const std::string& prompt,
                                         const std::string& tenant) {
    refuse_text_that_cannot_fit(model, prompt.size(), " bytes");
    auto tokens = model.tokenizer_for(tenant).tokenize(prompt);
    if (tokens.empty()) throw request_error(400, "the prompt is empty");
    const int limit = model.llm->slot_context_size();
    if (static_cast<int>(tokens.size()) >= limit) {
        throw request_error(400,
                            "the prompt has " + std::to_string(tokens.size()) + " tokens but the context holds " +
                                std::to_string(limit) + " tokens per request" + context_advice(model),
                            "exceed_context_size_error");
    }
    return tokens;
}

void refuse_chat_that_cannot_fit(const local_model& model, const chat_request& chat) {
    // Only message text every chat template writes into the prompt counts (reasoning of earlier turns may be dropped).
    size_t bytes = 0;
    for (const common_chat_msg& m : chat.messages) {
        bytes += m.content.size();
        for (const common_chat_msg_content_part& part : m.content_parts) bytes += part.text.size();
    }
    refuse_text_that_cannot_fit(model, bytes, " bytes of message text");
}

void bind_to_vocab(const local_model& model, common_params_sampling& sampling) {
    const llama_vocab* vocab = model.llm->vocab();
    const int n_vocab = llama_vocab_n_tokens(vocab);
    for (const auto& bias : sampling.logit_bias) {
        if (bias.token >= n_vocab) {
            throw request_error(400, "'logit_bias' names token " + std::to_string(bias.token) +
                                         " but the vocabulary has " + std::to_string(n_vocab) + " tokens");
        }
    }
    if (!sampling.ignore_eos) return;
    for (const llama_token t : model.llm->eog_tokens()) sampling.logit_bias.push_back({t, -INFINITY});
}

size_t widest_alternation(const std::string& grammar) {
    size_t widest = 0;
    size_t in_rule = 0;
    bool quoted = false;
    bool bracketed = false;
    for (size_t i = 0; i < grammar.size(); ++i) {
        const char c = grammar[i];
        if ((quoted || bracketed) && c == '\\') {
            ++i;  // an escaped character, e.g. \" or \]
        } else if (quoted) {
            quoted = c != '"';
        } else if (bracketed) {
            bracketed = c != ']';
        } else if (c == '"') {
            quoted = true;
        } else if (c == '[') {
            bracketed = true;
        } else if (c == '|') {
            widest = std::max(widest, ++in_rule);
        } else if (c == '\n') {
            in_rule = 0;
        }
    }
    return widest + 1;
}

void prepare_sampling(const local_model& model, generation_request& gen, const std::string& grammar_field) {
    bind_to_vocab(model, gen.sampling);
    const engine_options& limits = model.llm->options();
    const std::string& grammar = common_grammar_value(gen.sampling.grammar);
    const std::string field = "'" + grammar_field + "'";
    if (grammar.size() > limits.grammar_max_bytes) {
        throw request_error(400, "the grammar made from " + field + " has " + std::to_string(grammar.size()) +
                                     " bytes; the server allows " + std::to_string(limits.grammar_max_bytes) +
                                     " (--max-grammar-bytes)");
    }
    const auto cannot_build = [&](const std::string& why) {
        return request_error(400, "the grammar made from " + field + " cannot be used: " + why);
    };
    if (const size_t widest = widest_alternation(grammar); widest > limits.grammar_max_alternatives) {
        throw cannot_build("one of its rules has " + std::to_string(widest) + " alternatives (e.g. an enum); the " +
                           "server allows " + std::to_string(limits.grammar_max_alternatives) +
                           " (--max-grammar-alternatives)");
    }
    try {
        gen.sampler = std::make_unique<token_sampler>(model.llm->model(), gen.sampling);
    } catch (const std::invalid_argument& e) {
        throw request_error(400, std::string("sampling parameters cannot be used: ") + e.what());
    } catch (const std::exception& e) {
        // llama.cpp's parser says why only in its log; its usual reason for a schema's grammar is a repetition bound.
        throw cannot_build(std::string(e.what()) +
                           " (e.g. a minItems, maxItems, minLength or maxLength over 2000, which llama.cpp refuses)");
    }
}

std::string grammar_field(const chat_request& chat, const common_params_sampling& sampling) {
    if (sampling.grammar.type == COMMON_GRAMMAR_TYPE_TOOL_CALLS && !chat.tools.empty()) return "tools";
    if (chat.api == "anthropic") return "output_config.format";
    if (chat.api == "ollama") return "format";
    return "response_format";
}

}  // namespace keepwarm

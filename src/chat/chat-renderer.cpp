// Chat template rendering via common_chat_templates_apply, mirroring llama-server's oaicompat_chat_params_parse and
// its sampling-side handling of template grammars, triggers, preserved tokens and thinking tags.
#include "chat/chat-renderer.h"

#include <algorithm>
#include <stdexcept>

#include "base/request-error.h"
#include "json-schema-to-grammar.h"
#include "llama.h"

namespace keepwarm {

namespace {

[[noreturn]] void fail(const std::string& message) {
    throw request_error(400, message);
}

common_chat_templates_ptr init_templates(const llama_model* model, const std::string& source, const std::string& bos,
                                         const std::string& eos) {
    if (!model && source.empty()) {
        // common asserts (aborts) on this combination instead of throwing.
        throw std::invalid_argument("a chat template source is required when there is no model");
    }
    try {
        return common_chat_templates_init(model, source, bos, eos);
    } catch (const std::exception& e) {
        throw std::runtime_error(std::string("invalid chat template: ") + e.what());
    }
}

// The bos_token / eos_token strings and add-BOS/EOS flags common_chat_templates_init derives from a model's vocab.
chat_render_cache::template_tokens model_tokens(const llama_model* model) {
    chat_render_cache::template_tokens t;
    if (!model) return t;
    const llama_vocab* vocab = llama_model_get_vocab(model);
    if (llama_vocab_bos(vocab) != LLAMA_TOKEN_NULL) t.bos = common_token_to_piece(vocab, llama_vocab_bos(vocab), true);
    if (llama_vocab_eos(vocab) != LLAMA_TOKEN_NULL) t.eos = common_token_to_piece(vocab, llama_vocab_eos(vocab), true);
    t.add_bos = llama_vocab_get_add_bos(vocab);
    t.add_eos = llama_vocab_get_add_eos(vocab);
    return t;
}

// The word that makes the lazy tool-call grammar fire when tools are optional: the template's tool-call start marker.
std::string probe_tool_call_marker(const common_chat_templates* templates) {
    common_chat_templates_inputs in;
    common_chat_msg user;
    user.role = "user";
    user.content = "probe";
    in.messages = {user};
    common_chat_tool tool;
    tool.name = "probe";
    tool.parameters = R"({"type": "object", "properties": {}})";
    in.tools = {tool};
    in.tool_choice = COMMON_CHAT_TOOL_CHOICE_AUTO;
    in.enable_thinking = false;
    try {
        for (const auto& trigger : common_chat_templates_apply(templates, in).grammar_triggers) {
            if (trigger.type == COMMON_GRAMMAR_TRIGGER_TYPE_WORD) return trigger.value;
        }
    } catch (const std::exception&) {
    }
    return {};
}

}  // namespace

chat_renderer::chat_renderer(const llama_model* model, const std::string& template_override)
    : templates_(init_templates(model, template_override, "", "")),
      cache_(std::make_unique<chat_render_cache>(templates_.get(), model_tokens(model))) {
    init_caps();
}

chat_renderer::chat_renderer(const std::string& template_source, const std::string& bos_token,
                             const std::string& eos_token)
    : templates_(init_templates(nullptr, template_source, bos_token, eos_token)),
      cache_(std::make_unique<chat_render_cache>(templates_.get(),
                                                 chat_render_cache::template_tokens{bos_token, eos_token})) {
    init_caps();
}

chat_renderer::~chat_renderer() = default;

void chat_renderer::init_caps() {
    auto c = caps();
    supports_parallel_tool_calls_ = c["supports_parallel_tool_calls"];
    try {
        // Renders a probe conversation; a template that cannot even do that simply gets no thinking mode.
        supports_thinking_ = common_chat_templates_support_enable_thinking(templates_.get());
    } catch (const std::exception&) {
        supports_thinking_ = false;
    }
    tool_call_marker_ = probe_tool_call_marker(templates_.get());
}

std::map<std::string, bool> chat_renderer::caps() const {
    return common_chat_templates_get_caps(templates_.get());
}

std::string chat_renderer::source() const {
    return common_chat_templates_source(templates_.get());
}

chat_renderer::rendered chat_renderer::render(const chat_request& request) const {
    common_chat_templates_inputs in;
    in.messages = request.messages;
    in.tools = request.tools;
    in.tool_choice = request.tool_choice;
    in.parallel_tool_calls = request.parallel_tool_calls.value_or(supports_parallel_tool_calls_);
    in.json_schema = request.json_schema;
    in.use_jinja = true;
    in.reasoning_format = COMMON_REASONING_FORMAT_DEEPSEEK;
    in.enable_thinking = request.enable_thinking.value_or(supports_thinking_);
    in.add_generation_prompt = true;
    // llama-server's default: templates that would drop earlier turns' reasoning keep it, so the history re-renders
    // exactly as it was generated and the KV cache stays reusable. A request may still turn it off.
    in.chat_template_kwargs["preserve_reasoning"] = "true";
    for (const auto& [key, value] : request.chat_template_kwargs) {
        in.chat_template_kwargs[key] = value;
    }

    rendered r;
    // A trailing assistant message is a prefill to continue (llama-server's default --prefill-assistant).
    if (!in.messages.empty() && in.messages.back().role == "assistant") {
        const size_t n = in.messages.size();
        if (n >= 2 && in.messages[n - 2].role == "assistant") {
            fail("'messages' cannot end with two assistant messages");
        }
        if (!in.messages.back().tool_calls.empty()) {
            fail("'messages' cannot end with an assistant message that has tool calls (its tool results are missing)");
        }
        in.continue_final_message = COMMON_CHAT_CONTINUATION_AUTO;
        in.add_generation_prompt = false;
        r.continuation = true;
    } else if (in.tool_choice == COMMON_CHAT_TOOL_CHOICE_REQUIRED && !in.tools.empty() && !tool_call_marker_.empty()) {
        // The template's grammar lets text come first and ends only with a call, so a model may write until its limit
        // and never call: the answer starts with the marker instead, which leaves no room for a reasoning block.
        // Thinking on by default gives way; thinking the request asked for is a 400, as Anthropic's own API answers
        // a forced tool with extended thinking.
        if (in.enable_thinking && supports_thinking_) {
            if (request.enable_thinking.value_or(false)) {
                const char* thinking = request.api == "anthropic" ? "'thinking'"
                                       : request.api == "ollama"  ? "'think'"
                                                                  : "'chat_template_kwargs.enable_thinking'";
                fail(std::string("a required tool call cannot be enforced with thinking on: the answer must start "
                                 "with the call. Turn ") +
                     thinking + " off, or let the model choose (tool_choice auto)");
            }
            in.enable_thinking = false;
        }
        common_chat_msg start;
        start.role = "assistant";
        start.content = tool_call_marker_;
        in.messages.push_back(std::move(start));
        in.continue_final_message = COMMON_CHAT_CONTINUATION_AUTO;
        in.add_generation_prompt = false;
        r.continuation = true;
        r.tool_call_prefilled = true;
    }

    if (auto spliced = cache_->render(in)) {
        r.params = std::move(*spliced);
    } else {
        try {
            r.params = common_chat_templates_apply(templates_.get(), in);
        } catch (const request_error&) {
            throw;
        } catch (const std::exception& e) {
            fail(std::string("chat template error: ") + e.what());
        }
        cache_->remember(in, r.params);
    }
    r.prompt = std::move(r.params.prompt);  // one copy of it: rendered::prompt

    if (!r.params.grammar.empty()) {
        // Template grammars start at the generation prompt, so they are typed tool_calls: the sampler feeds the
        // generation prompt through them first (llama-server does the same for response-format grammars).
        r.grammar = common_grammar(COMMON_GRAMMAR_TYPE_TOOL_CALLS, r.params.grammar);
    } else if (!request.json_schema.empty()) {
        try {
            r.grammar = common_grammar(COMMON_GRAMMAR_TYPE_USER,
                                       json_schema_to_grammar(common_json::parse(request.json_schema)));
        } catch (const std::exception& e) {
            const char* field = request.api == "anthropic" ? "output_config.format"
                                : request.api == "ollama"  ? "format"
                                                           : "response_format";
            fail("'" + std::string(field) + "' schema cannot be used: " + e.what());
        }
    }

    r.stop = request.stop;
    for (const auto& s : r.params.additional_stops) {
        if (!s.empty() && std::find(r.stop.begin(), r.stop.end(), s) == r.stop.end()) {
            r.stop.push_back(s);
        }
    }
    return r;
}

void chat_renderer::apply_to_sampling(const rendered& r, common_params_sampling& sampling, const llama_vocab* vocab) {
    const common_chat_params& p = r.params;
    sampling.generation_prompt = p.generation_prompt;
    sampling.grammar_lazy = false;
    sampling.grammar_triggers.clear();
    if (!r.grammar.empty()) {
        sampling.grammar = r.grammar;
        sampling.grammar_lazy = r.grammar.type == COMMON_GRAMMAR_TYPE_TOOL_CALLS && p.grammar_lazy;
    }

    if (vocab) {
        for (const auto& t : p.preserved_tokens) {
            auto ids = common_tokenize(vocab, t, false, true);
            if (ids.size() == 1) {
                sampling.preserved_tokens.insert(ids[0]);
            }
        }
    }
    for (const auto& trigger : p.grammar_triggers) {
        if (vocab && trigger.type == COMMON_GRAMMAR_TRIGGER_TYPE_WORD) {
            // A trigger word that is one preserved special token fires on that token id, as in llama-server.
            auto ids = common_tokenize(vocab, trigger.value, false, true);
            if (ids.size() == 1 && sampling.preserved_tokens.count(ids[0])) {
                common_grammar_trigger t;
                t.type = COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN;
                t.value = trigger.value;
                t.token = ids[0];
                sampling.grammar_triggers.push_back(std::move(t));
                continue;
            }
        }
        sampling.grammar_triggers.push_back(trigger);
    }

    // The thinking tags let the sampler keep a lazy tool-call grammar from firing inside the reasoning block
    // (llama-server passes them with an unlimited budget).
    if (vocab && !p.thinking_end_tags.empty() && !p.thinking_start_tag.empty()) {
        sampling.reasoning_budget_start = common_tokenize(vocab, p.thinking_start_tag, false, true);
        sampling.reasoning_budget_end.clear();
        for (const auto& tag : p.thinking_end_tags) {
            if (!tag.empty()) {
                sampling.reasoning_budget_end.push_back(common_tokenize(vocab, tag, false, true));
            }
        }
        if (!sampling.reasoning_budget_end.empty()) {
            sampling.reasoning_budget_forced = sampling.reasoning_budget_end.front();
        }
    }
}

common_chat_parser_params chat_renderer::parser_params(const rendered& r, const chat_request& request) const {
    common_chat_parser_params p(r.params);
    p.reasoning_format = COMMON_REASONING_FORMAT_DEEPSEEK;
    p.reasoning_in_content = false;
    p.parse_tool_calls = !request.tools.empty() && request.tool_choice != COMMON_CHAT_TOOL_CHOICE_NONE;
    p.is_continuation = r.continuation;
    if (!r.params.parser.empty()) {
        p.parser.load(r.params.parser);
    }
    return p;
}

}  // namespace keepwarm

// Turns a parsed chat_request into the prompt text plus everything generation needs (grammar, triggers, stops,
// parser config), using the model's Jinja chat template through llama.cpp common's chat API, like llama-server.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "chat.h"
#include "chat/chat-render-cache.h"
#include "chat/chat-request.h"
#include "common.h"

struct llama_model;
struct llama_vocab;

namespace keepwarm {

class chat_renderer {
public:
    // The model's own template, or `template_override` (Jinja source, or "chatml") when non-empty.
    // Throws std::runtime_error when the template cannot be parsed, std::invalid_argument without model and template.
    explicit chat_renderer(const llama_model* model, const std::string& template_override = "");
    // Without a model (tests, tools): the template source and the strings for bos_token / eos_token.
    chat_renderer(const std::string& template_source, const std::string& bos_token, const std::string& eos_token);
    ~chat_renderer();
    chat_renderer(const chat_renderer&) = delete;
    chat_renderer& operator=(const chat_renderer&) = delete;

    struct rendered {
        std::string prompt;         // text to tokenize (with parse_special); bos is NOT included when the model adds it
        common_chat_params params;  // grammar, triggers, preserved tokens, parser, generation prompt, ... (its prompt
                                    // moved to `prompt`)
        // What constrains sampling: the template's grammar (typed tool_calls), or for a response_format the template
        // did not handle, a plain JSON-schema grammar (typed user, so no generation-prompt prefill). Often empty.
        common_grammar grammar;
        std::vector<std::string> stop;  // request stops + the template's additional stops
        bool continuation = false;      // trailing assistant message is being continued (prefill)
        // The answer was started with the template's tool-call marker so that a required tool call comes first
        // (see render()); the marker is not part of the returned message's text.
        bool tool_call_prefilled = false;
    };

    // Applies the template. A trailing assistant message (without tool calls) is continued rather than answered,
    // like llama-server's default prefill. A required tool call (tool_choice required/any/a named tool) starts the
    // answer with the template's tool-call marker, as Anthropic documents for tool_choice any/tool: the template
    // grammars allow free text before the marker, and a model may never reach it. Thinking on by default is turned off
    // for it; thinking the request asked for is a 400 (Anthropic's API refuses the same). Template/render errors throw
    // request_error 400 with the message. The result is always common_chat_templates_apply's; a chat that extends a
    // recently rendered one is spliced from it (see chat-render-cache.h), which makes a 40K-token agent turn ~1 ms
    // instead of ~150 ms. Thread-safe.
    rendered render(const chat_request& request) const;

    // Sets grammar (rendered.grammar), grammar_lazy, grammar_triggers and generation_prompt. With a vocab it also maps
    // preserved tokens to ids and single-token trigger words to token triggers (llama-server's logic); without one,
    // preserved tokens are left to the caller and triggers stay words.
    static void apply_to_sampling(const rendered& r, common_params_sampling& sampling,
                                  const llama_vocab* vocab = nullptr);

    // Parser configuration for chat_output_parser: the template's PEG parser, reasoning_format deepseek
    // (reasoning goes to reasoning_content), tool-call parsing when tools are active.
    common_chat_parser_params parser_params(const rendered& r, const chat_request& request) const;

    // Whether the template has a thinking mode; also the default for enable_thinking when the request leaves it unset.
    bool supports_thinking() const { return supports_thinking_; }
    // Template capabilities as common reports them (supports_tools, supports_parallel_tool_calls, ...).
    std::map<std::string, bool> caps() const;
    // The template source actually used.
    std::string source() const;
    // What the template's output starts a tool call with (e.g. "<tool_call>"), or "" if it has no such marker.
    const std::string& tool_call_marker() const { return tool_call_marker_; }

    // How often render() was spliced from an earlier render, and the render cache's other counters.
    chat_render_cache::counters render_stats() const { return cache_->stats(); }

private:
    void init_caps();

    common_chat_templates_ptr templates_;
    std::unique_ptr<chat_render_cache> cache_;
    bool supports_thinking_ = false;
    bool supports_parallel_tool_calls_ = false;
    std::string tool_call_marker_;
};

}  // namespace keepwarm

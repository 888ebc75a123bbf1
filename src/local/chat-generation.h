// One chat request's trip through the local engine, the same for every API (OpenAI, Anthropic, Ollama): the API's
// routes parse their body into a chat_request, and this renders it with the model's chat template, tokenizes it,
// submits it, and turns the generated text into message deltas (content, reasoning, tool calls) through the
// template's output parser. The routes only format what comes back in their API's shape.
// Threading: a chat_generation is used by its route's own thread.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/frontend-context.h"
#include "backend/generation-source.h"
#include "chat/chat-output-parser.h"
#include "chat/chat-renderer.h"
#include "chat/chat-request.h"
#include "engine/generation.h"
#include "http/http-server.h"
#include "local/generation-relay.h"
#include "local/local-model.h"

namespace keepwarm {

// Opens chat_generations on this server's engine.
generation_opener local_generation(frontend_context& front, local_model& model);

// count_tokens on this server: the policy as for counting, then this model's template and prompt tokenizer.
token_counter local_token_counter(frontend_context& front, local_model& model);

// The render routes' chat prompts on this server: the token ids a chat_generation would submit (prompt_of).
chat_prompt_renderer local_chat_prompt(frontend_context& front, local_model& model);

// The local engine's generation_source.
class chat_generation final : public generation_source {
public:
    // Applies the policy (see policy/policy.h), then renders, tokenizes and submits. Throws request_error (4xx) when
    // the request cannot be served; nothing has been sent to the client then. `id` names the request in the log. A
    // health ping the policy absorbs is answered by next() without rendering, the engine, a slot or the cache.
    chat_generation(frontend_context& front, local_model& model, const http::request& req, chat_request chat,
                    const request_clock& clock, http::response_writer& w, std::string id);

    ~chat_generation() override;
    chat_generation(const chat_generation&) = delete;
    chat_generation& operator=(const chat_generation&) = delete;

    std::optional<update> next() override;
    const common_chat_msg& message() const override { return ping_ ? ping_->message() : parser_->message(); }
    const chat_request& request() const override { return chat_; }
    const std::string& id() const override { return id_; }
    int prompt_tokens() const override { return static_cast<int>(gen_->prompt.size()); }
    bool continuation() const override { return rendered_.continuation; }
    const http::header_list& response_headers() const override { return headers_; }

    // Applies the policy, renders and tokenizes without generating: what the model would read for `chat`, in tokens.
    // `tenant`: whose prompt index to use.
    static int count_prompt_tokens(const frontend_context& front, const local_model& model, const chat_request& chat,
                                   const std::string& tenant = {});

    // The token ids the constructor would submit for `chat` from `req`, without generating: the policy with the
    // request's client, headers and tenant (as for counting: never a ping, no note remembered, no rule adopted), the
    // template, and the tenant's prompt tokenizer, which keeps the ids the model generated for answers that come back
    // as history. Throws request_error as the constructor does.
    static std::vector<llama_token> prompt_of(const frontend_context& front, const local_model& model,
                                              const http::request& req, chat_request chat);

private:
    // The policy as for counting (with `origin`), the fit check, the template and `tenant`'s prompt tokenizer.
    static std::vector<llama_token> counted_prompt(const frontend_context& front, const local_model& model,
                                                   chat_request chat, const policy::request_origin& origin,
                                                   const std::string& tenant);
    void record_delivered(const std::vector<llama_token>& generated, const common_chat_msg& answer, bool complete);

    frontend_context& front_;
    local_model& model_;
    chat_request chat_;
    std::shared_ptr<generation_request> gen_ = std::make_shared<generation_request>();
    std::string id_;
    chat_renderer::rendered rendered_;
    http::header_list headers_;
    std::optional<generation_relay> relay_;
    std::optional<chat_output_parser> parser_;
    std::optional<policy::cache_buster_report> buster_;  // a span that may have cost this prompt its cached prefix
    std::optional<ping_answer> ping_;                    // set for an absorbed ping: the whole answer
};

}  // namespace keepwarm

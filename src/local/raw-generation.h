// A raw completion on the local engine (OpenAI's /v1/completions, llama-server's /completion and /infill, Ollama's
// /api/generate with raw=true): after the policy call every raw completion goes through (apply_raw_completion_policy),
// the prompt text (or llama-server's mix of text and token ids) is tokenized as is, without a chat template, submitted,
// and the generated text comes back as plain content deltas.
// Threading: a raw_generation is used by its route's own thread.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "backend/frontend-context.h"
#include "backend/generation-source.h"
#include "engine/generation.h"
#include "http/http-server.h"
#include "local/generation-relay.h"
#include "local/local-model.h"

namespace keepwarm {

class raw_generation final : public generation_source {
public:
    // Applies the policy, then tokenizes, checks sampling (a JSON schema in raw.params becomes the grammar) and
    // submits. Throws request_error (4xx) when the request cannot be served; nothing has been sent to the client then.
    raw_generation(frontend_context& front, local_model& model, const http::request& req, raw_completion raw,
                   const request_clock& clock, http::response_writer& w, std::string id);

    std::optional<update> next() override;
    const common_chat_msg& message() const override { return message_; }
    const chat_request& request() const override { return params_; }
    const std::string& id() const override { return id_; }
    int prompt_tokens() const override { return static_cast<int>(gen_->prompt.size()); }
    bool continuation() const override { return false; }
    const http::header_list& response_headers() const override { return headers_; }
    std::string prompt_text() const override { return gen_->prompt_text; }

private:
    chat_request params_;
    std::shared_ptr<generation_request> gen_ = std::make_shared<generation_request>();
    std::string id_;
    http::header_list headers_;
    common_chat_msg message_;  // the generated text so far, as content
    std::optional<generation_relay> relay_;
};

// The render routes' raw prompts on this server: the token ids a raw_generation would submit, after the same policy
// call (with the request's client, headers and tenant) and tokenized the same way. Throws request_error as it does.
raw_prompt_renderer local_raw_prompt(frontend_context& front, local_model& model);

// Opens raw_generations on this server's engine.
raw_generation_opener local_raw_generation(frontend_context& front, local_model& model);

}  // namespace keepwarm

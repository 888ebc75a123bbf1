// One chat request's trip through the engine, the same for every API (OpenAI, Anthropic, Ollama): the API's routes
// parse their body into an api::chat_request, and this renders it with the model's chat template, tokenizes it,
// submits it, and turns the generated text into message deltas (content, reasoning, tool calls) through the
// template's output parser. The routes only format what comes back in their API's shape.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "api/chat-output-parser.h"
#include "api/chat-renderer.h"
#include "api/openai-api.h"
#include "engine/generation.h"
#include "http/http-server.h"
#include "server/generation-relay.h"
#include "server/server-context.h"

namespace keepwarm {

class chat_generation {
public:
    // Applies the policy (see policy/policy.h), then renders, tokenizes and submits. Throws http_error (4xx) when the
    // request cannot be served; nothing has been sent to the client then. `id` names the request in the log. A
    // health ping the policy absorbs is answered by next() without rendering, the engine, a slot or the cache.
    chat_generation(server_context& ctx, const http::request& req, api::chat_request chat,
                    std::shared_ptr<generation_request> gen, http::response_writer& w, std::string id);

    struct update {
        std::vector<common_chat_msg_diff> diffs;  // new deltas of the message (possibly none)
        bool done = false;
        finish_reason reason = finish_reason::stop;  // valid when done
        std::string error;                           // reason == error
        generation_stats stats;                      // final numbers when done
    };
    // The next deltas. nullopt: the client went away and the generation was cancelled. After an update with done
    // and reason != error, message() is the final parse (with the deltas of that parse included in the update).
    std::optional<update> next();

    // The message parsed so far; final once an update with done was returned.
    const common_chat_msg& message() const { return ping_reply_ ? *ping_reply_ : parser_->message(); }
    // The request as served (after the policy layer's rewrites).
    const api::chat_request& request() const { return chat_; }
    const std::string& id() const { return id_; }
    int prompt_tokens() const { return static_cast<int>(gen_->prompt.size()); }
    // Whether the template rendered the request as a continuation of its trailing assistant message (prefill).
    bool continuation() const { return rendered_.continuation; }
    // Headers every response to this request carries (e.g. what the policy layer did).
    const http::header_list& response_headers() const { return headers_; }

    // Applies the policy, renders and tokenizes without generating: what the model would read for `chat`, in tokens.
    static int count_prompt_tokens(server_context& ctx, const api::chat_request& chat);

private:
    // Runs the policy on chat_, keeping what fired for the response headers and the log.
    policy::policy_outcome apply_policy(const http::request& req);

    server_context& ctx_;
    api::chat_request chat_;
    std::shared_ptr<generation_request> gen_;
    std::string id_;
    api::chat_renderer::rendered rendered_;
    http::header_list headers_;
    std::optional<generation_relay> relay_;
    std::optional<api::chat_output_parser> parser_;
    std::optional<policy::cache_buster_report> buster_;  // a span that may have cost this prompt its cached prefix
    std::optional<common_chat_msg> ping_reply_;          // set for an absorbed ping: the whole answer
    bool ping_answered_ = false;
};

}  // namespace keepwarm

// One chat request's trip through the engine, the same for every API (OpenAI, Anthropic, Ollama): the API's routes
// parse their body into an chat_request, and this renders it with the model's chat template, tokenizes it,
// submits it, and turns the generated text into message deltas (content, reasoning, tool calls) through the
// template's output parser. The routes only format what comes back in their API's shape.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chat/chat-output-parser.h"
#include "chat/chat-renderer.h"
#include "chat/chat-request.h"
#include "engine/generation.h"
#include "http/http-server.h"
#include "routes/generation-relay.h"
#include "routes/server-context.h"

namespace keepwarm {

// One chat request's answer as message deltas, whoever generates it. Used by the route's own thread only.
class generation_source {
public:
    struct update {
        std::vector<common_chat_msg_diff> diffs;  // new deltas of the message (possibly none)
        bool done = false;
        finish_reason reason = finish_reason::stop;  // valid when done
        std::string error;                           // reason == error
        generation_stats stats;                      // final numbers when done
    };

    virtual ~generation_source() = default;

    // The next deltas. nullopt: the client went away and the generation was cancelled. After an update with done
    // and reason != error, message() is the final parse (with the deltas of that parse included in the update).
    virtual std::optional<update> next() = 0;
    // The message so far; final once an update with done was returned.
    virtual const common_chat_msg& message() const = 0;
    // The request as served (after the policy layer's rewrites).
    virtual const chat_request& request() const = 0;
    virtual const std::string& id() const = 0;
    // Prompt tokens known before the first update (0 when whoever generates only says at the end).
    virtual int prompt_tokens() const = 0;
    // Whether the request was rendered as a continuation of its trailing assistant message (prefill).
    virtual bool continuation() const = 0;
    // Headers every response to this request carries (e.g. what the policy layer did).
    virtual const http::header_list& response_headers() const = 0;
};
using generation_source_ptr = std::unique_ptr<generation_source>;

// Starts the generation of a parsed request, with the response's id. Throws request_error (4xx, 5xx) when it cannot be
// served; nothing has been sent to the client then.
using generation_opener = std::function<generation_source_ptr(const http::request& req, chat_request chat,
                                                              const std::shared_ptr<generation_request>& gen,
                                                              http::response_writer& w, std::string id)>;

// Opens chat_generations on this server's engine.
generation_opener local_generation(server_context& ctx);

// Runs the policy on `chat` for a generation, naming what fired in `headers` (x-keepwarm-policy) and the log.
policy::policy_outcome apply_request_policy(const policy::request_policy& policy, const http::request& req,
                                            chat_request& chat, const std::string& id, http::header_list& headers);

// A generation that the cache-buster detector flagged ended (not in error): keeps the report if the cache really
// stopped at the span, and in auto detect mode puts the span's rule in force for the requests that follow (at most
// the policy's max_auto_rules; a rule of that name already in force is not added again). `messages` are the
// request's, as the policy left them.
void confirm_cache_buster(server_context& ctx, policy::cache_buster_report report, const generation_stats& stats,
                          const std::vector<common_chat_msg>& messages);

// The local engine's generation_source.
class chat_generation final : public generation_source {
public:
    // Applies the policy (see policy/policy.h), then renders, tokenizes and submits. Throws request_error (4xx) when
    // the request cannot be served; nothing has been sent to the client then. `id` names the request in the log. A
    // health ping the policy absorbs is answered by next() without rendering, the engine, a slot or the cache.
    chat_generation(server_context& ctx, const http::request& req, chat_request chat,
                    std::shared_ptr<generation_request> gen, http::response_writer& w, std::string id);

    ~chat_generation() override;
    chat_generation(const chat_generation&) = delete;
    chat_generation& operator=(const chat_generation&) = delete;

    std::optional<update> next() override;
    const common_chat_msg& message() const override { return ping_reply_ ? *ping_reply_ : parser_->message(); }
    const chat_request& request() const override { return chat_; }
    const std::string& id() const override { return id_; }
    int prompt_tokens() const override { return static_cast<int>(gen_->prompt.size()); }
    bool continuation() const override { return rendered_.continuation; }
    const http::header_list& response_headers() const override { return headers_; }

    // Applies the policy, renders and tokenizes without generating: what the model would read for `chat`, in tokens.
    // `tenant`: whose prompt index to use.
    static int count_prompt_tokens(server_context& ctx, const chat_request& chat, const std::string& tenant = {});

private:
    void record_delivered(const std::vector<llama_token>& generated, const common_chat_msg& answer, bool complete);

    server_context& ctx_;
    chat_request chat_;
    std::shared_ptr<generation_request> gen_;
    std::string id_;
    chat_renderer::rendered rendered_;
    http::header_list headers_;
    std::optional<generation_relay> relay_;
    std::optional<chat_output_parser> parser_;
    std::optional<policy::cache_buster_report> buster_;  // a span that may have cost this prompt its cached prefix
    std::optional<common_chat_msg> ping_reply_;          // set for an absorbed ping: the whole answer
    bool ping_answered_ = false;
};

}  // namespace keepwarm

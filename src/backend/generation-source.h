// The routes' contract with a backend: a generation_source is one request's answer as message deltas, whoever
// generates it (local/chat-generation.h: this server's engine; proxy/upstream-generation.h: an upstream), and what
// every source shares: the request's clock, the policy call, the answer to a ping the policy absorbed, and the watch
// for a client that went away. A raw completion (a prompt without a chat template) goes through the same policy call
// on both backends (apply_raw_completion_policy).
// Threading: a source, its ping_answer and its client_watch are used by the route's own thread only.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include "chat/chat-request.h"

#include "backend/frontend-context.h"
#include "base/finish-reason.h"
#include "base/prompt-progress.h"
#include "chat/generation-report.h"
#include "http/http-server.h"
#include "policy/policy.h"

namespace keepwarm {

// When a request came in: started by the route wrapper (routes/generation-route.h) before its body is parsed, so a
// backend's setup time covers parsing, rendering and tokenizing.
struct request_clock {
    std::chrono::steady_clock::time_point received = std::chrono::steady_clock::now();
};

// One request's answer as message deltas, whoever generates it. Used by the route's own thread only.
class generation_source {
public:
    struct update {
        std::vector<common_chat_msg_diff> diffs;  // new deltas of the message (possibly none)
        bool done = false;
        finish_reason reason = finish_reason::stop;  // valid when done
        std::string error;                           // reason == error
        generation_report report;                    // final numbers when done
        std::vector<llama_token> generated;          // when done: the sampled tokens (raw completions; else empty)
        // The prompt's processing progress, when the request asked for it (chat_request::return_progress) and the
        // backend reports it.
        std::optional<prompt_progress> progress;
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
    // The prompt as the model read it, as text (llama-server's /completion returns it); empty where unknown.
    virtual std::string prompt_text() const { return {}; }
};
using generation_source_ptr = std::unique_ptr<generation_source>;

// A non-streamed answer's wait: the source's last update (done), or nullopt if the client went away. A generation that
// failed before anything was sent throws request_error 500 with its message and `error_type`, the API's word for a
// server error ("server_error", "api_error").
std::optional<generation_source::update> final_update(generation_source& source, const std::string& error_type);

// Starts the generation of a parsed chat request, with the response's id. Throws request_error (4xx, 5xx) when it
// cannot be served; nothing has been sent to the client then.
using generation_opener = std::function<generation_source_ptr(
    const http::request& req, chat_request chat, const request_clock& clock, http::response_writer& w, std::string id)>;

// Counts a parsed chat request's prompt tokens as the backend would compute them (Anthropic's count_tokens), the
// policy applied as for counting. Throws request_error.
using token_counter = std::function<int(const http::request&, const chat_request&)>;

// The body as a JSON object, parsed by bounded_json (linear time, at most bounded_json::max_depth levels);
// request_error 400 when it is empty, not JSON, too deep, or not an object.
nlohmann::ordered_json parse_json_body(const http::request& req);

// A whole generation route, for a backend that answers one itself (the proxy forwards /v1/completions as it came).
using generation_handler =
    std::function<void(frontend_context&, const http::request&, http::response_writer&, const request_clock&)>;

// A raw completion, whatever API asked for it (OpenAI's /v1/completions, Ollama's /api/generate with raw=true): the
// prompt text goes to the model as is, without a chat template.
struct raw_completion {
    // The client's model name, limit, stops, sampling, format and stream switches, in the neutral request model; no
    // messages. The policy rewrites it (apply_raw_completion_policy).
    chat_request params;
    std::string prompt;
    // When not empty, the prompt as text and token ids mixed (llama-server's /completion), read instead of `prompt`.
    std::vector<prompt_piece> pieces;
    // llama-server's /infill: the prompt is built from these and the vocab's FIM tokens, `prompt` (text the answer
    // continues after the cursor) going after the prefix.
    std::optional<infill_parts> infill;
    std::string grammar_field;  // the request field a grammar came from, in its API's words ("grammar", "format")
};

// The prompt token ids the backend would compute for a chat request or a raw completion, without generating (the
// render routes, routes/render-routes.h). Throw request_error as the openers would for the same request.
using chat_prompt_renderer = std::function<std::vector<llama_token>(const http::request& req, chat_request chat)>;
using raw_prompt_renderer = std::function<std::vector<llama_token>(const http::request& req, raw_completion raw)>;

// Starts a raw completion: its answer comes back as a source whose deltas are plain content. Throws request_error as
// a generation_opener does.
using raw_generation_opener =
    std::function<generation_source_ptr(const http::request& req, raw_completion raw, const request_clock& clock,
                                        http::response_writer& w, std::string id)>;

// Runs the policy on `chat` (see policy/policy.h), naming what fired in `headers` (x-keepwarm-policy) and the log.
// Throws request_error 404 for a model strict pinning refuses; nothing has been changed then.
policy::policy_outcome apply_request_policy(const policy::request_policy& policy, const http::request& req,
                                            chat_request& chat, const std::string& id, http::header_list& headers,
                                            policy::policy_use use = policy::policy_use::generation);

// The one policy call of a raw completion, on either backend: as for counting a chat (model pinning, a client's
// context size reported, forced options; never a ping, and no span rule, for there are no messages). Rewrites
// `params` in place, names what fired as apply_request_policy does, and throws as it does.
policy::policy_outcome apply_raw_completion_policy(const policy::request_policy& policy, const http::request& req,
                                                   chat_request& params, const std::string& id,
                                                   http::header_list& headers);

// The answer to a ping the policy absorbed: its reply text as the whole message, given at once, with zero token
// counts (nothing was computed, no slot, no cache, no upstream touched).
class ping_answer {
public:
    explicit ping_answer(std::string reply);
    // First the reply as one content delta and done; after that, done without deltas.
    generation_source::update next();
    const common_chat_msg& message() const { return reply_; }

private:
    common_chat_msg reply_;
    bool answered_ = false;
};

// How often a waiting route looks at its client's socket, whether or not anything is flowing: a non-streamed answer
// writes nothing until the end, so only this check notices a client that left.
inline constexpr std::chrono::milliseconds client_check_interval{50};

// Watches a response's client while a route waits for what it relays (engine events, an upstream's bytes).
class client_watch {
public:
    explicit client_watch(http::response_writer& w) : w_(w) {}

    // The next item `wait(timeout)` (returning a std::optional) gives, waiting as long as it takes; nullopt once the
    // client is gone (looked at once per client_check_interval). The caller then stops the work and counts the
    // disconnect.
    template <typename Wait>
    auto next(Wait&& wait) -> decltype(wait(client_check_interval)) {
        for (;;) {
            if (gone()) return std::nullopt;
            if (auto item = wait(client_check_interval)) return item;
        }
    }
    // Whether the client is gone; asks the socket at most once per client_check_interval (false in between).
    bool gone();

private:
    http::response_writer& w_;
    std::chrono::steady_clock::time_point last_check_ = std::chrono::steady_clock::now();
};

}  // namespace keepwarm

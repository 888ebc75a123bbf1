// One chat request answered by an upstream engine (`keepwarm proxy`): the same policy layer as `keepwarm serve`
// (pings are answered here, without an upstream), then the router picks an upstream, the request goes out in that
// upstream's dialect, and its stream comes back as message deltas for whichever API route drives it. The upstream's
// body is read on a thread of its own (upstream_body_reader: backpressure); a client that goes away cancels the
// upstream call; a whole answer leaves its connection for the upstream's next request. An answer is held to progress
// (pool_options): a content delta within first_byte_timeout of sending, then within idle_timeout of the last one,
// and for a client that takes the answer whole, all of it within answer_timeout; keep-alive comments and empty events
// are not progress, so an upstream that only pings cannot hold a request (silence is the connection's read timeouts'
// to end, as before).
// Threading: used by the route's own thread.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/frontend-context.h"
#include "backend/generation-source.h"
#include "http/http-client.h"
#include "proxy/upstream-body.h"
#include "proxy/upstream-dialects.h"
#include "proxy/upstream-pool.h"

namespace keepwarm::proxy {

class upstream_generation final : public generation_source {
public:
    // Throws request_error when no upstream can take the request (503), one does not answer in time (504), answers an
    // error or a redirect before streaming (its 4xx as is, a 5xx or 3xx as 502), or the policy refuses the request
    // (4xx). An upstream that cannot be reached is marked down and the next one is tried: nothing has reached the
    // client yet.
    upstream_generation(frontend_context& ctx, upstream_pool& pool, const http::request& req, chat_request chat,
                        const request_clock& clock, http::response_writer& w, std::string id);
    ~upstream_generation() override;  // cancels the upstream call if it has not ended, and leaves the router

    // An answer out of time (see above) ends with an error update, or for a client that takes the answer whole,
    // throws request_error(504) (nothing has been written to it).
    std::optional<update> next() override;
    const common_chat_msg& message() const override { return ping_ ? ping_->message() : decoder_->message(); }
    const chat_request& request() const override { return chat_; }
    const std::string& id() const override { return id_; }
    int prompt_tokens() const override { return 0; }  // upstreams say it at the end
    bool continuation() const override { return false; }
    const http::header_list& response_headers() const override { return headers_; }

private:
    void connect(const http::request& req);
    generation_report stats() const;
    void confirm_buster(const generation_report& st);
    // The policy's forced biases in this upstream's token ids, over the client's own; returns their fired names.
    std::vector<std::string> bind_biases(size_t upstream);
    void name_fired_rules(const std::vector<std::string>& rules);  // appended to x-keepwarm-policy and logged
    void log_end(const update& u) const;
    // When the answer runs out of time if no delta comes before, and which limit that is.
    enum class answer_limit { first_delta, next_delta, whole_answer };
    std::pair<std::chrono::steady_clock::time_point, answer_limit> deadline() const;
    std::string overdue_message(answer_limit limit) const;  // what the client is told when `limit` ran out
    // Once: the answer's connection goes back to the pool if it was read whole (else it is cancelled), and the router
    // stops counting this request against the upstream.
    void leave_upstream();

    frontend_context& ctx_;
    upstream_pool& pool_;
    client_watch client_;
    chat_request chat_;
    std::string prompt_text_;  // canonical_prompt_text(chat_): what routing and the cache-buster detector compare
    std::string id_;
    http::header_list headers_;
    std::optional<ping_answer> ping_;                           // set for an absorbed ping: the whole answer
    std::vector<policy::forced_bias> unbound_biases_;           // what the policy forces, by token text
    std::vector<std::pair<llama_token, float>> client_biases_;  // the client's own logit_bias
    std::optional<policy::cache_buster_report> buster_;  // a span that may have cost this prompt its cached prefix

    std::optional<upstream_pool::route> route_;
    std::unique_ptr<http::client_connection> conn_;
    std::optional<stream_decoder> decoder_;
    std::chrono::steady_clock::time_point received_, sent_, first_delta_;
    std::chrono::steady_clock::time_point first_delta_read_;  // when the bytes of the first delta came off the socket
    std::chrono::steady_clock::time_point last_delta_;        // the latest delta: the answer's last progress
    std::chrono::steady_clock::time_point last_read_;         // when the latest piece of the body came off the socket
    bool seen_delta_ = false;

    std::optional<upstream_body_reader> body_;  // the upstream's answer, read on a thread of its own
    bool left_ = false;                         // leave_upstream() ran: the router no longer counts this request
};

// Opens upstream_generations from `pool` for the API routes.
generation_opener upstream_generations(frontend_context& ctx, upstream_pool& pool);

// count_tokens through the proxy: the policy as for counting, then the upstream the request would go to counts it
// (Anthropic's count_tokens, which keepwarm and llama-server answer too). Throws request_error: 501 when that upstream
// cannot count (Ollama dialect), 503 when none is up, 504 on a timeout, its 4xx as is, 502 for anything else.
token_counter upstream_token_counter(frontend_context& ctx, upstream_pool& pool);

}  // namespace keepwarm::proxy

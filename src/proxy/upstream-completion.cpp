// See upstream-completion.h.
#include "proxy/upstream-completion.h"

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "base/logger.h"
#include "proxy/upstream-body.h"
#include "proxy/upstream-call.h"
#include "proxy/upstream-dialects.h"

namespace keepwarm::proxy {

namespace {

using json = nlohmann::ordered_json;

// The policy's forced options on a raw completion, through the raw-completion path's one policy call: what it set on
// parameters that carried only the client's model name and limit goes into the body. Names what fired in `headers`.
void apply_policy(const frontend_context& ctx, const http::request& req, json& body, http::header_list& headers) {
    chat_request params;
    params.api = "openai";
    if (body.contains("model") && body["model"].is_string()) params.model = body["model"].get<std::string>();
    if (body.contains("max_tokens") && body["max_tokens"].is_number_integer()) {
        params.max_tokens = body["max_tokens"].get<int>();
    }
    apply_raw_completion_policy(*ctx.policy, req, params, random_id("cmpl-"), headers);
    if (params.max_tokens) body["max_tokens"] = *params.max_tokens;
    write_openai_sampling(body, params.sampling);  // only what the policy forced: the request set none
}

constexpr size_t max_whole_answer = 64u << 20;   // a whole (unstreamed) answer, held before it is sent on
constexpr size_t max_partial_event = 8u << 20;   // an SSE event held until its end (see sse_relay)
constexpr size_t max_stream_bytes = 256u << 20;  // everything one streamed answer may send

// A streamed answer passed on to the client whole event by whole event: an upstream that breaks off mid-event leaves
// the client a stream it can still read, ended by an error event. It also watches for the stream's "data: [DONE]":
// a body that ends without it ended early (an upstream that streams without chunked encoding and dies looks like
// a clean end of body otherwise).
class sse_relay {
public:
    // The next bytes; returns what can go to the client now (whole events), or nullopt when the upstream broke the
    // limits (`error()` says which).
    std::optional<std::string> push(const std::string& bytes) {
        received_ += bytes.size();
        if (received_ > max_stream_bytes) {
            error_ = "the upstream sent over " + std::to_string(max_stream_bytes) + " bytes in one answer";
            return std::nullopt;
        }
        const size_t from = held_.size() >= 3 ? held_.size() - 3 : 0;
        held_ += bytes;
        size_t end = std::string::npos;  // just past the last event terminator
        for (size_t at = held_.find('\n', from); at != std::string::npos; at = held_.find('\n', at + 1)) {
            if (at + 1 < held_.size() && held_[at + 1] == '\n') end = at + 2;
            if (at + 2 < held_.size() && held_[at + 1] == '\r' && held_[at + 2] == '\n') end = at + 3;
        }
        if (end == std::string::npos) {
            if (held_.size() > max_partial_event) {
                error_ = "the upstream sent " + std::to_string(held_.size()) + " bytes without ending an event";
                return std::nullopt;
            }
            return std::string();
        }
        std::string ready = held_.substr(0, end);
        held_.erase(0, end);
        // Whether the stream's last event so far is its end marker.
        const size_t last = ready.rfind("data:", ready.size() - 2);
        if (last != std::string::npos) {
            std::string_view data = std::string_view(ready).substr(last + 5);
            while (!data.empty() && (data.front() == ' ')) data.remove_prefix(1);
            while (!data.empty() && (data.back() == '\n' || data.back() == '\r')) data.remove_suffix(1);
            ended_ = data == "[DONE]";
        }
        return ready;
    }
    bool ended() const { return ended_ && held_.find_first_not_of("\r\n") == std::string::npos; }
    const std::string& error() const { return error_; }

private:
    std::string held_;
    size_t received_ = 0;
    bool ended_ = false;
    std::string error_;
};

// The client's last event when the upstream's stream broke: an OpenAI error, then the end marker, as the chat routes
// end a stream that failed.
void end_stream_with_error(http::response_writer& w, const std::string& message) {
    w.write_chunk("data: " + http::openai_error_body(502, "server_error", message) + "\n\n");
    w.write_chunk("data: [DONE]\n\n");
    w.end_stream();
}

// Relays the upstream's answer to the client as it arrives; returns whether it was read to its end (the connection
// can carry another request then). Held to progress as a chat is (pool_options): a stream to an event with data
// within first_byte_timeout of `sent`, then within idle_timeout of the last one (keep-alive comments do not count); a
// whole answer to answer_timeout.
bool relay(upstream_body_reader& reader, const http::client_response& head, http::response_writer& w,
           const http::header_list& headers, upstream_pool& pool, size_t upstream, const std::string& url,
           std::chrono::steady_clock::time_point sent) {
    const std::string content_type =
        head.header("content-type").empty() ? "application/json" : head.header("content-type");
    const bool streaming = content_type.rfind("text/event-stream", 0) == 0;
    std::string whole;
    sse_relay events;
    if (streaming) w.begin_stream(head.status, content_type, headers);
    client_watch client(w);
    const pool_options& limits = pool.options();
    std::optional<std::chrono::steady_clock::time_point> last_data;  // when the last event with data went out
    std::chrono::steady_clock::time_point last_read;                 // when the last piece came off the socket
    enum class limit { none, first_data, next_data, whole_answer };
    // As for a chat (upstream-generation.h): silence since the last data is the connection's read timeouts' to end.
    const auto deadline = [&]() -> std::pair<std::chrono::steady_clock::time_point, limit> {
        if (!streaming) return {sent + limits.answer_timeout, limit::whole_answer};
        if (last_read <= last_data.value_or(sent)) return {std::chrono::steady_clock::time_point::max(), limit::none};
        if (!last_data) return {sent + limits.first_byte_timeout, limit::first_data};
        return {*last_data + limits.idle_timeout, limit::next_data};
    };
    const auto overdue_message = [&](limit l) {
        const std::string upstream = "upstream " + url;
        if (l == limit::first_data) {
            return upstream + " sent no data in " + http::seconds_text(limits.first_byte_timeout) +
                   " after the request (--first-byte-timeout; keep-alive comments are not progress)";
        }
        if (l == limit::next_data) {
            return upstream + " sent no data for " + http::seconds_text(limits.idle_timeout) +
                   " (--upstream-idle-timeout; keep-alive comments are not progress)";
        }
        return upstream + " did not finish its answer in " + http::seconds_text(limits.answer_timeout) +
               " (--answer-timeout)";
    };
    for (;;) {
        std::string overdue;  // set when the answer ran out of time before a piece came
        const auto piece = client.next([&](std::chrono::milliseconds timeout) {
            const auto [at, l] = deadline();
            const auto now = std::chrono::steady_clock::now();
            const auto left = l == limit::none ? timeout : std::chrono::ceil<std::chrono::milliseconds>(at - now);
            std::optional<upstream_body_reader::piece> p;
            if (left.count() > 0) p = reader.next(std::min(timeout, left));
            if (p) last_read = p->read_at;
            if (!p && l != limit::none && std::chrono::steady_clock::now() >= at) {
                overdue = overdue_message(l);
                p.emplace();  // ends the wait; `overdue` says why
            }
            return p;
        });
        if (!piece) {
            log::info("proxy", "completion client went away, upstream {} call cancelled", url);
            return false;  // finish(false) cancels the call
        }
        std::string broken;  // why the answer cannot be passed on whole
        if (!overdue.empty()) {
            // The upstream answers, but not this request: cancelled, and the upstream stays in routing.
            if (!streaming) {
                log::warn("proxy", "completion {}", overdue);
                throw request_error(504, overdue, "timeout_error");
            }
            broken = overdue;
        } else if (!piece->error.empty()) {
            pool.mark_down(upstream, "its answer broke off");
            broken = "upstream " + piece->error;
        } else if (piece->end && streaming && !events.ended()) {
            pool.mark_down(upstream, "its answer ended early");
            broken = "upstream " + url + " ended its stream before its end (no \"data: [DONE]\")";
        } else if (piece->end) {
            if (streaming) {
                w.end_stream();
            } else {
                w.send(head.status, content_type, whole, headers);
            }
            return true;
        } else if (!streaming) {
            whole += piece->bytes;
            if (whole.size() > max_whole_answer) {
                broken = "upstream " + url + " sent an answer over " + std::to_string(max_whole_answer) + " bytes";
            }
        } else if (const std::optional<std::string> ready = events.push(piece->bytes); !ready) {
            broken = "upstream " + url + ": " + events.error();
        } else if (!ready->empty()) {
            if (ready->starts_with("data:") || ready->find("\ndata:") != std::string::npos) {
                last_data = std::chrono::steady_clock::now();
            }
            if (!w.write_chunk(*ready)) return false;
        }
        if (broken.empty()) continue;
        log::warn("proxy", "completion {}", broken);
        if (!streaming) throw request_error(502, broken, "server_error");
        end_stream_with_error(w, broken);
        return false;
    }
}

}  // namespace

generation_handler upstream_completions(upstream_pool& pool) {
    return [&pool](frontend_context& ctx, const http::request& req, http::response_writer& w, const request_clock&) {
        json body = parse_json_body(req);
        if (!body.is_object() || !body.contains("prompt")) throw request_error(400, "'prompt' is required");
        const json& prompt = body["prompt"];
        if (!prompt.is_string() && !prompt.is_array()) {
            throw request_error(400, "'prompt' must be a string or an array");
        }
        http::header_list headers;
        apply_policy(ctx, req, body, headers);
        // Routed like a chat: by chained hashes of the prompt's blocks.
        const std::string text = "\x06prompt\x02" + (prompt.is_string() ? prompt.get<std::string>() : prompt.dump());
        const std::vector<uint64_t> blocks = chained_block_hashes(text, pool.routing().block_chars, req.tenant);
        const std::string asked = body.value("model", std::string());
        // Only OpenAI-dialect upstreams take a raw prompt.
        upstream_choice choice{.blocks = blocks, .model = body.value("model", std::string())};
        for (size_t i = 0; i < pool.size(); i++) {
            if (pool.config(i).dialect != upstream_dialect::openai) choice.excluded.push_back(i);
        }
        if (choice.excluded.size() == pool.size()) {
            const upstream_config& u = pool.config(0);
            throw request_error(501,
                                "/v1/completions: upstream " + u.origin.url() + " speaks " + dialect_name(u.dialect) +
                                    ", which has no raw-prompt completions (no OpenAI-dialect upstream is "
                                    "configured); use /v1/chat/completions",
                                "not_implemented_error");
        }
        upstream_exchange x = call_upstream(
            pool, std::move(choice),
            [&](const upstream_pool::route& route) {
                body["model"] = route.model;
                upstream_call call{.target = "/v1/completions",
                                   .body = body.dump(-1, ' ', false, json::error_handler_t::replace)};
                if (const std::string key = pool.credential(route.upstream, req.api_key); !key.empty())
                    call.headers.emplace_back("authorization", "Bearer " + key);
                return call;
            },
            "completion");
        struct in_flight {
            upstream_pool& pool;
            size_t upstream;
            ~in_flight() { pool.release(upstream); }
        } guard{pool, x.route.upstream};
        const std::string url = x.route.config->origin.url();
        headers.emplace_back("x-keepwarm-upstream", url);
        upstream_body_reader reader(*x.conn);
        const bool whole = relay(reader, x.head, w, headers, pool, x.route.upstream, url, x.sent);
        if (reader.finish(whole) && whole) pool.keep_alive(x.route.upstream, std::move(x.conn));
    };
}

raw_generation_opener upstream_raw_generations(frontend_context& ctx) {
    return [&ctx](const http::request& req, raw_completion raw, const request_clock&, http::response_writer&,
                  std::string id) -> generation_source_ptr {
        http::header_list headers;
        apply_raw_completion_policy(*ctx.policy, req, raw.params, id, headers);
        throw request_error(501,
                            "/api/generate with raw=true is not available through keepwarm proxy: it needs the local "
                            "model",
                            "not_implemented_error");
    };
}

}  // namespace keepwarm::proxy

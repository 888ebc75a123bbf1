// See upstream-completion.h.
#include "proxy/upstream-completion.h"

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "proxy/upstream-body.h"
#include "proxy/upstream-dialects.h"
#include "server/client-identity.h"

namespace keepwarm::proxy {

namespace {

using json = nlohmann::ordered_json;
using namespace std::chrono_literals;

constexpr auto check_interval = 50ms;

// The policy's forced options on a raw completion: what it set on a chat request that carried only the client's model
// name and limit goes into the body. Returns the x-keepwarm-policy value ("" when nothing fired).
std::string apply_policy(const server_context& ctx, const http::request& req, json& body) {
    api::chat_request chat;
    chat.api = "openai";
    if (body.contains("model") && body["model"].is_string()) chat.model = body["model"].get<std::string>();
    if (body.contains("max_tokens") && body["max_tokens"].is_number_integer()) {
        chat.max_tokens = body["max_tokens"].get<int>();
    }
    // Counting: a raw prompt is never answered as a ping (there is no chat reply to give it).
    const policy::policy_outcome outcome =
        ctx.policy->apply(chat, {.client = client_name(req), .headers = &req.headers}, policy::policy_use::counting);
    if (chat.max_tokens) body["max_tokens"] = *chat.max_tokens;
    write_openai_sampling(body, chat.sampling);  // only what the policy forced: the request set none
    return outcome.header_value();
}

// Relays the upstream's answer to the client as it arrives; returns whether it was read to its end (the connection
// can carry another request then).
bool relay(upstream_body_reader& reader, const http::client_response& head, http::response_writer& w,
           const http::header_list& headers, upstream_pool& pool, size_t upstream, const std::string& url) {
    const std::string content_type =
        head.header("content-type").empty() ? "application/json" : head.header("content-type");
    const bool streaming = content_type.rfind("text/event-stream", 0) == 0;
    std::string whole;
    if (streaming) w.begin_stream(head.status, content_type, headers);
    auto last_check = std::chrono::steady_clock::now();
    for (;;) {
        if (const auto now = std::chrono::steady_clock::now(); now - last_check >= check_interval) {
            last_check = now;
            if (w.client_gone()) {
                std::fprintf(stderr, "keepwarm proxy: completion client went away, upstream %s call cancelled\n",
                             url.c_str());
                return false;  // finish(false) cancels the call
            }
        }
        const auto piece = reader.next(check_interval);
        if (!piece) continue;
        if (!piece->error.empty()) {
            pool.mark_down(upstream);
            if (!streaming) {
                throw http::http_error(502, "upstream " + url + " failed mid-answer: " + piece->error, "server_error");
            }
            w.end_stream();
            return false;
        }
        if (piece->end) {
            if (streaming) {
                w.end_stream();
            } else {
                w.send(head.status, content_type, whole, headers);
            }
            return true;
        }
        if (!streaming) {
            whole += piece->bytes;
        } else if (!w.write_chunk(piece->bytes)) {
            return false;
        }
    }
}

}  // namespace

generation_handler upstream_completions(upstream_pool& pool) {
    return [&pool](server_context& ctx, const http::request& req, http::response_writer& w,
                   const std::shared_ptr<generation_request>&) {
        json body = parse_json_body(req);
        if (!body.is_object() || !body.contains("prompt")) throw http::http_error(400, "'prompt' is required");
        const json& prompt = body["prompt"];
        if (!prompt.is_string() && !prompt.is_array()) {
            throw http::http_error(400, "'prompt' must be a string or an array");
        }
        http::header_list headers;
        if (const std::string fired = apply_policy(ctx, req, body); !fired.empty()) {
            headers.emplace_back("x-keepwarm-policy", fired);
        }
        // Routed like a chat: by chained hashes of the prompt's blocks.
        const std::string text = "\x06prompt\x02" + (prompt.is_string() ? prompt.get<std::string>() : prompt.dump());
        const std::vector<uint64_t> blocks = chained_block_hashes(text, pool.routing().block_chars, req.tenant);
        const std::string asked = body.value("model", std::string());
        // Only OpenAI-dialect upstreams take a raw prompt.
        std::vector<size_t> tried;
        for (size_t i = 0; i < pool.size(); i++) {
            if (pool.config(i).dialect != upstream_dialect::openai) tried.push_back(i);
        }
        if (tried.size() == pool.size()) {
            const upstream_config& u = pool.config(0);
            throw http::http_error(501,
                                   "/v1/completions: upstream " + u.origin.url() + " speaks " +
                                       dialect_name(u.dialect) +
                                       ", which has no raw-prompt completions (no OpenAI-dialect upstream is "
                                       "configured); use /v1/chat/completions",
                                   "not_implemented_error");
        }
        for (;;) {
            const auto route = pool.acquire(blocks, tried, asked);
            if (!route) {
                throw http::http_error(503,
                                       "no upstream can take the request (" + std::to_string(pool.size()) +
                                           " configured, " + std::to_string(pool.size() - pool.healthy_count()) +
                                           " down)",
                                       "server_error");
            }
            struct in_flight {
                upstream_pool& pool;
                size_t upstream;
                ~in_flight() { pool.release(upstream); }
            } guard{pool, route->upstream};
            const upstream_config& u = *route->config;
            const std::string url = u.origin.url();
            body["model"] = route->model;
            http::header_list upstream_headers;
            if (const std::string key = pool.credential(route->upstream, req.api_key); !key.empty())
                upstream_headers.emplace_back("authorization", "Bearer " + key);
            std::unique_ptr<http::client_connection> conn = pool.connection(route->upstream);
            http::client_response head;
            try {
                head = conn->send("POST", "/v1/completions", body.dump(-1, ' ', false, json::error_handler_t::replace),
                                  "application/json", upstream_headers);
            } catch (const http::client_error& e) {
                if (e.reason == http::client_error::kind::timeout) {
                    throw http::http_error(504, "upstream " + url + " did not answer in time: " + e.what(),
                                           "timeout_error");
                }
                std::fprintf(stderr, "keepwarm proxy: completion upstream %s failed (%s), trying another\n",
                             url.c_str(), e.what());
                pool.mark_down(route->upstream);
                tried.push_back(route->upstream);
                continue;
            }
            if (head.status >= 400) {
                std::string error_body;
                try {
                    error_body = conn->read_body();
                } catch (const http::client_error&) {
                }
                throw upstream_http_error(head.status, error_body, url);
            }
            headers.emplace_back("x-keepwarm-upstream", url);
            upstream_body_reader reader(*conn);
            const bool whole = relay(reader, head, w, headers, pool, route->upstream, url);
            if (reader.finish(whole) && whole) pool.keep_alive(route->upstream, std::move(conn));
            return;
        }
    };
}

}  // namespace keepwarm::proxy

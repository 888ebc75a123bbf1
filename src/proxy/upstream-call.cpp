// See upstream-call.h.
#include "proxy/upstream-call.h"

#include <optional>
#include <utility>

#include "base/logger.h"
#include "base/request-error.h"

namespace keepwarm::proxy {

namespace {
// The upstream one try counts in flight: released when the try ends (failed over, thrown for), unless handed over to
// the caller with the answer.
class held_upstream {
public:
    held_upstream(upstream_pool& pool, size_t upstream) : pool_(pool), upstream_(upstream) {}
    ~held_upstream() {
        if (held_) pool_.release(upstream_);
    }
    held_upstream(const held_upstream&) = delete;
    held_upstream& operator=(const held_upstream&) = delete;
    void hand_over() { held_ = false; }

private:
    upstream_pool& pool_;
    size_t upstream_;
    bool held_ = true;
};
}  // namespace

upstream_exchange call_upstream(upstream_pool& pool, upstream_choice choice, const upstream_call_builder& build,
                                std::string_view log_name) {
    bool any_failed = false;
    for (;;) {
        std::optional<upstream_pool::route> route =
            pool.acquire(choice.blocks, choice.excluded, choice.model, choice.routing_key, choice.tokens);
        if (!route) {
            throw request_error(503,
                                "no upstream can take the request: " + std::to_string(pool.size()) + " configured, " +
                                    std::to_string(pool.size() - pool.healthy_count()) + " down" +
                                    (any_failed ? ", the others failed" : ""),
                                "server_error");
        }
        held_upstream held(pool, route->upstream);
        const std::string url = route->config->origin.url();
        const upstream_call call = build(*route);
        std::unique_ptr<http::client_connection> conn = pool.connection(route->upstream);
        upstream_exchange x{.route = std::move(*route), .conn = std::move(conn)};
        x.sent = std::chrono::steady_clock::now();
        try {
            x.head = x.conn->send("POST", call.target, call.body, "application/json", call.headers);
        } catch (const http::client_error& e) {
            const size_t failed = x.route.upstream;
            if (e.reason == http::client_error::kind::timeout) {
                // It may still be working on the request: not sent again elsewhere, but out of routing, so that the
                // next requests do not wait on it too.
                pool.mark_down(failed, "it timed out");
                throw request_error(504, std::string("upstream ") + e.what(), "timeout_error");
            }
            log::warn("proxy", "{} upstream {} failed ({}), trying another", log_name, url, e.what());
            pool.mark_down(failed);
            choice.excluded.push_back(failed);
            any_failed = true;
            continue;
        }
        if (x.head.status >= 300 && x.head.status < 400) {
            // Not an answer: followed, it would be a stream from somewhere else; read as one, a stream that ended
            // before its end event. The connection is dropped with its unread body.
            log::warn("proxy", "{} {}", log_name, redirect_message(x.head.status, x.head.headers, url));
            throw upstream_redirect_error(x.head.status, x.head.headers, url);
        }
        if (x.head.status >= 400) {
            std::string body;
            try {
                body = x.conn->read_body();
            } catch (const http::client_error&) {
            }
            throw upstream_request_error(x.head.status, body, url);
        }
        held.hand_over();
        return x;
    }
}

}  // namespace keepwarm::proxy

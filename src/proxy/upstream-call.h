// One request sent to an upstream engine of `keepwarm proxy`, written once for the chat path (upstream_generation)
// and the raw-completion path (upstream_completions): the pool picks an upstream, a connection to it sends the
// request, and an upstream that cannot be reached (refused, reset, not HTTP before any answer: nothing has reached
// the client) is marked down and the next one is tried. A timeout is not tried elsewhere (the upstream may still be
// working on it). What comes back before a stream is judged here too: a redirect or an error status ends the call as
// the request_error the routes send; only a 2xx head reaches the caller, whose body it reads.
// Threading: used by the route's own thread; the pool is safe from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "http/http-client.h"
#include "proxy/upstream-dialects.h"
#include "proxy/upstream-pool.h"

namespace keepwarm::proxy {

// Where a request may go (upstream_pool::acquire's arguments).
struct upstream_choice {
    std::span<const uint64_t> blocks;  // the prompt's chained block hashes
    std::string model;                 // the name the request asks for (after the policy): see acquire()
    uint64_t routing_key = 0;          // routing_key() of the request; 0: none
    std::vector<size_t> excluded;  // upstreams that cannot take it (another dialect), besides those not serving model
    std::span<const int32_t> tokens;  // the prompt's token ids for routing by KV events (empty: infer)
};

// An upstream that took the request and answered with a 2xx head.
struct upstream_exchange {
    upstream_pool::route route;  // counted in flight there until the caller's pool.release(route.upstream)
    std::unique_ptr<http::client_connection> conn;  // its head read; the body is the caller's to read
    http::client_response head;
    std::chrono::steady_clock::time_point sent;  // when the request went out
};

// Builds the request for the upstream `route` picked; called again for each upstream tried.
using upstream_call_builder = std::function<upstream_call(const upstream_pool::route& route)>;

// Sends the request `build` makes to the upstream `choice` picks, failing over as above. `log_name` starts each log
// line (the request's id, or the route's name). Throws request_error: 503 when no upstream is left to try, 504 when one
// timed out (it is taken out of routing), the upstream's 4xx as is, 502 for its 5xx or a redirect. Every upstream it
// tried is released when it throws (`build`'s own exceptions included), all but the one it returns when it does not.
upstream_exchange call_upstream(upstream_pool& pool, upstream_choice choice, const upstream_call_builder& build,
                                std::string_view log_name);

}  // namespace keepwarm::proxy

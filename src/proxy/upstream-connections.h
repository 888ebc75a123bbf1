// The proxy's kept-alive connections to its upstreams: per upstream, the idle connections whose last answer was read
// to its end, waiting for the next request (at most max_idle each), and counts of the connections opened for
// requests and of requests sent on a kept-alive one. An upstream that goes down loses its idle connections and keeps
// none until it is up again.
// Threading: every member function may be called from any thread; one mutex (mu_) guards the pools. Connections are
// made and closed outside it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "http/http-client.h"

namespace keepwarm::proxy {

class upstream_connections {
public:
    // One pool per origin; a new connection gets `options`. Every upstream starts up.
    upstream_connections(std::vector<http::endpoint> origins, size_t max_idle, http::client_options options);
    ~upstream_connections();
    upstream_connections(const upstream_connections&) = delete;
    upstream_connections& operator=(const upstream_connections&) = delete;

    // A connection to this upstream for one request: an idle kept-alive one when there is one, else a new one (its
    // first send() connects).
    std::unique_ptr<http::client_connection> take(size_t upstream);
    // A connection back after its request: kept when it is reusable (its answer was read to its end), the upstream is
    // up, and fewer than max_idle wait; else closed.
    void give_back(size_t upstream, std::unique_ptr<http::client_connection> conn);
    // The upstream went down (its idle connections are closed, and none is kept until it is up) or is up.
    void set_up(size_t upstream, bool up);

    struct counts {
        uint64_t opened = 0;  // connections made for requests
        uint64_t reused = 0;  // requests sent on a kept-alive connection
        size_t idle = 0;      // waiting now
    };
    counts stats(size_t upstream) const;
    size_t size() const { return origins_.size(); }

private:
    struct pool {
        std::vector<std::unique_ptr<http::client_connection>> idle;
        uint64_t opened = 0;
        uint64_t reused = 0;
        bool up = true;
    };

    const std::vector<http::endpoint> origins_;
    const size_t max_idle_;
    const http::client_options options_;

    mutable std::mutex mu_;
    std::vector<pool> pools_;  // guarded by mu_
};

}  // namespace keepwarm::proxy

// See upstream-connections.h.
#include "proxy/upstream-connections.h"

namespace keepwarm::proxy {

upstream_connections::upstream_connections(std::vector<http::endpoint> origins, size_t max_idle,
                                           http::client_options options)
    : origins_(std::move(origins)), max_idle_(max_idle), options_(options), pools_(origins_.size()) {}

upstream_connections::~upstream_connections() = default;

std::unique_ptr<http::client_connection> upstream_connections::take(size_t upstream) {
    {
        std::lock_guard lock(mu_);
        pool& p = pools_.at(upstream);
        if (!p.idle.empty()) {
            std::unique_ptr<http::client_connection> conn = std::move(p.idle.back());
            p.idle.pop_back();
            p.reused++;
            return conn;
        }
        p.opened++;
    }
    return std::make_unique<http::client_connection>(origins_[upstream], options_);
}

void upstream_connections::give_back(size_t upstream, std::unique_ptr<http::client_connection> conn) {
    if (!conn || !conn->reusable()) return;
    std::unique_ptr<http::client_connection> dropped;  // closed after the lock is let go
    std::lock_guard lock(mu_);
    pool& p = pools_.at(upstream);
    if (!p.up || p.idle.size() >= max_idle_) {
        dropped = std::move(conn);
        return;
    }
    p.idle.push_back(std::move(conn));
}

void upstream_connections::set_up(size_t upstream, bool up) {
    std::vector<std::unique_ptr<http::client_connection>> dropped;  // closed after the lock is let go
    std::lock_guard lock(mu_);
    pool& p = pools_.at(upstream);
    p.up = up;
    if (!up) dropped.swap(p.idle);
}

upstream_connections::counts upstream_connections::stats(size_t upstream) const {
    std::lock_guard lock(mu_);
    const pool& p = pools_.at(upstream);
    return {.opened = p.opened, .reused = p.reused, .idle = p.idle.size()};
}

}  // namespace keepwarm::proxy

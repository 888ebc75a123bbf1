// See upstream-body.h.
#include "proxy/upstream-body.h"

namespace keepwarm::proxy {

using namespace std::chrono_literals;

namespace {
constexpr size_t max_queued_pieces = 64;  // beyond this the reader waits for the client to catch up
constexpr auto drain_time = 250ms;        // for the end of a whole answer's body, before the connection is reused
}  // namespace

upstream_body_reader::upstream_body_reader(http::client_connection& conn) : conn_(conn) {
    thread_ = std::thread([this] { run(); });
}

upstream_body_reader::~upstream_body_reader() {
    finish(false);
}

void upstream_body_reader::run() {
    piece last;
    bool complete = false;
    try {
        std::string bytes;
        for (;;) {
            if (!conn_.read_some(bytes)) {
                complete = true;
                break;
            }
            std::unique_lock lock(mu_);
            cv_.wait(lock, [this] { return pieces_.size() < max_queued_pieces || stop_; });
            if (stop_) {
                if (drain_) continue;  // the answer is whole: read the rest (the end marker) and drop it
                break;
            }
            pieces_.push_back({.bytes = std::move(bytes), .read_at = std::chrono::steady_clock::now()});
            cv_.notify_all();
        }
        last.end = true;
    } catch (const std::exception& e) {
        // A client_error (reset, timeout, cancel) as a rule; anything else must not escape this thread either: an
        // exception out of a std::thread ends the process.
        last.error = e.what();
    }
    std::lock_guard lock(mu_);
    pieces_.push_back(std::move(last));
    body_complete_ = complete;
    done_ = true;
    cv_.notify_all();
}

std::optional<upstream_body_reader::piece> upstream_body_reader::next(std::chrono::milliseconds wait) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, wait, [this] { return !pieces_.empty(); })) return std::nullopt;
    piece p = std::move(pieces_.front());
    pieces_.pop_front();
    cv_.notify_all();
    return p;
}

bool upstream_body_reader::finish(bool drain) {
    if (finished_) {
        std::lock_guard lock(mu_);
        return body_complete_;
    }
    finished_ = true;
    bool done;
    {
        std::unique_lock lock(mu_);
        stop_ = true;
        drain_ = drain;
        cv_.notify_all();
        if (drain) cv_.wait_for(lock, drain_time, [this] { return done_; });
        done = done_;
    }
    if (!done) conn_.cancel();
    thread_.join();
    std::lock_guard lock(mu_);
    return body_complete_;
}

}  // namespace keepwarm::proxy

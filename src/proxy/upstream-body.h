// An upstream's response body read on a thread of its own into a short queue, so that the thread that writes to the
// client can keep checking whether the client is still there while the upstream thinks (a long prefill sends
// nothing for seconds). A slow client slows the upstream read (backpressure: the queue holds at most 64 pieces).
// Threading: one consumer thread calls next() and finish(); the reader thread only touches the connection and the
// queue.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "http/http-client.h"

namespace keepwarm::proxy {

class upstream_body_reader {
public:
    struct piece {
        std::string bytes;
        bool end = false;                               // the body ended
        std::string error;                              // reading failed
        std::chrono::steady_clock::time_point read_at;  // when it came off the socket
    };

    // Starts reading `conn`'s body (its response head has been read). `conn` must outlive this object.
    explicit upstream_body_reader(http::client_connection& conn);
    ~upstream_body_reader();  // finish(false) if not called
    upstream_body_reader(const upstream_body_reader&) = delete;
    upstream_body_reader& operator=(const upstream_body_reader&) = delete;

    // The next piece, waiting at most `wait`; nullopt when none came in that time. After a piece with `end` or
    // `error`, nothing more comes.
    std::optional<piece> next(std::chrono::milliseconds wait);

    // The consumer wants no more. With `drain` (the answer is whole: at most an end marker is left), the rest of the
    // body is read and dropped for up to a quarter second, so that the connection can carry another request; else,
    // or if it takes longer, the connection is cancelled. Returns whether the body was read to its end.
    bool finish(bool drain);

private:
    void run();

    http::client_connection& conn_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<piece> pieces_;    // guarded by mu_
    bool done_ = false;           // guarded by mu_: the reader has stopped
    bool stop_ = false;           // guarded by mu_: the consumer wants no more
    bool drain_ = false;          // guarded by mu_: ... but let the body end
    bool body_complete_ = false;  // guarded by mu_: the body was read to its end
    bool finished_ = false;       // finish() was called (consumer thread only)
    std::thread thread_;
};

}  // namespace keepwarm::proxy

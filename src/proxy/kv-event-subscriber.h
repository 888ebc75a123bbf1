// The proxy's ZeroMQ subscriptions to its upstreams' KV events (`events = "tcp://HOST:PORT"` on an upstream): one
// SUB socket per such upstream, on one thread of its own, each message decoded (kv-event-message.h) and handed to
// on_message. When that answers that the upstream is out of step (a gap), the socket is closed and opened again: a
// keepwarm upstream answers every new subscription with a snapshot (docs/kv-events.md), which puts it back in step.
// Threading: start() and the destructor from one thread; the callbacks run on the subscriber's thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "proxy/kv-block-index.h"
#include "proxy/kv-event-message.h"

namespace keepwarm::proxy {

class kv_event_subscriber {
public:
    struct hooks {
        // A decoded message from upstream i; returns what the index made of it.
        std::function<kv_block_index::outcome(size_t, const kv_event_message&)> on_message;
        // The subscription to upstream i was opened again: what came before is not to be continued.
        std::function<void(size_t)> on_reconnect;
    };
    // endpoints[i]: upstream i's events endpoint, empty for none.
    kv_event_subscriber(std::vector<std::string> endpoints, hooks h);
    ~kv_event_subscriber();  // stops the thread
    kv_event_subscriber(const kv_event_subscriber&) = delete;
    kv_event_subscriber& operator=(const kv_event_subscriber&) = delete;

    // Connects every socket and starts the thread (a no-op without endpoints).
    void start();

    // Messages that did not decode, over all upstreams (logged, not applied; each also resyncs its upstream).
    uint64_t malformed() const { return malformed_.load(); }

private:
    void run();

    const std::vector<std::string> endpoints_;
    const hooks hooks_;
    std::atomic<bool> stop_{false};
    std::atomic<uint64_t> malformed_{0};
    std::thread thread_;
};

}  // namespace keepwarm::proxy

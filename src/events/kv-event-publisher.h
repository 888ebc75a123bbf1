// serve --kv-events: publishes the prefix cache's block reports over ZeroMQ in vLLM's wire format
// (docs/kv-events.md). The cache hands reports to take() on its engine thread; they wait in a bounded queue that the
// publisher's own thread drains, so a slow or absent subscriber never holds the engine up. The thread keeps a mirror of
// what it has announced and sends it whole (AllBlocksCleared, then every block) when a subscriber joins.
// Threading: take() and counters() from any thread; the ZeroMQ socket belongs to the publisher's thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "cache/kv-block-events.h"

namespace keepwarm::events {

struct kv_event_publisher_options {
    // With `*` in it (tcp://*:5556) the socket binds, else it connects (vLLM's rule).
    std::string endpoint;
    std::string topic;  // kv@<pod>@<model> (event_topic)
    int block_size = 256;
    // Block changes that may wait for the thread; past it the queue is dropped and the cache sends a full listing.
    size_t max_pending_changes = 1'000'000;
    int send_high_water_mark = 100'000;  // messages ZeroMQ queues per subscriber before it drops that subscriber's
};

struct kv_event_counters {
    std::atomic<uint64_t> messages{0};              // messages sent (each has its sequence number)
    std::atomic<uint64_t> blocks_stored{0};         // blocks in BlockStored events
    std::atomic<uint64_t> blocks_removed{0};        // blocks in BlockRemoved events
    std::atomic<uint64_t> overflow_resyncs{0};      // queue overflows: the subscribers got a full listing
    std::atomic<uint64_t> subscriber_snapshots{0};  // snapshots sent because a subscriber joined
};

class kv_event_publisher final : public kv_block_observer {
public:
    // Binds or connects at once (a bad endpoint or a port in use throws std::runtime_error naming it), then starts the
    // thread.
    explicit kv_event_publisher(kv_event_publisher_options options);
    // Sends what is queued, then AllBlocksCleared (the server's blocks go with it), and stops the thread.
    ~kv_event_publisher() override;
    kv_event_publisher(const kv_event_publisher&) = delete;
    kv_event_publisher& operator=(const kv_event_publisher&) = delete;

    bool take(kv_block_report report) override;
    const kv_event_counters& counters() const;
    const kv_event_publisher_options& options() const;

private:
    struct state;
    std::unique_ptr<state> state_;
};

}  // namespace keepwarm::events

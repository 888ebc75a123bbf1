// See kv-event-publisher.h. One thread owns an XPUB socket (a PUB socket that also hears subscriptions): it sends the
// queued reports as messages of at most max_message_blocks blocks, and a snapshot of its mirror after each
// subscription it hears.
#include "events/kv-event-publisher.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include <zmq.hpp>

#include "base/logger.h"
#include "events/kv-event-encoder.h"

namespace keepwarm::events {

namespace {
constexpr size_t max_message_blocks = 1024;

double unix_seconds_now() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// What the subscribers were told, block by block: the snapshot a new subscriber gets.
struct announced_block {
    uint8_t media = 0;
    std::optional<uint64_t> parent;
    std::vector<llama_token> tokens;
};
}  // namespace

struct kv_event_publisher::state {
    kv_event_publisher_options options;
    kv_event_counters counters;
    zmq::context_t context{1};
    zmq::socket_t socket{context, zmq::socket_type::xpub};

    std::mutex mu;
    std::condition_variable wake;
    struct queued {
        double timestamp = 0;
        kv_block_report report;
    };
    std::deque<queued> pending;  // guarded by mu
    size_t pending_changes = 0;  // guarded by mu
    bool stopping = false;       // guarded by mu

    // The thread's own.
    uint64_t sequence = 0;
    std::unordered_map<uint64_t, announced_block> announced;
    std::thread thread;

    void run();
    void send(double timestamp, const std::vector<wire_event>& events);
    void send_changes(double timestamp, std::span<const kv_block_change> changes, bool cleared_first);
    void apply(const kv_block_report& report);
    std::vector<kv_block_change> snapshot() const;
    bool heard_subscription();
};

kv_event_publisher::kv_event_publisher(kv_event_publisher_options options) : state_(std::make_unique<state>()) {
    state& s = *state_;
    s.options = std::move(options);
    try {
        s.socket.set(zmq::sockopt::xpub_verbose, 1);  // every subscription, a repeated one too: each gets a snapshot
        s.socket.set(zmq::sockopt::sndhwm, s.options.send_high_water_mark);
        s.socket.set(zmq::sockopt::linger, 1000);  // at exit, a second to deliver the last AllBlocksCleared
        if (s.options.endpoint.find('*') != std::string::npos) {
            s.socket.bind(s.options.endpoint);
        } else {
            s.socket.connect(s.options.endpoint);
        }
    } catch (const zmq::error_t& e) {
        throw std::runtime_error("--kv-events " + s.options.endpoint + ": " + e.what());
    }
    s.thread = std::thread([&s] { s.run(); });
}

kv_event_publisher::~kv_event_publisher() {
    {
        std::lock_guard lock(state_->mu);
        state_->stopping = true;
    }
    state_->wake.notify_all();
    state_->thread.join();
}

bool kv_event_publisher::take(kv_block_report report) {
    state& s = *state_;
    {
        std::lock_guard lock(s.mu);
        if (report.full_listing) {
            s.pending.clear();  // everything before is void
            s.pending_changes = 0;
        } else if (s.pending_changes + report.changes.size() > s.options.max_pending_changes) {
            s.pending.clear();
            s.pending_changes = 0;
            s.counters.overflow_resyncs++;
            return false;  // the cache follows with a full listing
        }
        s.pending_changes += report.changes.size();
        s.pending.push_back({unix_seconds_now(), std::move(report)});
    }
    s.wake.notify_one();
    return true;
}

const kv_event_counters& kv_event_publisher::counters() const {
    return state_->counters;
}

const kv_event_publisher_options& kv_event_publisher::options() const {
    return state_->options;
}

void kv_event_publisher::state::run() {
    for (;;) {
        std::deque<queued> batch;
        bool stop = false;
        {
            std::unique_lock lock(mu);
            // Subscriptions arrive on the socket, which only this thread touches: it looks at least every 20 ms.
            wake.wait_for(lock, std::chrono::milliseconds(20), [&] { return stopping || !pending.empty(); });
            batch.swap(pending);
            pending_changes = 0;
            stop = stopping;
        }
        try {
            for (const queued& q : batch) {
                apply(q.report);
                send_changes(q.timestamp, q.report.changes, q.report.full_listing);
            }
            if (heard_subscription()) {
                counters.subscriber_snapshots++;
                send_changes(unix_seconds_now(), snapshot(), /*cleared_first=*/true);
            }
            if (stop) {
                send(unix_seconds_now(), {wire_event{.what = wire_event::kind::all_blocks_cleared}});
                return;
            }
        } catch (const std::exception& e) {
            // A send cannot fail for a subscriber's sake (PUB drops at its high-water mark); this is the socket itself.
            log::error("kv-events", "publishing stopped: {}", e.what());
            return;
        }
    }
}

bool kv_event_publisher::state::heard_subscription() {
    bool subscribed = false;
    zmq::message_t message;
    while (socket.recv(message, zmq::recv_flags::dontwait)) {
        // XPUB: a subscription is its topic prefix after a 1 byte; an unsubscription after a 0 byte.
        if (message.size() > 0 && *static_cast<const uint8_t*>(message.data()) == 1) subscribed = true;
    }
    return subscribed;
}

void kv_event_publisher::state::apply(const kv_block_report& report) {
    if (report.full_listing) announced.clear();
    for (const kv_block_change& c : report.changes) {
        const uint8_t bit = kv_medium_bit(c.medium);
        if (c.stored) {
            announced_block& b = announced[c.hash];
            if (b.media == 0) {
                b.parent = c.parent;
                b.tokens = c.tokens;
            }
            b.media |= bit;
        } else if (const auto it = announced.find(c.hash); it != announced.end()) {
            it->second.media &= static_cast<uint8_t>(~bit);
            if (it->second.media == 0) announced.erase(it);
        }
    }
}

// Every announced block as stored changes, each after its parent: from the blocks whose parent is not announced, down.
std::vector<kv_block_change> kv_event_publisher::state::snapshot() const {
    std::unordered_map<uint64_t, std::vector<uint64_t>> children;
    std::vector<uint64_t> stack;
    for (const auto& [hash, block] : announced) {
        if (block.parent && announced.count(*block.parent)) {
            children[*block.parent].push_back(hash);
        } else {
            stack.push_back(hash);
        }
    }
    std::vector<kv_block_change> out;
    while (!stack.empty()) {
        const uint64_t hash = stack.back();
        stack.pop_back();
        const announced_block& block = announced.at(hash);
        for (int m = 0; m < kv_medium_count; ++m) {
            const auto medium = static_cast<kv_medium>(m);
            if (block.media & kv_medium_bit(medium)) {
                out.push_back(
                    {.stored = true, .medium = medium, .hash = hash, .parent = block.parent, .tokens = block.tokens});
            }
        }
        if (const auto it = children.find(hash); it != children.end()) {
            stack.insert(stack.end(), it->second.begin(), it->second.end());
        }
    }
    return out;
}

void kv_event_publisher::state::send_changes(double timestamp, std::span<const kv_block_change> changes,
                                             bool cleared_first) {
    std::vector<wire_event> message;
    size_t blocks = 0;
    if (cleared_first) {
        message.push_back({.what = wire_event::kind::all_blocks_cleared});
        blocks = 1;
    }
    for (wire_event& e : group_changes(changes)) {
        if (blocks + e.blocks() > max_message_blocks && !message.empty()) {
            send(timestamp, message);
            message.clear();
            blocks = 0;
        }
        blocks += e.blocks();
        message.push_back(std::move(e));
    }
    if (!message.empty()) send(timestamp, message);
}

void kv_event_publisher::state::send(double timestamp, const std::vector<wire_event>& events) {
    const std::string topic = options.topic;
    const std::string seq = sequence_frame(sequence);
    const std::string payload = encode_batch(timestamp, events, options.block_size);
    socket.send(zmq::buffer(topic), zmq::send_flags::sndmore);
    socket.send(zmq::buffer(seq), zmq::send_flags::sndmore);
    socket.send(zmq::buffer(payload), zmq::send_flags::none);
    sequence++;
    counters.messages++;
    for (const wire_event& e : events) {
        if (e.what == wire_event::kind::block_stored) counters.blocks_stored += e.hashes.size();
        if (e.what == wire_event::kind::block_removed) counters.blocks_removed += e.hashes.size();
    }
}

}  // namespace keepwarm::events

// The KV-event publisher (events/kv-event-publisher.h) seen from a ZeroMQ subscriber: numbered three-frame messages, a
// report too big for its queue refused (counted, never sent in part) and the full listing that follows sent after
// AllBlocksCleared, a snapshot of what it announced for a subscriber that joins late, AllBlocksCleared at the end.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <msgpack.hpp>
#include <zmq.hpp>

#include "events/kv-event-encoder.h"
#include "events/kv-event-publisher.h"

using namespace keepwarm;
using namespace keepwarm::events;

namespace {

int free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    socklen_t len = sizeof addr;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    ::close(fd);
    return ntohs(addr.sin_port);
}

struct message {
    std::string topic;
    uint64_t sequence = 0;
    std::vector<std::string> tags;  // each event's name
    std::vector<uint64_t> stored;   // hashes in BlockStored events
};

// The next message within 5 s (nullopt: none came).
std::optional<message> receive(zmq::socket_t& sub) {
    zmq::pollitem_t item{sub.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::milliseconds(5000)) == 0) return std::nullopt;
    std::vector<zmq::message_t> frames(3);
    for (size_t i = 0; i < 3; ++i) {
        EXPECT_TRUE(sub.recv(frames[i]));
        EXPECT_EQ(frames[i].more(), i < 2);
    }
    message m;
    m.topic = frames[0].to_string();
    EXPECT_EQ(frames[1].size(), 8u);
    for (size_t i = 0; i < 8; ++i) m.sequence = m.sequence << 8 | static_cast<const uint8_t*>(frames[1].data())[i];
    const msgpack::object_handle h = msgpack::unpack(static_cast<const char*>(frames[2].data()), frames[2].size());
    for (uint32_t i = 0; i < h.get().via.array.ptr[1].via.array.size; ++i) {
        const msgpack::object& e = h.get().via.array.ptr[1].via.array.ptr[i];
        m.tags.push_back(e.via.array.ptr[0].as<std::string>());
        if (m.tags.back() == "BlockStored") {
            for (const uint64_t hash : e.via.array.ptr[1].as<std::vector<uint64_t>>()) m.stored.push_back(hash);
        }
    }
    return m;
}

kv_block_report changes(std::initializer_list<uint64_t> hashes, bool full = false) {
    kv_block_report r;
    r.full_listing = full;
    std::optional<uint64_t> parent;
    for (const uint64_t h : hashes) {
        r.changes.push_back(
            {.stored = true, .medium = kv_medium::device, .hash = h, .parent = parent, .tokens = {1, 2}});
        parent = h;
    }
    return r;
}

}  // namespace

TEST(kv_event_publisher, overflow_snapshot_and_shutdown_reach_a_subscriber_in_order) {
    const int port = free_port();
    zmq::context_t context;
    zmq::socket_t sub(context, zmq::socket_type::sub);
    sub.set(zmq::sockopt::subscribe, "kv@");
    sub.connect("tcp://127.0.0.1:" + std::to_string(port));
    uint64_t next = 0;
    {
        kv_event_publisher publisher({.endpoint = "tcp://*:" + std::to_string(port),
                                      .topic = event_topic("pod", "model"),
                                      .block_size = 2,
                                      .max_pending_changes = 2});
        // The subscription is heard: the snapshot of nothing (AllBlocksCleared alone) comes first.
        auto first = receive(sub);
        ASSERT_TRUE(first);
        EXPECT_EQ(first->topic, "kv@pod@model");
        EXPECT_EQ(first->tags, std::vector<std::string>{"AllBlocksCleared"});
        next = first->sequence + 1;

        EXPECT_TRUE(publisher.take(changes({1, 2})));
        auto m = receive(sub);
        ASSERT_TRUE(m);
        EXPECT_EQ(m->sequence, next++);
        EXPECT_EQ(m->stored, (std::vector<uint64_t>{1, 2}));

        EXPECT_FALSE(publisher.take(changes({3, 4, 5}))) << "more than the queue holds: refused whole";
        EXPECT_EQ(publisher.counters().overflow_resyncs.load(), 1u);
        EXPECT_TRUE(publisher.take(changes({1, 2, 3, 4, 5}, /*full=*/true))) << "a full listing is always taken";
        m = receive(sub);
        ASSERT_TRUE(m);
        EXPECT_EQ(m->sequence, next++);
        ASSERT_FALSE(m->tags.empty());
        EXPECT_EQ(m->tags.front(), "AllBlocksCleared") << "a full listing starts from nothing";
        EXPECT_EQ(m->stored, (std::vector<uint64_t>{1, 2, 3, 4, 5}));

        // A subscriber that joins now gets everything announced so far; the first one gets it too, in sequence.
        zmq::socket_t late(context, zmq::socket_type::sub);
        late.set(zmq::sockopt::subscribe, "kv@");
        late.connect("tcp://127.0.0.1:" + std::to_string(port));
        auto snapshot = receive(late);
        ASSERT_TRUE(snapshot);
        EXPECT_EQ(snapshot->tags.front(), "AllBlocksCleared");
        EXPECT_EQ(snapshot->stored, (std::vector<uint64_t>{1, 2, 3, 4, 5})) << "parents before children";
        m = receive(sub);
        ASSERT_TRUE(m);
        EXPECT_EQ(m->sequence, next++);
        EXPECT_EQ(m->stored, snapshot->stored);
    }
    auto last = receive(sub);
    ASSERT_TRUE(last);
    EXPECT_EQ(last->sequence, next);
    EXPECT_EQ(last->tags, std::vector<std::string>{"AllBlocksCleared"}) << "the server's blocks go with it";
}

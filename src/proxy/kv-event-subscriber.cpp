// See kv-event-subscriber.h.
#include "proxy/kv-event-subscriber.h"

#include <zmq.hpp>

#include <chrono>
#include <memory>
#include <optional>

#include "base/logger.h"

namespace keepwarm::proxy {

namespace {

// At most one reconnection per upstream in this time: a publisher without snapshots (vLLM's) would otherwise be
// reconnected to on every message after a gap.
constexpr auto reconnect_pause = std::chrono::seconds(2);
constexpr int poll_ms = 200;  // how soon the thread sees stop_
constexpr size_t max_frames = 8;

std::unique_ptr<zmq::socket_t> open_subscription(zmq::context_t& ctx, const std::string& endpoint) {
    auto s = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::sub);
    s->set(zmq::sockopt::linger, 0);
    s->set(zmq::sockopt::rcvhwm, 1 << 17);
    // A larger message drops the connection (ZeroMQ reconnects, the publisher sends a snapshot).
    s->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(max_kv_message_bytes));
    s->set(zmq::sockopt::subscribe, "kv@");
    s->connect(endpoint);
    return s;
}

}  // namespace

kv_event_subscriber::kv_event_subscriber(std::vector<std::string> endpoints, hooks h)
    : endpoints_(std::move(endpoints)), hooks_(std::move(h)) {}

kv_event_subscriber::~kv_event_subscriber() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
}

void kv_event_subscriber::start() {
    bool any = false;
    for (const std::string& e : endpoints_) any = any || !e.empty();
    if (!any || thread_.joinable()) return;
    thread_ = std::thread([this] { run(); });
}

void kv_event_subscriber::run() {
    try {
        zmq::context_t ctx(1);
        std::vector<std::unique_ptr<zmq::socket_t>> sockets(endpoints_.size());
        std::vector<std::chrono::steady_clock::time_point> opened(endpoints_.size());
        for (size_t i = 0; i < endpoints_.size(); i++) {
            if (endpoints_[i].empty()) continue;
            sockets[i] = open_subscription(ctx, endpoints_[i]);
            opened[i] = std::chrono::steady_clock::now();
            log::info("proxy", "subscribed to the KV events of upstream {} at {}", i, endpoints_[i]);
        }
        // An upstream out of step is subscribed to again once reconnect_pause has passed since its last subscription.
        std::vector<bool> out_of_step(endpoints_.size(), false);
        const auto reopen_due = [&] {
            const auto now = std::chrono::steady_clock::now();
            for (size_t i = 0; i < sockets.size(); i++) {
                if (!out_of_step[i] || now - opened[i] < reconnect_pause) continue;
                sockets[i].reset();
                sockets[i] = open_subscription(ctx, endpoints_[i]);
                opened[i] = now;
                out_of_step[i] = false;
                hooks_.on_reconnect(i);
                log::info("proxy", "upstream {}'s KV events are out of step: subscribed again for a snapshot", i);
            }
        };
        std::vector<zmq::message_t> frames;
        while (!stop_) {
            reopen_due();
            std::vector<zmq::pollitem_t> items;
            std::vector<size_t> upstream_of;
            for (size_t i = 0; i < sockets.size(); i++) {
                if (!sockets[i]) continue;
                items.push_back({sockets[i]->handle(), 0, ZMQ_POLLIN, 0});
                upstream_of.push_back(i);
            }
            zmq::poll(items, std::chrono::milliseconds(poll_ms));
            for (size_t k = 0; k < items.size(); k++) {
                if (!(items[k].revents & ZMQ_POLLIN)) continue;
                const size_t i = upstream_of[k];
                // Drain what is there now, one whole message at a time.
                for (int n = 0; n < 1024 && !stop_; n++) {
                    frames.clear();
                    zmq::message_t frame;
                    if (!sockets[i]->recv(frame, zmq::recv_flags::dontwait)) break;
                    bool more = frame.more();
                    frames.push_back(std::move(frame));
                    while (more) {
                        zmq::message_t next;
                        (void)sockets[i]->recv(next);  // the rest of a message arrives with its first frame
                        more = next.more();
                        if (frames.size() < max_frames) frames.push_back(std::move(next));
                    }
                    std::vector<std::string_view> views;
                    for (const zmq::message_t& f : frames) views.emplace_back(f.data<char>(), f.size());
                    std::string error;
                    const std::optional<kv_event_message> m = decode_kv_event_message(views, error);
                    if (!m) {
                        malformed_++;
                        log::warn("proxy", "upstream {}'s KV events: a message is not the format ({})", i, error);
                        out_of_step[i] = true;
                        break;
                    }
                    if (hooks_.on_message(i, *m) == kv_block_index::outcome::resync) {
                        out_of_step[i] = true;
                        break;
                    }
                }
            }
        }
    } catch (const std::exception& e) {
        // Routing goes on by inference; the proxy keeps serving.
        log::error("proxy", "the KV-event subscriber stopped: {}", e.what());
    }
}

}  // namespace keepwarm::proxy

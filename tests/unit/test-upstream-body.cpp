// upstream_body_reader against keepwarm's own http_server on 127.0.0.1 (and a raw socket where an upstream must break
// HTTP): a body arrives whole and in order with its end, a consumer that stops reading stops the upstream's writes
// (backpressure) without losing a byte, an upstream that closes mid-body ends the read with an error, and finish()
// either drains a whole answer so that the connection carries the next request, or cancels at once a body that
// goes on or an upstream that says nothing.
#include "proxy/upstream-body.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "http/http-server.h"

using namespace keepwarm;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr size_t flood_chunk = 64 * 1024;
constexpr size_t flood_chunks = 512;  // 32 MiB: far more than the reader's queue (1 MiB) and the sockets' buffers hold

class UpstreamBody : public ::testing::Test {
protected:
    void SetUp() override {
        http::server_options options;
        options.port = 0;
        server = std::make_unique<http::http_server>(options);
        server->add_route("GET", "/stream", [](const http::request&, http::response_writer& w) {
            w.begin_stream(200, "text/event-stream");
            for (int i = 0; i < 3; ++i) {
                if (!w.write_chunk("data: " + std::to_string(i) + "\n\n")) return;
                std::this_thread::sleep_for(20ms);
            }
            w.end_stream();
        });
        server->add_route("GET", "/flood", [this](const http::request&, http::response_writer& w) {
            w.begin_stream(200, "application/octet-stream");
            for (size_t i = 0; i < flood_chunks; ++i) {
                if (!w.write_chunk(std::string(flood_chunk, static_cast<char>('a' + i % 26)))) return;
                flood_written += flood_chunk;
            }
            w.end_stream();
        });
        server->add_route("GET", "/endless", [this](const http::request&, http::response_writer& w) {
            w.begin_stream(200, "text/event-stream");
            while (w.write_chunk("data: tick\n\n") && !w.client_gone()) std::this_thread::sleep_for(10ms);
            endless_stopped = true;
        });
        // The head at once, then nothing for up to a minute (a long prefill), unless the client leaves.
        server->add_route("GET", "/silent", [](const http::request&, http::response_writer& w) {
            w.begin_stream(200, "text/event-stream");
            for (int i = 0; i < 3000 && !w.client_gone(); ++i) std::this_thread::sleep_for(20ms);
            w.end_stream();
        });
        server->start();
        origin = http::endpoint::parse("http://127.0.0.1:" + std::to_string(server->port()));
    }

    std::unique_ptr<http::http_server> server;
    http::endpoint origin;
    std::atomic<size_t> flood_written{0};
    std::atomic<bool> endless_stopped{false};
};

// Everything the reader gives until a piece with an end or an error (or 20 s without one).
struct body_read {
    std::string bytes;
    int pieces = 0;  // with bytes
    proxy::upstream_body_reader::piece last;
};
body_read read_to_end(proxy::upstream_body_reader& reader) {
    body_read r;
    for (const auto deadline = clock_type::now() + 20s; clock_type::now() < deadline;) {
        std::optional<proxy::upstream_body_reader::piece> p = reader.next(100ms);
        if (!p) continue;
        r.bytes += p->bytes;
        if (p->end || !p->error.empty()) {
            r.last = std::move(*p);
            return r;
        }
        r.pieces++;
    }
    ADD_FAILURE() << "the body neither ended nor failed";
    return r;
}

// A one-shot upstream on a raw socket: accepts one connection, reads the request head, writes `reply` and closes,
// however little of the body `reply` holds.
class raw_upstream {
public:
    explicit raw_upstream(std::string reply) {
        listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof addr;
        if (listener_ < 0 || ::bind(listener_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
            ::listen(listener_, 1) != 0 || ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
            throw std::runtime_error("raw_upstream: no listening socket");
        }
        port_ = ntohs(addr.sin_port);
        thread_ = std::thread([this, reply = std::move(reply)] {
            const int conn = ::accept(listener_, nullptr, nullptr);
            if (conn < 0) return;
            std::string head;
            char buf[4096];
            while (head.find("\r\n\r\n") == std::string::npos) {
                const ssize_t n = ::recv(conn, buf, sizeof buf, 0);
                if (n <= 0) break;
                head.append(buf, static_cast<size_t>(n));
            }
            (void)::send(conn, reply.data(), reply.size(), MSG_NOSIGNAL);
            std::this_thread::sleep_for(50ms);  // the piece arrives on its own before the close
            ::close(conn);
        });
    }
    ~raw_upstream() {
        ::shutdown(listener_, SHUT_RDWR);  // wakes an accept() that never got a connection
        thread_.join();
        ::close(listener_);
    }
    http::endpoint origin() const { return http::endpoint::parse("http://127.0.0.1:" + std::to_string(port_)); }

private:
    int listener_ = -1;
    uint16_t port_ = 0;
    std::thread thread_;
};

}  // namespace

TEST_F(UpstreamBody, ABodyArrivesWholeAndInOrderWithItsEnd) {
    http::client_connection conn(origin);
    const auto sent = clock_type::now();
    ASSERT_EQ(conn.send("GET", "/stream").status, 200);
    proxy::upstream_body_reader reader(conn);
    std::optional<proxy::upstream_body_reader::piece> first = reader.next(60s);
    ASSERT_TRUE(first);
    EXPECT_EQ(first->bytes, "data: 0\n\n");
    EXPECT_GE(first->read_at, sent);
    EXPECT_LE(first->read_at, clock_type::now());
    const body_read rest = read_to_end(reader);
    EXPECT_EQ(rest.bytes, "data: 1\n\ndata: 2\n\n");
    EXPECT_TRUE(rest.last.end);
    EXPECT_EQ(rest.last.error, "");
    EXPECT_FALSE(reader.next(50ms));  // nothing after the end
    EXPECT_TRUE(reader.finish(true));
    EXPECT_TRUE(reader.finish(true));  // a second finish() says the same
    EXPECT_TRUE(conn.reusable());
}

TEST_F(UpstreamBody, NextWaitsNoLongerThanItIsTold) {
    http::client_connection conn(origin);
    conn.send("GET", "/silent");
    proxy::upstream_body_reader reader(conn);
    const auto start = clock_type::now();
    EXPECT_FALSE(reader.next(100ms));
    const auto waited = clock_type::now() - start;
    EXPECT_GE(waited, 100ms);
    EXPECT_LT(waited, 30s);  // not the upstream's minute
}

TEST_F(UpstreamBody, AConsumerThatStopsReadingStopsTheUpstreamAndLosesNoByte) {
    http::client_connection conn(origin);
    conn.send("GET", "/flood");
    proxy::upstream_body_reader reader(conn);
    // Nobody reads: the reader's queue fills, then the sockets' buffers, then the upstream's writes block.
    size_t before = 0, after = 0;
    for (int i = 0; i < 50; ++i) {
        std::this_thread::sleep_for(200ms);
        after = flood_written.load();
        if (after == before && after > 0) break;
        before = after;
    }
    EXPECT_EQ(after, before) << "the upstream kept writing to a reader nobody reads";
    EXPECT_LT(after, flood_chunk * flood_chunks / 2);  // about 4 MiB on Linux's loopback

    const body_read r = read_to_end(reader);
    EXPECT_TRUE(r.last.end) << r.last.error;
    ASSERT_EQ(r.bytes.size(), flood_chunk * flood_chunks);
    for (size_t i = 0; i < flood_chunks; ++i) {
        ASSERT_EQ(r.bytes[i * flood_chunk], static_cast<char>('a' + i % 26)) << "chunk " << i;
        ASSERT_EQ(r.bytes[(i + 1) * flood_chunk - 1], static_cast<char>('a' + i % 26)) << "chunk " << i;
    }
    EXPECT_TRUE(reader.finish(true));
}

TEST(UpstreamBodyBroken, AnUpstreamThatClosesMidBodyEndsTheReadWithAnError) {
    const char* chunked =
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        "9\r\ndata: 0\n\n\r\n";
    const char* sized = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\ndata: 0\n\n";
    for (const char* reply : {chunked, sized}) {
        raw_upstream upstream(reply);
        http::client_connection conn(upstream.origin());
        ASSERT_EQ(conn.send("GET", "/v1/chat/completions").status, 200);
        proxy::upstream_body_reader reader(conn);
        const body_read r = read_to_end(reader);
        EXPECT_EQ(r.bytes, "data: 0\n\n") << reply;
        EXPECT_FALSE(r.last.end) << reply;
        EXPECT_NE(r.last.error, "") << reply;
        EXPECT_FALSE(reader.finish(true)) << reply;
        EXPECT_FALSE(conn.reusable()) << reply;
    }
}

TEST_F(UpstreamBody, FinishWithoutDrainCancelsABodyThatGoesOn) {
    auto conn = std::make_unique<http::client_connection>(origin);
    conn->send("GET", "/endless");
    {
        proxy::upstream_body_reader reader(*conn);
        ASSERT_TRUE(reader.next(60s));
        const auto start = clock_type::now();
        EXPECT_FALSE(reader.finish(false));
        EXPECT_LT(clock_type::now() - start, 30s);  // a hang guard: the body never ends
        EXPECT_FALSE(conn->reusable());
    }
    conn.reset();  // what the proxy does with a connection it cannot reuse: the upstream sees its client go
    for (int i = 0; i < 3000 && !endless_stopped; ++i) std::this_thread::sleep_for(20ms);
    EXPECT_TRUE(endless_stopped) << "the upstream still writes to a connection the proxy gave up";
}

TEST_F(UpstreamBody, FinishCancelsAnUpstreamThatSaysNothing) {
    http::client_connection conn(origin);
    conn.send("GET", "/silent");
    proxy::upstream_body_reader reader(conn);
    const auto start = clock_type::now();
    EXPECT_FALSE(reader.finish(false));
    EXPECT_LT(clock_type::now() - start, 30s);  // not the upstream's minute
}

TEST_F(UpstreamBody, FinishWithDrainReadsTheEndSoTheConnectionCarriesTheNextRequest) {
    http::client_connection conn(origin);
    conn.send("GET", "/stream");
    proxy::upstream_body_reader reader(conn);
    std::string bytes;
    while (bytes.find("data: 2") == std::string::npos) {
        std::optional<proxy::upstream_body_reader::piece> p = reader.next(60s);
        ASSERT_TRUE(p && !p->end && p->error.empty());
        bytes += p->bytes;
    }
    EXPECT_TRUE(reader.finish(true));  // only the end marker was left
    ASSERT_TRUE(conn.reusable());
    conn.send("GET", "/stream");
    EXPECT_EQ(conn.read_body(), "data: 0\n\ndata: 1\n\ndata: 2\n\n");
    EXPECT_EQ(conn.connects(), 1u);
}

TEST_F(UpstreamBody, FinishWithDrainGivesUpOnABodyThatGoesOn) {
    http::client_connection conn(origin);
    conn.send("GET", "/endless");
    proxy::upstream_body_reader reader(conn);
    ASSERT_TRUE(reader.next(60s));
    const auto start = clock_type::now();
    EXPECT_FALSE(reader.finish(true));
    const auto took = clock_type::now() - start;
    EXPECT_GE(took, 200ms);  // it waited for the end a while
    EXPECT_LT(took, 30s);    // and gave up: the body never ends
    EXPECT_FALSE(conn.reusable());
}

TEST_F(UpstreamBody, DestroyingTheReaderWithoutFinishStopsItsThread) {
    http::client_connection conn(origin);
    conn.send("GET", "/endless");
    const auto start = clock_type::now();
    {
        proxy::upstream_body_reader reader(conn);
        ASSERT_TRUE(reader.next(60s));
    }
    EXPECT_LT(clock_type::now() - start, 30s);  // a hang guard: the body never ends
    EXPECT_FALSE(conn.reusable());
}

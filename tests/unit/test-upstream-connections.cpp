// upstream_connections against keepwarm's own http_server on 127.0.0.1: a connection given back after a whole answer
// carries the next request on the same TCP connection, one whose answer was not read to its end is closed, at most
// max_idle wait, and an upstream that goes down loses its idle connections and keeps none until it is up.
#include "proxy/upstream-connections.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "http/http-server.h"

using namespace keepwarm;
using namespace std::chrono_literals;

namespace {

class UpstreamConnections : public ::testing::Test {
protected:
    void SetUp() override {
        http::server_options options;
        options.port = 0;
        server = std::make_unique<http::http_server>(options);
        server->add_route("POST", "/echo", [](const http::request& req, http::response_writer& w) {
            w.send(200, "text/plain", req.body);
        });
        server->add_route("GET", "/stream", [](const http::request&, http::response_writer& w) {
            w.begin_stream(200, "text/event-stream");
            for (int i = 0; i < 3 && w.write_chunk("data: " + std::to_string(i) + "\n\n"); ++i) {
                std::this_thread::sleep_for(20ms);
            }
            w.end_stream();
        });
        server->start();
        origin = http::endpoint::parse("http://127.0.0.1:" + std::to_string(server->port()));
    }

    // A connection that carried one whole request.
    std::unique_ptr<http::client_connection> used(proxy::upstream_connections& pool, size_t upstream = 0) {
        auto conn = pool.take(upstream);
        conn->send("POST", "/echo", "hi", "text/plain");
        EXPECT_EQ(conn->read_body(), "hi");
        return conn;
    }

    std::unique_ptr<http::http_server> server;
    http::endpoint origin;
};

}  // namespace

TEST_F(UpstreamConnections, AConnectionGivenBackCarriesTheNextRequestOnTheSameSocket) {
    proxy::upstream_connections pool({origin}, 4, {});
    auto conn = used(pool);
    const http::client_connection* first = conn.get();
    pool.give_back(0, std::move(conn));
    EXPECT_EQ(pool.stats(0).idle, 1u);

    auto again = pool.take(0);
    EXPECT_EQ(again.get(), first);
    again->send("POST", "/echo", "again", "text/plain");
    EXPECT_EQ(again->read_body(), "again");
    EXPECT_EQ(again->connects(), 1u);  // one TCP connection for both requests

    const auto counts = pool.stats(0);
    EXPECT_EQ(counts.opened, 1u);
    EXPECT_EQ(counts.reused, 1u);
    EXPECT_EQ(counts.idle, 0u);
}

TEST_F(UpstreamConnections, AConnectionWhoseAnswerWasNotReadToItsEndIsClosed) {
    proxy::upstream_connections pool({origin}, 4, {});
    auto conn = pool.take(0);
    conn->send("GET", "/stream");
    std::string piece;
    ASSERT_TRUE(conn->read_some(piece));  // the first piece only
    pool.give_back(0, std::move(conn));
    EXPECT_EQ(pool.stats(0).idle, 0u);
    pool.give_back(0, nullptr);  // nothing to give back: nothing kept
    EXPECT_EQ(pool.stats(0).idle, 0u);
    EXPECT_NE(pool.take(0), nullptr);
    EXPECT_EQ(pool.stats(0).opened, 2u);
}

TEST_F(UpstreamConnections, AtMostMaxIdleWaitPerUpstream) {
    proxy::upstream_connections pool({origin, origin}, 2, {});
    std::vector<std::unique_ptr<http::client_connection>> conns;
    for (int i = 0; i < 3; ++i) conns.push_back(used(pool));
    conns.push_back(used(pool, 1));
    for (int i = 0; i < 3; ++i) pool.give_back(0, std::move(conns[i]));
    pool.give_back(1, std::move(conns[3]));
    EXPECT_EQ(pool.stats(0).idle, 2u);
    EXPECT_EQ(pool.stats(0).opened, 3u);
    EXPECT_EQ(pool.stats(1).idle, 1u);  // each upstream has its own pool
    EXPECT_EQ(pool.stats(1).opened, 1u);
}

TEST_F(UpstreamConnections, AnUpstreamThatGoesDownLosesItsIdleConnectionsAndKeepsNoneUntilItIsUp) {
    proxy::upstream_connections pool({origin, origin}, 4, {});
    pool.give_back(0, used(pool));
    pool.give_back(1, used(pool, 1));
    pool.set_up(0, false);
    EXPECT_EQ(pool.stats(0).idle, 0u);
    EXPECT_EQ(pool.stats(1).idle, 1u);

    pool.give_back(0, used(pool));  // a request that was under way when it went down
    EXPECT_EQ(pool.stats(0).idle, 0u);

    pool.set_up(0, true);
    pool.give_back(0, used(pool));
    EXPECT_EQ(pool.stats(0).idle, 1u);
}

TEST_F(UpstreamConnections, ANewConnectionGetsThePoolsOptions) {
    // A read timeout shorter than the upstream's pause: the pool's options reach the connection it makes.
    http::server_options options;
    options.port = 0;
    std::atomic<bool> timed_out{false};
    http::http_server silent(options);
    // Answers only once the client has timed out (60 s at most), however late its timer fires on a busy machine.
    silent.add_route("GET", "/slow", [&timed_out](const http::request&, http::response_writer& w) {
        for (int i = 0; i < 6000 && !timed_out; ++i) std::this_thread::sleep_for(10ms);
        w.send(200, "text/plain", "late");
    });
    silent.start();
    proxy::upstream_connections slow_pool({http::endpoint::parse("http://127.0.0.1:" + std::to_string(silent.port()))},
                                          4, {.read_timeout = 100ms});
    auto conn = slow_pool.take(0);
    EXPECT_THROW(conn->send("GET", "/slow"), http::client_error);
    timed_out = true;
}

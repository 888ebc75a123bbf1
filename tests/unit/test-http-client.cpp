// client_connection against keepwarm's own http_server on 127.0.0.1: whole and streamed bodies, keep-alive reuse
// and reconnect, refused connections, timeouts, cancel() from another thread, and endpoint parsing.
#include "http/http-client.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

using namespace keepwarm::http;
using namespace std::chrono_literals;

namespace {

class HttpClient : public ::testing::Test {
protected:
    void SetUp() override {
        server_options options;
        options.port = 0;
        options.idle_timeout = 300ms;  // so a kept-alive client connection gets closed by the server
        server = std::make_unique<http_server>(options);
        server->add_route("POST", "/echo", [this](const request& req, response_writer& out) {
            ++echo_calls;
            out.send(200, "text/plain", req.method + " " + req.path + " " + req.header("x-test") + " " + req.body,
                     {{"X-Reply", "yes"}});
        });
        // The first piece, then the rest once the client says it has read the first (60 s at most).
        server->add_route("GET", "/stream", [this](const request&, response_writer& out) {
            out.begin_stream(200, "text/event-stream");
            if (!out.write_chunk("data: 0\n\n")) return;
            hold(first_piece_read);
            for (int i = 1; i < 3; ++i) {
                if (!out.write_chunk("data: " + std::to_string(i) + "\n\n")) return;
            }
            out.end_stream();
        });
        server->add_route("GET", "/endless", [this](const request&, response_writer& out) {
            out.begin_stream(200, "text/event-stream");
            while (out.write_chunk("data: tick\n\n")) {
                if (out.client_gone()) break;
                std::this_thread::sleep_for(20ms);
            }
            endless_stopped = true;
        });
        // A prefill: nothing at all for 2 s, then a stream of pieces 20 ms apart.
        server->add_route("GET", "/prefill", [](const request&, response_writer& out) {
            std::this_thread::sleep_for(2s);
            out.begin_stream(200, "text/event-stream");
            for (int i = 0; i < 3; ++i) {
                if (!out.write_chunk("data: " + std::to_string(i) + "\n\n")) return;
                std::this_thread::sleep_for(20ms);
            }
            out.end_stream();
        });
        // The head at once, then nothing until the test ends (60 s at most); or one piece and then nothing.
        server->add_route("GET", "/head-then-hang", [this](const request& req, response_writer& out) {
            out.begin_stream(200, "text/event-stream");
            if (req.query.find("piece") != std::string::npos) out.write_chunk("data: 0\n\n");
            hold(test_over);
            out.end_stream();
        });
        server->add_route("GET", "/slow", [this](const request&, response_writer& out) {
            hold(test_over);
            out.send(200, "text/plain", "late");
        });
        server->start();
        origin = endpoint::parse("http://127.0.0.1:" + std::to_string(server->port()));
    }

    void TearDown() override { test_over = true; }

    // Waits for `flag` with a hang guard: no timing here depends on the machine's speed.
    static void hold(const std::atomic<bool>& flag) {
        for (int i = 0; i < 6000 && !flag; ++i) std::this_thread::sleep_for(10ms);
    }

    std::unique_ptr<http_server> server;
    endpoint origin;
    std::atomic<int> echo_calls{0};
    std::atomic<bool> endless_stopped{false};
    std::atomic<bool> first_piece_read{false};
    std::atomic<bool> test_over{false};
};

TEST_F(HttpClient, WholeResponseWithHeadersAndBody) {
    client_connection connection(origin);
    client_response head = connection.send("POST", "/echo", "hello", "text/plain", {{"X-Test", "t1"}});
    EXPECT_EQ(head.status, 200);
    EXPECT_EQ(head.header("x-reply"), "yes");
    EXPECT_EQ(head.header("content-type"), "text/plain");
    EXPECT_EQ(connection.read_body(), "POST /echo t1 hello");
}

TEST_F(HttpClient, KeepAliveReusesTheConnectionAndReconnectsAfterTheServerClosedIt) {
    client_connection connection(origin);
    for (int i = 0; i < 2; ++i) {
        connection.send("POST", "/echo", std::to_string(i));
        EXPECT_EQ(connection.read_body(), "POST /echo  " + std::to_string(i));
    }
    std::this_thread::sleep_for(700ms);  // past the server's idle timeout: it closes the kept-alive connection
    connection.send("POST", "/echo", "again");
    EXPECT_EQ(connection.read_body(), "POST /echo  again");
    EXPECT_EQ(echo_calls, 3);  // the stale connection was retried, not answered twice
}

TEST_F(HttpClient, StreamedBodyArrivesPieceByPiece) {
    client_connection connection(origin);
    client_response head = connection.send("GET", "/stream");
    EXPECT_EQ(head.status, 200);
    std::string piece, all;
    int pieces = 0;
    while (connection.read_some(piece)) {
        ++pieces;
        all += piece;
        first_piece_read = true;
    }
    EXPECT_EQ(all, "data: 0\n\ndata: 1\n\ndata: 2\n\n");
    EXPECT_GE(pieces, 2);  // the server sends the rest only after the first piece was read
    EXPECT_TRUE(piece.empty());
}

TEST_F(HttpClient, UnknownRouteIsAStatusNotAnError) {
    fetched r = fetch(origin, "GET", "/nowhere");
    EXPECT_EQ(r.status, 404);
    EXPECT_NE(r.body.find("error"), std::string::npos);
}

TEST_F(HttpClient, RefusedConnectionIsAConnectError) {
    uint16_t port = server->port();
    server->stop();
    client_connection connection(endpoint::parse("http://127.0.0.1:" + std::to_string(port)));
    try {
        connection.send("GET", "/stream");
        FAIL() << "expected client_error";
    } catch (const client_error& e) {
        EXPECT_EQ(e.reason, client_error::kind::connect) << e.what();
    }
}

TEST_F(HttpClient, ReadTimeout) {
    client_options options;
    options.read_timeout = 150ms;
    client_connection connection(origin, options);
    auto start = std::chrono::steady_clock::now();
    try {
        connection.send("GET", "/slow");
        FAIL() << "expected a timeout";
    } catch (const client_error& e) {
        EXPECT_EQ(e.reason, client_error::kind::timeout) << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);  // the server holds its answer for 60 s
}

TEST_F(HttpClient, AFirstByteTimeoutSaysTheRequestWasSent) {
    client_options options;
    options.first_byte_timeout = 150ms;
    client_connection connection(origin, options);
    const auto start = std::chrono::steady_clock::now();
    try {
        connection.send("GET", "/slow");
        FAIL() << "expected a timeout";
    } catch (const client_error& e) {
        EXPECT_EQ(e.reason, client_error::kind::timeout) << e.what();
        EXPECT_NE(std::string(e.what()).find("was sent and no answer came in 0.15 s (first-byte timeout)"),
                  std::string::npos)
            << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);  // the server holds its answer for 60 s
}

TEST_F(HttpClient, TheFirstByteTimeoutCoversAHeadThatComesBeforeTheAnswer) {
    client_options options;
    options.first_byte_timeout = 150ms;
    client_connection connection(origin, options);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(connection.send("GET", "/head-then-hang").status, 200);
    std::string piece;
    try {
        connection.read_some(piece);
        FAIL() << "expected a timeout";
    } catch (const client_error& e) {
        EXPECT_EQ(e.reason, client_error::kind::timeout) << e.what();
        EXPECT_NE(std::string(e.what()).find("(first-byte timeout)"), std::string::npos) << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);  // the server holds its answer for 60 s
}

TEST_F(HttpClient, AnIdleTimeoutIsNamedAsOne) {
    client_options options;
    options.first_byte_timeout = 60s;
    options.read_timeout = 150ms;
    client_connection connection(origin, options);
    EXPECT_EQ(connection.send("GET", "/head-then-hang?piece").status, 200);
    std::string piece;
    ASSERT_TRUE(connection.read_some(piece));
    try {
        connection.read_some(piece);
        FAIL() << "expected a timeout";
    } catch (const client_error& e) {
        EXPECT_EQ(e.reason, client_error::kind::timeout) << e.what();
        EXPECT_NE(std::string(e.what()).find("nothing came for 0.15 s (idle timeout)"), std::string::npos) << e.what();
    }
}

TEST_F(HttpClient, AFirstByteTimeoutLongerThanTheIdleOneLetsAPrefillFinish) {
    client_options options;
    options.first_byte_timeout = 60s;
    options.read_timeout = 1s;  // shorter than the 2 s prefill: only the first byte may take that long
    client_connection connection(origin, options);
    EXPECT_EQ(connection.send("GET", "/prefill").status, 200);
    EXPECT_EQ(connection.read_body(), "data: 0\n\ndata: 1\n\ndata: 2\n\n");
}

TEST_F(HttpClient, CancelFromAnotherThreadStopsAStreamAndTheServerSeesTheClientGo) {
    client_connection connection(origin);
    connection.send("GET", "/endless");
    std::string piece;
    ASSERT_TRUE(connection.read_some(piece));
    std::thread canceller([&] {
        std::this_thread::sleep_for(100ms);
        connection.cancel();
    });
    bool cancelled = false;
    try {
        while (connection.read_some(piece)) {
        }
    } catch (const client_error& e) {
        cancelled = e.reason == client_error::kind::cancelled;
    }
    canceller.join();
    EXPECT_TRUE(cancelled);
    // A hang guard of 60 s: under the sanitizers on a busy machine the server thread took over 2 s to notice.
    for (int i = 0; i < 3000 && !endless_stopped; ++i) std::this_thread::sleep_for(20ms);
    EXPECT_TRUE(endless_stopped);
    EXPECT_THROW(connection.send("POST", "/echo", "x"), client_error);
}

TEST(Endpoint, Parse) {
    endpoint a = endpoint::parse("http://localhost:11434");
    EXPECT_EQ(a.host, "localhost");
    EXPECT_EQ(a.port, 11434);
    EXPECT_EQ(a.base_path, "");
    endpoint b = endpoint::parse("http://10.0.0.2/llm/");
    EXPECT_EQ(b.port, 80);
    EXPECT_EQ(b.base_path, "/llm");
    EXPECT_EQ(b.url(), "http://10.0.0.2:80/llm");
    endpoint c = endpoint::parse("http://[::1]:8080/v1");
    EXPECT_EQ(c.host, "::1");
    EXPECT_EQ(c.url(), "http://[::1]:8080/v1");
    for (const char* bad : {"https://x:1", "x:80", "http://:80", "http://h:0", "http://h:70000", "http://h:8a"}) {
        EXPECT_THROW(endpoint::parse(bad), std::invalid_argument) << bad;
    }
}

}  // namespace

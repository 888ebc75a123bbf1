// A quiet stream gets its API's keep-alive once the interval passes without a write, only while it streams, and a
// failed keep-alive write is a client gone.
#include <gtest/gtest.h>

#include <thread>

#include "fake-response-writer.h"
#include "routes/stream-keepalive.h"

using keepwarm::keepalive_writer;
using namespace std::chrono_literals;

namespace {

keepalive_writer pinging(test_support::fake_writer& client, std::chrono::milliseconds interval) {
    return keepalive_writer(
        client, [] { return std::string(": ka\n\n"); }, interval);
}

}  // namespace

// Every wait here holds on a busy machine: a check that nothing is due comes well inside its interval, one that
// something is due polls for it.
TEST(stream_keepalive, a_quiet_stream_gets_a_keepalive_per_interval) {
    test_support::fake_writer client;
    keepalive_writer w = pinging(client, 1s);
    std::this_thread::sleep_for(1100ms);
    EXPECT_FALSE(w.client_gone());
    EXPECT_EQ(client.body, "");  // nothing before the stream begins (a whole answer has no room for one)

    ASSERT_TRUE(w.begin_stream(200, "text/event-stream"));
    EXPECT_FALSE(w.client_gone());
    EXPECT_EQ(client.body, "");                              // not due yet
    for (int i = 0; i < 6000 && client.body.empty(); ++i) {  // a hang guard: 60 s
        std::this_thread::sleep_for(10ms);
        EXPECT_FALSE(w.client_gone());
    }
    EXPECT_EQ(client.body, ": ka\n\n");
    EXPECT_FALSE(w.client_gone());  // the keep-alive was a write: the next one is an interval away
    EXPECT_EQ(w.keepalives_written(), 1);

    w.end_stream();
    std::this_thread::sleep_for(1100ms);
    EXPECT_FALSE(w.client_gone());
    EXPECT_EQ(w.keepalives_written(), 1);  // nothing after the end
}

TEST(stream_keepalive, a_real_write_restarts_the_interval) {
    test_support::fake_writer client;
    keepalive_writer w = pinging(client, 3s);
    ASSERT_TRUE(w.begin_stream(200, "text/event-stream"));
    std::this_thread::sleep_for(1500ms);
    ASSERT_TRUE(w.write_chunk("data: x\n\n"));
    std::this_thread::sleep_for(1700ms);  // past the interval since the stream began, half of it since the write
    EXPECT_FALSE(w.client_gone());
    EXPECT_EQ(client.body, "data: x\n\n");
    EXPECT_EQ(w.keepalives_written(), 0);
}

TEST(stream_keepalive, zero_means_never) {
    test_support::fake_writer client;
    keepalive_writer w = pinging(client, 0ms);
    ASSERT_TRUE(w.begin_stream(200, "text/event-stream"));
    std::this_thread::sleep_for(10ms);
    EXPECT_FALSE(w.client_gone());
    EXPECT_EQ(client.body, "");
}

TEST(stream_keepalive, a_failed_write_is_a_client_gone) {
    // A socket whose writes fail while its poll has not seen the peer leave yet.
    struct broken_pipe final : keepwarm::http::response_writer {
        bool send(int, std::string_view, std::string_view, const keepwarm::http::header_list&) override {
            return false;
        }
        bool begin_stream(int, std::string_view, const keepwarm::http::header_list&) override { return true; }
        bool write_chunk(std::string_view) override { return false; }
        void end_stream() override {}
        bool client_gone() override { return false; }
        bool started() const override { return true; }
    } client;
    keepalive_writer w(
        client, [] { return std::string(": ka\n\n"); }, 10ms);
    ASSERT_TRUE(w.begin_stream(200, "text/event-stream"));
    EXPECT_FALSE(w.client_gone());
    std::this_thread::sleep_for(15ms);
    EXPECT_TRUE(w.client_gone());
    EXPECT_TRUE(w.client_gone());  // and stays gone
}

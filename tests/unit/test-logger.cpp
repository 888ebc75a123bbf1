// The process log (base/logger.h): the level threshold, the text line's shape and escaping, JSON lines that parse
// with their fields, and whole lines from many threads.
#include "base/logger.h"

#include <gtest/gtest.h>

#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

using namespace keepwarm;  // `log::` then names keepwarm::log (a namespace alias named log would clash with ::log)
using json = nlohmann::json;

namespace {

// Captures the lines written while it lives, and puts the defaults back afterwards.
class captured_log {
public:
    explicit captured_log(log::level threshold = log::level::info, log::format f = log::format::text) {
        log::set_level(threshold);
        log::set_format(f);
        log::set_sink([this](std::string_view line) {
            std::lock_guard lock(mu_);
            lines_.emplace_back(line);
        });
    }
    ~captured_log() {
        log::set_sink({});
        log::set_level(log::level::info);
        log::set_format(log::format::text);
    }
    std::vector<std::string> lines() const {
        std::lock_guard lock(mu_);
        return lines_;
    }

private:
    mutable std::mutex mu_;
    std::vector<std::string> lines_;
};

}  // namespace

TEST(Logger, ParsesLevelAndFormatNames) {
    EXPECT_EQ(log::parse_level("error"), log::level::error);
    EXPECT_EQ(log::parse_level("warn"), log::level::warn);
    EXPECT_EQ(log::parse_level("info"), log::level::info);
    EXPECT_EQ(log::parse_level("debug"), log::level::debug);
    EXPECT_EQ(log::parse_level("INFO"), std::nullopt);
    EXPECT_EQ(log::parse_level("verbose"), std::nullopt);
    EXPECT_EQ(log::parse_format("text"), log::format::text);
    EXPECT_EQ(log::parse_format("json"), log::format::json);
    EXPECT_EQ(log::parse_format("logfmt"), std::nullopt);
}

TEST(Logger, WritesOnlyLevelsAtOrAboveTheThreshold) {
    captured_log out(log::level::warn);
    EXPECT_TRUE(log::enabled(log::level::error));
    EXPECT_TRUE(log::enabled(log::level::warn));
    EXPECT_FALSE(log::enabled(log::level::info));
    EXPECT_FALSE(log::enabled(log::level::debug));
    log::error("test", "e");
    log::warn("test", "w");
    log::info("test", "i");
    log::debug("test", "d");
    log::write(log::level::info, "test", "i2", {{"n", 1}});
    const auto lines = out.lines();
    ASSERT_EQ(lines.size(), 2u);
    EXPECT_NE(lines[0].find("ERROR test: e\n"), std::string::npos) << lines[0];
    EXPECT_NE(lines[1].find("WARN  test: w\n"), std::string::npos) << lines[1];

    log::set_level(log::level::debug);
    log::debug("test", "d");
    ASSERT_EQ(out.lines().size(), 3u);
    EXPECT_NE(out.lines()[2].find("DEBUG test: d\n"), std::string::npos);
}

TEST(Logger, TextLineHasTimestampLevelComponentMessageAndFields) {
    captured_log out;
    const std::string dir = "/tmp/cache";
    log::info("disk cache", "{} blocks and {} checkpoints ({} MiB) in {}", size_t{3}, 0, log::fixed(12.345, 1), dir);
    log::write(log::level::info, "http", "request",
               {{"method", "GET"},
                {"path", "/v1/models"},
                {"status", 200},
                {"duration_ms", 1.5},
                {"client", "has space"},
                {"quote", "a\"b=c"},
                {"empty", ""},
                {"ok", true}});
    const auto lines = out.lines();
    ASSERT_EQ(lines.size(), 2u);
    const std::regex stamp(R"(^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO  )");
    EXPECT_TRUE(std::regex_search(lines[0], stamp)) << lines[0];
    EXPECT_EQ(lines[0].substr(31), "disk cache: 3 blocks and 0 checkpoints (12.3 MiB) in /tmp/cache\n");
    EXPECT_EQ(lines[1].substr(31),
              "http: request method=GET path=/v1/models status=200 duration_ms=1.5 client=\"has space\" "
              "quote=\"a\\\"b=c\" empty=\"\" ok=true\n");
}

TEST(Logger, TextLineStaysOneLine) {
    captured_log out;
    log::warn("policy", "prompt \"{}\"", std::string("line one\nline two\r\x01\t"));
    log::write(log::level::info, "http", "request", {{"path", "/a\nb"}});
    const auto lines = out.lines();
    ASSERT_EQ(lines.size(), 2u);
    for (const std::string& line : lines) {
        EXPECT_EQ(line.find('\n'), line.size() - 1) << line;
        EXPECT_EQ(line.find('\r'), std::string::npos) << line;
    }
    EXPECT_NE(lines[0].find(R"(prompt "line one\nline two\r\x01\t")"), std::string::npos) << lines[0];
    EXPECT_NE(lines[1].find(R"(path="/a\nb")"), std::string::npos) << lines[1];
}

TEST(Logger, JsonLinesParseWithEscapedTextAndTypedFields) {
    captured_log out(log::level::info, log::format::json);
    const std::string hostile = "quote \" backslash \\ newline \n tab \t nul " + std::string(1, '\0') + " end";
    log::warn("proxy", "upstream {} failed ({})", "http://u:1", hostile);
    log::write(log::level::info, "http", "request",
               {{"method", "POST"}, {"status", 503}, {"duration_ms", 12.5}, {"request_id", "ab-1"}, {"ok", false}});
    log::info("chat", "bad bytes {}", std::string("\xff\xfe"));
    const auto lines = out.lines();
    ASSERT_EQ(lines.size(), 3u);
    for (const std::string& line : lines) EXPECT_EQ(line.find('\n'), line.size() - 1) << line;

    const json first = json::parse(lines[0]);
    EXPECT_EQ(first["level"], "warn");
    EXPECT_EQ(first["component"], "proxy");
    EXPECT_EQ(first["msg"], "upstream http://u:1 failed (" + hostile + ")");
    EXPECT_TRUE(
        std::regex_match(first["time"].get<std::string>(), std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)")));

    const json access = json::parse(lines[1]);
    EXPECT_EQ(access["msg"], "request");
    EXPECT_EQ(access["method"], "POST");
    EXPECT_EQ(access["status"], 503);
    EXPECT_TRUE(access["status"].is_number_integer());
    EXPECT_EQ(access["duration_ms"], 12.5);
    EXPECT_EQ(access["request_id"], "ab-1");
    EXPECT_EQ(access["ok"], false);

    const json replaced = json::parse(lines[2]);  // invalid UTF-8 is replaced, not thrown on
    EXPECT_EQ(replaced["msg"], "bad bytes \xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(Logger, FormatsNumbersAndText) {
    captured_log out;
    const std::string_view view = "view";
    log::info("t", "{} {} {} {} {} {} {}", -7, uint64_t{18446744073709551615u}, 0.25, log::fixed(2.0, 0), view, 'c',
              true);
    ASSERT_EQ(out.lines().size(), 1u);
    EXPECT_EQ(out.lines()[0].substr(31), "t: -7 18446744073709551615 0.25 2 view c true\n");
}

TEST(Logger, LinesFromManyThreadsArriveWhole) {
    captured_log out(log::level::info, log::format::json);
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
        threads.emplace_back([t] {
            for (int i = 0; i < 200; ++i) log::info("thread", "{} says {}", t, std::string(100, 'a' + t));
        });
    }
    for (auto& th : threads) th.join();
    const auto lines = out.lines();
    ASSERT_EQ(lines.size(), 1600u);
    for (const std::string& line : lines) {
        const json parsed = json::parse(line);
        const int t = std::stoi(parsed["msg"].get<std::string>());
        EXPECT_EQ(parsed["msg"], std::to_string(t) + " says " + std::string(100, static_cast<char>('a' + t)));
    }
}

// http_server over real sockets on 127.0.0.1: routing, auth, limits, error mapping, streaming, client-gone
// detection, keep-alive, concurrency, connection caps (in all and per address, from 127.0.0.2 as a second client
// address: Linux routes all of 127.0.0.0/8 to lo), read deadlines, CORS and shutdown. The client is raw POSIX sockets
// with poll() timeouts, so a broken server fails a test instead of hanging it.
#include "http/http-server.h"

#include "base/logger.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace keepwarm::http;
using namespace std::chrono_literals;
using json = nlohmann::json;
using steady = std::chrono::steady_clock;

namespace {

constexpr auto io_timeout = 60s;  // a hang guard: nothing waits for it unless something is broken

struct response {
    int status = 0;
    std::map<std::string, std::string> headers;  // lowercased names
    std::string body;
    std::string header(const std::string& name) const {
        auto it = headers.find(name);
        return it == headers.end() ? "" : it->second;
    }
    json body_json() const { return json::parse(body, nullptr, false); }
};

std::string lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

class client {
public:
    // `from`: the local address to connect from, e.g. "127.0.0.2" to be another client address.
    explicit client(uint16_t port, const char* from = nullptr) {
        fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (from) {
            sockaddr_in local{};
            local.sin_family = AF_INET;
            ::inet_pton(AF_INET, from, &local.sin_addr);
            if (::bind(fd_, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0) return;
        }
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_port = htons(port);
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
        int one = 1;
        ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    ~client() { close(); }
    client(const client&) = delete;
    client& operator=(const client&) = delete;

    bool connected() const { return connected_; }
    void close() {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
    }

    bool send(const std::string& data) {
        size_t off = 0;
        while (off < data.size()) {
            ssize_t n = ::send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
            if (n <= 0) return false;
            off += static_cast<size_t>(n);
        }
        return true;
    }

    // Reads more bytes into the buffer; false on EOF, error or timeout.
    bool fill(std::chrono::milliseconds timeout = std::chrono::duration_cast<std::chrono::milliseconds>(io_timeout)) {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return false;
        char tmp[16384];
        ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
        if (n <= 0) {
            eof_ = true;
            return false;
        }
        buf_.append(tmp, static_cast<size_t>(n));
        return true;
    }

    bool read_until(const std::string& needle) {
        auto deadline = steady::now() + io_timeout;
        while (buf_.find(needle) == std::string::npos) {
            if (steady::now() > deadline || !fill()) return false;
        }
        return true;
    }

    // True if the server closes the connection (after any remaining bytes) within the timeout.
    bool closed_by_server() {
        auto deadline = steady::now() + io_timeout;
        while (!eof_ && steady::now() < deadline) fill(100ms);
        return eof_;
    }

    // Reads one response (skipping 1xx); nullopt on timeout or malformed data.
    std::optional<response> read_response() {
        for (;;) {
            if (!read_until("\r\n\r\n")) return std::nullopt;
            size_t head_end = buf_.find("\r\n\r\n");
            std::string head = buf_.substr(0, head_end);
            buf_.erase(0, head_end + 4);
            response r;
            size_t line_end = head.find("\r\n");
            std::string status_line = head.substr(0, line_end);
            if (status_line.size() < 12) return std::nullopt;
            r.status = std::stoi(status_line.substr(9, 3));
            size_t pos = line_end == std::string::npos ? head.size() : line_end + 2;
            while (pos < head.size()) {
                size_t e = head.find("\r\n", pos);
                if (e == std::string::npos) e = head.size();
                std::string line = head.substr(pos, e - pos);
                size_t colon = line.find(':');
                if (colon != std::string::npos) {
                    std::string value = line.substr(colon + 1);
                    while (!value.empty() && value.front() == ' ') value.erase(0, 1);
                    r.headers[lower(line.substr(0, colon))] = value;
                }
                pos = e + 2;
            }
            if (r.status >= 100 && r.status < 200) continue;
            if (lower(r.header("transfer-encoding")) == "chunked") {
                for (;;) {
                    if (!read_until("\r\n")) return std::nullopt;
                    size_t e = buf_.find("\r\n");
                    size_t size = std::stoul(buf_.substr(0, e), nullptr, 16);
                    buf_.erase(0, e + 2);
                    while (buf_.size() < size + 2) {
                        if (!fill()) return std::nullopt;
                    }
                    r.body += buf_.substr(0, size);
                    buf_.erase(0, size + 2);
                    if (size == 0) break;  // no trailers from this server
                }
            } else if (!r.header("content-length").empty()) {
                size_t len = std::stoul(r.header("content-length"));
                while (buf_.size() < len) {
                    if (!fill()) return std::nullopt;
                }
                r.body = buf_.substr(0, len);
                buf_.erase(0, len);
            } else if (r.status != 204 && r.status != 304) {
                closed_by_server();
                r.body = std::move(buf_);
                buf_.clear();
            }
            return r;
        }
    }

    const std::string& buffer() const { return buf_; }
    bool eof() const { return eof_; }

private:
    int fd_ = -1;
    bool connected_ = false;
    bool eof_ = false;
    std::string buf_;
};

std::string make_request(const std::string& method, const std::string& target, const std::string& body = "",
                         const std::vector<std::string>& headers = {}) {
    std::string r = method + " " + target + " HTTP/1.1\r\nHost: test\r\n";
    for (const auto& h : headers) r += h + "\r\n";
    if (!body.empty() || method == "POST") r += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    r += "\r\n" + body;
    return r;
}

std::optional<response> roundtrip(uint16_t port, const std::string& req, const char* from = nullptr) {
    client c(port, from);
    if (!c.connected() || !c.send(req)) return std::nullopt;
    return c.read_response();
}

server_options local_options() {
    server_options o;
    o.host = "127.0.0.1";
    o.port = 0;
    return o;
}

void reply_text(response_writer& w, const std::string& text) {
    w.send(200, "text/plain", text);
}

}  // namespace

TEST(HttpServer, ErrorBodyShape) {
    json j = json::parse(openai_error_body(404, "invalid_request_error", "no \"such\" thing"));
    EXPECT_EQ(j["error"]["message"], "no \"such\" thing");
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_EQ(j["error"]["code"], 404);
    // Invalid UTF-8 (bytes echoed from a request) must not throw.
    EXPECT_NO_THROW(openai_error_body(400, "x", std::string("bad \xff\xfe bytes")));
}

TEST(HttpServer, BindsFreePortAndReportsBindFailure) {
    http_server a(local_options());
    a.start();
    ASSERT_NE(a.port(), 0);

    server_options o = local_options();
    o.port = a.port();
    http_server b(o);
    try {
        b.start();
        FAIL() << "binding a port in use should throw";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(a.port())), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("is in use"), std::string::npos) << e.what();
    }

    server_options bad = local_options();
    bad.host = "256.1.2.3";
    http_server c(bad);
    EXPECT_THROW(c.start(), std::runtime_error);
}

// A server that listens while its model loads: every request gets the held answer (the health path too, with a
// key required or not), routes registered meanwhile answer only after open().
TEST(HttpServer, AHeldServerAnswersItsHoldUntilOpened) {
    server_options o = local_options();
    o.api_key = "sk-held-0123";
    http_server s(o);
    const std::string loading = R"({"error":{"code":503,"message":"Loading model","type":"unavailable_error"}})";
    s.hold(503, loading);
    s.start();
    for (const char* path : {"/health", "/v1/models", "/nowhere"}) {
        auto r = roundtrip(s.port(), make_request("GET", path, ""));
        ASSERT_TRUE(r) << path;
        EXPECT_EQ(r->status, 503) << path;
        EXPECT_EQ(r->body, loading) << path;
        EXPECT_EQ(r->header("retry-after"), "1") << path;
    }
    s.add_route("GET", "/health", [](const request&, response_writer& w) { reply_text(w, "ok"); },
                {.requires_auth = false});
    s.add_route("GET", "/v1/models", [](const request&, response_writer& w) { reply_text(w, "models"); });
    auto r = roundtrip(s.port(), make_request("GET", "/health", ""));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 503) << "registered, not yet open";
    s.open();
    r = roundtrip(s.port(), make_request("GET", "/health", ""));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, "ok");
    r = roundtrip(s.port(), make_request("GET", "/v1/models", ""));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401) << "open: the key is asked for again";
}

TEST(HttpServer, RoutingAndRequestFields) {
    http_server s(local_options());
    s.add_route("GET", "/hello", [](const request& r, response_writer& w) {
        reply_text(w, r.method + "|" + r.path + "|" + r.query + "|" + r.header("x-custom") + "|" +
                          (r.remote.rfind("127.0.0.1:", 0) == 0 ? "local" : r.remote));
    });
    s.add_route("POST", "/echo", [](const request& r, response_writer& w) { reply_text(w, r.body); });
    s.start();

    auto r = roundtrip(s.port(), make_request("GET", "/hello?a=1&b=2", "", {"X-Custom: Value"}));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, "GET|/hello|a=1&b=2|Value|local");

    r = roundtrip(s.port(), make_request("POST", "/echo", "payload"));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, "payload");

    r = roundtrip(s.port(), make_request("POST", "/hello", "x"));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 405);
    EXPECT_EQ(r->header("allow"), "GET");
    EXPECT_EQ(r->header("content-type"), "application/json");
    EXPECT_EQ(r->body_json()["error"]["code"], 405);

    r = roundtrip(s.port(), make_request("GET", "/missing"));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 404);
    EXPECT_EQ(r->body_json()["error"]["code"], 404);
    EXPECT_EQ(r->body_json()["error"]["type"], "invalid_request_error");

    r = roundtrip(s.port(), make_request("OPTIONS", "/echo"));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 204);
    EXPECT_NE(r->header("allow").find("POST"), std::string::npos);
}

// A "/*" route takes the paths under it that no exact route takes (the longest prefix first), with its method checks
// and error shape; paths under a prefix with an error format of its own answer 404 in that shape.
TEST(HttpServer, PrefixRoutesAndPrefixErrorFormats) {
    http_server s(local_options());
    const auto shape = [](const char* name) {
        return [name](int status, const std::string&, const std::string& message) {
            return json{{"shape", name}, {"status", status}, {"message", message}}.dump();
        };
    };
    s.add_route("GET", "/v1/models", [](const request&, response_writer& w) { reply_text(w, "list"); });
    s.add_route("GET", "/v1/models/*", [](const request& r, response_writer& w) {
        reply_text(w, "one:" + path_rest(r.path, "/v1/models/").value_or("?"));
    });
    s.add_route("GET", "/v1/models/special/*", [](const request&, response_writer& w) { reply_text(w, "special"); });
    s.add_route(
        "GET", "/api/tags", [](const request&, response_writer& w) { reply_text(w, "tags"); },
        route_options{.format_error = shape("ollama")});
    s.set_error_format("/api/", shape("ollama"));
    s.start();

    const auto get = [&](const std::string& method, const std::string& target) {
        auto r = roundtrip(s.port(), make_request(method, target, method == "GET" ? "" : "{}"));
        EXPECT_TRUE(r) << target;
        return r.value_or(response{});
    };
    EXPECT_EQ(get("GET", "/v1/models").body, "list");
    EXPECT_EQ(get("GET", "/v1/models/qwen3:0.6b").body, "one:qwen3:0.6b");
    EXPECT_EQ(get("GET", "/v1/models/org/name").body, "one:org/name");
    EXPECT_EQ(get("GET", "/v1/models/org%2Fname?x=1").body, "one:org/name");
    EXPECT_EQ(get("GET", "/v1/models/special/x").body, "special");
    EXPECT_EQ(get("GET", "/v1/models/").status, 404) << "an empty rest is no model";
    response r = get("POST", "/v1/models/x");
    EXPECT_EQ(r.status, 405);
    EXPECT_EQ(r.header("allow"), "GET");

    r = get("GET", "/api/nope");
    EXPECT_EQ(r.status, 404);
    EXPECT_EQ(r.body_json()["shape"], "ollama");
    EXPECT_EQ(r.body_json()["message"], "Invalid URL (GET /api/nope)");
    EXPECT_EQ(get("POST", "/api/tags").body_json()["shape"], "ollama") << "405 in the route's shape";
    r = get("GET", "/apix");
    EXPECT_EQ(r.status, 404);
    EXPECT_EQ(r.body_json()["error"]["code"], 404) << "outside the prefix: OpenAI's shape";
}

TEST(HttpServer, PathRestAndQueryValue) {
    EXPECT_EQ(path_rest("/v1/models/a%3Ab", "/v1/models/"), "a:b");
    EXPECT_EQ(path_rest("/v1/models/a+b", "/v1/models/"), "a+b") << "'+' is a space only in a query";
    EXPECT_EQ(path_rest("/v1/models/a%2", "/v1/models/"), std::nullopt);
    EXPECT_EQ(path_rest("/v1/other", "/v1/models/"), std::nullopt);
    EXPECT_EQ(query_value("a=1&fail_on_no_slot=1", "fail_on_no_slot"), "1");
    EXPECT_EQ(query_value("flag&b=x+y%21", "flag"), "");
    EXPECT_EQ(query_value("flag&b=x+y%21", "b"), "x y!");
    EXPECT_EQ(query_value("ab=1", "a"), std::nullopt);
    EXPECT_EQ(query_value("", "a"), std::nullopt);
    EXPECT_EQ(query_value("a=%zz&a=2", "a"), "2") << "a malformed value is skipped";
}

// One access line per request, as it ends: method, path (no query), status, client, duration and the id the response
// carried in x-request-id; also for a request refused before any handler (404) and one that could not be read (400).
TEST(HttpServer, EachRequestGetsAnIdAndOneAccessLine) {
    std::mutex mu;
    std::vector<std::string> lines;
    keepwarm::log::set_format(keepwarm::log::format::json);
    keepwarm::log::set_sink([&](std::string_view line) {
        std::lock_guard lock(mu);
        lines.emplace_back(line);
    });
    struct restore {
        ~restore() {
            keepwarm::log::set_sink({});
            keepwarm::log::set_format(keepwarm::log::format::text);
        }
    } restore_log;
    http_server s(local_options());
    s.add_route("POST", "/echo", [](const request& r, response_writer& w) { reply_text(w, r.id); });
    s.start();

    auto first = roundtrip(s.port(), make_request("POST", "/echo?secret=1", "hi"));
    auto second = roundtrip(s.port(), make_request("POST", "/echo", "hi"));
    auto missing = roundtrip(s.port(), make_request("GET", "/missing"));
    auto malformed = roundtrip(s.port(), "POST /echo HTTP/1.1\r\nContent-Length: zz\r\n\r\n");
    ASSERT_TRUE(first && second && missing && malformed);
    EXPECT_FALSE(first->header("x-request-id").empty());
    EXPECT_EQ(first->body, first->header("x-request-id"));  // the handler sees the id the client gets
    EXPECT_NE(first->header("x-request-id"), second->header("x-request-id"));
    EXPECT_EQ(missing->status, 404);
    EXPECT_FALSE(missing->header("x-request-id").empty());
    EXPECT_EQ(malformed->status, 400);
    s.stop();

    std::lock_guard lock(mu);
    ASSERT_EQ(lines.size(), 4u);
    std::map<std::string, json> by_id;  // a line is written after its response, so their order may vary
    for (const std::string& line : lines) {
        json parsed = json::parse(line);
        by_id[parsed["request_id"].get<std::string>()] = parsed;
    }
    const json& one = by_id[first->header("x-request-id")];
    EXPECT_EQ(one["component"], "http");
    EXPECT_EQ(one["level"], "info");
    EXPECT_EQ(one["method"], "POST");
    EXPECT_EQ(one["path"], "/echo");  // the query is left out: it may hold what the log should not
    EXPECT_EQ(one["status"], 200);
    EXPECT_EQ(one["client"].get<std::string>().rfind("127.0.0.1:", 0), 0u);
    EXPECT_TRUE(one["duration_ms"].is_number());
    EXPECT_GE(one["duration_ms"].get<double>(), 0.0);
    EXPECT_EQ(by_id[second->header("x-request-id")]["status"], 200);
    EXPECT_EQ(by_id[missing->header("x-request-id")]["path"], "/missing");
    EXPECT_EQ(by_id[missing->header("x-request-id")]["status"], 404);
    EXPECT_EQ(by_id[malformed->header("x-request-id")]["status"], 400);
    EXPECT_EQ(by_id[malformed->header("x-request-id")]["method"], "POST");
}

TEST(HttpServer, AccessLinesAreLeftOutBelowInfo) {
    std::atomic<int> written{0};
    keepwarm::log::set_level(keepwarm::log::level::warn);
    keepwarm::log::set_sink([&](std::string_view) { ++written; });
    struct restore {
        ~restore() {
            keepwarm::log::set_sink({});
            keepwarm::log::set_level(keepwarm::log::level::info);
        }
    } restore_log;
    http_server s(local_options());
    s.add_route("GET", "/hello", [](const request&, response_writer& w) { reply_text(w, "hi"); });
    s.start();
    auto r = roundtrip(s.port(), make_request("GET", "/hello"));
    ASSERT_TRUE(r);
    EXPECT_FALSE(r->header("x-request-id").empty());
    s.stop();
    EXPECT_EQ(written.load(), 0);
}

TEST(HttpServer, ApiKeyAuth) {
    server_options o = local_options();
    o.api_key = "s3cret";
    http_server s(o);
    s.add_route("GET", "/private", [](const request&, response_writer& w) { reply_text(w, "ok"); });
    s.add_route(
        "GET", "/public", [](const request&, response_writer& w) { reply_text(w, "open"); },
        route_options{.requires_auth = false});
    s.start();

    auto r = roundtrip(s.port(), make_request("GET", "/private"));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401);
    EXPECT_EQ(r->body_json()["error"]["type"], "authentication_error");

    r = roundtrip(s.port(), make_request("GET", "/private", "", {"Authorization: Bearer wrong"}));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401);
    r = roundtrip(s.port(), make_request("GET", "/private", "", {"x-api-key: s3cre"}));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401);

    r = roundtrip(s.port(), make_request("GET", "/private", "", {"Authorization: Bearer s3cret"}));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, "ok");
    r = roundtrip(s.port(), make_request("GET", "/private", "", {"X-Api-Key: s3cret"}));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    r = roundtrip(s.port(), make_request("GET", "/private", "", {"Authorization: Basic Zm9v", "x-api-key: s3cret"}));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);

    r = roundtrip(s.port(), make_request("GET", "/public"));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, "open");
}

TEST(HttpServer, ApiKeysNameTheirTenant) {
    server_options o = local_options();
    o.api_keys = {{"key-alice-0123", "alice"}, {"key-bob-012345", "bob"}};
    http_server s(o);
    s.add_route("GET", "/who", [](const request& req, response_writer& w) { reply_text(w, "tenant=" + req.tenant); });
    s.start();
    auto r = roundtrip(s.port(), make_request("GET", "/who", "", {"Authorization: Bearer key-alice-0123"}));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->body, "tenant=alice");
    r = roundtrip(s.port(), make_request("GET", "/who", "", {"x-api-key: key-bob-012345"}));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->body, "tenant=bob");
    // A header that claims a tenant changes nothing: only the key does.
    r = roundtrip(s.port(), make_request("GET", "/who", "", {"x-api-key: key-bob-01234", "x-keepwarm-tenant: bob"}));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401);
}

TEST(HttpServer, BodyLimitAndMalformedRequests) {
    server_options o = local_options();
    o.max_body_bytes = 1024;
    http_server s(o);
    s.add_route("POST", "/echo", [](const request& r, response_writer& w) { reply_text(w, r.body); });
    s.start();

    {
        client c(s.port());
        ASSERT_TRUE(c.send(make_request("POST", "/echo", std::string(4096, 'x'))));
        auto r = c.read_response();
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 413);
        EXPECT_NE(r->body_json()["error"]["message"].get<std::string>().find("1024-byte limit"), std::string::npos)
            << r->body;
        EXPECT_TRUE(c.closed_by_server());
    }
    {  // chunked upload that grows past the limit
        client c(s.port());
        std::string chunk(800, 'y');
        char size_line[16];
        std::snprintf(size_line, sizeof size_line, "%zx\r\n", chunk.size());
        std::string req = "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
        for (int i = 0; i < 2; ++i) req += size_line + chunk + "\r\n";
        req += "0\r\n\r\n";
        ASSERT_TRUE(c.send(req));
        auto r = c.read_response();
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 413);
        EXPECT_TRUE(c.closed_by_server());
    }
    {
        auto r = roundtrip(s.port(), make_request("POST", "/echo", std::string(1024, 'z')));
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 200);
        EXPECT_EQ(r->body.size(), 1024u);
    }
    {
        client c(s.port());
        ASSERT_TRUE(c.send("THIS IS NOT HTTP\r\n\r\n"));
        auto r = c.read_response();
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 400);
        EXPECT_EQ(r->body_json()["error"]["code"], 400);
        EXPECT_TRUE(c.closed_by_server());
    }
}

TEST(HttpServer, TransferEncodingNotEndingInChunkedOrBesideContentLengthIs400) {
    http_server s(local_options());
    s.add_route("POST", "/echo", [](const request& r, response_writer& w) { reply_text(w, r.body); });
    s.start();

    // RFC 9112 6.1: the body's length cannot be trusted, whichever way a proxy in front read it.
    const std::vector<std::pair<std::string, std::string>> ambiguous = {
        {"Transfer-Encoding: chunked, identity\r\nContent-Length: 5\r\n\r\nhello", "both Transfer-Encoding"},
        {"Transfer-Encoding: identity\r\nContent-Length: 5\r\n\r\nhello", "both Transfer-Encoding"},
        {"Transfer-Encoding: gzip\r\n\r\n", "'gzip' is not supported"},
        {"Transfer-Encoding: chunked, gzip\r\n\r\n5\r\nhello\r\n0\r\n\r\n", "'chunked, gzip' is not supported"},
        {"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", ""},
        {"Transfer-Encoding: ,\r\nContent-Length: 5\r\n\r\nhello", "both Transfer-Encoding"},
        {"Transfer-Encoding: ,\r\n\r\n", "names no coding"},
    };
    for (const auto& [headers, says] : ambiguous) {
        SCOPED_TRACE(headers);
        client c(s.port());
        ASSERT_TRUE(c.send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n" + headers));
        auto r = c.read_response();
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 400);
        EXPECT_EQ(r->body_json()["error"]["code"], 400);
        EXPECT_NE(r->body_json()["error"]["message"].get<std::string>().find(says), std::string::npos) << r->body;
        EXPECT_TRUE(c.closed_by_server());
    }
    // Chunked alone is read as before.
    auto r = roundtrip(s.port(),
                       "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: Chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, "hello");
}

TEST(HttpServer, ExpectContinue) {
    http_server s(local_options());
    s.add_route("POST", "/echo", [](const request& r, response_writer& w) { reply_text(w, r.body); });
    s.start();
    client c(s.port());
    ASSERT_TRUE(c.send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"));
    ASSERT_TRUE(c.read_until("100 Continue\r\n\r\n"));
    ASSERT_TRUE(c.send("hello"));
    auto r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, "hello");
}

TEST(HttpServer, HandlerErrorsMapToRouteErrorBodies) {
    http_server s(local_options());
    auto custom = [](int status, const std::string& type, const std::string& message) {
        return json{{"type", "error"}, {"error", {{"type", type}, {"message", message}, {"status", status}}}}.dump();
    };
    s.add_route(
        "POST", "/bad",
        [](const request&, response_writer&) { throw keepwarm::request_error(422, "nope", "custom_type"); },
        route_options{.format_error = custom});
    s.add_route("POST", "/busy", [](const request&, response_writer&) {
        throw keepwarm::request_error(503, "wait", "server_error", /*retry_after_s=*/1);
    });
    s.add_route("POST", "/boom", [](const request&, response_writer&) { throw std::runtime_error("kaboom"); });
    s.add_route("POST", "/silent", [](const request&, response_writer&) {});
    s.add_route("GET", "/ok", [](const request&, response_writer& w) { reply_text(w, "fine"); });
    s.start();

    // All on one keep-alive connection: error responses leave it usable.
    client c(s.port());
    ASSERT_TRUE(c.send(make_request("POST", "/bad", "{}")));
    auto r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 422);
    EXPECT_EQ(r->body_json()["error"]["type"], "custom_type");
    EXPECT_EQ(r->body_json()["error"]["message"], "nope");
    EXPECT_EQ(r->body_json()["type"], "error");
    EXPECT_EQ(r->header("retry-after"), "");

    ASSERT_TRUE(c.send(make_request("POST", "/busy", "{}")));  // a full queue: try again in a second
    r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 503);
    EXPECT_EQ(r->header("retry-after"), "1");
    EXPECT_EQ(r->body_json()["error"]["message"], "wait");

    ASSERT_TRUE(c.send(make_request("POST", "/boom", "{}")));
    r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 500);
    EXPECT_EQ(r->body_json()["error"]["type"], "server_error");
    EXPECT_EQ(r->body_json()["error"]["message"], "kaboom");

    ASSERT_TRUE(c.send(make_request("POST", "/silent", "{}")));
    r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 500);
    EXPECT_EQ(r->body_json()["error"]["message"], "handler sent no response");

    ASSERT_TRUE(c.send(make_request("GET", "/ok")));
    r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
}

TEST(HttpServer, StreamingDeliversChunksIncrementally) {
    http_server s(local_options());
    std::promise<void> first_received;
    auto first_received_future = first_received.get_future();
    std::atomic<bool> handler_saw_client_ack{false};
    s.add_route("POST", "/stream", [&](const request&, response_writer& w) {
        ASSERT_TRUE(w.begin_stream(200, "text/event-stream"));
        ASSERT_TRUE(w.write_chunk("data: one\n\n"));
        // The client acknowledges the first event before the handler goes on: proves it was not buffered.
        handler_saw_client_ack = first_received_future.wait_for(io_timeout) == std::future_status::ready;
        std::this_thread::sleep_for(10ms);
        w.write_chunk("data: two\n\n");
        std::this_thread::sleep_for(10ms);
        w.write_chunk("data: three\n\n");
        w.end_stream();
    });
    s.add_route("GET", "/after", [](const request&, response_writer& w) { reply_text(w, "after"); });
    s.start();

    client c(s.port());
    ASSERT_TRUE(c.send(make_request("POST", "/stream", "{}")));
    ASSERT_TRUE(c.read_until("data: one\n\n"));
    first_received.set_value();
    auto r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_TRUE(handler_saw_client_ack);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->header("content-type"), "text/event-stream");
    EXPECT_EQ(r->header("cache-control"), "no-cache");
    EXPECT_EQ(lower(r->header("transfer-encoding")), "chunked");
    EXPECT_EQ(r->body, "data: one\n\ndata: two\n\ndata: three\n\n");

    // The connection stays usable after a finished stream.
    ASSERT_TRUE(c.send(make_request("GET", "/after")));
    r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->body, "after");
}

TEST(HttpServer, StreamWithoutEndAndStreamCutByException) {
    http_server s(local_options());
    s.add_route("GET", "/unended", [](const request&, response_writer& w) {
        w.begin_stream(200, "text/plain");
        w.write_chunk("abc");
    });
    s.add_route("GET", "/throws", [](const request&, response_writer& w) {
        w.begin_stream(200, "text/plain");
        w.write_chunk("partial");
        throw std::runtime_error("generation failed");
    });
    s.start();

    client c(s.port());
    ASSERT_TRUE(c.send(make_request("GET", "/unended")));
    auto r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->body, "abc");

    client d(s.port());
    ASSERT_TRUE(d.send(make_request("GET", "/throws")));
    ASSERT_TRUE(d.read_until("partial"));
    EXPECT_FALSE(d.read_response());  // no final chunk: the stream ends with the connection
    EXPECT_TRUE(d.closed_by_server());
}

TEST(HttpServer, Http10StreamEndsWithClose) {
    http_server s(local_options());
    s.add_route("GET", "/s", [](const request&, response_writer& w) {
        w.begin_stream(200, "text/plain");
        w.write_chunk("x");
        w.write_chunk("y");
        w.end_stream();
    });
    s.start();
    client c(s.port());
    ASSERT_TRUE(c.send("GET /s HTTP/1.0\r\n\r\n"));
    auto r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, "xy");
}

TEST(HttpServer, ClientGoneDetectedAfterClientCloses) {
    http_server s(local_options());
    std::promise<bool> gone_before;  // client_gone() while the client is still connected
    std::promise<void> first_written;
    std::promise<bool> observed;  // client_gone() turned true within the handler's budget
    s.add_route("POST", "/stream", [&](const request&, response_writer& w) {
        w.begin_stream(200, "text/event-stream");
        w.write_chunk("data: first\n\n");
        gone_before.set_value(w.client_gone());
        first_written.set_value();
        auto deadline = steady::now() + io_timeout;
        while (!w.client_gone() && steady::now() < deadline) std::this_thread::sleep_for(5ms);
        observed.set_value(w.client_gone());
    });
    s.start();

    auto c = std::make_unique<client>(s.port());
    ASSERT_TRUE(c->send(make_request("POST", "/stream", "{}")));
    ASSERT_EQ(first_written.get_future().wait_for(io_timeout), std::future_status::ready);
    ASSERT_TRUE(c->read_until("data: first"));
    c->close();
    auto closed_at = steady::now();
    auto fut = observed.get_future();
    ASSERT_EQ(fut.wait_for(io_timeout), std::future_status::ready);
    EXPECT_TRUE(fut.get());  // seen before the handler's budget (io_timeout) ran out
    EXPECT_LT(steady::now() - closed_at, io_timeout);
    EXPECT_FALSE(gone_before.get_future().get());
}

TEST(HttpServer, PipelinedRequestIsNotClientGone) {
    http_server s(local_options());
    std::promise<void> started;
    std::promise<bool> gone;
    s.add_route("GET", "/wait", [&](const request&, response_writer& w) {
        started.set_value();
        std::this_thread::sleep_for(200ms);  // lets the next request arrive in the socket
        gone.set_value(w.client_gone());
        reply_text(w, "waited");
    });
    s.add_route("GET", "/next", [](const request&, response_writer& w) { reply_text(w, "next"); });
    s.start();

    client c(s.port());
    ASSERT_TRUE(c.send(make_request("GET", "/wait")));
    ASSERT_EQ(started.get_future().wait_for(io_timeout), std::future_status::ready);
    ASSERT_TRUE(c.send(make_request("GET", "/next")));
    auto r1 = c.read_response();
    auto r2 = c.read_response();
    ASSERT_TRUE(r1 && r2);
    EXPECT_EQ(r1->body, "waited");
    EXPECT_EQ(r2->body, "next");
    EXPECT_FALSE(gone.get_future().get());
}

TEST(HttpServer, KeepAliveAndPipelining) {
    http_server s(local_options());
    std::atomic<int> n{0};
    s.add_route("GET", "/n", [&](const request&, response_writer& w) { reply_text(w, std::to_string(++n)); });
    s.start();

    client c(s.port());
    ASSERT_TRUE(c.send(make_request("GET", "/n")));
    auto r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->body, "1");
    ASSERT_TRUE(c.send(make_request("GET", "/n")));
    r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->body, "2");

    ASSERT_TRUE(c.send(make_request("GET", "/n") + make_request("GET", "/n")));
    auto a = c.read_response();
    auto b = c.read_response();
    ASSERT_TRUE(a && b);
    EXPECT_EQ(a->body, "3");
    EXPECT_EQ(b->body, "4");

    ASSERT_TRUE(c.send(make_request("GET", "/n", "", {"Connection: close"})));
    r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(lower(r->header("connection")), "close");
    EXPECT_TRUE(c.closed_by_server());
}

TEST(HttpServer, ConcurrentSlowRequests) {
    constexpr int count = 8;
    http_server s(local_options());
    std::mutex m;
    std::condition_variable cv;
    int in_flight = 0;
    std::atomic<int> saw_all{0};
    s.add_route("GET", "/slow", [&](const request&, response_writer& w) {
        std::unique_lock lock(m);
        ++in_flight;
        cv.notify_all();
        // Every handler waits until all are running at once: only possible if they run concurrently.
        if (cv.wait_for(lock, io_timeout, [&] { return in_flight >= count; })) ++saw_all;
        lock.unlock();
        std::this_thread::sleep_for(200ms);
        reply_text(w, "done");
    });
    s.start();

    std::vector<std::thread> threads;
    std::atomic<int> ok{0};
    for (int i = 0; i < count; ++i) {
        threads.emplace_back([&] {
            auto r = roundtrip(s.port(), make_request("GET", "/slow"));
            if (r && r->status == 200 && r->body == "done") ++ok;
        });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(ok, count);
    EXPECT_EQ(saw_all, count);  // every handler saw all of them running at once: no timing needed
}

TEST(HttpServer, StopClosesIdleKeepAliveAndStreamingConnections) {
    auto s = std::make_unique<http_server>(local_options());
    std::promise<void> streaming;
    std::atomic<bool> handler_done{false};
    s->add_route("GET", "/n", [](const request&, response_writer& w) { reply_text(w, "1"); });
    s->add_route("GET", "/forever", [&](const request&, response_writer& w) {
        w.begin_stream(200, "text/event-stream");
        w.write_chunk("data: x\n\n");
        streaming.set_value();
        auto deadline = steady::now() + 2 * io_timeout;
        while (!w.client_gone() && steady::now() < deadline) std::this_thread::sleep_for(5ms);
        handler_done = true;
    });
    s->start();

    client idle(s->port());
    ASSERT_TRUE(idle.send(make_request("GET", "/n")));
    ASSERT_TRUE(idle.read_response());
    client stream(s->port());
    ASSERT_TRUE(stream.send(make_request("GET", "/forever")));
    ASSERT_EQ(streaming.get_future().wait_for(io_timeout), std::future_status::ready);

    auto t0 = steady::now();
    s->stop();
    EXPECT_LT(steady::now() - t0, io_timeout);  // not the handler's own deadline (twice that)
    EXPECT_TRUE(handler_done);
    EXPECT_TRUE(idle.closed_by_server());
    EXPECT_TRUE(stream.closed_by_server());
    s->stop();  // idempotent

    s->start();  // a stopped server can start again
    auto r = roundtrip(s->port(), make_request("GET", "/n"));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->body, "1");
    s.reset();
}

TEST(HttpServer, MaxConnectionsAnswers503) {
    server_options o = local_options();
    o.max_connections = 2;
    http_server s(o);
    s.add_route("GET", "/n", [](const request&, response_writer& w) { reply_text(w, "ok"); });
    s.start();

    auto c1 = std::make_unique<client>(s.port());
    client c2(s.port());
    ASSERT_TRUE(c1->send(make_request("GET", "/n")));
    ASSERT_TRUE(c1->read_response());
    ASSERT_TRUE(c2.send(make_request("GET", "/n")));
    ASSERT_TRUE(c2.read_response());

    {
        client c3(s.port());
        ASSERT_TRUE(c3.send(make_request("GET", "/n")));
        auto r = c3.read_response();
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 503);
        EXPECT_EQ(r->body_json()["error"]["code"], 503);
        EXPECT_TRUE(c3.closed_by_server());
    }

    // A slot frees once a connection closes.
    c1.reset();
    bool served = false;
    auto deadline = steady::now() + io_timeout;
    while (!served && steady::now() < deadline) {
        auto r = roundtrip(s.port(), make_request("GET", "/n"));
        served = r && r->status == 200;
        if (!served) std::this_thread::sleep_for(20ms);
    }
    EXPECT_TRUE(served);
}

TEST(HttpServer, IdleConnectionsAreClosedButSlowHandlersAreNot) {
    server_options o = local_options();
    o.idle_timeout = 300ms;
    o.header_timeout = 300ms;
    http_server s(o);
    s.add_route("GET", "/n", [](const request&, response_writer& w) { reply_text(w, "ok"); });
    s.add_route("GET", "/slow", [](const request&, response_writer& w) {
        std::this_thread::sleep_for(2500ms);  // well past the idle timeout: handlers are not timed out
        reply_text(w, "done");
    });
    s.start();

    client idle(s.port());
    ASSERT_TRUE(idle.send(make_request("GET", "/n")));
    ASSERT_TRUE(idle.read_response());
    // A client that sends only part of its headers counts as idle too.
    client trickle(s.port());
    ASSERT_TRUE(trickle.send("GET /n HTTP/1.1\r\nHost: x\r\n"));

    client slow(s.port());
    ASSERT_TRUE(slow.send(make_request("GET", "/slow")));
    auto r = slow.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, "done");
    EXPECT_TRUE(idle.closed_by_server());
    EXPECT_TRUE(trickle.closed_by_server());
}

namespace {

// Opens `count` connections from `from` and has each answered once, so the server counts them all as open.
std::vector<std::unique_ptr<client>> hold_connections(uint16_t port, int count, const char* from = nullptr) {
    std::vector<std::unique_ptr<client>> held;
    for (int i = 0; i < count; ++i) {
        auto c = std::make_unique<client>(port, from);
        EXPECT_TRUE(c->send(make_request("GET", "/n")));
        auto r = c->read_response();
        EXPECT_TRUE(r && r->status == 200);
        held.push_back(std::move(c));
    }
    return held;
}

// One connection from `from`, kept open once it is served; tried again while the server answers 503. A connection
// that hold_connections() got an answer on may still be finishing that request on the server's side (on a busy
// machine, for a while), and only a connection waiting for its next request can give its place to a newcomer.
std::unique_ptr<client> hold_once_served(uint16_t port, const char* from) {
    const auto deadline = steady::now() + io_timeout;
    for (;;) {
        auto c = std::make_unique<client>(port, from);
        EXPECT_TRUE(c->send(make_request("GET", "/n")));
        auto r = c->read_response();
        if ((r && r->status == 200) || steady::now() > deadline) {
            EXPECT_TRUE(r && r->status == 200);
            return c;
        }
        std::this_thread::sleep_for(20ms);
    }
}

}  // namespace

TEST(HttpServer, PerAddressLimitLeavesOtherAddressesServed) {
    server_options o = local_options();
    o.max_connections = 16;
    o.max_connections_per_address = 3;
    http_server s(o);
    s.add_route("GET", "/n", [](const request&, response_writer& w) { reply_text(w, "ok"); });
    s.start();

    auto held = hold_connections(s.port(), 3, "127.0.0.1");
    {
        client over(s.port(), "127.0.0.1");
        ASSERT_TRUE(over.send(make_request("GET", "/n")));
        auto r = over.read_response();
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 503);
        const std::string message = r->body_json()["error"]["message"];
        EXPECT_NE(message.find("from 127.0.0.1 (limit 3 per address)"), std::string::npos) << message;
        EXPECT_EQ(r->header("retry-after"), "1");
        EXPECT_TRUE(over.closed_by_server());
    }
    auto r = roundtrip(s.port(), make_request("GET", "/n"), "127.0.0.2");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);

    // The address gets a slot back once one of its connections closes.
    held.pop_back();
    hold_once_served(s.port(), "127.0.0.1");  // expects a 200 within io_timeout
}

namespace {

// How many of `held` the server has closed: each is read with a short wait for half a second (a connection closed
// to make room was shut down before the newcomer was served, so its end is there to read).
int count_closed(std::vector<std::unique_ptr<client>>& held) {
    const auto deadline = steady::now() + 500ms;
    while (steady::now() < deadline) {
        for (auto& c : held) {
            if (!c->eof()) c->fill(10ms);
        }
    }
    int closed = 0;
    for (auto& c : held) closed += c->eof() ? 1 : 0;
    return closed;
}

}  // namespace

TEST(HttpServer, AFullServerTakesAWaitingConnectionFromTheBiggestHolderForAnotherAddress) {
    // Two addresses fill the server within their per-address limit (the probe: 4 addresses x 64 filled 256).
    server_options o = local_options();
    o.max_connections = 8;
    o.max_connections_per_address = 4;
    http_server s(o);
    s.add_route("GET", "/n", [](const request&, response_writer& w) { reply_text(w, "ok"); });
    s.start();
    auto held = hold_connections(s.port(), 4, "127.0.0.2");
    for (auto& c : hold_connections(s.port(), 4, "127.0.0.3")) held.push_back(std::move(c));

    // A third address is served: one waiting connection of a biggest holder gives way.
    auto third = hold_once_served(s.port(), "127.0.0.4");
    EXPECT_EQ(count_closed(held), 1);
    // And again: it still holds fewer than the others (1 against 4).
    auto more = hold_once_served(s.port(), "127.0.0.4");
    EXPECT_EQ(count_closed(held), 2);

    // Now the shares are 3, 3, 2: nobody holds two more than a holder of 3, so a third connection from one of them is
    // refused rather than taken from another.
    client over(s.port(), "127.0.0.2");
    ASSERT_TRUE(over.send(make_request("GET", "/n")));
    auto r = over.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 503);
    EXPECT_NE(r->body_json()["error"]["message"].get<std::string>().find("too many connections (limit 8)"),
              std::string::npos)
        << r->body;
    EXPECT_EQ(count_closed(held), 2);
}

TEST(HttpServer, AConnectionRunningARequestIsNeverTakenToMakeRoom) {
    server_options o = local_options();
    o.max_connections = 2;
    o.max_connections_per_address = 0;
    http_server s(o);
    std::atomic<bool> slow_started{false};
    std::atomic<bool> newcomer_served{false};
    s.add_route("GET", "/n", [](const request&, response_writer& w) { reply_text(w, "ok"); });
    // Runs until the newcomer is served (a hang guard of io_timeout), however long that takes on a busy machine.
    s.add_route("GET", "/slow", [&slow_started, &newcomer_served](const request&, response_writer& w) {
        slow_started = true;
        const auto deadline = steady::now() + io_timeout;
        while (!newcomer_served && steady::now() < deadline) std::this_thread::sleep_for(10ms);
        reply_text(w, "done");
    });
    s.start();
    client busy(s.port(), "127.0.0.2");
    ASSERT_TRUE(busy.send(make_request("GET", "/slow")));
    auto idle = hold_connections(s.port(), 1, "127.0.0.2");
    for (int i = 0; i < 6000 && !slow_started; ++i) std::this_thread::sleep_for(10ms);
    ASSERT_TRUE(slow_started);

    auto newcomer = hold_once_served(s.port(), "127.0.0.3");
    EXPECT_EQ(count_closed(idle), 1);  // the idle one went
    newcomer_served = true;
    std::optional<response> r;
    r = busy.read_response();  // the busy one finishes its request
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, "done");
}

TEST(HttpServer, HealthIsAnsweredOverTheLimits) {
    server_options o = local_options();
    o.max_connections = 2;
    http_server s(o);
    s.add_route("GET", "/n", [](const request&, response_writer& w) { reply_text(w, "ok"); });
    s.add_route("GET", "/health", [](const request&, response_writer& w) { reply_text(w, "up"); });
    s.add_route("HEAD", "/health", [](const request&, response_writer& w) { w.send(200, "text/plain", ""); });
    s.start();

    auto held = hold_connections(s.port(), 1);
    client full(s.port());  // the second and last slot
    ASSERT_TRUE(full.send(make_request("GET", "/n")));
    ASSERT_TRUE(full.read_response());

    {
        client c(s.port());
        ASSERT_TRUE(c.send(make_request("GET", "/health?verbose=1")));
        auto r = c.read_response();
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 200);
        EXPECT_EQ(r->body, "up");
        EXPECT_EQ(lower(r->header("connection")), "close");
        EXPECT_TRUE(c.closed_by_server());
    }
    {
        client c(s.port());
        ASSERT_TRUE(c.send(make_request("HEAD", "/health")));
        auto r = c.read_response();
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 200);
    }
    {
        auto r = roundtrip(s.port(), make_request("GET", "/n"));
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 503);
        EXPECT_NE(r->body_json()["error"]["message"].get<std::string>().find("too many connections (limit 2)"),
                  std::string::npos)
            << r->body;
    }
    // Over a per-address limit too.
    server_options p = local_options();
    p.max_connections_per_address = 1;
    http_server per_address(p);
    per_address.add_route("GET", "/n", [](const request&, response_writer& w) { reply_text(w, "ok"); });
    per_address.add_route("GET", "/health", [](const request&, response_writer& w) { reply_text(w, "up"); });
    per_address.start();
    auto one = hold_connections(per_address.port(), 1);
    auto r = roundtrip(per_address.port(), make_request("GET", "/health"));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, "up");
    r = roundtrip(per_address.port(), make_request("GET", "/n"));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 503);
}

TEST(HttpServer, IdleSocketsFromOneAddressDoNotLockOthersOut) {
    server_options o = local_options();
    o.max_connections = 8;
    o.max_connections_per_address = 4;
    o.header_timeout = 2 * io_timeout;  // so a newcomer that waited for the idle sockets to go would wait that long
    http_server s(o);
    s.add_route("GET", "/n", [](const request&, response_writer& w) { reply_text(w, "ok"); });
    s.add_route("GET", "/health", [](const request&, response_writer& w) { reply_text(w, "up"); });
    s.start();

    // Sockets that connect and never send anything, far more than the limits.
    std::vector<std::unique_ptr<client>> idle;
    for (int i = 0; i < 40; ++i) idle.push_back(std::make_unique<client>(s.port(), "127.0.0.1"));
    std::this_thread::sleep_for(200ms);  // all accepted

    auto t0 = steady::now();
    auto r = roundtrip(s.port(), make_request("GET", "/n"), "127.0.0.2");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    r = roundtrip(s.port(), make_request("GET", "/health"), "127.0.0.2");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_LT(steady::now() - t0, io_timeout);  // not after the idle sockets' header timeout

    // Past the threads that wait for an over-limit request (8 per address), a socket is answered and closed at once.
    auto refused = idle.back()->read_response();
    ASSERT_TRUE(refused);
    EXPECT_EQ(refused->status, 503);
    EXPECT_NE(refused->body_json()["error"]["message"].get<std::string>().find("limit 4 per address"),
              std::string::npos)
        << refused->body;
    EXPECT_TRUE(idle.back()->closed_by_server());
}

TEST(HttpServer, FirstRequestHasAShorterDeadlineThanKeepAlive) {
    server_options o = local_options();
    o.header_timeout = 300ms;
    o.idle_timeout = 2 * io_timeout;  // a first request held to it would not be closed within closed_by_server's wait
    http_server s(o);
    s.add_route("GET", "/n", [](const request&, response_writer& w) { reply_text(w, "ok"); });
    s.start();

    client silent(s.port());  // never sends a request
    client kept(s.port());
    ASSERT_TRUE(kept.send(make_request("GET", "/n")));
    ASSERT_TRUE(kept.read_response());
    client trickle(s.port());  // a second request whose head never ends
    ASSERT_TRUE(trickle.send(make_request("GET", "/n")));
    ASSERT_TRUE(trickle.read_response());
    ASSERT_TRUE(trickle.send("GET /n HTTP/1.1\r\nHost: x\r\n"));

    auto t0 = steady::now();
    EXPECT_TRUE(silent.closed_by_server());
    EXPECT_LT(steady::now() - t0, io_timeout);
    EXPECT_TRUE(trickle.closed_by_server());
    EXPECT_LT(steady::now() - t0, io_timeout);

    // Idle keep-alive is held to idle_timeout, not header_timeout.
    std::this_thread::sleep_for(700ms);
    ASSERT_TRUE(kept.send(make_request("GET", "/n")));
    auto r = kept.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
}

TEST(HttpServer, CorsIsOffByDefault) {
    http_server s(local_options());
    std::atomic<int> runs{0};
    s.add_route("POST", "/v1/run", [&](const request&, response_writer& w) {
        ++runs;
        w.send(200, "application/json", "{}");
    });
    s.add_route("GET", "/v1/cache", [](const request&, response_writer& w) { w.send(200, "application/json", "{}"); });
    s.start();
    const std::string evil = "Origin: https://evil.example";

    auto r = roundtrip(s.port(), make_request("GET", "/v1/cache", "", {evil}));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->header("access-control-allow-origin"), "");

    r = roundtrip(s.port(), make_request("OPTIONS", "/v1/run", "",
                                         {evil, "Access-Control-Request-Method: POST",
                                          "Access-Control-Request-Headers: authorization, content-type"}));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 403);
    EXPECT_EQ(r->header("access-control-allow-origin"), "");
    EXPECT_EQ(r->header("access-control-allow-headers"), "");
    EXPECT_EQ(r->body_json()["error"]["type"], "permission_error");

    // What a page can send without a preflight: refused before the handler runs.
    for (const char* type : {"Content-Type: text/plain", "Content-Type: application/x-www-form-urlencoded",
                             "Content-Type: multipart/form-data; boundary=x", ""}) {
        std::vector<std::string> headers = {evil};
        if (*type) headers.push_back(type);
        r = roundtrip(s.port(), make_request("POST", "/v1/run", "{}", headers));
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 403) << type;
        EXPECT_EQ(r->body_json()["error"]["type"], "permission_error");
        EXPECT_NE(r->body_json()["error"]["message"].get<std::string>().find("https://evil.example"),
                  std::string::npos);
    }
    r = roundtrip(s.port(), make_request("POST", "/v1/run", "{}", {"Origin: null", "Content-Type: text/plain"}));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 403);
    EXPECT_EQ(runs, 0);

    // A browser sends JSON across origins only after a preflight, which failed above: JSON with an Origin is a
    // client outside a browser, and no Origin is not a browser's cross-origin request (curl sends a form type).
    r = roundtrip(s.port(),
                  make_request("POST", "/v1/run", "{}", {evil, "Content-Type: Application/JSON; charset=utf-8"}));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->header("access-control-allow-origin"), "");
    r = roundtrip(s.port(), make_request("POST", "/v1/run", "{}", {"Content-Type: application/x-www-form-urlencoded"}));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(runs, 2);
}

TEST(HttpServer, CorsAllowsNamedOrigins) {
    server_options o = local_options();
    o.cors_origins = {"https://App.example/", "http://localhost:3000"};
    o.max_body_bytes = 16;
    http_server s(o);
    std::atomic<int> runs{0};
    s.add_route("POST", "/v1/run", [&](const request&, response_writer& w) {
        ++runs;
        w.send(200, "application/json", "{}");
    });
    s.start();
    const std::string app = "Origin: https://app.example";

    auto r = roundtrip(s.port(), make_request("OPTIONS", "/v1/run", "",
                                              {app, "Access-Control-Request-Method: POST",
                                               "Access-Control-Request-Headers: authorization, x-stainless-os"}));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 204);
    EXPECT_EQ(r->header("access-control-allow-origin"), "https://app.example");
    EXPECT_NE(r->header("access-control-allow-methods").find("POST"), std::string::npos);
    EXPECT_EQ(r->header("access-control-allow-headers"), "authorization, x-stainless-os");
    EXPECT_NE(r->header("vary").find("Origin"), std::string::npos);

    r = roundtrip(s.port(), make_request("POST", "/v1/run", "{}", {app, "Content-Type: text/plain"}));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->header("access-control-allow-origin"), "https://app.example");
    EXPECT_EQ(r->header("vary"), "Origin");
    r = roundtrip(s.port(), make_request("POST", "/v1/run", "{}", {"Origin: http://localhost:3000"}));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->header("access-control-allow-origin"), "http://localhost:3000");
    EXPECT_EQ(runs, 2);

    // Other origins get nothing they could read, and the answer says it depends on the origin.
    for (const char* other : {"Origin: https://evil.example", "Origin: https://app.example.evil.example",
                              "Origin: http://app.example", "Origin: http://localhost:3001"}) {
        r = roundtrip(s.port(), make_request("OPTIONS", "/v1/run", "", {other, "Access-Control-Request-Method: POST"}));
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 403) << other;
        EXPECT_EQ(r->header("access-control-allow-origin"), "") << other;
        r = roundtrip(s.port(), make_request("POST", "/v1/run", "{}", {other, "Content-Type: application/json"}));
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 200);
        EXPECT_EQ(r->header("access-control-allow-origin"), "") << other;
        EXPECT_EQ(r->header("vary"), "Origin");
    }

    // Errors the page should be able to read carry the headers too.
    r = roundtrip(s.port(), make_request("POST", "/v1/run", std::string(64, 'x'), {app}));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 413);
    EXPECT_EQ(r->header("access-control-allow-origin"), "https://app.example");
}

TEST(HttpServer, CorsAnyOriginOnlyWhenAsked) {
    server_options o = local_options();
    o.cors_origins = {"*"};
    http_server s(o);
    s.add_route("GET", "/v1/cache", [](const request&, response_writer& w) { w.send(200, "application/json", "{}"); });
    s.start();
    auto r = roundtrip(s.port(), make_request("GET", "/v1/cache", "", {"Origin: https://anything.example"}));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->header("access-control-allow-origin"), "*");
    r = roundtrip(s.port(), make_request("OPTIONS", "/v1/cache", "",
                                         {"Origin: https://anything.example", "Access-Control-Request-Method: GET"}));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 204);
    EXPECT_EQ(r->header("access-control-allow-origin"), "*");
}

TEST(HttpServer, ParseCorsOrigin) {
    EXPECT_EQ(parse_cors_origin("*"), "*");
    EXPECT_EQ(parse_cors_origin("https://App.Example.com/"), "https://app.example.com");
    EXPECT_EQ(parse_cors_origin(" http://localhost:3000 "), "http://localhost:3000");
    EXPECT_EQ(parse_cors_origin("http://[::1]:8080"), "http://[::1]:8080");
    EXPECT_EQ(parse_cors_origin("https://app.example:443"), "https://app.example");  // as browsers send it
    EXPECT_EQ(parse_cors_origin("http://app.example:80"), "http://app.example");
    EXPECT_EQ(parse_cors_origin("http://app.example:8080"), "http://app.example:8080");
    EXPECT_EQ(parse_cors_origin("chrome-extension://abcdefgh"), "chrome-extension://abcdefgh");
    for (const char* bad :
         {"", "app.example.com", "https://", "https://app.example.com/path", "https://*.example.com",
          "https://a.example, https://b.example", "null", "://x", "ht tp://x", "https://user@app.example"}) {
        EXPECT_THROW(parse_cors_origin(bad), std::invalid_argument) << bad;
    }
    server_options o = local_options();
    o.cors_origins = {"not an origin"};
    EXPECT_THROW(http_server{o}, std::invalid_argument);
}

// Synchronous Boost.Beast server: one acceptor thread (poll on the listening socket and a wake pipe), one thread
// per connection. stop() wakes the acceptor through the pipe and shuts down every open socket, so blocked reads
// and writes return, then joins every thread. Connections are counted in all and per client address; the acceptor
// also enforces each connection's read deadline by shutting its socket down.
#include "http/http-server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <list>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <unordered_map>

#include "base/logger.h"

namespace keepwarm::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;
using error_code = boost::system::error_code;

namespace {

constexpr size_t header_limit_bytes = 64 * 1024;
// Connections over the limits are answered on their own short-lived thread (503, or the health path); beyond this
// many of those at once in all, or from one address, a new connection gets a 503 written without waiting for its
// request, and is closed.
constexpr int max_rejecting = 64;
constexpr int max_rejecting_per_address = 8;
// How long a connection over the limits may take to send its request head: enough for any client that sends its
// request on connecting, short enough that idle sockets cannot hold the rejecting threads.
constexpr auto over_limit_head_time = std::chrono::milliseconds(2000);
// The body a request to the health path may carry on a connection over the limits.
constexpr size_t over_limit_body_bytes = 64 * 1024;
// After an error response that leaves request bytes unread, read and discard what the client still sends (up to
// this long / this much) before closing, so the kernel does not reset the connection before the client has read
// the response.
constexpr auto linger_time = std::chrono::milliseconds(1000);
constexpr size_t linger_max_bytes = 8u << 20;

std::string lowercase(std::string_view s) {
    std::string out(s);
    for (char& ch : out) {
        if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch - 'A' + 'a');
    }
    return out;
}

bool iequals(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
        char x = a[i], y = b[i];
        if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
        if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
        if (x != y) return false;
    }
    return true;
}

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
}

// Time independent of where the strings differ (the length of the expected key is not secret).
bool constant_time_equals(std::string_view given, std::string_view expected) {
    unsigned char diff = given.size() == expected.size() ? 0 : 1;
    for (size_t i = 0; i < expected.size(); ++i) {
        unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
        diff |= static_cast<unsigned char>(g ^ static_cast<unsigned char>(expected[i]));
    }
    return diff == 0;
}

std::string format_endpoint(const tcp::endpoint& ep) {
    auto addr = ep.address();
    if (addr.is_v6()) return "[" + addr.to_string() + "]:" + std::to_string(ep.port());
    return addr.to_string() + ":" + std::to_string(ep.port());
}

// The key connections are counted under: the IP address, IPv4 for an IPv4-mapped IPv6 peer, and the /64 of an IPv6
// peer (one host or site usually holds a whole /64, and could otherwise take a fresh address per connection).
std::string address_key(const net::ip::address& address) {
    if (!address.is_v6()) return address.to_string();
    const net::ip::address_v6 v6 = address.to_v6();
    if (v6.is_v4_mapped()) return net::ip::make_address_v4(net::ip::v4_mapped, v6).to_string();
    net::ip::address_v6::bytes_type bytes = v6.to_bytes();
    std::fill(bytes.begin() + 8, bytes.end(), 0);
    return net::ip::address_v6(bytes).to_string() + "/64";
}

// The Content-Type's media type is application/json. A browser sends a POST without asking the server first (a
// CORS preflight) only as text/plain, a form, or without a type, so requiring JSON from pages of origins that are
// not allowed stops them from running requests whose answers they could not read anyway.
bool is_json_media_type(std::string_view content_type) {
    if (auto semicolon = content_type.find(';'); semicolon != std::string_view::npos) {
        content_type = content_type.substr(0, semicolon);
    }
    return iequals(trim(content_type), "application/json");
}

bool is_safe_method(std::string_view method) {
    return method == "GET" || method == "HEAD" || method == "OPTIONS";
}

const error_code& http_category_probe() {
    static const error_code ec = bhttp::make_error_code(bhttp::error::bad_method);
    return ec;
}

// "<8 hex digits, random per process>-<count>": unique in the process, and across restarts most likely, without a
// random draw per request.
std::string next_request_id() {
    static const std::string process = [] {
        char hex[9];
        std::snprintf(hex, sizeof hex, "%08x", static_cast<unsigned>(std::random_device{}()));
        return std::string(hex);
    }();
    static std::atomic<uint64_t> count{0};
    return process + "-" + std::to_string(count.fetch_add(1, std::memory_order_relaxed) + 1);
}

// The access line of a request answered with `status`, `started` when its whole request had been read.
void log_access(std::string_view method, std::string_view path, int status, const std::string& client,
                const std::string& id, std::chrono::steady_clock::time_point started) {
    if (!log::enabled(log::level::info)) return;
    const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - started;
    log::write(log::level::info, "http", "request",
               {{"method", method},
                {"path", path},
                {"status", status},
                {"client", client},
                {"duration_ms", std::round(took.count() * 10) / 10},
                {"request_id", id}});
}

}  // namespace

std::string parse_cors_origin(std::string_view origin) {
    origin = trim(origin);
    if (origin == "*") return "*";
    while (!origin.empty() && origin.back() == '/') origin.remove_suffix(1);
    const std::string quoted = "'" + std::string(origin) + "'";
    const size_t scheme_end = origin.find("://");
    if (scheme_end == std::string_view::npos || scheme_end == 0) {
        throw std::invalid_argument(quoted +
                                    " is not an origin: expected scheme://host[:port], e.g. "
                                    "https://app.example.com, or *");
    }
    for (char ch : origin.substr(0, scheme_end)) {
        const bool scheme_char = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                                 ch == '+' || ch == '-' || ch == '.';
        if (!scheme_char) throw std::invalid_argument(quoted + " is not an origin: its scheme is not valid");
    }
    const std::string_view authority = origin.substr(scheme_end + 3);
    if (authority.empty()) throw std::invalid_argument(quoted + " is not an origin: it has no host");
    for (char ch : authority) {
        const auto byte = static_cast<unsigned char>(ch);
        if (ch == '/') throw std::invalid_argument(quoted + " is not an origin: an origin has no path");
        if (byte <= ' ' || byte >= 0x7f || std::string_view("\"',?#*\\@").find(ch) != std::string_view::npos) {
            throw std::invalid_argument(quoted + " is not an origin: it must not contain '" + std::string(1, ch) + "'");
        }
    }
    // A browser leaves the scheme's default port out of the Origin it sends.
    std::string normalized = lowercase(origin);
    for (std::string_view default_port : {std::string_view("http://:80"), std::string_view("https://:443")}) {
        const std::string_view scheme = default_port.substr(0, default_port.find(':') + 3);
        const std::string_view port = default_port.substr(scheme.size());
        if (normalized.starts_with(scheme) && normalized.ends_with(port) &&
            normalized.size() > scheme.size() + port.size()) {
            normalized.resize(normalized.size() - port.size());
        }
    }
    return normalized;
}

namespace {

int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// `text` with its %XX escapes decoded (and '+' as a space where `plus_is_space`, as in a query); nullopt for a '%'
// without two hex digits after it.
std::optional<std::string> percent_decode(std::string_view text, bool plus_is_space) {
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size(); ++i) {
        if (text[i] == '%') {
            const int high = i + 2 < text.size() ? hex_digit(text[i + 1]) : -1;
            const int low = high >= 0 ? hex_digit(text[i + 2]) : -1;
            if (low < 0) return std::nullopt;
            out += static_cast<char>(high * 16 + low);
            i += 2;
        } else {
            out += plus_is_space && text[i] == '+' ? ' ' : text[i];
        }
    }
    return out;
}

}  // namespace

std::optional<std::string> path_rest(std::string_view path, std::string_view prefix) {
    if (!path.starts_with(prefix)) return std::nullopt;
    return percent_decode(path.substr(prefix.size()), false);
}

std::optional<std::string> query_value(std::string_view query, std::string_view name) {
    while (!query.empty()) {
        const size_t amp = query.find('&');
        const std::string_view pair = query.substr(0, amp);
        query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
        const size_t eq = pair.find('=');
        const std::optional<std::string> key = percent_decode(pair.substr(0, eq), true);
        if (!key || *key != name) continue;
        if (eq == std::string_view::npos) return std::string();
        if (std::optional<std::string> value = percent_decode(pair.substr(eq + 1), true)) return value;
    }
    return std::nullopt;
}

std::string request::header(const std::string& lowercase_name) const {
    auto it = headers.find(lowercase_name);
    return it == headers.end() ? std::string() : it->second;
}

std::string openai_error_body(int status, const std::string& type, const std::string& message) {
    nlohmann::json body = {{"error", {{"message", message}, {"type", type}, {"code", status}}}};
    // Messages can carry bytes from the request; replace invalid UTF-8 rather than throw.
    return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

namespace {
class conn_writer;  // a response_writer over one connection (below)
}  // namespace

struct http_server::impl {
    struct route {
        handler fn;
        route_options options;
    };
    struct connection {
        static constexpr int64_t no_deadline = -1;
        static constexpr int64_t overdue = -2;  // set by the acceptor as it shuts the socket down

        explicit connection(net::io_context& ioc) : socket(ioc) {}
        tcp::socket socket;
        int fd = -1;
        std::string remote;
        std::string address;  // what it is counted under: see address_key()
        bool rejected = false;
        std::string rejected_because;  // the 503's message, when rejected
        std::thread thread;
        bool closed = false;    // guarded by impl::mutex; the fd may be reused once true
        bool finished = false;  // guarded by impl::mutex; the thread is about to return
        bool evicted = false;   // guarded by impl::mutex; closed to make room (make_room_for): no longer counted
        // Steady-clock milliseconds by which the awaited bytes (a request head, a body, the next request) must have
        // arrived, or no_deadline while a handler runs. Written by the connection's thread, checked by the acceptor.
        std::atomic<int64_t> deadline_ms{no_deadline};

        // False if the acceptor already found the connection overdue: its socket is being shut down.
        bool set_deadline(int64_t ms) { return deadline_ms.exchange(ms) != overdue; }
    };
    struct address_use {
        int active = 0;
        int rejecting = 0;
    };

    explicit impl(server_options o) : options(std::move(o)), acceptor(ioc) {
        for (std::string& origin : options.cors_origins) origin = parse_cors_origin(origin);
    }

    using method_routes = std::map<std::string, route>;

    server_options options;
    // Registered before start(), or before open() on a held server, read-only afterwards: path -> method -> route;
    // the "/*" routes by their prefix (the path without '*'); the error shapes of paths under a prefix that no route
    // takes. Connection threads read them only once they see `held` false (acquire; open() stores it with release).
    std::map<std::string, method_routes> routes;
    std::map<std::string, method_routes> prefix_routes;
    std::map<std::string, error_formatter> prefix_error_formats;
    // hold(): every request gets held_status and held_body until open(). Written before start(), then read-only.
    std::atomic<bool> held{false};
    int held_status = 503;
    std::string held_body;

    net::io_context ioc;
    tcp::acceptor acceptor;
    uint16_t bound_port = 0;
    int wake_pipe[2] = {-1, -1};
    std::thread accept_thread;
    std::atomic<bool> stopping{false};
    bool started = false;
    std::mutex stop_mutex;  // serializes start()/stop()

    std::mutex mutex;  // guards connections, counters, addresses and connection::closed/finished
    std::list<std::shared_ptr<connection>> connections;
    int active = 0;
    int rejecting = 0;
    std::unordered_map<std::string, address_use> addresses;  // only addresses with a connection open

    void start();
    void stop();
    void accept_loop();
    void admit(tcp::socket socket);
    bool make_room_for(const std::string& address);
    void reap_finished();
    int64_t close_overdue();
    void serve(const std::shared_ptr<connection>& c);
    void reject(const std::shared_ptr<connection>& c);
    // One request read from `c`, answered: read_request, then find_route (404, 405, OPTIONS and CORS preflights
    // answered there), refuse_cross_origin_write, authorize, dispatch. Whether `c` can serve another request.
    bool handle_request(connection& c, bhttp::request<bhttp::string_body>&& req);
    // The request as handlers see it: an id, method, path and query, headers (lowercase names, repeats joined with
    // ", "), body and remote address.
    static request read_request(const connection& c, bhttp::request<bhttp::string_body>& msg);
    // The route for the request's path and method; nullptr once a request without one is answered (404, 405, or
    // answer_options).
    const route* find_route(const request& req, const std::string& origin, conn_writer& w) const;
    // OPTIONS on a path without an OPTIONS route: the methods allowed (204), or a CORS preflight's verdict (204 with
    // the Access-Control headers, or 403 for an origin that is not allowed).
    void answer_options(const request& req, const std::string& origin, const method_routes& methods,
                        const std::string& allow, conn_writer& w) const;
    // A write that needs no preflight (not JSON) from a page of an origin that is not allowed: answered 403, true.
    bool refuse_cross_origin_write(const request& req, const std::string& origin, const route& r, conn_writer& w) const;
    // Whether the request may use the route: an API key where one is required (sets req.tenant and req.api_key),
    // else answered 401.
    bool authorize(request& req, const route& r, conn_writer& w) const;
    // Runs the route's handler, answering what it throws or leaves unanswered, ending a stream it left open. Whether
    // the connection can serve another request.
    static bool dispatch(const route& r, request& req, conn_writer& w);
    void answer_read_error(connection& c, const error_code& ec, const bhttp::request<bhttp::string_body>& head);
    // Answers a request that cannot be read (`status` with `message` in the path's error shape) and closes.
    void answer_unreadable(connection& c, int status, const std::string& message,
                           const bhttp::request<bhttp::string_body>& head);
    bool origin_allowed(std::string_view origin) const;
    header_list cors_headers(std::string_view origin) const;
    void linger(connection& c);
    void finish(const std::shared_ptr<connection>& c);
    const method_routes* routes_for_path(std::string_view path) const;
    error_formatter format_for_path(std::string_view path) const;
};

namespace {

class conn_writer final : public response_writer {
public:
    // `cors`: the CORS headers every response to this request carries; `request_id`: its x-request-id.
    conn_writer(tcp::socket& socket, int fd, const std::atomic<bool>& stopping, unsigned version, bool keep_alive,
                header_list cors, std::string request_id)
        : socket_(socket),
          fd_(fd),
          stopping_(stopping),
          version_(version),
          keep_alive_(keep_alive),
          cors_(std::move(cors)),
          request_id_(std::move(request_id)) {}

    bool send(int status, std::string_view content_type, std::string_view body, const header_list& extra) override {
        if (started_) throw std::logic_error("response already started");
        started_ = true;
        status_ = status;
        bhttp::response<bhttp::string_body> res{static_cast<bhttp::status>(status), version_};
        set_common(res, content_type, extra);
        res.body().assign(body.data(), body.size());
        res.keep_alive(keep_alive_);
        res.prepare_payload();
        error_code ec;
        bhttp::write(socket_, res, ec);
        if (ec) failed_ = true;
        complete_ = !failed_;
        return !failed_;
    }

    bool begin_stream(int status, std::string_view content_type, const header_list& extra) override {
        if (started_) throw std::logic_error("response already started");
        started_ = true;
        status_ = status;
        streaming_ = true;
        bhttp::response<bhttp::empty_body> res{static_cast<bhttp::status>(status), version_};
        set_common(res, content_type, extra);
        if (content_type.substr(0, 17) == "text/event-stream") {
            res.set(bhttp::field::cache_control, "no-cache");
            res.set("X-Accel-Buffering", "no");
        }
        res.erase(bhttp::field::content_length);
        if (version_ >= 11) {
            res.keep_alive(keep_alive_);
            res.chunked(true);
        } else {
            // HTTP/1.0 has no chunked encoding: the body runs until the connection closes.
            keep_alive_ = false;
            res.keep_alive(false);
        }
        bhttp::response_serializer<bhttp::empty_body> sr{res};
        error_code ec;
        bhttp::write_header(socket_, sr, ec);
        if (ec) failed_ = true;
        return !failed_;
    }

    bool write_chunk(std::string_view data) override {
        if (!streaming_ || ended_) throw std::logic_error("write_chunk outside a stream");
        if (failed_) return false;
        if (data.empty()) return true;  // an empty chunk would end the chunked body
        error_code ec;
        if (version_ >= 11) {
            net::write(socket_, bhttp::make_chunk(net::const_buffer(data.data(), data.size())), ec);
        } else {
            net::write(socket_, net::const_buffer(data.data(), data.size()), ec);
        }
        if (ec) failed_ = true;
        return !failed_;
    }

    void end_stream() override {
        if (!streaming_ || ended_) return;
        ended_ = true;
        if (failed_) return;
        if (version_ >= 11) {
            error_code ec;
            net::write(socket_, bhttp::make_chunk_last(), ec);
            if (ec) failed_ = true;
        }
        complete_ = !failed_;
    }

    bool client_gone() override {
        if (failed_ || stopping_.load(std::memory_order_relaxed)) return true;
        pollfd p{};
        p.fd = fd_;
        p.events = POLLIN | POLLRDHUP;
        int n = ::poll(&p, 1, 0);
        if (n <= 0) return false;
        if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return true;
        if (p.revents & (POLLIN | POLLRDHUP)) {
            char byte;
            ssize_t r = ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
            if (r == 0) return true;
            if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
        }
        return false;  // readable data (a pipelined request) is not a close
    }

    bool started() const override { return started_; }

    // The status sent, 0 before send() or begin_stream().
    int status() const { return status_; }
    bool streaming() const { return streaming_; }
    bool ended() const { return ended_; }
    bool failed() const { return failed_; }
    // The whole response reached the socket, so the connection can carry another request.
    bool reusable() const { return complete_ && keep_alive_; }

private:
    template <class Message>
    void set_common(Message& res, std::string_view content_type, const header_list& extra) {
        res.set(bhttp::field::server, "keepwarm");
        for (const auto& [name, value] : cors_) res.set(name, value);
        if (!content_type.empty()) res.set(bhttp::field::content_type, content_type);
        for (const auto& [name, value] : extra) {
            if (iequals(name, "content-length") || iequals(name, "transfer-encoding") || iequals(name, "connection"))
                continue;  // framing is ours
            res.set(name, value);
        }
        res.set("x-request-id", request_id_);
    }

    tcp::socket& socket_;
    int fd_;
    const std::atomic<bool>& stopping_;
    unsigned version_;
    bool keep_alive_;
    header_list cors_;
    std::string request_id_;
    int status_ = 0;
    bool started_ = false;
    bool streaming_ = false;
    bool ended_ = false;
    bool failed_ = false;
    bool complete_ = false;
};

}  // namespace

void http_server::impl::start() {
    std::lock_guard stop_lock(stop_mutex);
    if (started) throw std::logic_error("http_server already started");
    stopping.store(false);  // a stopped server may be started again

    std::string where = (options.host.find(':') != std::string::npos ? "[" + options.host + "]" : options.host) + ":" +
                        std::to_string(options.port);
    error_code ec;
    tcp::resolver resolver(ioc);
    auto results = resolver.resolve(options.host, std::to_string(options.port),
                                    tcp::resolver::passive | tcp::resolver::numeric_service, ec);
    if (ec) throw std::runtime_error("cannot listen on " + where + ": cannot resolve host: " + ec.message());
    std::string reason = "no address";
    bool bound = false;
    bool address_in_use = false;
    for (const auto& entry : results) {
        error_code e;
        if (acceptor.is_open()) acceptor.close(e);
        acceptor.open(entry.endpoint().protocol(), e);
        if (!e) acceptor.set_option(tcp::acceptor::reuse_address(true), e);
        if (!e) acceptor.bind(entry.endpoint(), e);
        if (!e) acceptor.listen(net::socket_base::max_listen_connections, e);
        if (!e) acceptor.non_blocking(true, e);
        if (!e) {
            bound = true;
            break;
        }
        reason = e.message();
        address_in_use = address_in_use || e == net::error::address_in_use;
    }
    if (!bound) {
        error_code ignored;
        acceptor.close(ignored);
        if (address_in_use) {
            throw std::runtime_error("cannot listen on " + where + ": port " + std::to_string(options.port) +
                                     " is in use (another server runs there): stop it, or pick another with --port");
        }
        throw std::runtime_error("cannot listen on " + where + ": " + reason);
    }
    ::fcntl(acceptor.native_handle(), F_SETFD, FD_CLOEXEC);
    bound_port = acceptor.local_endpoint(ec).port();

    if (::pipe2(wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        error_code ignored;
        acceptor.close(ignored);
        throw std::runtime_error(std::string("cannot create wake pipe: ") + std::strerror(errno));
    }
    started = true;
    accept_thread = std::thread([this] { accept_loop(); });
}

void http_server::impl::accept_loop() {
    int64_t wait_ms = 1000;
    while (!stopping.load()) {
        pollfd fds[2] = {};
        fds[0].fd = acceptor.native_handle();
        fds[0].events = POLLIN;
        fds[1].fd = wake_pipe[0];
        fds[1].events = POLLIN;
        // The timeout paces reaping of finished connection threads and wakes the loop at the next read deadline.
        int n = ::poll(fds, 2, static_cast<int>(wait_ms));
        if (stopping.load()) break;
        reap_finished();
        wait_ms = close_overdue();
        if (n < 0) {
            if (errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(10));
            continue;
        }
        if (n == 0 || !(fds[0].revents & POLLIN)) continue;
        for (int i = 0; i < 64 && !stopping.load(); ++i) {
            tcp::socket socket(ioc);
            error_code ec;
            acceptor.accept(socket, ec);
            if (ec == net::error::would_block || ec == net::error::try_again) break;
            if (ec) {
                // Out of descriptors and the like: back off instead of spinning on a readable listener.
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
                break;
            }
            admit(std::move(socket));
        }
        wait_ms = std::min<int64_t>(wait_ms, close_overdue());
    }
}

namespace {

int64_t steady_now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// For a connection refused without a thread: a 503 in one non-blocking send (a full socket buffer just loses it),
// before the socket closes.
void send_refusal(int fd, const std::string& message) {
    const std::string body = openai_error_body(503, "server_error", message);
    const std::string response =
        "HTTP/1.1 503 Service Unavailable\r\nServer: keepwarm\r\nContent-Type: "
        "application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body;
    [[maybe_unused]] ssize_t sent = ::send(fd, response.data(), response.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
}

}  // namespace

void http_server::impl::admit(tcp::socket socket) {
    error_code ec;
    socket.non_blocking(false, ec);
    socket.set_option(tcp::no_delay(true), ec);
    ::fcntl(socket.native_handle(), F_SETFD, FD_CLOEXEC);
    auto remote = socket.remote_endpoint(ec);

    auto c = std::make_shared<connection>(ioc);
    c->socket = std::move(socket);
    c->fd = c->socket.native_handle();
    c->remote = ec ? std::string() : format_endpoint(remote);
    c->address = ec ? std::string() : address_key(remote.address());

    std::string refusal;  // sent after the lock is released
    {
        std::lock_guard lock(mutex);
        if (stopping.load()) return;  // the socket closes with c
        address_use& use = addresses[c->address];
        const int per_address = options.max_connections_per_address;
        if (active >= options.max_connections && !make_room_for(c->address)) {
            c->rejected_because = "too many connections (limit " + std::to_string(options.max_connections) + ")";
        } else if (per_address > 0 && use.active >= per_address) {
            c->rejected_because =
                "too many connections from " + c->address + " (limit " + std::to_string(per_address) + " per address)";
        }
        c->rejected = !c->rejected_because.empty();
        const int64_t now = steady_now_ms();
        c->deadline_ms = now + (c->rejected ? std::min(over_limit_head_time, options.header_timeout).count()
                                            : options.header_timeout.count());
        if (c->rejected && (rejecting >= max_rejecting || use.rejecting >= max_rejecting_per_address)) {
            refusal = c->rejected_because;
        } else {
            connections.push_back(c);
            auto it = std::prev(connections.end());
            try {
                c->thread = std::thread([this, c] {
                    if (c->rejected) {
                        reject(c);
                    } else {
                        serve(c);
                    }
                    finish(c);
                });
                ++(c->rejected ? use.rejecting : use.active);
                ++(c->rejected ? rejecting : active);
                return;
            } catch (const std::system_error&) {
                connections.erase(it);
            }
        }
        if (use.active == 0 && use.rejecting == 0) addresses.erase(c->address);
    }
    if (!refusal.empty()) send_refusal(c->fd, refusal);
}

// The server is full and a connection from `address` came: if some address holds more than one connection above
// what `address` would hold with it, one of that address's connections that is not running a request (waiting for its
// next request, or still sending one) is closed and its slot goes to the newcomer. The biggest holder loses first,
// so the addresses that want connections converge on equal shares of max_connections: four addresses that took 64
// each cannot lock a fifth out, and no number of connections from one address makes it an owner. A connection that
// runs a request is never cut. Returns whether a slot was freed. Caller holds mutex.
bool http_server::impl::make_room_for(const std::string& address) {
    const auto holds = [this](const std::string& a) {
        const auto it = addresses.find(a);
        return it == addresses.end() ? 0 : it->second.active;
    };
    std::shared_ptr<connection> victim;
    int victim_holds = holds(address) + 1;  // what the newcomer's address would hold: a victim's must hold more
    for (const auto& other : connections) {
        if (other->rejected || other->closed || other->finished || other->evicted) continue;
        if (other->deadline_ms.load() < 0) continue;  // running a request, or already being closed
        if (const int n = holds(other->address); n > victim_holds) {
            victim = other;
            victim_holds = n;
        }
    }
    if (!victim) return false;
    // As close_overdue() does: unless its thread has just moved on to run a request.
    int64_t deadline = victim->deadline_ms.load();
    if (deadline < 0 || !victim->deadline_ms.compare_exchange_strong(deadline, connection::overdue)) return false;
    ::shutdown(victim->fd, SHUT_RDWR);
    victim->evicted = true;
    --addresses[victim->address].active;
    --active;
    log::info("http", "server full ({} connections): closed a waiting connection of {} ({} open) for {}",
              options.max_connections, victim->address, victim_holds - 1, address);
    return true;
}

void http_server::impl::finish(const std::shared_ptr<connection>& c) {
    std::lock_guard lock(mutex);
    error_code ec;
    c->socket.shutdown(tcp::socket::shutdown_both, ec);
    c->socket.close(ec);
    c->closed = true;
    c->finished = true;
    if (c->evicted) return;  // make_room_for() gave its slot away already
    address_use& use = addresses[c->address];
    --(c->rejected ? use.rejecting : use.active);
    --(c->rejected ? rejecting : active);
    if (use.active == 0 && use.rejecting == 0) addresses.erase(c->address);
}

void http_server::impl::reap_finished() {
    std::list<std::shared_ptr<connection>> done;
    {
        std::lock_guard lock(mutex);
        for (auto it = connections.begin(); it != connections.end();) {
            if ((*it)->finished) {
                done.push_back(*it);
                it = connections.erase(it);
            } else {
                ++it;
            }
        }
    }
    for (auto& c : done) {
        if (c->thread.joinable()) c->thread.join();
    }
}

// Shutting the socket down makes the connection thread's blocked read return, and the thread ends the connection.
// Returns the milliseconds until the next deadline (at most 1000).
int64_t http_server::impl::close_overdue() {
    const int64_t now = steady_now_ms();
    int64_t next = 1000;
    std::lock_guard lock(mutex);
    for (auto& c : connections) {
        int64_t deadline = c->deadline_ms.load();
        if (c->closed || c->finished || deadline < 0) continue;
        if (deadline > now) {
            next = std::min(next, deadline - now);
            continue;
        }
        // Unless the thread has just moved on (its request arrived, or it waits for another one).
        if (c->deadline_ms.compare_exchange_strong(deadline, connection::overdue)) ::shutdown(c->fd, SHUT_RDWR);
    }
    return std::max<int64_t>(next, 1);
}

void http_server::impl::stop() {
    std::lock_guard stop_lock(stop_mutex);
    if (!started) return;
    stopping.store(true);
    if (wake_pipe[1] >= 0) {
        char byte = 1;
        [[maybe_unused]] ssize_t w = ::write(wake_pipe[1], &byte, 1);
    }
    if (accept_thread.joinable()) accept_thread.join();
    error_code ec;
    acceptor.close(ec);

    std::list<std::shared_ptr<connection>> all;
    {
        std::lock_guard lock(mutex);
        for (auto& c : connections) {
            if (!c->closed) ::shutdown(c->fd, SHUT_RDWR);  // wakes blocked reads and writes
        }
        all.swap(connections);
    }
    for (auto& c : all) {
        if (c->thread.joinable()) c->thread.join();
    }
    for (int& fd : wake_pipe) {
        if (fd >= 0) ::close(fd);
        fd = -1;
    }
    started = false;
}

void http_server::impl::linger(connection& c) {
    ::shutdown(c.fd, SHUT_WR);
    auto deadline = std::chrono::steady_clock::now() + linger_time;
    size_t drained = 0;
    char buf[16384];
    while (drained < linger_max_bytes && !stopping.load()) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) break;
        pollfd p{};
        p.fd = c.fd;
        p.events = POLLIN;
        int n = ::poll(&p, 1, static_cast<int>(left.count()));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        ssize_t r = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
        if (r <= 0) break;
        drained += static_cast<size_t>(r);
    }
}

// A connection over the limits: its request head is read (briefly, see over_limit_head_time), a GET or HEAD of the
// health path is answered as usual, and anything else gets a 503.
void http_server::impl::reject(const std::shared_ptr<connection>& c) {
    beast::flat_buffer buffer;
    bhttp::request_parser<bhttp::string_body> parser;
    parser.header_limit(static_cast<std::uint32_t>(header_limit_bytes));
    parser.body_limit(static_cast<std::uint64_t>(over_limit_body_bytes));
    error_code ec;
    bhttp::read_header(c->socket, buffer, parser, ec);
    // Timed out, closed, or reset: nobody to answer. A malformed head still learns why it was not served.
    if (ec && (ec.category() != http_category_probe().category() || ec == bhttp::error::end_of_stream ||
               ec == bhttp::error::partial_message || stopping.load())) {
        return;
    }
    if (!ec && !options.health_path.empty()) {
        const auto& head = parser.get();
        std::string_view path = head.target();
        if (auto q = path.find('?'); q != std::string_view::npos) path = path.substr(0, q);
        if ((head.method() == bhttp::verb::get || head.method() == bhttp::verb::head) && path == options.health_path) {
            bhttp::read(c->socket, buffer, parser, ec);
            if (ec || !c->set_deadline(connection::no_deadline)) return;
            bhttp::request<bhttp::string_body> msg = parser.release();
            msg.keep_alive(false);  // the connection is over the limits: one answer, then it closes
            handle_request(*c, std::move(msg));
            return;
        }
    }
    if (!c->set_deadline(connection::no_deadline)) return;
    const auto started = std::chrono::steady_clock::now();
    std::string_view target = parser.get().target();
    if (auto q = target.find('?'); q != std::string_view::npos) target = target.substr(0, q);
    const error_formatter format = format_for_path(target);
    std::string body;
    try {
        body = format(503, "server_error", c->rejected_because);
    } catch (const std::exception&) {
        body = openai_error_body(503, "server_error", c->rejected_because);
    }
    const std::string id = next_request_id();
    conn_writer w(c->socket, c->fd, stopping, 11, false, cors_headers(parser.get()[bhttp::field::origin]), id);
    w.send(503, "application/json", body, {{"Retry-After", "1"}});
    log_access(parser.get().method_string(), target, 503, c->remote, id, started);
    linger(*c);
}

// The longest key of `by_prefix` that `path` starts with (and, when `strictly_longer`, is longer than); end() if none.
// The maps are small (a few prefixes), so a scan costs less than anything cleverer.
template <typename T>
static typename std::map<std::string, T>::const_iterator longest_prefix(const std::map<std::string, T>& by_prefix,
                                                                        std::string_view path, bool strictly_longer) {
    auto best = by_prefix.end();
    for (auto it = by_prefix.begin(); it != by_prefix.end(); ++it) {
        if ((!strictly_longer || path.size() > it->first.size()) && path.starts_with(it->first) &&
            (best == by_prefix.end() || it->first.size() > best->first.size())) {
            best = it;
        }
    }
    return best;
}

const http_server::impl::method_routes* http_server::impl::routes_for_path(std::string_view path) const {
    if (auto it = routes.find(std::string(path)); it != routes.end()) return &it->second;
    if (auto it = longest_prefix(prefix_routes, path, true); it != prefix_routes.end()) return &it->second;
    return nullptr;
}

// The error shape of the API that `path` belongs to: its route's, else its prefix's, else OpenAI's.
error_formatter http_server::impl::format_for_path(std::string_view path) const {
    if (held.load(std::memory_order_acquire)) return openai_error_body;  // the routes may be being registered
    if (const method_routes* methods = routes_for_path(path); methods && !methods->empty()) {
        return methods->begin()->second.options.format_error;
    }
    if (auto it = longest_prefix(prefix_error_formats, path, false); it != prefix_error_formats.end())
        return it->second;
    return openai_error_body;
}

bool http_server::impl::origin_allowed(std::string_view origin) const {
    for (const std::string& allowed : options.cors_origins) {
        if (allowed == "*" || iequals(allowed, trim(origin))) return true;
    }
    return false;
}

// What every response to a request from `origin` (its Origin header; empty: none) carries: with CORS off, nothing.
header_list http_server::impl::cors_headers(std::string_view origin) const {
    header_list headers;
    if (options.cors_origins.empty()) return headers;
    const bool any_origin = origin_allowed("*");  // "*" is allowed only when "*" was configured
    // The answer depends on the Origin header whenever origins are named, so caches must key on it.
    if (!any_origin) headers.emplace_back("Vary", "Origin");
    if (origin.empty() || !origin_allowed(origin)) return headers;
    headers.emplace_back("Access-Control-Allow-Origin", any_origin ? "*" : std::string(trim(origin)));
    return headers;
}

void http_server::impl::answer_read_error(connection& c, const error_code& ec,
                                          const bhttp::request<bhttp::string_body>& head) {
    int status;
    std::string message;
    if (ec == bhttp::error::body_limit) {
        status = 413;
        message = "request body exceeds the " + std::to_string(options.max_body_bytes) + "-byte limit";
    } else if (ec == bhttp::error::header_limit) {
        status = 431;
        message = "request headers exceed the " + std::to_string(header_limit_bytes) + "-byte limit";
    } else {
        status = 400;
        message = "malformed HTTP request: " + ec.message();
    }
    answer_unreadable(c, status, message, head);
}

void http_server::impl::answer_unreadable(connection& c, int status, const std::string& message,
                                          const bhttp::request<bhttp::string_body>& head) {
    const auto started = std::chrono::steady_clock::now();
    std::string_view target = head.target();
    if (auto q = target.find('?'); q != std::string_view::npos) target = target.substr(0, q);
    const error_formatter format = format_for_path(target);
    std::string body;
    try {
        body = format(status, "invalid_request_error", message);
    } catch (const std::exception&) {
        body = openai_error_body(status, "invalid_request_error", message);
    }
    const std::string id = next_request_id();
    conn_writer w(c.socket, c.fd, stopping, 11, false, cors_headers(head[bhttp::field::origin]), id);
    w.send(status, "application/json", body, {});
    log_access(head.method_string(), target, status, c.remote, id, started);
    linger(c);
}

namespace {

// Why a request head's body framing cannot be trusted, or "" when it can. RFC 9112 6.1 and 6.3: a Transfer-Encoding
// whose final coding is not chunked leaves the body's length unknown, and one beside a Content-Length is how request
// smuggling starts (a proxy in front may read the length the other way); both must be answered 400 and the
// connection closed. Beast reads "chunked, identity" with a Content-Length by the length, so it is checked here. No
// other coding (gzip, ...) is supported in a request, so only "chunked" alone is taken.
std::string body_framing_error(const bhttp::request<bhttp::string_body>& head) {
    std::vector<std::string> codings;
    bool present = false;
    for (const auto& field : head) {
        if (field.name() != bhttp::field::transfer_encoding) continue;
        present = true;
        std::string_view list = field.value();
        while (!list.empty()) {
            const size_t comma = list.find(',');
            const std::string_view coding = trim(list.substr(0, comma));
            if (!coding.empty()) codings.push_back(lowercase(coding));
            list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
        }
    }
    if (!present) return "";
    if (head.find(bhttp::field::content_length) != head.end()) {
        return "a request may not carry both Transfer-Encoding and Content-Length (RFC 9112 6.1)";
    }
    if (codings.size() != 1 || codings.front() != "chunked") {
        std::string named;
        for (const std::string& coding : codings) named += (named.empty() ? "" : ", ") + coding.substr(0, 32);
        if (named.empty()) return "Transfer-Encoding names no coding";
        return "Transfer-Encoding '" + named.substr(0, 200) +
               "' is not supported: send a body with Content-Length, or with Transfer-Encoding: chunked alone";
    }
    return "";
}

// Blocks until the socket has bytes to read, is closed by the peer, or is shut down (by stop() or an overdue
// deadline).
void wait_readable(int fd) {
    pollfd p{};
    p.fd = fd;
    p.events = POLLIN | POLLRDHUP;
    while (::poll(&p, 1, -1) < 0 && errno == EINTR) {
    }
}

}  // namespace

void http_server::impl::serve(const std::shared_ptr<connection>& c) {
    beast::flat_buffer buffer;
    bool first = true;  // admit() set the first request's deadline
    while (!stopping.load()) {
        bhttp::request_parser<bhttp::string_body> parser;
        parser.header_limit(static_cast<std::uint32_t>(header_limit_bytes));
        parser.body_limit(static_cast<std::uint64_t>(options.max_body_bytes));
        error_code ec;
        if (!first) {
            // Idle until the next request's first byte (unless it is already here), then its head has header_timeout.
            if (buffer.size() == 0) {
                if (!c->set_deadline(steady_now_ms() + options.idle_timeout.count())) return;
                wait_readable(c->fd);
            }
            if (!c->set_deadline(steady_now_ms() + options.header_timeout.count())) return;
        }
        first = false;
        bhttp::read_header(c->socket, buffer, parser, ec);
        if (!ec) {
            const auto& head = parser.get();
            if (const std::string framing = body_framing_error(head); !framing.empty()) {
                if (c->set_deadline(connection::no_deadline)) answer_unreadable(*c, 400, framing, head);
                return;
            }
            if (!parser.is_done() && !c->set_deadline(steady_now_ms() + options.idle_timeout.count())) return;
            if (head.version() >= 11 && iequals(trim(head[bhttp::field::expect]), "100-continue") &&
                !parser.is_done()) {
                static constexpr std::string_view cont = "HTTP/1.1 100 Continue\r\n\r\n";
                net::write(c->socket, net::const_buffer(cont.data(), cont.size()), ec);
                if (ec) return;
            }
            bhttp::read(c->socket, buffer, parser, ec);
        }
        if (ec) {
            if (ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message) return;
            if (ec.category() == http_category_probe().category() && !stopping.load() &&
                c->set_deadline(connection::no_deadline)) {
                answer_read_error(*c, ec, parser.get());
            }
            return;  // network error, reset, or shutdown by stop() or an overdue deadline
        }
        if (!c->set_deadline(connection::no_deadline)) return;
        if (!handle_request(*c, parser.release())) return;
    }
}

namespace {

// An error in the route's shape (`format`; OpenAI's where there is none or where it throws).
void send_error(conn_writer& w, const error_formatter& format, int status, const std::string& type,
                const std::string& message, const header_list& extra = {}) {
    std::string body;
    try {
        body = format ? format(status, type, message) : openai_error_body(status, type, message);
    } catch (const std::exception&) {
        body = openai_error_body(status, type, message);
    }
    w.send(status, "application/json", body, extra);
}

}  // namespace

request http_server::impl::read_request(const connection& c, bhttp::request<bhttp::string_body>& msg) {
    request req;
    req.id = next_request_id();
    req.method = std::string(msg.method_string());
    std::string_view target = msg.target();
    if (auto q = target.find('?'); q != std::string_view::npos) {
        req.path = std::string(target.substr(0, q));
        req.query = std::string(target.substr(q + 1));
    } else {
        req.path = std::string(target);
    }
    for (const auto& field : msg) {
        std::string name = lowercase(field.name_string());
        auto [it, inserted] = req.headers.emplace(name, std::string(field.value()));
        if (!inserted) {
            it->second += ", ";
            it->second += field.value();
        }
    }
    req.body = std::move(msg.body());
    req.remote = c.remote;
    return req;
}

const http_server::impl::route* http_server::impl::find_route(const request& req, const std::string& origin,
                                                              conn_writer& w) const {
    const method_routes* found = routes_for_path(req.path);
    if (!found) {
        send_error(w, format_for_path(req.path), 404, "invalid_request_error",
                   "Invalid URL (" + req.method + " " + req.path + ")");
        return nullptr;
    }
    const method_routes& methods = *found;
    auto route_it = methods.find(req.method);
    if (route_it != methods.end()) return &route_it->second;
    std::string allow;
    for (const auto& [method, r] : methods) allow += (allow.empty() ? "" : ", ") + method;
    if (req.method == "OPTIONS") {
        answer_options(req, origin, methods, allow, w);
        return nullptr;
    }
    send_error(w, methods.begin()->second.options.format_error, 405, "invalid_request_error",
               "method " + req.method + " is not allowed for " + req.path + " (allowed: " + allow + ")",
               {{"Allow", allow}});
    return nullptr;
}

void http_server::impl::answer_options(const request& req, const std::string& origin, const method_routes& methods,
                                       const std::string& allow, conn_writer& w) const {
    if (origin.empty() || req.header("access-control-request-method").empty()) {
        w.send(204, "", "", {{"Allow", allow + ", OPTIONS"}});
        return;
    }
    // A CORS preflight: may a page of `origin` send this request?
    if (!origin_allowed(origin)) {
        send_error(w, methods.begin()->second.options.format_error, 403, "permission_error",
                   "cross-origin requests from " + origin + " are not allowed (see the server's --cors-origin)",
                   {{"Vary", "Origin"}});
        return;
    }
    // The origin is trusted, so it may send the headers it asks for (the SDKs send their own x- headers).
    const std::string headers = req.header("access-control-request-headers");
    header_list preflight = {{"Allow", allow + ", OPTIONS"},
                             {"Access-Control-Allow-Methods", allow + ", OPTIONS"},
                             {"Access-Control-Max-Age", "600"},
                             {"Vary", "Origin, Access-Control-Request-Method, Access-Control-Request-Headers"}};
    if (!headers.empty()) preflight.emplace_back("Access-Control-Allow-Headers", headers);
    w.send(204, "", "", preflight);
}

bool http_server::impl::refuse_cross_origin_write(const request& req, const std::string& origin, const route& r,
                                                  conn_writer& w) const {
    // Every route that takes a body takes JSON. A page of an origin that is not allowed can still make the browser
    // POST text/plain or a form without a preflight; its answer would be unreadable, but the work would run.
    if (origin.empty() || is_safe_method(req.method) || is_json_media_type(req.header("content-type")) ||
        origin_allowed(origin)) {
        return false;
    }
    send_error(w, r.options.format_error, 403, "permission_error",
               "cross-origin request from " + origin +
                   " refused: it is not an allowed origin (see the server's --cors-origin), and its Content-Type "
                   "is not application/json");
    return true;
}

bool http_server::impl::authorize(request& req, const route& r, conn_writer& w) const {
    if ((options.api_key.empty() && options.api_keys.empty()) || !r.options.requires_auth) return true;
    // Either credential may carry the key (OpenAI clients send a bearer token, Anthropic clients x-api-key).
    bool present = false;
    std::vector<std::string_view> given;
    std::string authz = req.header("authorization");
    std::string_view a = trim(authz);
    if (a.size() > 7 && iequals(a.substr(0, 7), "bearer ")) {
        present = true;
        given.push_back(trim(a.substr(7)));
    }
    if (auto it = req.headers.find("x-api-key"); it != req.headers.end()) {
        present = true;
        given.push_back(trim(it->second));
    }
    // Every key is compared (no early exit), so the time taken does not say which key came close.
    const api_key_entry* matched = nullptr;
    std::string_view matched_given;
    const auto check = [&](const api_key_entry& k) {
        for (const std::string_view g : given) {
            if (constant_time_equals(g, k.key) && !matched) {
                matched = &k;
                matched_given = g;
            }
        }
    };
    const api_key_entry single{options.api_key, {}};
    if (!options.api_key.empty()) check(single);
    for (const api_key_entry& k : options.api_keys) check(k);
    if (!matched) {
        send_error(
            w, r.options.format_error, 401, "authentication_error",
            present ? "invalid API key" : "missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
            {{"WWW-Authenticate", "Bearer"}});
        return false;
    }
    req.tenant = matched->tenant;
    req.api_key = std::string(matched_given);
    return true;
}

bool http_server::impl::dispatch(const route& r, request& req, conn_writer& w) {
    // An exception after the handler had started answering cannot change the status: the connection closes (a
    // stream then lacks its final chunk, so the client sees it incomplete).
    bool threw_after_start = false;
    try {
        r.fn(req, w);
    } catch (const request_error& e) {
        threw_after_start = w.started();
        if (!w.started()) {
            header_list extra;
            if (e.retry_after_s > 0) extra.push_back({"Retry-After", std::to_string(e.retry_after_s)});
            send_error(w, r.options.format_error, e.status, e.type, e.what(), extra);
        }
    } catch (const std::exception& e) {
        threw_after_start = w.started();
        if (!w.started()) send_error(w, r.options.format_error, 500, "server_error", e.what());
    } catch (...) {
        threw_after_start = w.started();
        if (!w.started()) send_error(w, r.options.format_error, 500, "server_error", "unknown error");
    }
    if (w.failed() || threw_after_start) return false;
    if (!w.started()) {
        send_error(w, r.options.format_error, 500, "server_error", "handler sent no response");
        return w.reusable();
    }
    if (w.streaming() && !w.ended()) w.end_stream();  // the handler returned without ending its stream
    return w.reusable();
}

bool http_server::impl::handle_request(connection& c, bhttp::request<bhttp::string_body>&& msg) {
    const auto started = std::chrono::steady_clock::now();
    request req = read_request(c, msg);
    const std::string origin = req.header("origin");
    conn_writer w(c.socket, c.fd, stopping, msg.version(), msg.keep_alive() && !stopping.load(), cors_headers(origin),
                  req.id);
    // Written when the request is over, whichever way it ends below.
    struct access_line {
        const request& req;
        const conn_writer& w;
        std::chrono::steady_clock::time_point started;
        ~access_line() {
            try {
                log_access(req.method, req.path, w.status(), req.remote, req.id, started);
            } catch (const std::exception&) {  // out of memory: the line is lost, the connection is not
            }
        }
    } access{req, w, started};

    if (held.load(std::memory_order_acquire)) {  // not open yet (a model loading): no route may be read
        w.send(held_status, "application/json", held_body, {{"Retry-After", "1"}});
        return w.reusable();
    }
    const route* r = find_route(req, origin, w);
    if (!r || refuse_cross_origin_write(req, origin, *r, w) || !authorize(req, *r, w)) return w.reusable();
    return dispatch(*r, req, w);
}

http_server::http_server(server_options options) : impl_(std::make_unique<impl>(std::move(options))) {}

http_server::~http_server() {
    stop();
}

void http_server::add_route(const std::string& method, const std::string& path, handler h, route_options options) {
    if (!options.format_error) options.format_error = openai_error_body;
    auto& table = path.ends_with("/*") ? impl_->prefix_routes[path.substr(0, path.size() - 1)] : impl_->routes[path];
    table[method] = impl::route{std::move(h), std::move(options)};
}

void http_server::set_error_format(const std::string& prefix, error_formatter format) {
    impl_->prefix_error_formats[prefix] = format ? std::move(format) : openai_error_body;
}

void http_server::hold(int status, std::string body) {
    if (impl_->started) throw std::logic_error("http_server::hold() after start()");
    impl_->held_status = status;
    impl_->held_body = std::move(body);
    impl_->held.store(true, std::memory_order_release);
}

void http_server::open() {
    impl_->held.store(false, std::memory_order_release);
}

void http_server::start() {
    impl_->start();
}

uint16_t http_server::port() const {
    return impl_->bound_port;
}

void http_server::stop() {
    if (impl_) impl_->stop();
}

}  // namespace keepwarm::http

// Every network operation is an asynchronous Beast operation with a deadline (beast::tcp_stream::expires_after),
// run to completion on the connection's own io_context by the calling thread; that gives blocking calls with
// timeouts, and a cancel() that is only a post() of a socket close onto that io_context.
#include "http/http-client.h"

#include <algorithm>
#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <charconv>
#include <cstdio>
#include <limits>
#include <optional>

namespace keepwarm::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;
using error_code = boost::system::error_code;

endpoint endpoint::parse(const std::string& url) {
    constexpr std::string_view scheme = "http://";
    if (url.rfind("https://", 0) == 0) {
        throw std::invalid_argument("'" + url + "': https is not supported; put keepwarm behind the TLS terminator");
    }
    if (url.rfind(scheme, 0) != 0) throw std::invalid_argument("'" + url + "': expected http://host:port[/path]");
    std::string_view rest = std::string_view(url).substr(scheme.size());
    size_t slash = rest.find('/');
    std::string_view authority = rest.substr(0, slash);
    endpoint ep;
    if (slash != std::string_view::npos) {
        ep.base_path = std::string(rest.substr(slash));
        while (!ep.base_path.empty() && ep.base_path.back() == '/') ep.base_path.pop_back();
    }
    if (!authority.empty() && authority.front() == '[') {  // [::1]:8080
        size_t close = authority.find(']');
        if (close == std::string_view::npos) throw std::invalid_argument("'" + url + "': unterminated IPv6 address");
        ep.host = std::string(authority.substr(1, close - 1));
        authority.remove_prefix(close + 1);
    } else {
        size_t colon = authority.find(':');
        ep.host = std::string(authority.substr(0, colon));
        authority.remove_prefix(colon == std::string_view::npos ? authority.size() : colon);
    }
    if (ep.host.empty()) throw std::invalid_argument("'" + url + "': no host");
    if (!authority.empty()) {
        std::string_view port = authority.substr(1);
        unsigned value = 0;
        auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
        if (authority.front() != ':' || ec != std::errc() || end != port.data() + port.size() || value == 0 ||
            value > 65535) {
            throw std::invalid_argument("'" + url + "': bad port");
        }
        ep.port = static_cast<uint16_t>(value);
    }
    return ep;
}

std::string endpoint::url() const {
    bool v6 = host.find(':') != std::string::npos;
    return "http://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port) + base_path;
}

std::string client_response::header(std::string_view lowercase_name) const {
    for (const auto& [name, value] : headers) {
        if (name == lowercase_name) return value;
    }
    return {};
}

std::string seconds_text(std::chrono::milliseconds ms) {
    char text[32];
    std::snprintf(text, sizeof(text), "%g s", static_cast<double>(ms.count()) / 1000.0);
    return text;
}

struct client_connection::impl {
    net::io_context io;
    beast::tcp_stream stream{io};
    beast::flat_buffer buffer;
    std::optional<bhttp::response_parser<bhttp::buffer_body>> parser;
    std::atomic<bool> cancelled{false};
    bool connected = false;
    bool body_pending = false;         // a response head was read and its body not yet to the end
    bool awaiting_first_byte = false;  // the request was sent and no byte of the body has come yet
    std::chrono::steady_clock::time_point first_byte_deadline;
    uint64_t connects = 0;
    char chunk[16384];

    // Runs one asynchronous operation to completion on the calling thread, with a deadline.
    template <typename Start>
    error_code run(std::chrono::milliseconds timeout, Start&& start) {
        if (cancelled) {
            // Cancelled between two operations (cancel() found none to abort): the socket still closes, so the
            // server sees the client go (under the sanitizers it streamed on for the test's whole 30 s).
            close();
            throw client_error(client_error::kind::cancelled, "request cancelled");
        }
        stream.expires_after(timeout);
        error_code result = net::error::would_block;
        start([&result](error_code ec, size_t) { result = ec; });
        io.restart();
        io.run();
        stream.expires_never();
        if (cancelled) {
            close();
            throw client_error(client_error::kind::cancelled, "request cancelled");
        }
        return result;
    }

    void close() {
        error_code ignored;
        stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
        stream.socket().close(ignored);
        connected = false;
        body_pending = false;
        parser.reset();
        buffer.clear();
    }

    // `timed_out` says what the wait was, for a timeout's message.
    [[noreturn]] void fail(const endpoint& origin, error_code ec, std::string_view during, std::string_view timed_out) {
        close();
        if (ec == beast::error::timeout) {
            throw client_error(client_error::kind::timeout, origin.url() + ": " + std::string(timed_out));
        }
        throw client_error(client_error::kind::io, origin.url() + ": " + std::string(during) + ": " + ec.message());
    }

    // What is left of the first-byte wait (at least a millisecond, so that a spent one times out at once).
    std::chrono::milliseconds first_byte_left() const {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(first_byte_deadline -
                                                                                std::chrono::steady_clock::now());
        return std::max(left, std::chrono::milliseconds(1));
    }
};

client_connection::client_connection(endpoint origin, client_options options)
    : origin_(std::move(origin)), options_(options), impl_(std::make_unique<impl>()) {}

client_connection::~client_connection() = default;

client_response client_connection::send(std::string_view method, std::string_view target, std::string_view body,
                                        std::string_view content_type, const header_list& headers) {
    impl& s = *impl_;
    if (s.body_pending) throw std::logic_error("client_connection::send before the previous body was read");
    bhttp::request<bhttp::string_body> request{bhttp::string_to_verb(method), origin_.base_path + std::string(target),
                                               11};
    if (request.method() == bhttp::verb::unknown) request.method_string(method);
    request.set(bhttp::field::host, origin_.host + ":" + std::to_string(origin_.port));
    for (const auto& [name, value] : headers) request.set(name, value);
    if (!content_type.empty() && !body.empty()) request.set(bhttp::field::content_type, content_type);
    request.body() = std::string(body);
    request.prepare_payload();

    for (int attempt = 0;; ++attempt) {
        bool reused = s.connected;
        if (!s.connected) {
            tcp::resolver resolver(s.io);
            error_code ec;
            auto addresses = resolver.resolve(origin_.host, std::to_string(origin_.port), ec);
            if (ec) throw client_error(client_error::kind::connect, origin_.url() + ": " + ec.message());
            ec = s.run(options_.connect_timeout, [&](auto done) {
                s.stream.async_connect(addresses, [done](error_code e, const tcp::endpoint&) { done(e, 0); });
            });
            if (ec) {
                s.close();
                throw client_error(
                    ec == beast::error::timeout ? client_error::kind::timeout : client_error::kind::connect,
                    origin_.url() + ": connect: " +
                        (ec == beast::error::timeout ? "no connection in " + seconds_text(options_.connect_timeout)
                                                     : ec.message()));
            }
            s.connected = true;
            s.connects++;
        }
        error_code ec =
            s.run(options_.write_timeout, [&](auto done) { bhttp::async_write(s.stream, request, std::move(done)); });
        if (ec == beast::error::timeout) {
            s.fail(origin_, ec, "", "sending the request: not taken in " + seconds_text(options_.write_timeout));
        }
        const bool sent = !ec;
        if (sent) {
            s.parser.emplace();
            s.parser->body_limit(std::numeric_limits<std::uint64_t>::max());  // read_body() has its own limit
            s.parser->header_limit(64 * 1024);
            s.first_byte_deadline = std::chrono::steady_clock::now() + first_byte_timeout();
            ec = s.run(s.first_byte_left(),
                       [&](auto done) { bhttp::async_read_header(s.stream, s.buffer, *s.parser, std::move(done)); });
        }
        if (!ec) break;
        bool stale = reused && attempt == 0 && s.buffer.size() == 0 &&
                     (ec == bhttp::error::end_of_stream || ec == net::error::eof ||
                      ec == net::error::connection_reset || ec == net::error::broken_pipe);
        if (stale) {  // the server closed an idle kept-alive connection: once more on a fresh one
            s.close();
            continue;
        }
        if (ec.category() == bhttp::make_error_code(bhttp::error::end_of_stream).category()) {
            s.close();
            throw client_error(client_error::kind::protocol, origin_.url() + ": bad or no response: " + ec.message());
        }
        s.fail(origin_, ec, sent ? "reading the response" : "sending the request",
               "the request was sent and no answer came in " + seconds_text(first_byte_timeout()) +
                   " (first-byte timeout)");
    }

    client_response response;
    const auto& head = s.parser->get();
    response.status = static_cast<int>(head.result_int());
    for (const auto& field : head) {
        std::string name(field.name_string());
        for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        response.headers.emplace_back(std::move(name), std::string(field.value()));
    }
    s.body_pending = !s.parser->is_done();
    s.awaiting_first_byte = s.body_pending;
    if (!s.body_pending && !s.parser->keep_alive()) s.close();
    return response;
}

std::chrono::milliseconds client_connection::first_byte_timeout() const {
    return options_.first_byte_timeout.count() > 0 ? options_.first_byte_timeout : options_.read_timeout;
}

bool client_connection::read_some(std::string& piece) {
    impl& s = *impl_;
    piece.clear();
    while (s.body_pending) {
        auto& body = s.parser->get().body();
        body.data = s.chunk;
        body.size = sizeof(s.chunk);
        const bool first = s.awaiting_first_byte;
        error_code ec = s.run(first ? s.first_byte_left() : options_.read_timeout, [&](auto done) {
            bhttp::async_read_some(s.stream, s.buffer, *s.parser, std::move(done));
        });
        if (ec == bhttp::error::need_buffer) ec = {};
        if (ec) {
            s.fail(origin_, ec, "reading the response",
                   first ? "the answer's head came and then nothing in " + seconds_text(first_byte_timeout()) +
                               " after sending the request (first-byte timeout)"
                         : "the answer stopped: nothing came for " + seconds_text(options_.read_timeout) +
                               " (idle timeout)");
        }
        piece.append(s.chunk, sizeof(s.chunk) - body.size);
        if (!piece.empty()) s.awaiting_first_byte = false;
        if (s.parser->is_done()) {
            s.body_pending = false;
            if (!s.parser->keep_alive()) s.close();
        }
        if (!piece.empty()) return true;
    }
    return false;
}

std::string client_connection::read_body() {
    std::string body, piece;
    while (read_some(piece)) {
        body += piece;
        if (body.size() > options_.max_body_bytes) {
            impl_->close();
            throw client_error(client_error::kind::protocol, origin_.url() + ": response body over " +
                                                                 std::to_string(options_.max_body_bytes) + " bytes");
        }
    }
    return body;
}

bool client_connection::reusable() const {
    return !impl_->cancelled && !impl_->body_pending && impl_->connected;
}

uint64_t client_connection::connects() const {
    return impl_->connects;
}

void client_connection::cancel() {
    impl_->cancelled = true;
    net::post(impl_->io, [s = impl_.get()] {
        error_code ignored;
        s->stream.socket().cancel(ignored);
    });
}

fetched fetch(const endpoint& origin, std::string_view method, std::string_view target, std::string_view body,
              const header_list& headers, client_options options) {
    client_connection connection(origin, options);
    client_response head = connection.send(method, target, body, "application/json", headers);
    fetched result;
    result.status = head.status;
    result.headers = std::move(head.headers);
    result.body = connection.read_body();
    return result;
}

}  // namespace keepwarm::http

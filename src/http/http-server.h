// A small HTTP/1.1 server on Boost.Beast: routing, API-key auth, body limits, connection limits (in all and per client
// address) and read deadlines, CORS, chunked streaming, and per-route error mapping. Each request gets an id (the
// x-request-id response header) and, once answered, one access line in the log at info: method, path, status,
// client, duration and id. A server may listen before its routes are ready (hold(): a model still loading), answering
// every request with one fixed error until open().
// Threading: one acceptor thread; one thread per connection runs its handlers. Routes, error formats and hold() are
// set by one thread before start(), or, on a held server, before open(); never after.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/request-error.h"

#include "http/api-keys.h"

namespace keepwarm::http {

struct request {
    std::string method;                          // "GET", "POST", ...
    std::string path;                            // target without the query string
    std::string query;                           // raw query string, without '?'
    std::map<std::string, std::string> headers;  // names lowercased
    std::string body;
    std::string remote;  // "ip:port" of the peer
    // This request's id: in its access line (base/logger.h) and in the x-request-id header of its response.
    std::string id;
    // Set by the API-key check: the tenant of the key the request carried ("" without keys, on a route without auth,
    // or when the keys share one tenant), and that key (the proxy forwards it to upstreams that have none of their
    // own).
    std::string tenant;
    std::string api_key;

    // Header value or empty string.
    std::string header(const std::string& lowercase_name) const;
};

using header_list = std::vector<std::pair<std::string, std::string>>;

// Lets a handler answer once, either whole or as a stream. Used only on the connection's own thread.
class response_writer {
public:
    virtual ~response_writer() = default;

    // Sends a complete response. Returns false if the client is gone.
    virtual bool send(int status, std::string_view content_type, std::string_view body,
                      const header_list& extra = {}) = 0;

    // Starts a chunked response (e.g. text/event-stream). Returns false if the client is gone.
    virtual bool begin_stream(int status, std::string_view content_type, const header_list& extra = {}) = 0;
    // Writes one chunk and flushes it to the socket. Returns false if the client is gone.
    virtual bool write_chunk(std::string_view data) = 0;
    // Ends the chunked response.
    virtual void end_stream() = 0;

    // Non-blocking: true once the peer has closed or reset the connection. Handlers that wait on slow work
    // (generation) poll this to cancel work nobody will read.
    virtual bool client_gone() = 0;

    // True once send() or begin_stream() was called.
    virtual bool started() const = 0;
};

// A handler that throws request_error (base/request-error.h) is answered with its status and the route's error body.

using handler = std::function<void(const request&, response_writer&)>;
// Builds the JSON error body for a route's API from (status, type, message).
using error_formatter = std::function<std::string(int status, const std::string& type, const std::string& message)>;

// OpenAI's error shape: {"error": {"message": ..., "type": ..., "code": status}}.
std::string openai_error_body(int status, const std::string& type, const std::string& message);

struct server_options {
    std::string host = "127.0.0.1";
    uint16_t port = 8080;  // 0 picks a free port; see http_server::port()
    std::string api_key;   // empty: no auth; else "Authorization: Bearer <key>" (or "x-api-key") required
    std::vector<api_key_entry> api_keys;  // more keys, each with its tenant (--api-keys-file); api_key's tenant is ""
    size_t max_body_bytes = 64u << 20;
    // Open connections in all. When they are all open, a new connection from an address that holds fewer than the
    // biggest holder (by two or more) takes the place of one of that holder's connections that is not running a
    // request (an idle keep-alive, a request still arriving), so addresses converge on equal shares and a few cannot
    // starve the rest; otherwise it is answered 503 (a GET of health_path is still answered).
    int max_connections = 256;
    // Open connections from one client address (an IPv6 client's /64), so that one host cannot take every slot. An
    // address is a host, a NAT or a proxy in front; 64 is more than one host needs when requests beyond the slots
    // only wait in the queue, and leaves three quarters of the default total to everyone else. 0: no such limit.
    int max_connections_per_address = 64;
    // How long a request head may take: from the connection's opening for its first request (an idle socket that
    // never sends one loses its slot after this), and from a later request's first byte.
    std::chrono::milliseconds header_timeout{std::chrono::seconds(10)};
    // How long a keep-alive connection may wait for its next request, and a request body take to arrive, before the
    // connection is closed, so idle clients cannot hold connection slots for long. Handlers are never timed out.
    std::chrono::milliseconds idle_timeout{std::chrono::seconds(120)};
    // Not the server's own: the streaming routes write their API's keep-alive when a stream has had nothing to send
    // for this long (routes/stream-keepalive.h); 0: never.
    std::chrono::milliseconds stream_keepalive{std::chrono::seconds(10)};
    // A GET or HEAD of this path is answered even on a connection over the limits above, so a monitor can always
    // tell a busy server from a dead one. Empty: none.
    std::string health_path = "/health";
    // Web origins ("https://app.example.com") whose pages may read responses (CORS). Empty, the default: none, so a
    // page in the user's browser can neither read the API nor pass a preflight; "*" allows every origin. A POST from
    // a page of another origin that is not JSON (what a browser sends without a preflight) is refused.
    std::vector<std::string> cors_origins;
};

// What a "/*" route's request path has after `prefix` (the route's path without its '*'), percent-decoded
// ("%2F" -> "/"); nullopt if the path is not under it or an escape is malformed.
std::optional<std::string> path_rest(std::string_view path, std::string_view prefix);

// The percent-decoded value of `name` in a raw query string ("a=1&b=x%20y"); nullopt if absent. A name given without
// '=' has the value "".
std::optional<std::string> query_value(std::string_view query, std::string_view name);

// Validates and normalizes a --cors-origin value: "*", or scheme://host[:port] lowercased, without a path or a
// trailing slash. Throws std::invalid_argument with the reason.
std::string parse_cors_origin(std::string_view origin);

struct route_options {
    bool requires_auth = true;
    error_formatter format_error = openai_error_body;
};

class http_server {
public:
    // Throws std::invalid_argument if an entry of options.cors_origins is not an origin.
    explicit http_server(server_options options);
    ~http_server();  // stops and joins
    http_server(const http_server&) = delete;
    http_server& operator=(const http_server&) = delete;

    // Register before start() (or before open() on a held server). Exact path match; a path with a route but another
    // method answers 405. A path ending in "/*" (e.g. "/v1/models/*") takes every longer path under it that no exact
    // route takes, the longest such prefix first; its handler reads the rest from request::path (see path_rest).
    void add_route(const std::string& method, const std::string& path, handler h, route_options options = {});
    // Paths under `prefix` (e.g. "/api/") that no route takes are answered 404 with `format`, the error shape of the
    // API that lives there, rather than OpenAI's; so are errors found before a route is (a body over the limit, a
    // connection over the limits). The longest matching prefix wins.
    void set_error_format(const std::string& prefix, error_formatter format);

    // Before start(): until open(), every request (a GET of the health path too) is answered `status` with `body`
    // (JSON, e.g. llama-server's 503 "Loading model") and Retry-After: 1, so the port can be bound and watched while
    // the routes' backing (a model) loads. Routes and error formats may be added until open(), by the thread that
    // calls open().
    void hold(int status, std::string body);
    // Ends hold(): from now on the routes answer. Nothing may be registered after this.
    void open();

    // Binds and starts accepting. Throws std::runtime_error if the address cannot be bound (naming the address, and
    // saying so when the port is in use).
    void start();
    // Actual bound port (useful with port 0). Valid after start().
    uint16_t port() const;
    // Stops accepting, closes open connections, joins all threads.
    void stop();

private:
    struct impl;
    std::unique_ptr<impl> impl_;
};

}  // namespace keepwarm::http

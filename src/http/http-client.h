// A blocking HTTP/1.1 client on Boost.Beast for keepwarm's own outbound calls (the proxy's upstreams, the gauntlet
// bench's targets): one connection to one origin, one request at a time, the response body read whole or piece by
// piece as it arrives (SSE and NDJSON streams), every wait bounded by a timeout, and cancel() from any thread.
// Threading: a client_connection is used by one thread at a time; only cancel() may be called from another.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "http/http-server.h"

namespace keepwarm::http {

// "http://host:port/prefix" in parts. parse() throws std::invalid_argument naming what is wrong (https is not
// supported: upstreams and bench targets are local or behind a TLS-terminating proxy).
struct endpoint {
    std::string host;
    uint16_t port = 80;
    std::string base_path;  // "" or "/prefix", never with a trailing slash

    static endpoint parse(const std::string& url);
    std::string url() const;  // "http://host:port/prefix"
};

struct client_options {
    std::chrono::milliseconds connect_timeout{std::chrono::seconds(5)};
    // The longest wait from sending a request to the first byte of its answer: the response head and, when the head
    // comes at once, the first piece of the body (an upstream's prefill, which for a long cold prompt on a CPU takes
    // minutes). Zero: read_timeout.
    std::chrono::milliseconds first_byte_timeout{0};
    // The longest wait for each further piece of the body once it flows (not for the whole body: a long generation
    // streams for minutes), and for the first byte when first_byte_timeout is zero.
    std::chrono::milliseconds read_timeout{std::chrono::minutes(10)};
    std::chrono::milliseconds write_timeout{std::chrono::seconds(60)};
    size_t max_body_bytes = 256u << 20;  // for read_body(); read_some() has no limit
};

// A failure below HTTP: refused, reset, timed out, cancelled, or not HTTP. An HTTP error status is not one of these.
// A timeout's message says which wait ran out: connecting, sending the request, the first byte of the answer, or
// the next piece of a body that had been flowing.
struct client_error : std::runtime_error {
    enum class kind { connect, timeout, cancelled, io, protocol };
    kind reason;
    client_error(kind reason, const std::string& message) : std::runtime_error(message), reason(reason) {}
};

struct client_response {
    int status = 0;
    header_list headers;  // names lowercased, in the order received

    // Value of the first header with this (lowercase) name, or "".
    std::string header(std::string_view lowercase_name) const;
};

class client_connection {
public:
    explicit client_connection(endpoint origin, client_options options = {});
    ~client_connection();
    client_connection(const client_connection&) = delete;
    client_connection& operator=(const client_connection&) = delete;

    // Sends a request and waits for the response head. Connects first if needed; a kept-alive connection that turns
    // out to be closed before any response byte is reconnected once. `target` is appended to the endpoint's
    // base_path. Host, Content-Length and Content-Type (when `content_type` is not empty) are set here. The previous
    // response's body must have been read to its end. Throws client_error.
    client_response send(std::string_view method, std::string_view target, std::string_view body = {},
                         std::string_view content_type = "application/json", const header_list& headers = {});

    // Appends the next piece of the body as it arrives (de-chunked) to `piece` (cleared first). Returns false, with
    // `piece` empty, once the body has ended. Throws client_error.
    bool read_some(std::string& piece);
    // The rest of the body. Throws client_error, also past options.max_body_bytes.
    std::string read_body();

    // From any thread: a blocked or later send()/read_some() throws client_error(cancelled) and the connection
    // closes. The connection can not be used again after this.
    void cancel();

    // Whether it is worth keeping for another request: not cancelled, the last response read to its end, and the
    // server did not say it closes (it may still close it later; send() then connects again, once).
    bool reusable() const;
    // TCP connections it has opened so far (a kept-alive connection opens one for many requests).
    uint64_t connects() const;

    const endpoint& origin() const { return origin_; }

private:
    std::chrono::milliseconds first_byte_timeout() const;

    struct impl;
    endpoint origin_;
    client_options options_;
    std::unique_ptr<impl> impl_;
};

// "600 s", "0.15 s": a timeout as the errors of outbound calls say it.
std::string seconds_text(std::chrono::milliseconds ms);

// One whole request on a fresh connection: send, read the body, close.
struct fetched {
    int status = 0;
    header_list headers;
    std::string body;
};
fetched fetch(const endpoint& origin, std::string_view method, std::string_view target, std::string_view body = {},
              const header_list& headers = {}, client_options options = {});

}  // namespace keepwarm::http

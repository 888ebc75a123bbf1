// Keeps a quiet stream open. Before the first token of a long prompt (31.5K tokens compute for minutes on a CPU), or
// while a tool call is being parsed, a streaming route has nothing to write, and clients and proxies with idle
// timeouts drop the connection: the prompt is computed for nobody. A route wraps its writer in a keepalive_writer and
// hands that to the backend; once the stream has begun, whenever `interval` passes without a write, it writes the
// API's keep-alive (OpenAI: an SSE comment; Anthropic: a ping event; Ollama: a line with empty content), none of which
// changes what a client assembles. The backend's wait polls client_gone() every client_check_interval
// (backend/generation-source.h): that is when it writes, on the route's own thread.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "http/http-server.h"

namespace keepwarm {

class keepalive_writer final : public http::response_writer {
public:
    // `keepalive` makes the bytes to write (called each time, so they may hold a timestamp). An `interval` of zero
    // writes none.
    keepalive_writer(http::response_writer& inner, std::function<std::string()> keepalive,
                     std::chrono::milliseconds interval);

    bool send(int status, std::string_view content_type, std::string_view body,
              const http::header_list& extra = {}) override;
    bool begin_stream(int status, std::string_view content_type, const http::header_list& extra = {}) override;
    bool write_chunk(std::string_view data) override;
    void end_stream() override;
    // Also writes the keep-alive when it is due; a failed write means the client is gone.
    bool client_gone() override;
    bool started() const override { return inner_.started(); }

    int keepalives_written() const { return written_; }

private:
    http::response_writer& inner_;
    std::function<std::string()> keepalive_;
    std::chrono::milliseconds interval_;
    bool streaming_ = false;
    bool write_failed_ = false;
    int written_ = 0;
    std::chrono::steady_clock::time_point last_write_ = std::chrono::steady_clock::now();
};

}  // namespace keepwarm

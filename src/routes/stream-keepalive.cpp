// See stream-keepalive.h.
#include "routes/stream-keepalive.h"

namespace keepwarm {

keepalive_writer::keepalive_writer(http::response_writer& inner, std::function<std::string()> keepalive,
                                   std::chrono::milliseconds interval)
    : inner_(inner), keepalive_(std::move(keepalive)), interval_(interval) {}

bool keepalive_writer::send(int status, std::string_view content_type, std::string_view body,
                            const http::header_list& extra) {
    return inner_.send(status, content_type, body, extra);
}

bool keepalive_writer::begin_stream(int status, std::string_view content_type, const http::header_list& extra) {
    streaming_ = inner_.begin_stream(status, content_type, extra);
    last_write_ = std::chrono::steady_clock::now();
    return streaming_;
}

bool keepalive_writer::write_chunk(std::string_view data) {
    last_write_ = std::chrono::steady_clock::now();
    const bool ok = inner_.write_chunk(data);
    if (!ok) write_failed_ = true;
    return ok;
}

void keepalive_writer::end_stream() {
    streaming_ = false;
    inner_.end_stream();
}

bool keepalive_writer::client_gone() {
    if (write_failed_) return true;
    if (streaming_ && interval_.count() > 0 && std::chrono::steady_clock::now() - last_write_ >= interval_) {
        if (!write_chunk(keepalive_())) return true;
        ++written_;
    }
    return inner_.client_gone();
}

}  // namespace keepwarm

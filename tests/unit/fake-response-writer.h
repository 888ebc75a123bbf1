// A response_writer without a socket, for tests of what a route or a generation source does: it keeps what the
// handler wrote, and `gone` plays a client that left.
#pragma once

#include <string>
#include <string_view>

#include "http/http-server.h"

namespace test_support {

// What a handler wrote, and a switch for the client leaving.
class fake_writer final : public keepwarm::http::response_writer {
public:
    bool send(int s, std::string_view type, std::string_view b, const keepwarm::http::header_list& extra) override {
        status = s;
        content_type = type;
        body = b;
        headers = extra;
        started_ = true;
        return !gone;
    }
    bool begin_stream(int s, std::string_view type, const keepwarm::http::header_list& extra) override {
        status = s;
        content_type = type;
        headers = extra;
        started_ = true;
        return !gone;
    }
    bool write_chunk(std::string_view data) override {
        body += data;
        return !gone;
    }
    void end_stream() override { ended = true; }
    bool client_gone() override { return gone; }
    bool started() const override { return started_; }

    std::string header(const std::string& name) const {
        for (const auto& [n, v] : headers) {
            if (n == name) return v;
        }
        return {};
    }

    int status = 0;
    std::string content_type, body;
    keepwarm::http::header_list headers;
    bool ended = false;
    bool gone = false;

private:
    bool started_ = false;
};

}  // namespace test_support

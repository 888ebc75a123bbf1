// What the fuzz targets share: reading a request body the way the server's routes do, and telling a finding (a
// broken contract: an exception where the parser promises a 4xx or a return value) from an expected rejection.
// Crashes, leaks and undefined behaviour are caught by libFuzzer, ASan and UBSan themselves.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "http/http-server.h"
#include "json/bounded-json.h"

namespace keepwarm::fuzz {

// The model fingerprints the binary targets' stores and indexes are opened with (and make-seeds writes).
inline constexpr const char* disk_fingerprint = "5eed0f0f5eed0f0f5eed0f0f5eed0f0f";
inline constexpr const char* prompt_index_fingerprint = "fuzz-qwen2-vocab";

inline std::string_view as_text(const uint8_t* data, size_t size) {
    return {reinterpret_cast<const char*>(data), size};
}

// A broken contract that is not a crash (an exception the route would turn into a 500, a decoded message that
// depends on how the socket split the bytes). With KEEPWARM_FUZZ_STRICT=1 it stops the run like a crash, so libFuzzer
// saves the input; otherwise each distinct finding is reported once and the run goes on looking for crashes.
inline void finding(const std::string& what) {
    static const bool strict = [] {
        const char* v = std::getenv("KEEPWARM_FUZZ_STRICT");
        return v && std::string_view(v) == "1";
    }();
    static std::mutex mu;
    static std::set<std::string> seen;
    const std::string key = what.substr(0, 120);
    {
        std::lock_guard lock(mu);
        if (!strict && !seen.insert(key).second) return;
    }
    std::fprintf(stderr, "keepwarm fuzz finding: %s\n", what.c_str());
    if (strict) std::abort();
}

// Runs `parse`, which may reject its input only with an request_error of status 4xx (the route's 400 naming the field).
template <typename F>
void expect_accepted_or_4xx(const char* parser, F&& parse) {
    try {
        parse();
    } catch (const request_error& e) {
        if (e.status < 400 || e.status > 499)
            finding(std::string(parser) + ": request_error " + std::to_string(e.status) + ": " + e.what());
    } catch (const std::exception& e) {
        finding(std::string(parser) + ": exception instead of a 4xx (the route answers 500): " + e.what());
    }
}

// The body as backend/generation-source.cpp's parse_json_body reads it (bounded_json: linear time, bounded depth):
// nullopt where the route answers 400 (not JSON, too deep, not an object). Any other exception would escape that
// function as a 500, so it is a finding here.
// bounded_json parses with simdjson and falls back to nlohmann's parser: it must accept what nlohmann's parser accepts
// and build the same value, which is checked here too.
inline std::optional<nlohmann::ordered_json> request_body(const uint8_t* data, size_t size) {
    if (size == 0) return std::nullopt;
    const std::string_view text = as_text(data, size);
    try {
        nlohmann::ordered_json body = bounded_json::parse(text);
        if (!nlohmann::ordered_json::accept(text)) {
            finding("request body: bounded_json accepted a text nlohmann's parser refuses");
        } else if (body.dump() != nlohmann::ordered_json::parse(text).dump()) {
            finding("request body: bounded_json built another value than nlohmann's parser");
        }
        if (!body.is_object()) return std::nullopt;
        return body;
    } catch (const bounded_json::depth_error&) {
        return std::nullopt;
    } catch (const bounded_json::limit_error&) {
        if (nlohmann::ordered_json::accept(text)) {
            finding("request body: bounded_json refused a text nlohmann's parser accepts");
        }
        return std::nullopt;
    } catch (const std::exception& e) {
        finding(std::string("request body: JSON parser threw past parse_json_body (500): ") + e.what());
        return std::nullopt;
    }
}

}  // namespace keepwarm::fuzz

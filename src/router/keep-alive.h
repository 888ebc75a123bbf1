// Ollama's `keep_alive` request field, which says how long the model stays loaded after the request: 0 unloads it
// once the request is done, a negative value keeps it loaded until told otherwise, anything else is the idle time
// after which it is unloaded. A number is seconds; a string is a number of seconds or a Go duration ("5m", "1h30m",
// "1.5h", "300ms", "-1m") in units ns, us, ms, s, m, h.
// Threading: pure functions.
#pragma once

#include <chrono>
#include <optional>
#include <string_view>

#include "json/bounded-json.h"

namespace keepwarm::router {

struct keep_alive {
    enum class kind { unload_now, pinned, idle_for };
    kind what = kind::idle_for;
    std::chrono::milliseconds idle{0};  // kind::idle_for only
};

// A Go duration or a number of seconds as text; nullopt if it is neither (or beyond 100 years).
std::optional<keep_alive> parse_keep_alive_text(std::string_view text);
// The request field's value; null is nullopt. Throws request_error 400 naming keep_alive when it is neither a number
// nor a duration.
std::optional<keep_alive> parse_keep_alive(const bounded_json::json& value);

}  // namespace keepwarm::router

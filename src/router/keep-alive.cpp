// See keep-alive.h.
#include "router/keep-alive.h"

#include <charconv>
#include <cmath>
#include <string>

#include "base/request-error.h"

namespace keepwarm::router {

namespace {
constexpr double max_seconds = 100.0 * 365 * 24 * 3600;

std::optional<keep_alive> from_seconds(double seconds) {
    if (!std::isfinite(seconds) || std::fabs(seconds) > max_seconds) return std::nullopt;
    if (seconds < 0) return keep_alive{keep_alive::kind::pinned, {}};
    const auto ms = std::chrono::milliseconds(static_cast<int64_t>(std::llround(seconds * 1000)));
    if (ms.count() == 0) return keep_alive{keep_alive::kind::unload_now, {}};
    return keep_alive{keep_alive::kind::idle_for, ms};
}

// The leading number of `s` ("1.5" of "1.5h"), consumed.
std::optional<double> take_number(std::string_view& s) {
    size_t n = 0;
    while (n < s.size() && ((s[n] >= '0' && s[n] <= '9') || s[n] == '.')) ++n;
    if (n == 0) return std::nullopt;
    double v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + n, v);
    if (ec != std::errc() || end != s.data() + n) return std::nullopt;
    s.remove_prefix(n);
    return v;
}
}  // namespace

std::optional<keep_alive> parse_keep_alive_text(std::string_view text) {
    if (text.empty() || text.size() > 64) return std::nullopt;
    bool negative = false;
    if (text.front() == '-' || text.front() == '+') {
        negative = text.front() == '-';
        text.remove_prefix(1);
    }
    std::string_view rest = text;
    const std::optional<double> whole = take_number(rest);
    if (whole && rest.empty()) return from_seconds(negative ? -*whole : *whole);  // "300": seconds
    static const std::pair<std::string_view, double> units[] = {{"ns", 1e-9}, {"us", 1e-6}, {"µs", 1e-6}, {"ms", 1e-3},
                                                                {"s", 1},     {"m", 60},    {"h", 3600}};
    double seconds = 0;
    rest = text;
    if (rest == "0") return from_seconds(0);
    while (!rest.empty()) {
        const std::optional<double> n = take_number(rest);
        if (!n) return std::nullopt;
        bool matched = false;
        for (const auto& [unit, scale] : units) {  // "ms" before "m" and "s": the longer unit first
            if (rest.starts_with(unit)) {
                seconds += *n * scale;
                rest.remove_prefix(unit.size());
                matched = true;
                break;
            }
        }
        if (!matched) return std::nullopt;
    }
    return from_seconds(negative ? -seconds : seconds);
}

std::optional<keep_alive> parse_keep_alive(const bounded_json::json& value) {
    if (value.is_null()) return std::nullopt;
    std::optional<keep_alive> parsed;
    if (value.is_number()) {
        parsed = from_seconds(value.get<double>());
    } else if (value.is_string()) {
        parsed = parse_keep_alive_text(value.get_ref<const std::string&>());
    }
    if (!parsed) {
        throw request_error(400, "'keep_alive' must be a number of seconds or a duration such as \"5m\" or \"1h30m\"");
    }
    return parsed;
}

}  // namespace keepwarm::router

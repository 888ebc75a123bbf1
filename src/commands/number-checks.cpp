// See number-checks.h.
#include "commands/number-checks.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace keepwarm {

namespace {

std::string in_unit(const std::string& unit) {
    return unit.empty() ? "" : " (" + unit + ")";
}

// The shortest text of a real number: 0.5, 2, 1e-06.
std::string real_text(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

std::string bounds(const std::string& min, const std::string& max, bool bounded_above, bool above_min,
                   const std::string& unit) {
    if (!bounded_above) return (above_min ? "more than " : "at least ") + min + in_unit(unit);
    return (above_min ? "more than " + min + " and at most " : "from " + min + " to ") + max + in_unit(unit);
}

}  // namespace

CLI::Validator whole_number(int64_t min, int64_t max, const std::string& unit) {
    // A bound that is only the type's (an int's 2147483647) is not worth saying unless a value passes it.
    const bool bounded_above = max < (int64_t{1} << 30);
    const std::string rule = bounds(std::to_string(min), std::to_string(max), bounded_above, false, unit);
    return CLI::Validator(
        [min, max, rule, bounded_above](std::string& text) -> std::string {
            int64_t value = 0;
            const auto r = std::from_chars(text.data(), text.data() + text.size(), value);
            if (r.ec == std::errc::result_out_of_range) {
                return "must be " + (text.starts_with("-") ? rule : "at most " + std::to_string(max)) + ", not " + text;
            }
            if (r.ec != std::errc() || r.ptr != text.data() + text.size()) {
                return "must be a whole number " + rule + ", not '" + text + "'";
            }
            if (value < min) return "must be " + rule + ", not " + text;
            if (value > max) {
                return "must be " + (bounded_above ? rule : "at most " + std::to_string(max)) + ", not " + text;
            }
            return std::string();
        },
        "");
}

CLI::Validator real_number(double min, double max, const std::string& unit, bool above_min) {
    const bool bounded_above = max != std::numeric_limits<double>::max();
    const std::string rule = bounds(real_text(min), real_text(max), bounded_above, above_min, unit);
    return CLI::Validator(
        [min, max, above_min, rule](std::string& text) -> std::string {
            errno = 0;
            char* end = nullptr;
            const double value = std::strtod(text.c_str(), &end);
            if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(value)) {
                return "must be a number " + rule + ", not '" + text + "'";
            }
            if (value < min || (above_min && value <= min) || value > max) return "must be " + rule + ", not " + text;
            return std::string();
        },
        "");
}

}  // namespace keepwarm

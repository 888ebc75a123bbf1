// Checks of numeric options whose failure a person reads: "--ctx-size: must be at least 1 (tokens), not 0" rather
// than CLI11's "Value 0 not in range 0.000000 to 1797693...". A value that is not a number, or not a whole one where
// one is expected, is named the same way.
// Threading: the validators are used while the command line is parsed.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <limits>
#include <string>

namespace keepwarm {

// A whole number from `min` to `max` (the largest value the option's type holds: no upper bound is said); `unit`
// ("tokens", "seconds"; may be empty) is shown after the bound.
CLI::Validator whole_number(int64_t min, int64_t max, const std::string& unit);
inline CLI::Validator whole_number_at_least(int64_t min, const std::string& unit) {
    return whole_number(min, std::numeric_limits<int64_t>::max(), unit);
}

// A real number from `min` to `max` (inclusive), or, with `above_min`, more than `min` (seconds that must not be 0).
CLI::Validator real_number(double min, double max, const std::string& unit, bool above_min = false);
inline CLI::Validator positive_real(const std::string& unit) {
    return real_number(0, std::numeric_limits<double>::max(), unit, true);
}

}  // namespace keepwarm

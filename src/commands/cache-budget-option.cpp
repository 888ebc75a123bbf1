// See cache-budget-option.h.
#include "commands/cache-budget-option.h"

#include <unistd.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <system_error>

namespace keepwarm {

namespace {

char lower(char c) {
    return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

// The multiplier of a unit (case ignored): b; k, kb, kib; m, mb, mib; g, gb, gib; t, tb, tib. 0: not a unit.
uint64_t unit_bytes(std::string_view unit) {
    std::string u;
    for (const char c : unit) u += lower(c);
    if (u == "b") return 1;
    static const char* const prefixes = "kmgt";
    for (int i = 0; i < 4; ++i) {
        const std::string p(1, prefixes[i]);
        if (u == p || u == p + "b" || u == p + "ib") return uint64_t{1} << (10 * (i + 1));
    }
    return 0;
}

}  // namespace

cache_budget parse_cache_budget(std::string_view text, const std::string& option) {
    const std::string quoted = option + " " + std::string(text);
    while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
    while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
    if (text == "-1") return std::nullopt;
    size_t number_end = 0;
    while (number_end < text.size() &&
           ((text[number_end] >= '0' && text[number_end] <= '9') || text[number_end] == '.'))
        ++number_end;
    const std::string_view number = text.substr(0, number_end);
    std::string_view unit = text.substr(number_end);
    while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
    double value = 0;
    const auto parsed = std::from_chars(number.data(), number.data() + number.size(), value);
    if (number.empty() || parsed.ec != std::errc() || parsed.ptr != number.data() + number.size()) {
        throw std::invalid_argument(quoted +
                                    ": expected a size: MiB as a bare number (8192), a number with a unit (8GiB, "
                                    "512MB, 1.5GiB), 0 (no tier) or -1 (half of the machine's)");
    }
    const uint64_t multiplier = unit.empty() ? uint64_t{1} << 20 : unit_bytes(unit);
    if (multiplier == 0) {
        throw std::invalid_argument(quoted + ": unknown unit '" + std::string(unit) +
                                    "' (B, KiB, MiB, GiB, TiB; KB, MB, GB, TB are the same binary units)");
    }
    const double bytes = std::floor(value * static_cast<double>(multiplier));
    if (bytes >= 0x1p63) throw std::invalid_argument(quoted + ": larger than any machine's memory or disk");
    return static_cast<uint64_t>(bytes);
}

CLI::Option* add_cache_budget_option(CLI::App& cmd, const std::string& name, cache_budget& budget,
                                     const std::string& what) {
    return cmd
        .add_option_function<std::string>(
            name,
            [&budget, name](const std::string& text) {
                try {
                    budget = parse_cache_budget(text, name);
                } catch (const std::invalid_argument& e) {
                    throw CLI::ValidationError(e.what());
                }
            },
            what +
                ": MiB as a bare number, as llama-server (8192 = 8 GiB), or with a unit (8GiB, 512MB); 0: no such "
                "tier; -1 (llama-server's no limit): half of the machine's")
        ->type_name("SIZE");
}

uint64_t half_of_physical_memory() {
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0) return uint64_t{4} << 30;
    return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 2;
}

uint64_t half_of_free_disk(const std::filesystem::path& dir) {
    std::filesystem::path at = dir;
    std::error_code ec;
    while (!at.empty() && !std::filesystem::exists(at, ec)) {
        if (at == at.parent_path()) break;
        at = at.parent_path();
    }
    const std::filesystem::space_info space = std::filesystem::space(at.empty() ? "." : at, ec);
    if (ec)
        throw std::runtime_error("--cache-disk -1: cannot tell the free space of '" + dir.string() +
                                 "': " + ec.message());
    return space.available / 2;
}

std::string format_bytes(uint64_t bytes) {
    static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double value = static_cast<double>(bytes);
    int unit = 0;
    while (value >= 1024 && unit < 5) {
        value /= 1024;
        ++unit;
    }
    char buf[48];
    if (unit == 0 || value == std::floor(value)) {
        std::snprintf(buf, sizeof buf, "%.0f %s", value, units[unit]);
    } else {
        std::snprintf(buf, sizeof buf, "%.1f %s", value, units[unit]);
    }
    return buf;
}

}  // namespace keepwarm

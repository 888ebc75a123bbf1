// The process's log: one line per event on stderr, each with a UTC timestamp, a level and the component that speaks,
// written as text for people or as one JSON object per line for log collectors (--log-format). Threading: every
// function may be called from any thread; each line reaches the output whole, in one write, so lines of different
// threads never interleave.
//
// A call reads like the message it writes, with typed arguments in place of {}:
//     log::info("disk cache", "{} blocks in {}", blocks, dir);
//     log::warn("proxy", "upstream {} is down ({})", url, why);
// and, for events a machine reads (the HTTP access line), named fields:
//     log::write(log::level::info, "http", "request", {{"status", 200}, {"path", path}});
// A format string with a {} count other than the argument count does not compile. Text in the message is the
// caller's to keep safe (--log-prompts decides whether prompt text may appear); the logger only keeps a line one
// line (control characters are escaped) and JSON valid (invalid UTF-8 is replaced).
//
// Why {} and not printf or streams: the arguments are typed (a std::string goes in as it is, no .c_str(), no %zu),
// the count is checked when compiling, and a message stays readable as one sentence. Why not std::format: this
// compiler's library lacks it, and the few conversions the log needs (text, integers, real numbers, fixed decimals)
// fit in a page.
#pragma once

#include <atomic>
#include <charconv>
#include <concepts>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>

namespace keepwarm::log {

// From the most to the least severe; a line is written when its level is at or above the threshold.
enum class level { error, warn, info, debug };
enum class format { text, json };

// "error", "warn", "info", "debug" / "text", "json"; nullopt for anything else.
std::optional<level> parse_level(std::string_view name);
std::optional<format> parse_format(std::string_view name);
const char* level_name(level l);

// The threshold (default info) and the format (default text), for the whole process; set at start-up.
void set_level(level threshold);
void set_format(format f);

namespace detail {
extern std::atomic<int> threshold;
}

// True when lines of level `l` are written: callers with a costly message ask first (the functions below do).
inline bool enabled(level l) {
    return static_cast<int>(l) <= detail::threshold.load(std::memory_order_relaxed);
}

// A named value of a line: text, an integer, a real number or a truth value. JSON writes it as a member of the line's
// object, text as ` name=value` after the message (quoted when it holds a space, a quote or '=').
struct field {
    std::string_view name;
    std::variant<std::string_view, int64_t, double, bool> value;

    field(std::string_view n, std::string_view v) : name(n), value(v) {}
    field(std::string_view n, const char* v) : name(n), value(std::string_view(v)) {}
    field(std::string_view n, const std::string& v) : name(n), value(std::string_view(v)) {}
    field(std::string_view n, bool v) : name(n), value(v) {}
    field(std::string_view n, double v) : name(n), value(v) {}
    template <std::integral T>
    requires(!std::same_as<T, bool>) field(std::string_view n, T v) : name(n), value(static_cast<int64_t>(v)) {}
};

// Writes one line if `l` is enabled. `component` names the part of keepwarm that speaks ("http", "disk cache").
void write(level l, std::string_view component, std::string_view message, std::initializer_list<field> fields = {});

// A real number shown with `decimals` digits after the point, e.g. log::fixed(mib, 1) -> "12.5".
struct fixed {
    double value;
    int decimals;
};

// What a command tells its user on stdout (serve's start-up banner, "listening on URL"): `text` as it is, followed by
// a newline, with the text format; one JSON line per line of `text` with the json format (time, level info,
// `component`, msg: the line without its indentation, and `fields` on the last line), so that everything the process
// writes can be read by one log collector. Written whatever the level.
void announce(std::string_view component, std::string_view text, std::initializer_list<field> fields = {});

// Sends every line (with its '\n') to `sink` instead of stderr, for tests; an empty function restores stderr.
void set_sink(std::function<void(std::string_view line)> sink);

namespace detail {

consteval size_t placeholders(std::string_view text) {
    size_t n = 0;
    for (size_t i = 0; i + 1 < text.size(); ++i) {
        if (text[i] == '{' && text[i + 1] == '}') ++n, ++i;
    }
    return n;
}

// The message with each {} of `text` replaced by the next of `args`, in order.
std::string substitute(std::string_view text, const std::string* args, size_t count);

inline std::string to_text(std::string_view s) {
    return std::string(s);
}
inline std::string to_text(const char* s) {
    return s ? std::string(s) : std::string("(null)");
}
inline std::string to_text(bool b) {
    return b ? "true" : "false";
}
inline std::string to_text(char c) {
    return std::string(1, c);
}
template <std::integral T>
requires(!std::same_as<T, bool> && !std::same_as<T, char>) std::string to_text(T v) {
    char buf[24];
    return std::string(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
}
std::string to_text(double v);  // the shortest text that reads back as v
std::string to_text(fixed f);
template <class T>
requires std::is_enum_v<T> std::string to_text(T v)
= delete;  // say what an enum means in words, e.g. with its *_name() function

}  // namespace detail

// A message with {} for each argument, checked when compiling.
template <class... Args>
struct format_string {
    std::string_view text;

    template <class S>
    requires std::convertible_to<const S&, std::string_view>
    consteval format_string(const S& s) : text(s) {
        if (detail::placeholders(text) != sizeof...(Args)) {
            throw "log: the message has a different number of {} than arguments";  // a compile error in consteval
        }
    }
};

template <class... Args>
void line(level l, std::string_view component, format_string<std::type_identity_t<Args>...> message,
          const Args&... args) {
    if (!enabled(l)) return;
    if constexpr (sizeof...(Args) == 0) {
        write(l, component, message.text);
    } else {
        const std::string texts[] = {detail::to_text(args)...};
        write(l, component, detail::substitute(message.text, texts, sizeof...(Args)));
    }
}

template <class... Args>
void error(std::string_view component, format_string<std::type_identity_t<Args>...> message, const Args&... args) {
    line<Args...>(level::error, component, message, args...);
}
template <class... Args>
void warn(std::string_view component, format_string<std::type_identity_t<Args>...> message, const Args&... args) {
    line<Args...>(level::warn, component, message, args...);
}
template <class... Args>
void info(std::string_view component, format_string<std::type_identity_t<Args>...> message, const Args&... args) {
    line<Args...>(level::info, component, message, args...);
}
template <class... Args>
void debug(std::string_view component, format_string<std::type_identity_t<Args>...> message, const Args&... args) {
    line<Args...>(level::debug, component, message, args...);
}

}  // namespace keepwarm::log

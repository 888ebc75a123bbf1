// See logger.h. A line is built whole in a local string, then written under one mutex in one fwrite to the unbuffered
// stderr, so it reaches the file in one write(2).
#include "base/logger.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <nlohmann/json.hpp>

namespace keepwarm::log {

namespace detail {
std::atomic<int> threshold{static_cast<int>(level::info)};
}

namespace {

std::atomic<format> line_format{format::text};

std::mutex output_mutex;
std::function<void(std::string_view)> output_sink;  // guarded by output_mutex; empty: stderr

// 2026-03-14T09:26:53.589Z
std::string utc_timestamp() {
    const auto now = std::chrono::system_clock::now();
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
    const std::time_t seconds = static_cast<std::time_t>(ms / 1000);
    std::tm tm{};
    gmtime_r(&seconds, &tm);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                  tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms % 1000));
    return buf;
}

// Keeps a text line one line: control characters become C escapes; other bytes (UTF-8 included) stay.
void append_escaped(std::string& out, std::string_view text) {
    for (const char ch : text) {
        const auto byte = static_cast<unsigned char>(ch);
        if (byte >= 0x20 && byte != 0x7f) {
            out += ch;
        } else if (ch == '\n') {
            out += "\\n";
        } else if (ch == '\r') {
            out += "\\r";
        } else if (ch == '\t') {
            out += "\\t";
        } else {
            static const char hex[] = "0123456789abcdef";
            out += "\\x";
            out += hex[byte >> 4];
            out += hex[byte & 15];
        }
    }
}

// A field's value in a text line: as it is when it reads as one word, else in double quotes with \" and \\ escaped.
void append_text_value(std::string& out, std::string_view value) {
    bool plain = !value.empty();
    for (const char ch : value) {
        const auto byte = static_cast<unsigned char>(ch);
        if (byte <= ' ' || byte == 0x7f || ch == '"' || ch == '=' || ch == '\\') plain = false;
    }
    if (plain) {
        out += value;
        return;
    }
    out += '"';
    for (const char ch : value) {
        if (ch == '"' || ch == '\\') out += '\\';
        append_escaped(out, std::string_view(&ch, 1));
    }
    out += '"';
}

nlohmann::json json_value(const field& f) {
    return std::visit([](auto v) { return nlohmann::json(v); }, f.value);
}

std::string text_line(level l, std::string_view component, std::string_view message,
                      std::initializer_list<field> fields) {
    std::string out = utc_timestamp();
    out += ' ';
    static const char* const padded[] = {"ERROR", "WARN ", "INFO ", "DEBUG"};
    out += padded[static_cast<int>(l)];
    out += ' ';
    append_escaped(out, component);
    out += ": ";
    append_escaped(out, message);
    for (const field& f : fields) {
        out += ' ';
        append_escaped(out, f.name);
        out += '=';
        if (const auto* text = std::get_if<std::string_view>(&f.value)) {
            append_text_value(out, *text);
        } else {
            out += json_value(f).dump();
        }
    }
    out += '\n';
    return out;
}

std::string json_line(level l, std::string_view component, std::string_view message,
                      std::initializer_list<field> fields) {
    nlohmann::ordered_json line = {
        {"time", utc_timestamp()},
        {"level", level_name(l)},
        {"component", component},
        {"msg", message},
    };
    for (const field& f : fields) line[std::string(f.name)] = json_value(f);
    // Messages quote bytes of requests: invalid UTF-8 is replaced rather than thrown on.
    std::string out = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    out += '\n';
    return out;
}

}  // namespace

std::optional<level> parse_level(std::string_view name) {
    for (const level l : {level::error, level::warn, level::info, level::debug}) {
        if (name == level_name(l)) return l;
    }
    return std::nullopt;
}

std::optional<format> parse_format(std::string_view name) {
    if (name == "text") return format::text;
    if (name == "json") return format::json;
    return std::nullopt;
}

const char* level_name(level l) {
    switch (l) {
        case level::error:
            return "error";
        case level::warn:
            return "warn";
        case level::info:
            return "info";
        case level::debug:
            return "debug";
    }
    return "info";
}

void set_level(level threshold) {
    detail::threshold.store(static_cast<int>(threshold), std::memory_order_relaxed);
}

void set_format(format f) {
    line_format.store(f, std::memory_order_relaxed);
}

void set_sink(std::function<void(std::string_view line)> sink) {
    std::lock_guard lock(output_mutex);
    output_sink = std::move(sink);
}

void write(level l, std::string_view component, std::string_view message, std::initializer_list<field> fields) {
    if (!enabled(l)) return;
    const std::string line = line_format.load(std::memory_order_relaxed) == format::json
                                 ? json_line(l, component, message, fields)
                                 : text_line(l, component, message, fields);
    std::lock_guard lock(output_mutex);
    if (output_sink) {
        output_sink(line);
    } else {
        std::fwrite(line.data(), 1, line.size(), stderr);
    }
}

void announce(std::string_view component, std::string_view text, std::initializer_list<field> fields) {
    std::string out;
    if (line_format.load(std::memory_order_relaxed) == format::json) {
        const std::initializer_list<field> none = {};
        while (!text.empty()) {
            const size_t end = text.find('\n');
            std::string_view line = text.substr(0, end);
            text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
            const size_t start = line.find_first_not_of(' ');
            line = start == std::string_view::npos ? std::string_view() : line.substr(start);
            if (!line.empty()) out += json_line(level::info, component, line, text.empty() ? fields : none);
        }
    } else {
        out = text;
        if (out.empty() || out.back() != '\n') out += '\n';
    }
    std::lock_guard lock(output_mutex);
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
}

namespace detail {

std::string substitute(std::string_view text, const std::string* args, size_t count) {
    std::string out;
    size_t next = 0;
    for (size_t i = 0; i < text.size(); ++i) {
        if (text[i] == '{' && i + 1 < text.size() && text[i + 1] == '}' && next < count) {
            out += args[next++];
            ++i;
        } else {
            out += text[i];
        }
    }
    return out;
}

std::string to_text(double v) {
    char buf[32];
    return std::string(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
}

std::string to_text(fixed f) {
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, f.value, std::chars_format::fixed, f.decimals);
    return r.ec == std::errc() ? std::string(buf, r.ptr) : to_text(f.value);
}

}  // namespace detail

}  // namespace keepwarm::log

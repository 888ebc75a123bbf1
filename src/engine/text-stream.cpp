// See text-stream.h.
#include "engine/text-stream.h"

#include <algorithm>

namespace keepwarm {

namespace {

constexpr std::string_view replacement_char = "\xEF\xBF\xBD";

// Length of a UTF-8 sequence from its lead byte; 0 for a byte that cannot start one.
size_t sequence_length(unsigned char lead) {
    if (lead < 0x80) return 1;
    if (lead >= 0xC2 && lead <= 0xDF) return 2;
    if (lead >= 0xE0 && lead <= 0xEF) return 3;
    if (lead >= 0xF0 && lead <= 0xF4) return 4;
    return 0;
}

// Whether bytes[0..len) is a well-formed sequence (no overlongs, surrogates or values past U+10FFFF).
bool well_formed(std::string_view bytes, size_t len) {
    const auto b = [&](size_t i) { return static_cast<unsigned char>(bytes[i]); };
    for (size_t i = 1; i < len; ++i) {
        if ((b(i) & 0xC0) != 0x80) return false;
    }
    if (len == 3) {
        if (b(0) == 0xE0 && b(1) < 0xA0) return false;
        if (b(0) == 0xED && b(1) > 0x9F) return false;
    }
    if (len == 4) {
        if (b(0) == 0xF0 && b(1) < 0x90) return false;
        if (b(0) == 0xF4 && b(1) > 0x8F) return false;
    }
    return true;
}

// Appends the valid UTF-8 of `bytes` to `out`; returns how many trailing bytes form an incomplete but so far
// valid character (left for the next call).
size_t append_valid(std::string_view bytes, std::string& out) {
    size_t i = 0;
    while (i < bytes.size()) {
        const size_t len = sequence_length(static_cast<unsigned char>(bytes[i]));
        if (len == 0) {
            out += replacement_char;
            ++i;
            continue;
        }
        if (i + len > bytes.size()) {
            // Possibly incomplete: keep it if what we have so far is a valid start.
            const size_t have = bytes.size() - i;
            bool ok = true;
            for (size_t k = 1; k < have; ++k) ok = ok && (static_cast<unsigned char>(bytes[i + k]) & 0xC0) == 0x80;
            if (ok) return have;
            out += replacement_char;
            ++i;
            continue;
        }
        if (!well_formed(bytes.substr(i), len)) {
            out += replacement_char;
            ++i;
            continue;
        }
        out.append(bytes.substr(i, len));
        i += len;
    }
    return 0;
}

}  // namespace

std::string sanitize_utf8(std::string_view bytes) {
    std::string out;
    const size_t incomplete = append_valid(bytes, out);
    if (incomplete) out += replacement_char;
    return out;
}

text_stream::text_stream(std::vector<std::string> stop_strings) {
    for (auto& s : stop_strings) {
        if (!s.empty()) stops_.push_back(std::move(s));
    }
}

std::string text_stream::push(std::string_view piece) {
    if (stopped_) return {};
    std::string bytes = partial_utf8_;
    bytes.append(piece);
    partial_utf8_.clear();

    std::string text = std::move(held_);
    held_.clear();
    const size_t incomplete = append_valid(bytes, text);
    partial_utf8_ = bytes.substr(bytes.size() - incomplete);

    // A stop string can only start in `text`: everything emitted earlier was checked not to begin one.
    size_t first = std::string::npos;
    for (const auto& stop : stops_) {
        const size_t pos = text.find(stop);
        if (pos != std::string::npos && (first == std::string::npos || pos < first)) {
            first = pos;
            matched_stop_ = stop;
        }
    }
    if (first != std::string::npos) {
        stopped_ = true;
        partial_utf8_.clear();
        text.resize(first);
        return text;
    }

    // Hold back the longest suffix that is a proper prefix of some stop string.
    size_t hold = 0;
    for (const auto& stop : stops_) {
        for (size_t k = std::min(stop.size() - 1, text.size()); k > hold; --k) {
            if (text.compare(text.size() - k, k, stop, 0, k) == 0) {
                hold = k;
                break;
            }
        }
    }
    held_ = text.substr(text.size() - hold);
    text.resize(text.size() - hold);
    return text;
}

std::string text_stream::finish() {
    if (stopped_) return {};
    std::string text = std::move(held_);
    held_.clear();
    if (!partial_utf8_.empty()) text += replacement_char;
    partial_utf8_.clear();
    return text;
}

}  // namespace keepwarm

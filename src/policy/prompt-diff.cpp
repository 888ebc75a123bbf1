// See prompt-diff.h.
#include "policy/prompt-diff.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <unordered_map>

namespace keepwarm::policy {

namespace {

constexpr size_t anchor_chars = 32;      // two prompts agree again where this many chars match
constexpr int max_bridges = 16;          // further short spans bridged while measuring how long they agree
constexpr size_t max_value_chars = 512;  // an id, date or number longer than this is something else
constexpr size_t max_context_chars = 48;

bool is_digit(char c) {
    return c >= '0' && c <= '9';
}
bool is_lower(char c) {
    return c >= 'a' && c <= 'z';
}
bool is_upper(char c) {
    return c >= 'A' && c <= 'Z';
}
bool is_alnum(char c) {
    return is_digit(c) || is_lower(c) || is_upper(c);
}
bool is_hex(char c) {
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
bool has(std::string_view s, bool (*pred)(char)) {
    return std::any_of(s.begin(), s.end(), pred);
}
// Chars of the key in front of a value ("cch", "request-id", "cc_version").
bool is_key_char(char c) {
    return is_alnum(c) || c == '_' || c == '-' || c == '.';
}
// Printable ASCII between a key and its value (": ", "=", "\"").
bool is_space(char c) {
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

bool has_space(std::string_view s) {
    return std::any_of(s.begin(), s.end(), is_space);
}

bool is_separator(char c) {
    return (c == '\t' || (c >= ' ' && c < 0x7f)) && !is_key_char(c);
}

// ---- where two texts agree again

struct rejoin {
    size_t earlier_skip, later_skip;  // chars skipped in each text before they agree for anchor_chars
};

// Polynomial hashes of text[i, i + anchor_chars) for i < count, rolled in one pass.
std::vector<uint64_t> anchor_hashes(std::string_view text, size_t count) {
    constexpr uint64_t base = 1099511628211ull;
    uint64_t top = 1;
    for (size_t k = 1; k < anchor_chars; ++k) top *= base;
    uint64_t h = 0;
    for (size_t k = 0; k < anchor_chars; ++k) h = h * base + static_cast<uint8_t>(text[k]);
    std::vector<uint64_t> out(count);
    out[0] = h;
    for (size_t i = 1; i < count; ++i) {
        h = (h - static_cast<uint8_t>(text[i - 1]) * top) * base + static_cast<uint8_t>(text[i - 1 + anchor_chars]);
        out[i] = h;
    }
    return out;
}

// The nearest point where a and b (which differ at their first char) agree for anchor_chars, skipping at most
// max_skip chars in each: the smallest larger skip, then the smallest sum. O(max_skip log max_skip): the earlier
// text's anchors in the window are indexed by hash, and the later text's are looked up.
std::optional<rejoin> find_rejoin(std::string_view a, std::string_view b, size_t max_skip) {
    if (a.size() < anchor_chars || b.size() < anchor_chars) return std::nullopt;
    const size_t na = std::min(max_skip, a.size() - anchor_chars) + 1;
    const size_t nb = std::min(max_skip, b.size() - anchor_chars) + 1;
    const std::vector<uint64_t> ha = anchor_hashes(a, na), hb = anchor_hashes(b, nb);
    std::vector<std::pair<uint64_t, size_t>> index(na);
    for (size_t i = 0; i < na; ++i) index[i] = {ha[i], i};
    std::sort(index.begin(), index.end());

    std::optional<rejoin> best;
    const auto better = [&](size_t i, size_t j) {
        if (!best) return true;
        const size_t m = std::max(i, j), best_m = std::max(best->earlier_skip, best->later_skip);
        return m < best_m || (m == best_m && i + j < best->earlier_skip + best->later_skip);
    };
    const auto by_hash = [](const std::pair<uint64_t, size_t>& e, uint64_t h) { return e.first < h; };
    for (size_t j = 0; j < nb && better(0, j); ++j) {
        // Within one hash the positions ascend, and a larger i is never better for the same j.
        for (auto it = std::lower_bound(index.begin(), index.end(), hb[j], by_hash);
             it != index.end() && it->first == hb[j] && better(it->second, j); ++it) {
            if (a.compare(it->second, anchor_chars, b, j, anchor_chars) == 0) {
                best = rejoin{it->second, j};
                break;
            }
        }
    }
    return best;
}

struct agreement {
    size_t chars = 0;
    int bridges = 0;
};

// How many chars a[i..] and b[j..] agree on, bridging up to max_bridges further short spans.
agreement agree_from(std::string_view a, std::string_view b, size_t i, size_t j, size_t max_skip) {
    agreement out;
    for (;;) {
        const size_t n = common_prefix_length(a.substr(i), b.substr(j));
        out.chars += n;
        i += n;
        j += n;
        if (i >= a.size() || j >= b.size() || out.bridges == max_bridges) return out;
        const auto r = find_rejoin(a.substr(i), b.substr(j), max_skip);
        if (!r) return out;
        i += r->earlier_skip;
        j += r->later_skip;
        ++out.bridges;
    }
}

// ---- lines

size_t line_start(std::string_view text, size_t offset) {
    if (offset == 0) return 0;
    const size_t nl = text.rfind('\n', offset - 1);
    return nl == std::string_view::npos ? 0 : nl + 1;
}

// Just past the '\n' that ends the line holding text[offset] (the text's end without one).
size_t line_end(std::string_view text, size_t offset) {
    const size_t nl = text.find('\n', offset);
    return nl == std::string_view::npos ? text.size() : nl + 1;
}

std::vector<std::string_view> lines_of(std::string_view text) {
    std::vector<std::string_view> lines;
    for (size_t at = 0; at < text.size();) {
        const size_t end = line_end(text, at);
        lines.push_back(text.substr(at, end - at));
        at = end;
    }
    return lines;
}

// Whether a[from, end_a) and b[from, end_b) hold the same lines (at least two) in another order.
bool same_lines_reordered(std::string_view a, std::string_view b, size_t from, size_t end_a, size_t end_b) {
    if (end_a != end_b) return false;
    std::vector<std::string_view> la = lines_of(a.substr(from, end_a - from)),
                                  lb = lines_of(b.substr(from, end_b - from));
    if (la.size() < 2 || la == lb) return false;
    std::sort(la.begin(), la.end());
    std::sort(lb.begin(), lb.end());
    return la == lb;
}

// The shortest run of whole lines, from the line where a and b first differ (at p), that holds the same lines in
// both: [start, end), the same in both. One pass over at most max_chars, with a balance of lines seen on each side.
std::optional<std::pair<size_t, size_t>> find_reordered_block(std::string_view a, std::string_view b, size_t p,
                                                              size_t max_chars) {
    const size_t start = line_start(a, p);  // a and b agree before p
    std::unordered_map<std::string_view, int> balance;
    size_t unbalanced = 0;
    const auto count = [&](std::string_view line, int delta) {
        int& n = balance[line];
        if (n == 0) ++unbalanced;
        n += delta;
        if (n == 0) --unbalanced;
    };
    size_t ia = start, ib = start;
    while (ia < a.size() && ib < b.size() && ia - start <= max_chars) {
        const size_t ea = line_end(a, ia), eb = line_end(b, ib);
        count(a.substr(ia, ea - ia), +1);
        count(b.substr(ib, eb - ib), -1);
        ia = ea;
        ib = eb;
        if (unbalanced == 0 && ia == ib) return std::pair{start, ia};
    }
    return std::nullopt;
}

// ---- what the span is

struct value_bounds {
    size_t start, end_a, end_b;
};

// Widens [offset, offset + la) in a and [offset, offset + lb) in b to the value they lie in: every char of both
// spans must satisfy `part(text, i)`, then the value grows over such chars on the left (shared text) and on the
// right (as long as both texts have the same char there). nullopt when a span char does not fit or the value gets
// too long to be one.
template <class Part>
std::optional<value_bounds> widen(std::string_view a, std::string_view b, size_t offset, size_t la, size_t lb,
                                  Part part) {
    for (size_t k = offset; k < offset + la; ++k)
        if (!part(a, k)) return std::nullopt;
    for (size_t k = offset; k < offset + lb; ++k)
        if (!part(b, k)) return std::nullopt;
    size_t start = offset;
    while (start > 0 && offset - start < max_value_chars && part(a, start - 1)) --start;
    size_t ea = offset + la, eb = offset + lb;
    while (ea < a.size() && eb < b.size() && a[ea] == b[eb] && part(a, ea) && ea - start < max_value_chars) {
        ++ea;
        ++eb;
    }
    if (ea - start >= max_value_chars || eb - start >= max_value_chars) return std::nullopt;
    return value_bounds{start, ea, eb};
}

template <bool (*pred)(char)>
bool char_is(std::string_view text, size_t i) {
    return pred(text[i]);
}

bool alnum_bounded(std::string_view text, size_t start, size_t end) {
    return (start == 0 || !is_alnum(text[start - 1])) && (end == text.size() || !is_alnum(text[end]));
}

bool uuid_at(std::string_view text, size_t i) {
    if (i + 36 > text.size()) return false;
    for (size_t k = 0; k < 36; ++k) {
        const char c = text[i + k];
        if (k == 8 || k == 13 || k == 18 || k == 23 ? c != '-' : !is_hex(c)) return false;
    }
    return true;
}

std::optional<value_bounds> find_uuid(std::string_view a, std::string_view b, size_t offset, size_t la, size_t lb) {
    const size_t end = offset + std::max(la, lb);
    for (size_t s = offset + 1; s-- > 0 && s + 36 >= end;) {
        if (uuid_at(a, s) && uuid_at(b, s)) return value_bounds{s, s + 36, s + 36};
    }
    return std::nullopt;
}

bool timestamp_char(std::string_view t, size_t i) {
    const char c = t[i];
    if (is_digit(c) || c == ':' || c == '-' || c == '/' || c == '.' || c == 'T' || c == 'Z' || c == '+') return true;
    // "2025-01-06 10:00:07": a space between digits
    return c == ' ' && i > 0 && i + 1 < t.size() && is_digit(t[i - 1]) && is_digit(t[i + 1]);
}

bool number_char(std::string_view t, size_t i) {
    // digits, and dots between digits ("2.1.197")
    return is_digit(t[i]) || (t[i] == '.' && i > 0 && i + 1 < t.size() && is_digit(t[i - 1]) && is_digit(t[i + 1]));
}

bool base64_char(std::string_view t, size_t i) {
    const char c = t[i];
    return is_alnum(c) || c == '+' || c == '/' || c == '_' || c == '-';
}

std::string digit_shape(std::string_view value) {
    std::string shape(value);
    for (char& c : shape)
        if (is_digit(c)) c = '9';
    return shape;
}

// A unix time in seconds or milliseconds (2001-2033).
bool epoch_time(std::string_view value) {
    return (value.size() == 10 || value.size() == 13) && value[0] == '1' &&
           !has(value, [](char c) { return !is_digit(c); });
}

bool date_or_time(std::string_view value) {
    const std::string shape = digit_shape(value);
    for (const char* form : {"9999-99-99", "9999/99/99", "99/99/9999", "99.99.9999", "9:99"}) {
        if (shape.find(form) != std::string::npos) return true;
    }
    return false;
}

// The non-digit chars of a value in order: dates of the same format share it ("--T::Z").
std::string separators_of(std::string_view value) {
    std::string out;
    for (const char c : value)
        if (!is_digit(c)) out += c;
    return out;
}

std::optional<value_bounds> find_timestamp(std::string_view a, std::string_view b, size_t offset, size_t la,
                                           size_t lb) {
    auto w = widen(a, b, offset, la, lb, timestamp_char);
    if (!w) return std::nullopt;
    // Trim to start at a digit and end at a digit or 'Z'; the differing chars must stay inside.
    while (w->start < offset && !is_digit(a[w->start])) ++w->start;
    while (w->end_a > offset + la && w->end_b > offset + lb && a[w->end_a - 1] == b[w->end_b - 1] &&
           !is_digit(a[w->end_a - 1]) && a[w->end_a - 1] != 'Z') {
        --w->end_a;
        --w->end_b;
    }
    const std::string_view va = a.substr(w->start, w->end_a - w->start), vb = b.substr(w->start, w->end_b - w->start);
    if (va.empty() || vb.empty() || !is_digit(va[0]) || !is_digit(vb[0])) return std::nullopt;
    if (epoch_time(va) && epoch_time(vb) && va.size() == vb.size()) return w;
    if (date_or_time(va) && date_or_time(vb) && separators_of(va) == separators_of(vb)) return w;
    return std::nullopt;
}

// Random text switches between digits, lower and upper case all the time; words and paths rarely do.
bool high_entropy(std::string_view value) {
    if (value.size() < 16) return false;
    const auto class_of = [](char c) { return is_digit(c) ? 1 : is_lower(c) ? 2 : is_upper(c) ? 3 : 0; };
    size_t switches = 0;
    for (size_t i = 1; i < value.size(); ++i) {
        const int p = class_of(value[i - 1]), c = class_of(value[i]);
        if (p != 0 && c != 0 && p != c) ++switches;
    }
    const int classes = int(has(value, is_digit)) + int(has(value, is_lower)) + int(has(value, is_upper));
    return classes >= 2 && switches * 4 >= value.size();
}

struct classified {
    span_kind kind;
    value_bounds bounds;
};

classified classify(std::string_view a, std::string_view b, size_t offset, size_t la, size_t lb) {
    const auto value = [&](std::string_view t, const value_bounds& w, bool earlier) {
        return t.substr(w.start, (earlier ? w.end_a : w.end_b) - w.start);
    };
    const std::string_view sa = a.substr(offset, la), sb = b.substr(offset, lb);
    if (sa.find('\n') != std::string_view::npos || sb.find('\n') != std::string_view::npos) {
        const size_t from = line_start(a, offset);
        const size_t end_a = la ? line_end(a, offset + la - 1) : line_end(a, offset);
        const size_t end_b = lb ? line_end(b, offset + lb - 1) : line_end(b, offset);
        if (same_lines_reordered(a, b, from, end_a, end_b)) return {span_kind::reordered, {from, end_a, end_b}};
    }
    if (auto w = find_uuid(a, b, offset, la, lb)) return {span_kind::uuid, *w};
    if (auto w = find_timestamp(a, b, offset, la, lb)) return {span_kind::timestamp, *w};
    if (auto w = widen(a, b, offset, la, lb, number_char)) {
        // A number as a part of a hex or base64 id ("5f2e1" vs "5f2e7") is the id's.
        if (alnum_bounded(a, w->start, w->end_a) && alnum_bounded(b, w->start, w->end_b)) {
            return {span_kind::number, *w};
        }
    }
    if (auto w = widen(a, b, offset, la, lb, char_is<is_hex>)) {
        const std::string_view va = value(a, *w, true), vb = value(b, *w, false);
        const auto is_hex_letter = [](char c) { return is_hex(c) && !is_digit(c); };
        if (alnum_bounded(a, w->start, w->end_a) && alnum_bounded(b, w->start, w->end_b) && va.size() >= 3 &&
            vb.size() >= 3 && (has(va, is_digit) || has(vb, is_digit)) &&
            (has(va, is_hex_letter) || has(vb, is_hex_letter)))
            return {span_kind::hex_id, *w};
    }
    if (auto w = widen(a, b, offset, la, lb, base64_char)) {
        if (high_entropy(value(a, *w, true)) && high_entropy(value(b, *w, false))) return {span_kind::base64_id, *w};
    }
    // Prose: whole words (bytes of non-ASCII UTF-8 characters count as letters, so no character is cut).
    const auto word_char = [](char c) { return is_alnum(c) || static_cast<unsigned char>(c) >= 0x80; };
    size_t start = offset, ea = offset + la, eb = offset + lb;
    while (start > 0 && offset - start < max_value_chars && word_char(a[start - 1])) --start;
    while (ea < a.size() && eb < b.size() && a[ea] == b[eb] && word_char(a[ea]) && ea - offset - la < max_value_chars) {
        ++ea;
        ++eb;
    }
    return {span_kind::prose, {start, ea, eb}};
}

// ---- rules

// Where the literal context in front of a value starts: separators and a key word, again (at most three times,
// max_context_chars in all) while the key has no letter ("cc_version=2.1.197." in front of a suffix).
size_t context_start(std::string_view text, size_t value_start) {
    size_t s = value_start;
    for (int round = 0; round < 3; ++round) {
        size_t k = s;
        while (k > 0 && s - k < 4 && value_start - k < max_context_chars && is_separator(text[k - 1])) --k;
        size_t w = k;
        while (w > 0 && value_start - w < max_context_chars && is_key_char(text[w - 1])) --w;
        s = w;
        if (w == k || has(text.substr(w, k - w), [](char c) { return is_lower(c) || is_upper(c); })) break;
    }
    return s;
}

// The literal context after a value: separators and a key word, for a value with nothing usable in front.
size_t context_end(std::string_view text, size_t value_end) {
    size_t e = value_end;
    while (e < text.size() && e - value_end < 4 && is_separator(text[e])) ++e;
    while (e < text.size() && e - value_end < max_context_chars && is_key_char(text[e])) ++e;
    return e;
}

std::string escape_regex(std::string_view text) {
    std::string out;
    for (const char c : text) {
        if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
        out += c;
    }
    return out;
}

std::string quantifier(size_t a, size_t b) {
    const size_t lo = std::min(a, b), hi = std::max(a, b);
    return lo == hi ? "{" + std::to_string(lo) + "}" : "{" + std::to_string(lo) + "," + std::to_string(hi) + "}";
}

// [0-9a-f], [0-9A-F] or [0-9A-Fa-f] as the values' letters are.
std::string hex_class(std::string_view va, std::string_view vb, std::string_view extra = "") {
    const bool lower = has(va, is_lower) || has(vb, is_lower), upper = has(va, is_upper) || has(vb, is_upper);
    return "[0-9" + std::string(upper ? "A-F" : "") + (lower || !upper ? "a-f" : "") + std::string(extra) + "]";
}

// Digit runs become [0-9]{n} (or {m,n} where the two values' runs differ), other chars stay literal.
std::string digit_runs_pattern(std::string_view va, std::string_view vb) {
    std::string out;
    size_t i = 0, j = 0;
    while (i < va.size() && j < vb.size()) {
        if (is_digit(va[i]) && is_digit(vb[j])) {
            size_t ri = i, rj = j;
            while (ri < va.size() && is_digit(va[ri])) ++ri;
            while (rj < vb.size() && is_digit(vb[rj])) ++rj;
            out += "[0-9]" + quantifier(ri - i, rj - j);
            i = ri;
            j = rj;
        } else {
            out += escape_regex(va.substr(i, 1));
            ++i;
            ++j;
        }
    }
    return out;
}

std::string toml_string(std::string_view s) {
    const bool literal = std::none_of(s.begin(), s.end(), [](char c) {
        return c == '\'' || (static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f;
    });
    if (literal) return "'" + std::string(s) + "'";
    std::string out = "\"";
    for (const char c : s) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
        } else if (c == '\n') {
            out += "\\n";
        } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned char>(c));
            out += buf;
        } else {
            out += c;
        }
    }
    return out + "\"";
}

std::string rule_name(std::string_view key, span_kind kind) {
    std::string name;
    for (const char c : key) {
        if (is_alnum(c)) {
            name += static_cast<char>(is_upper(c) ? c - 'A' + 'a' : c);
        } else if (!name.empty() && name.back() != '-') {
            name += '-';
        }
    }
    while (!name.empty() && name.back() == '-') name.pop_back();
    std::string kind_name = span_kind_name(kind);
    std::replace(kind_name.begin(), kind_name.end(), '_', '-');
    // Without a key, "-span" keeps the name apart from the policy's built-in rules ("uuid", "timestamp").
    return name.empty() ? kind_name + "-span" : name + "-" + kind_name;
}

// The last key word with a letter in a context ("request-id" in "request-id: ", "cc_version" in
// "cc_version=2.1.197."), for the rule's name.
std::string_view key_of(std::string_view context) {
    size_t end = context.size();
    while (end > 0) {
        while (end > 0 && !is_key_char(context[end - 1])) --end;
        size_t start = end;
        while (start > 0 && is_key_char(context[start - 1])) --start;
        const std::string_view word = context.substr(start, end - start);
        if (has(word, [](char c) { return is_lower(c) || is_upper(c); })) return word;
        end = start;
    }
    return {};
}

}  // namespace

const char* span_kind_name(span_kind kind) {
    switch (kind) {
        case span_kind::uuid:
            return "uuid";
        case span_kind::hex_id:
            return "hex_id";
        case span_kind::base64_id:
            return "base64_id";
        case span_kind::timestamp:
            return "timestamp";
        case span_kind::number:
            return "number";
        case span_kind::reordered:
            return "reordered";
        case span_kind::prose:
            return "prose";
    }
    return "prose";
}

const char* span_kind_description(span_kind kind) {
    switch (kind) {
        case span_kind::uuid:
            return "uuid";
        case span_kind::hex_id:
            return "hex id";
        case span_kind::base64_id:
            return "base64-like random id";
        case span_kind::timestamp:
            return "timestamp or date";
        case span_kind::number:
            return "number or counter";
        case span_kind::reordered:
            return "reordered block of lines";
        case span_kind::prose:
            return "prose";
    }
    return "prose";
}

bool is_random_id(span_kind kind) {
    return kind == span_kind::uuid || kind == span_kind::hex_id || kind == span_kind::base64_id;
}

size_t common_prefix_length(std::string_view a, std::string_view b) {
    const size_t n = std::min(a.size(), b.size());
    // Whole blocks through memcmp (vectorized), then the first block that differs byte by byte: prompts of an agent's
    // turns share hundreds of KB.
    constexpr size_t block = 256;
    size_t i = 0;
    while (i + block <= n && std::memcmp(a.data() + i, b.data() + i, block) == 0) i += block;
    return i + static_cast<size_t>(std::mismatch(a.begin() + i, a.begin() + n, b.begin() + i).first - (a.begin() + i));
}

std::optional<volatile_span> find_volatile_span(std::string_view earlier, std::string_view later,
                                                const diff_options& options) {
    const size_t p = common_prefix_length(earlier, later);
    if (p == earlier.size() || p == later.size()) return std::nullopt;

    // Whether the prompts, different in [p, p + la) and [p, p + lb), agree for long after that.
    const auto worth_it = [&](size_t la, size_t lb, agreement& agreed) {
        agreed = agree_from(earlier, later, p + la, p + lb, options.max_span_chars);
        const size_t rest = std::min(earlier.size() - p - la, later.size() - p - lb);
        return agreed.chars >= options.min_agreed_chars && double(agreed.chars) >= options.min_agreed_share * rest;
    };
    agreement agreed;
    volatile_span span;
    span.first_difference = p;
    if (const auto r = find_rejoin(earlier.substr(p), later.substr(p), options.max_span_chars);
        r && worth_it(r->earlier_skip, r->later_skip, agreed)) {
        const classified c = classify(earlier, later, p, r->earlier_skip, r->later_skip);
        // A volatile value is one token-like run (an id, a number, a word); prose that differs by words, with
        // spaces or lines between them, is another conversation going its own way (two users' questions), even where
        // the text after it agrees again.
        if (c.kind == span_kind::prose && (has_space(earlier.substr(c.bounds.start, c.bounds.end_a - c.bounds.start)) ||
                                           has_space(later.substr(c.bounds.start, c.bounds.end_b - c.bounds.start))))
            return std::nullopt;
        span.kind = c.kind;
        span.offset = c.bounds.start;
        span.earlier_length = c.bounds.end_a - c.bounds.start;
        span.later_length = c.bounds.end_b - c.bounds.start;
        // The widened value may take some of the agreement's first chars.
        agreed.chars -= std::min(agreed.chars, c.bounds.end_a - (p + r->earlier_skip));
    } else if (const auto block = find_reordered_block(earlier, later, p, options.max_reordered_chars);
               block && worth_it(block->second - p, block->second - p, agreed)) {
        span.kind = span_kind::reordered;
        span.offset = block->first;
        span.earlier_length = span.later_length = block->second - block->first;
    } else {
        return std::nullopt;
    }
    span.agreed_chars = agreed.chars;
    span.further_spans = agreed.bridges;
    return span;
}

suggested_rule suggest_rule(std::string_view earlier, std::string_view later, const volatile_span& span) {
    suggested_rule rule;
    const std::string_view va = span.in_earlier(earlier), vb = span.in_later(later);
    if (span.kind == span_kind::reordered) {
        const size_t lines = lines_of(va).size();
        rule.name = rule_name("", span.kind);
        rule.note = "the client sent the same " + std::to_string(lines) +
                    " lines in another order; a span rule cannot restore an order: keep it stable in the client "
                    "(e.g. sort its tool list)";
        return rule;
    }

    std::string shape;
    std::string placeholder;  // a constant of the same shape, for "replace"
    switch (span.kind) {
        case span_kind::uuid:
            shape = hex_class(va, vb, "-") + "{36}";
            placeholder = "00000000-0000-0000-0000-000000000000";
            break;
        case span_kind::hex_id:
            shape = hex_class(va, vb) + quantifier(va.size(), vb.size());
            placeholder = std::string(std::max(va.size(), vb.size()), '0');
            break;
        case span_kind::base64_id: {
            std::string chars = "A-Za-z0-9";
            for (const char extra : std::string_view("+/_-")) {
                if (va.find(extra) != std::string_view::npos || vb.find(extra) != std::string_view::npos)
                    chars += extra;  // '-' comes last, where a class takes it literally
            }
            shape = "[" + chars + "]" + quantifier(va.size(), vb.size());
            placeholder = std::string(std::max(va.size(), vb.size()), '0');
            break;
        }
        case span_kind::timestamp:
            shape = digit_runs_pattern(va, vb);
            break;
        case span_kind::number:
            shape = va.find('.') != std::string_view::npos || vb.find('.') != std::string_view::npos
                        ? "[0-9]+(?:\\.[0-9]+)*"
                        : "[0-9]+";
            break;
        default: {
            // Prose has no shape: the rule takes the rest of the span's line(s).
            const auto newlines = [](std::string_view s) { return std::count(s.begin(), s.end(), '\n'); };
            const auto n = std::max(newlines(va), newlines(vb));
            shape = n == 0 ? "[^\\n]*" : "[^\\n]*(?:\\n[^\\n]*){" + std::to_string(n) + "}";
            break;
        }
    }

    // The literal context anchors the pattern: in front of the value if there is one, else after it.
    const size_t ctx = context_start(earlier, span.offset);
    std::string before(earlier.substr(ctx, span.offset - ctx)), after;
    if (before.empty() && span.kind != span_kind::prose) {
        const size_t end = context_end(earlier, span.offset + span.earlier_length);
        after = earlier.substr(span.offset + span.earlier_length, end - span.offset - span.earlier_length);
    }
    if (before.empty() && after.empty() && span.kind == span_kind::prose) {
        rule.name = rule_name("", span.kind);
        rule.note = "prose with no literal context in front of it to anchor a pattern";
        return rule;
    }
    rule.name = rule_name(key_of(before.empty() ? after : before), span.kind);
    rule.pattern = escape_regex(before) + shape + escape_regex(after);
    if (is_random_id(span.kind)) {
        rule.action = "replace";
        // RE2 rewrite text: a backslash starts \0..\9, so a literal one is doubled.
        for (const char c : before + placeholder + after)
            rule.replacement += c == '\\' ? std::string("\\\\") : std::string(1, c);
        rule.note = std::string("a random ") + span_kind_description(span.kind) +
                    ": a constant in its place changes nothing the model can use";
    } else {
        rule.action = "move";
        rule.note = std::string(span_kind_description(span.kind)) +
                    ": it means something to the model, so the rule moves it after the reusable prefix";
    }
    return rule;
}

std::string suggested_rule::toml() const {
    std::string out = "# " + note + "\n";
    if (pattern.empty()) return out;
    out += "[[spans.rule]]\nname = " + toml_string(name) + "\npattern = " + toml_string(pattern) +
           "\naction = " + toml_string(action) + "\n";
    if (action == "replace") out += "replacement = " + toml_string(replacement) + "\n";
    return out;
}

std::string suggested_rule::one_line() const {
    if (pattern.empty()) return "none (" + note + ")";
    std::string out = "[[spans.rule]] name = " + toml_string(name) + ", pattern = " + toml_string(pattern) +
                      ", action = " + toml_string(action);
    if (action == "replace") out += ", replacement = " + toml_string(replacement);
    return out;
}

std::vector<size_t> message_text_offsets(const std::vector<common_chat_msg>& messages, std::string_view prompt) {
    std::vector<size_t> offsets;
    size_t cursor = 0;
    for (const common_chat_msg& m : messages) {
        std::string_view text = m.content;
        for (const auto& part : m.content_parts)
            if (text.empty()) text = part.text;
        if (text.empty()) text = m.reasoning_content;
        if (text.empty() && !m.tool_calls.empty()) text = m.tool_calls.front().arguments;
        // Templates often trim a message's text.
        while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
        while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
        if (text.empty()) {
            offsets.push_back(std::string_view::npos);
            continue;
        }
        const std::string_view needle = text.substr(0, 64);
        const size_t at = prompt.find(needle, cursor);
        if (at == std::string_view::npos) break;
        offsets.push_back(at);
        cursor = at + (prompt.compare(at, text.size(), text) == 0 ? text.size() : needle.size());
    }
    return offsets;
}

int message_index_at(const std::vector<common_chat_msg>& messages, std::string_view prompt, size_t offset) {
    int found = -1;
    const std::vector<size_t> offsets = message_text_offsets(messages, prompt);
    for (size_t i = 0; i < offsets.size(); ++i) {
        if (offsets[i] == std::string_view::npos) continue;
        if (offsets[i] > offset) break;
        found = static_cast<int>(i);
    }
    return found;
}

std::string printable(std::string_view text, size_t max_chars) {
    std::string out;
    size_t i = 0;
    for (; i < text.size() && out.size() < max_chars; ++i) {
        const char c = text[i];
        if (c == '\n') {
            out += "\\n";
        } else if (c == '\t') {
            out += "\\t";
        } else if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
        } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(c));
            out += buf;
        } else {
            out += c;
        }
    }
    // Never end inside a UTF-8 character.
    while (i < text.size() && (static_cast<unsigned char>(text[i]) & 0xc0) == 0x80 && !out.empty()) {
        out.pop_back();
        --i;
    }
    if (i < text.size()) out += "...";
    return out;
}

}  // namespace keepwarm::policy

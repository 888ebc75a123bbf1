#include "bench/report-text.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace keepwarm::report_text {

std::string fixed(double value, int decimals) {
    if (std::isnan(value)) return "-";
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.*f", decimals, value);
    return buf;
}

std::string xml_escape(const std::string& text) {
    std::string out;
    out.reserve(text.size());
    for (const char c : text) {
        switch (c) {
            case '&':
                out += "&amp;";
                break;
            case '<':
                out += "&lt;";
                break;
            case '>':
                out += "&gt;";
                break;
            case '"':
                out += "&quot;";
                break;
            default:
                out += c;
        }
    }
    return out;
}

std::string markdown_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
    std::vector<size_t> width(header.size());
    for (size_t c = 0; c < header.size(); ++c) {
        width[c] = header[c].size();
        for (const auto& row : rows) width[c] = std::max(width[c], row[c].size());
    }
    std::ostringstream out;
    const auto print_row = [&](const std::vector<std::string>& row) {
        out << "|";
        for (size_t c = 0; c < row.size(); ++c)
            out << " " << std::string(width[c] - row[c].size(), ' ') << row[c] << " |";
        out << "\n";
    };
    print_row(header);
    out << "|";
    for (const size_t w : width) out << std::string(w + 1, '-') << ":|";
    out << "\n";
    for (const auto& row : rows) print_row(row);
    return out.str();
}

}  // namespace keepwarm::report_text

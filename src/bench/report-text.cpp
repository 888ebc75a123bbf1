#include "bench/report-text.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "base/command-exit.h"

namespace keepwarm::bench::report_text {

std::vector<std::string> split_list(const std::string& text) {
    std::vector<std::string> items;
    std::string item;
    std::istringstream in(text);
    while (std::getline(in, item, ',')) items.push_back(item);
    if (!text.empty() && text.back() == ',') items.push_back("");  // getline drops a trailing empty entry
    return items;
}

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

void write_report_file(std::string_view command, const std::string& path, const std::string& text,
                       std::ostream& progress) {
    std::ofstream out(path, std::ios::binary);
    out << text;
    if (!out) fail_command(command, "cannot write '" + path + "'");
    progress << "wrote " << path << "\n";
}

}  // namespace keepwarm::bench::report_text

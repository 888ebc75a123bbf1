// Small text helpers the bench commands share: their lists on the command line, their reports (terminal tables, SVG
// charts, HTML), and how a report is written to a file.
#pragma once

#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace keepwarm::bench::report_text {

// The items of a comma-separated list ("1,2,4"), empty ones included ("4,,8" has "" second; "" has none), for the
// caller to name a bad item.
std::vector<std::string> split_list(const std::string& text);

// `value` with `decimals` digits after the point; NaN (a value that does not exist) prints as "-".
std::string fixed(double value, int decimals);

// Text made safe for an XML/HTML element or attribute value (& < > ").
std::string xml_escape(const std::string& text);

// A Markdown table with right-aligned columns padded to their widest cell; every row has header.size() cells.
std::string markdown_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows);

// Writes `text` to the file `path` and says so on `progress` ("wrote PATH"); a file that cannot be written ends the
// command named `command` with an error (base/command-exit.h).
void write_report_file(std::string_view command, const std::string& path, const std::string& text,
                       std::ostream& progress);

}  // namespace keepwarm::bench::report_text

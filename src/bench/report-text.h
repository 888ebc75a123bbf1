// Small text helpers the bench reports (terminal tables, SVG charts, HTML) share.
#pragma once

#include <string>
#include <vector>

namespace keepwarm::report_text {

// `value` with `decimals` digits after the point; NaN (a value that does not exist) prints as "-".
std::string fixed(double value, int decimals);

// Text made safe for an XML/HTML element or attribute value (& < > ").
std::string xml_escape(const std::string& text);

// A Markdown table with right-aligned columns padded to their widest cell; every row has header.size() cells.
std::string markdown_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows);

}  // namespace keepwarm::report_text

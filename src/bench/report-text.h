// Small text helpers the bench reports (terminal tables, SVG charts, HTML) share.
#pragma once

#include <string>

namespace keepwarm::report_text {

// `value` with `decimals` digits after the point; NaN (a value that does not exist) prints as "-".
std::string fixed(double value, int decimals);

// Text made safe for an XML/HTML element or attribute value (& < > ").
std::string xml_escape(const std::string& text);

}  // namespace keepwarm::report_text

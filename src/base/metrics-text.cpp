// See metrics-text.h.
#include "base/metrics-text.h"

#include <algorithm>

namespace keepwarm {

namespace {

// A label value as the format wants it: backslash, double quote and newline escaped.
void write_label_value(std::ostringstream& out, std::string_view value) {
    for (const char c : value) {
        if (c == '\\' || c == '"') {
            out << '\\' << c;
        } else if (c == '\n') {
            out << "\\n";
        } else {
            out << c;
        }
    }
}

void write_labels(std::ostringstream& out, const metrics_text::labels& l, std::string_view le = {}) {
    if (l.empty() && le.empty()) return;
    out << '{';
    bool first = true;
    for (const auto& [name, value] : l) {
        out << (first ? "" : ",") << name << "=\"";
        write_label_value(out, value);
        out << '"';
        first = false;
    }
    if (!le.empty()) out << (first ? "" : ",") << "le=\"" << le << '"';
    out << '}';
}

}  // namespace

void metrics_text::family(std::string_view name, std::string_view type, std::string_view help) {
    out_ << "# HELP " << name << ' ' << help << '\n' << "# TYPE " << name << ' ' << type << '\n';
}

void metrics_text::sample(std::string_view name, double value, const labels& l) {
    out_ << name;
    write_labels(out_, l);
    out_ << ' ' << value << '\n';
}

void metrics_text::counter(std::string_view name, std::string_view help, double value) {
    family(name, "counter", help);
    sample(name, value);
}

void metrics_text::gauge(std::string_view name, std::string_view help, double value) {
    family(name, "gauge", help);
    sample(name, value);
}

void metrics_text::histogram(std::string_view name, const latency_histogram& h, const labels& l) {
    const auto counts = h.cumulative();
    const std::string bucket = std::string(name) + "_bucket";
    for (size_t i = 0; i < counts.size(); i++) {
        std::ostringstream le;
        if (i < h.bounds().size()) {
            le << h.bounds()[i];
        } else {
            le << "+Inf";
        }
        out_ << bucket;
        write_labels(out_, l, le.str());
        out_ << ' ' << counts[i] << '\n';
    }
    sample(std::string(name) + "_sum", h.sum_seconds(), l);
    sample(std::string(name) + "_count", static_cast<double>(h.count()), l);
}

}  // namespace keepwarm

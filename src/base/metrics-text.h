// The Prometheus text exposition format (0.0.4) that `keepwarm serve` and `keepwarm proxy` answer on GET /metrics:
// metric families, each with its HELP and TYPE once and then its samples, labels escaped; histograms from
// base/latency-histogram.h. Not thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/latency-histogram.h"

namespace keepwarm {

class metrics_text {
public:
    using labels = std::vector<std::pair<std::string, std::string>>;

    metrics_text() { out_.precision(12); }

    // A family's HELP and TYPE lines; its samples follow with sample() (or histogram()).
    void family(std::string_view name, std::string_view type, std::string_view help);
    void sample(std::string_view name, double value, const labels& l = {});
    // A family with one sample without labels.
    void counter(std::string_view name, std::string_view help, double value);
    void gauge(std::string_view name, std::string_view help, double value);
    // One labelled series of a histogram family (declared with family(name, "histogram", ...)): its _bucket lines,
    // _sum and _count.
    void histogram(std::string_view name, const latency_histogram& h, const labels& l = {});

    std::string str() const { return out_.str(); }

private:
    std::ostringstream out_;
};

}  // namespace keepwarm

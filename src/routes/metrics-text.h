// The Prometheus text exposition format (0.0.4) that `keepwarm serve` and `keepwarm proxy` answer on GET /metrics:
// metric families, each with its HELP and TYPE once and then its samples, labels escaped; and latency_histogram,
// the bucket counts of a Prometheus histogram, so that a scraper can take the difference of two scrapes (a
// benchmark leaves out its warm-up that way) where a window of recent samples could not.
// Threading: neither class is thread-safe; the owner of a histogram guards it.
#pragma once

#include <array>
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace keepwarm {

// Counts of observed durations in buckets, cumulative as Prometheus has them. The bounds suit latencies from tens
// of microseconds to a second: the proxy's own share of a request is in the first few, a stall shows in the rest.
class latency_histogram {
public:
    static constexpr std::array<double, 16> bounds_seconds = {0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015,
                                                              0.002,  0.003,   0.005,  0.0075,  0.01,  0.025,
                                                              0.05,   0.1,     0.25,   1.0};
    void record(double seconds);
    // Observations <= bounds_seconds[i] (the last entry, +Inf, is every observation).
    std::array<uint64_t, bounds_seconds.size() + 1> cumulative() const;
    uint64_t count() const { return count_; }
    double sum_seconds() const { return sum_; }

private:
    std::array<uint64_t, bounds_seconds.size() + 1> buckets_{};  // per bucket, not cumulative; the last is > 1 s
    uint64_t count_ = 0;
    double sum_ = 0;
};

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

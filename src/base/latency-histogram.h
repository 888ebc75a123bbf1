// latency_histogram: the bucket counts of a Prometheus histogram, so that a scraper can take the difference of two
// scrapes (a benchmark leaves out its warm-up that way) where a window of recent samples could not. Written out by
// base/metrics-text.h. Not thread-safe: the owner guards it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace keepwarm {

// Counts of observed durations in buckets, cumulative as Prometheus has them.
class latency_histogram {
public:
    // From tens of microseconds to a second: the proxy's own share of a request is in the first few, a stall shows
    // in the rest.
    static constexpr std::array<double, 16> fine_bounds_seconds = {0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015,
                                                                   0.002,  0.003,   0.005,  0.0075,  0.01,  0.025,
                                                                   0.05,   0.1,     0.25,   1.0};
    // From ten milliseconds to ten minutes: a request's wait for a slot and its time to first token, from a warm
    // turn on a GPU to a cold 100K-token prompt on a CPU.
    static constexpr std::array<double, 16> request_bounds_seconds = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,   2.5,
                                                                      5,    10,    20,   30,  60,   120, 300, 600};

    latency_histogram() : latency_histogram(fine_bounds_seconds) {}
    template <size_t N>
    explicit latency_histogram(const std::array<double, N>& bounds)
        : bounds_(bounds.begin(), bounds.end()), buckets_(N + 1) {}

    void record(double seconds);
    const std::vector<double>& bounds() const { return bounds_; }
    // Observations <= bounds()[i] (the last entry, +Inf, is every observation).
    std::vector<uint64_t> cumulative() const;
    uint64_t count() const { return count_; }
    double sum_seconds() const { return sum_; }

private:
    std::vector<double> bounds_;
    std::vector<uint64_t> buckets_;  // per bucket, not cumulative; the last is above every bound
    uint64_t count_ = 0;
    double sum_ = 0;
};

}  // namespace keepwarm

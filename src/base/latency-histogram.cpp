// See latency-histogram.h.
#include "base/latency-histogram.h"

#include <algorithm>

namespace keepwarm {

void latency_histogram::record(double seconds) {
    const auto it = std::lower_bound(bounds_.begin(), bounds_.end(), seconds);
    buckets_[static_cast<size_t>(it - bounds_.begin())]++;
    count_++;
    sum_ += seconds;
}

std::vector<uint64_t> latency_histogram::cumulative() const {
    std::vector<uint64_t> out(buckets_.size());
    uint64_t running = 0;
    for (size_t i = 0; i < out.size(); i++) out[i] = running += buckets_[i];
    return out;
}

}  // namespace keepwarm

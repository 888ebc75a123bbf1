// The grammars whose checks already took too long for one token: a request that brings one again is refused before
// it reaches the engine thread. The first such request costs the engine one token's sampling (up to --max-sample-ms
// and the pass in progress); a client that loops on it costs nothing more (a looping client's 1,000-value enum cut
// another tenant's throughput from 1,079 to 13 requests in 30 s when each try was sampled).
// Threading: any thread (one mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string_view>
#include <unordered_map>

namespace keepwarm {

class costly_grammars {
public:
    explicit costly_grammars(size_t capacity = 1024) : capacity_(capacity) {}

    // `grammar` (its text) took `ms` to sample one token. The oldest is forgotten past the capacity.
    void remember(std::string_view grammar, double ms);
    // What one token took under `grammar`, if it was too long before.
    std::optional<double> cost_of(std::string_view grammar) const;

private:
    const size_t capacity_;
    mutable std::mutex mu_;
    std::unordered_map<uint64_t, double> ms_by_hash_;  // guarded by mu_
    std::deque<uint64_t> order_;                       // guarded by mu_: oldest first
};

}  // namespace keepwarm

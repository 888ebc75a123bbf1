// The grammars whose checks already took too long for one token: a request that brings one again within `memory`
// (10 minutes) is refused before it reaches the engine thread. The first such request costs the engine one token's
// sampling (up to --max-sample-ms); a client that loops on it costs nothing more (a looping client's 1,000-value
// enum cut another tenant's throughput from 1,079 to 13 requests in 30 s when each try was sampled). Forgotten after
// `memory`, so a grammar that passed the limit only while the machine was busy is not refused for good.
// Threading: any thread (one mutex).
#pragma once

#include <chrono>
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
    using clock = std::chrono::steady_clock;
    explicit costly_grammars(size_t capacity = 1024, clock::duration memory = std::chrono::minutes(10))
        : capacity_(capacity), memory_(memory) {}

    // `grammar` (its text) took `ms` to sample one token. The oldest is forgotten past the capacity.
    void remember(std::string_view grammar, double ms);
    // What one token took under `grammar`, if it was too long within `memory` before `now`.
    std::optional<double> cost_of(std::string_view grammar, clock::time_point now = clock::now()) const;

private:
    struct cost {
        double ms;
        clock::time_point at;
    };
    const size_t capacity_;
    const clock::duration memory_;
    mutable std::mutex mu_;
    std::unordered_map<uint64_t, cost> by_hash_;  // guarded by mu_
    std::deque<uint64_t> order_;                  // guarded by mu_: oldest first
};

}  // namespace keepwarm

// See costly-grammars.h.
#include "engine/costly-grammars.h"

#include <xxhash.h>

namespace keepwarm {

namespace {
uint64_t hash_of(std::string_view grammar) {
    return XXH3_64bits(grammar.data(), grammar.size());
}
}  // namespace

void costly_grammars::remember(std::string_view grammar, double ms) {
    const uint64_t h = hash_of(grammar);
    std::lock_guard lock(mu_);
    if (auto [it, added] = by_hash_.try_emplace(h, cost{ms, clock::now()}); !added) {
        it->second = {ms, clock::now()};
        return;
    }
    order_.push_back(h);
    while (order_.size() > capacity_) {
        by_hash_.erase(order_.front());
        order_.pop_front();
    }
}

std::optional<double> costly_grammars::cost_of(std::string_view grammar, clock::time_point now) const {
    const uint64_t h = hash_of(grammar);
    std::lock_guard lock(mu_);
    const auto it = by_hash_.find(h);
    if (it == by_hash_.end() || now - it->second.at >= memory_) return std::nullopt;
    return it->second.ms;
}

}  // namespace keepwarm

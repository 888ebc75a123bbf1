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
    if (auto [it, added] = ms_by_hash_.try_emplace(h, ms); !added) {
        it->second = ms;
        return;
    }
    order_.push_back(h);
    while (order_.size() > capacity_) {
        ms_by_hash_.erase(order_.front());
        order_.pop_front();
    }
}

std::optional<double> costly_grammars::cost_of(std::string_view grammar) const {
    const uint64_t h = hash_of(grammar);
    std::lock_guard lock(mu_);
    const auto it = ms_by_hash_.find(h);
    if (it == ms_by_hash_.end()) return std::nullopt;
    return it->second;
}

}  // namespace keepwarm

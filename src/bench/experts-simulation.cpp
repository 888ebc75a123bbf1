// See experts-simulation.h. Each layer is simulated on its own: an LRU list of resident experts and, for the gate,
// the times of each expert's recent uses; the stats of all layers are summed.
#include "bench/experts-simulation.h"

#include <algorithm>
#include <deque>
#include <list>
#include <sstream>
#include <stdexcept>

#include "bench/report-text.h"

namespace keepwarm::bench {

namespace {

// Per-layer state of the simulated cache: an LRU list of resident experts and, for the gate, recent use times.
class layer_cache {
public:
    layer_cache(uint32_t n_expert, uint32_t slots, const expert_cache_policy& policy)
        : slots_(slots), policy_(policy), where_(n_expert), resident_(n_expert, false), recent_uses_(n_expert) {}

    void access(int32_t expert, uint64_t token, uint64_t expert_bytes, expert_cache_stats& stats) {
        ++stats.lookups;
        if (policy_.gated()) note_use(expert, token);
        if (resident_[expert]) {
            ++stats.hits;
            lru_.splice(lru_.begin(), lru_, where_[expert]);
            return;
        }
        stats.bytes_moved += expert_bytes;
        if (policy_.gated() && recent_uses_[expert].size() < policy_.admit_k) {
            ++stats.streamed;
            return;
        }
        ++stats.fills;
        if (lru_.size() == slots_) {
            resident_[lru_.back()] = false;
            lru_.pop_back();
            ++stats.evictions;
        }
        lru_.push_front(expert);
        where_[expert] = lru_.begin();
        resident_[expert] = true;
    }

private:
    // Keeps the uses within the last admit_window tokens, the current one included.
    void note_use(int32_t expert, uint64_t token) {
        std::deque<uint64_t>& uses = recent_uses_[expert];
        uses.push_back(token);
        while (uses.front() + policy_.admit_window <= token) uses.pop_front();
    }

    uint32_t slots_;
    expert_cache_policy policy_;
    std::list<int32_t> lru_;  // most recently used first
    std::vector<std::list<int32_t>::iterator> where_;
    std::vector<bool> resident_;
    std::vector<std::deque<uint64_t>> recent_uses_;
};

}  // namespace

expert_cache_stats simulate_expert_cache(const expert_trace& trace, uint32_t slots, const expert_cache_policy& policy) {
    if (slots == 0) throw std::invalid_argument("an expert cache needs at least 1 slot");
    if (policy.admit_k == 0 || policy.admit_window < policy.admit_k) {
        throw std::invalid_argument("admission needs 1 <= k <= window (k " + std::to_string(policy.admit_k) +
                                    ", window " + std::to_string(policy.admit_window) + ")");
    }
    expert_cache_stats stats;
    stats.slots = slots;
    for (const auto& layer : trace.layers) {
        layer_cache cache(trace.n_expert, slots, policy);
        for (uint64_t i = 0; i < layer.ids.size(); ++i) {
            cache.access(layer.ids[i], i / trace.n_expert_used, layer.expert_bytes, stats);
        }
    }
    return stats;
}

experts_bench_report simulate_expert_caches(const expert_trace& trace, const std::vector<uint32_t>& slots,
                                            const expert_cache_policy& admission) {
    experts_bench_report report;
    report.model_path = trace.model_path;
    report.model_desc = trace.model_desc;
    report.n_expert = trace.n_expert;
    report.n_expert_used = trace.n_expert_used;
    report.n_moe_layers = uint32_t(trace.layers.size());
    report.n_prompt_tokens = trace.n_prompt_tokens;
    report.n_generated_tokens = trace.n_generated_tokens;
    for (const auto& layer : trace.layers) report.bytes_per_token_uncached += layer.expert_bytes * trace.n_expert_used;
    report.admission = admission;
    report.slots = slots;
    for (const uint32_t s : slots) {
        report.lru.push_back(simulate_expert_cache(trace, s, expert_cache_policy{}));
        report.gated.push_back(simulate_expert_cache(trace, s, admission));
    }
    return report;
}

std::vector<uint32_t> parse_slot_list(const std::string& text) {
    std::vector<uint32_t> slots;
    for (const std::string& item : report_text::split_list(text)) {
        const bool digits = !item.empty() && item.size() <= 6 &&
                            std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; });
        const unsigned long value = digits ? std::stoul(item) : 0;
        if (value == 0) {
            throw std::invalid_argument("bad slot count '" + item +
                                        "': expected a comma-separated list of expert slots per layer, e.g. 8,16,32");
        }
        slots.push_back(uint32_t(value));
    }
    if (slots.empty()) throw std::invalid_argument("no slot counts given: expected e.g. 8,16,32");
    return slots;
}

std::vector<uint32_t> default_slot_list(uint32_t n_expert, uint32_t n_expert_used) {
    std::vector<uint32_t> slots = {n_expert_used, n_expert};
    for (uint32_t s = 1; s < n_expert; s *= 2) slots.push_back(s);
    std::sort(slots.begin(), slots.end());
    slots.erase(std::unique(slots.begin(), slots.end()), slots.end());
    return slots;
}

}  // namespace keepwarm::bench

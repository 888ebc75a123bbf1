// `bench experts`' simulation: replays a routing trace through a per-layer GPU expert cache of S slots, as plain LRU
// or LRU behind an admission gate, and sweeps a list of slot counts under both policies. Pure functions over a
// trace: the same trace always gives the same numbers.
// Threading: pure functions and plain data; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/experts-trace.h"

namespace keepwarm::bench {

// admission: an expert missing from the cache is uploaded into a slot only once it has been used by at least
// admit_k of the last admit_window tokens (the current one included); before that it is streamed for this use only.
// admit_k = 1 is plain LRU.
struct expert_cache_policy {
    uint32_t admit_k = 1;
    uint32_t admit_window = 1;

    bool gated() const { return admit_k > 1; }
};

// One policy at one cache size, summed over all MoE layers (each layer has its own S slots).
struct expert_cache_stats {
    uint32_t slots = 0;
    uint64_t lookups = 0;  // tokens x experts used x layers
    uint64_t hits = 0;
    uint64_t fills = 0;     // misses uploaded into a slot
    uint64_t streamed = 0;  // misses the gate did not admit: uploaded for one use, not kept
    uint64_t evictions = 0;
    uint64_t bytes_moved = 0;  // expert weights copied to the device by fills and streams

    uint64_t uploads() const { return fills + streamed; }
    double hit_rate() const { return lookups ? double(hits) / double(lookups) : 0; }
};

// Replays the trace, which must be valid (see validate_expert_trace; read_expert_trace and record_expert_trace return
// only valid ones), through one LRU cache of `slots` experts per layer. Throws std::invalid_argument for 0 slots or a
// gate that can never admit (k of 0, or k above the window).
expert_cache_stats simulate_expert_cache(const expert_trace& trace, uint32_t slots, const expert_cache_policy& policy);

// A sweep: the trace's shape, and each slot count under plain LRU and under the admission gate.
struct experts_bench_report {
    std::string model_path;
    std::string model_desc;
    uint32_t n_expert = 0;
    uint32_t n_expert_used = 0;
    uint32_t n_moe_layers = 0;
    uint64_t n_prompt_tokens = 0;
    uint64_t n_generated_tokens = 0;
    uint64_t bytes_per_token_uncached = 0;  // every expert every token uses, uploaded
    expert_cache_policy admission;
    std::vector<uint32_t> slots;
    std::vector<expert_cache_stats> lru;    // one per slots entry
    std::vector<expert_cache_stats> gated;  // one per slots entry, with `admission`

    uint64_t n_tokens() const { return n_prompt_tokens + n_generated_tokens; }
};

experts_bench_report simulate_expert_caches(const expert_trace& trace, const std::vector<uint32_t>& slots,
                                            const expert_cache_policy& admission);

// The slot counts a sweep covers. "1,2,4,8" -> sizes; throws std::invalid_argument naming the bad entry (0, "x", "").
std::vector<uint32_t> parse_slot_list(const std::string& text);
// Powers of two up to n_expert, plus n_expert_used and n_expert themselves.
std::vector<uint32_t> default_slot_list(uint32_t n_expert, uint32_t n_expert_used);

}  // namespace keepwarm::bench

// `keepwarm bench experts`: records which experts each MoE layer routes every token to over a workload, then
// simulates a per-layer GPU expert cache of S slots (plain LRU, and LRU behind an admission gate) to show how many
// slots a model and its traffic need. Recording needs libllama; the simulation is a pure function over a trace.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace keepwarm {

// The router's choices in one MoE layer: for each token in workload order, its n_expert_used expert ids.
struct expert_layer_trace {
    int layer = 0;              // block index in the model (dense blocks of a mixed model have no trace)
    uint64_t expert_bytes = 0;  // weights of one expert in this layer: its slice of every ffn_*_exps tensor
    std::vector<int32_t> ids;   // token-major: ids[token * n_expert_used + k]
};

struct expert_trace {
    std::string model_path;
    std::string model_desc;
    uint32_t n_expert = 0;
    uint32_t n_expert_used = 0;
    uint64_t n_prompt_tokens = 0;
    uint64_t n_generated_tokens = 0;
    std::vector<expert_layer_trace> layers;

    uint64_t n_tokens() const { return n_prompt_tokens + n_generated_tokens; }
};

// Throws std::invalid_argument naming the first inconsistency: a layer whose id count is not tokens x experts
// used, an id outside [0, n_expert), an expert used twice by one token.
void validate_expert_trace(const expert_trace& trace);

// The trace file: JSON when the path ends in ".json", otherwise a compact binary form (16-bit ids). Both validate
// the trace (std::invalid_argument when writing); read_expert_trace tells the forms apart by content and throws
// std::runtime_error for a file that can't be read or holds a bad trace, as write does for an unwritable path.
void write_expert_trace(const expert_trace& trace, const std::string& path);
expert_trace read_expert_trace(const std::string& path);

struct expert_record_options {
    std::string model_path;
    std::string prompt_text;  // empty: the built-in mixed workload
    int n_gen = 64;           // tokens decoded greedily after the prompt (fewer if the model ends its answer)
    int threads = 0;          // 0: common_cpu_get_num_math()
};

// Mixed text (prose, code, JSON, a tool call, a table, other languages) for when no prompt file is given.
const std::string& builtin_expert_workload();

// Prefills the prompt then decodes greedily, capturing the router's top-k output (`ffn_moe_topk-<layer>`) through
// libllama's eval callback. Throws std::runtime_error for a model that can't be loaded or has no experts.
expert_trace record_expert_trace(const expert_record_options& options, std::ostream& progress);

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

// Replays the trace through one LRU cache of `slots` experts per layer. Pure: same trace, same numbers.
expert_cache_stats simulate_expert_cache(const expert_trace& trace, uint32_t slots, const expert_cache_policy& policy);

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

// "1,2,4,8" -> sizes; throws std::invalid_argument naming the bad entry (0, "x", "").
std::vector<uint32_t> parse_slot_list(const std::string& text);
// Powers of two up to n_expert, plus n_expert_used and n_expert themselves.
std::vector<uint32_t> default_slot_list(uint32_t n_expert, uint32_t n_expert_used);

std::string format_experts_table(const experts_bench_report& report);
std::string format_experts_json(const experts_bench_report& report);
std::string format_experts_svg(const experts_bench_report& report);

// Registers `experts` under `keepwarm bench`.
void add_experts_bench_command(CLI::App& bench);

}  // namespace keepwarm

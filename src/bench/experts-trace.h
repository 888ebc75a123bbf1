// `bench experts`' routing trace: which experts each MoE layer's router chose for every token of a workload, and its
// file in two forms (JSON when the path ends in ".json", otherwise a compact binary form with 16-bit ids). A trace
// file is input: reading one validates everything in it and reports a bad file as an error, never a crash.
// Threading: pure functions and plain data; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace keepwarm::bench {

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

// Both validate the trace (std::invalid_argument when writing); read_expert_trace tells the two forms apart by
// content and throws std::runtime_error for a file that can't be read or holds a bad trace, as write does for an
// unwritable path.
void write_expert_trace(const expert_trace& trace, const std::string& path);
expert_trace read_expert_trace(const std::string& path);

}  // namespace keepwarm::bench

// Recording `bench experts`' routing trace: runs a workload through an MoE model with libllama (prefill, then greedy
// decode) and captures, through the eval callback, the expert ids the router of every MoE layer picks per token.
// Threading: record_expert_trace runs on the calling thread, which libllama also calls the capture back on; each call
// loads its own model and context, so calls share nothing.
#pragma once

#include <iosfwd>
#include <string>

#include "bench/experts-trace.h"

namespace keepwarm::bench {

struct expert_record_options {
    std::string model_path;
    std::string prompt_text;  // empty: the built-in mixed workload
    int n_gen = 64;           // tokens decoded greedily after the prompt (fewer if the model ends its answer)
    int threads = 0;          // 0: common_cpu_get_num_math()
};

// Mixed text (prose, code, JSON, a tool call, a table, other languages) for when no prompt file is given.
const std::string& builtin_expert_workload();

// Prefills the prompt then decodes greedily, capturing the router's top-k output (`ffn_moe_topk-<layer>`) through
// libllama's eval callback, and returns the validated trace; progress lines go to `progress`. Throws
// std::runtime_error for a model that can't be loaded or has no experts.
expert_trace record_expert_trace(const expert_record_options& options, std::ostream& progress);

}  // namespace keepwarm::bench

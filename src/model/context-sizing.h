// The context a server gets when its operator names none (`serve` without -c, or -c 0 as in llama-server): sized
// from the model's trained context and the memory the machine has, so that an agent's first request fits. Every
// agent client sends 7K-13K tokens of instructions and tools before its user types a word, and a conversation grows
// from there: a slot under 32K tokens turns them away. Pure: the caller reads the machine (free memory) and the
// model's header (inspect_model); callable from any thread.
#pragma once

#include <cstdint>
#include <string>

#include "model/model-inspect.h"

namespace keepwarm {

// A slot this large serves agents: their first request and a long conversation after it.
inline constexpr int agent_slot_tokens = 32768;
// The largest slot chosen on its own (-c goes further): 128K covers the context agents compact at, and a longer
// trained context (256K, 1M) would ask for memory most machines lack.
inline constexpr int largest_default_slot_tokens = 131072;
// The smallest slot chosen when memory is short.
inline constexpr int smallest_default_slot_tokens = 4096;

struct context_sizing_input {
    uint32_t trained_tokens = 0;  // the model's trained context (0: unknown)
    int slots = 1;                // --parallel
    // Memory the KV cache and recurrent states may take: free memory where the model runs (the GPU's when its
    // layers are offloaded, the host's otherwise) less the weights and, on the host, the RAM tier's budget.
    uint64_t memory_for_cache = 0;
    // Bytes one more KV cell costs (every attention layer), and per sequence (recurrent states), for the chosen
    // cache types.
    uint64_t bytes_per_cell = 0;
    uint64_t bytes_per_sequence = 0;
    int sequences = 1;  // recurrent states held at once (slots, parked conversations, scratch)
};

struct context_choice {
    int slot_tokens = 0;
    int context_size = 0;  // slot_tokens * slots
    uint64_t cache_bytes = 0;
    // For the banner, e.g. "auto: the model's trained 40960 tokens per slot; -c sets another".
    std::string why;
};

// Slots of the trained context (at most largest_default_slot_tokens) when they fit in three quarters of
// memory_for_cache; else halved while above agent_slot_tokens; else the largest multiple of 1,024 tokens that fits
// (at least smallest_default_slot_tokens, and then `why` says memory is short). Never more than the trained context.
// memory_for_cache 0 (unknown): agent_slot_tokens.
context_choice choose_default_context(const context_sizing_input& in);

// The input above for `report`'s model served with these cache types and sequences, given the free memory where it
// runs and what else takes it there (weights, the RAM tier).
context_sizing_input sizing_input_for(const model_report& report, ggml_type type_k, ggml_type type_v, int slots,
                                      int sequences, uint64_t free_memory, uint64_t reserved);

// `in` with a draft model served beside the model (serve -md) in the same memory: its weights come out of the memory
// for the cache, and each cell of the context costs the draft context's cell too, with the draft's cache types (the
// draft context holds as many tokens as the model's: llama.cpp sizes it so).
context_sizing_input with_draft_model(context_sizing_input in, const model_report& draft, ggml_type type_k,
                                      ggml_type type_v);

// `in` with the model's MTP heads drafting (serve --spec-type draft-mtp): each cell of the context costs the MTP
// context's cell too (llama.cpp gives it as many cells as the model's context, in the heads' layers alone).
context_sizing_input with_mtp_heads(context_sizing_input in, const model_report& report, ggml_type type_k,
                                    ggml_type type_v);

// MemAvailable of /proc/meminfo (0 when it cannot be read).
uint64_t host_available_memory();

}  // namespace keepwarm

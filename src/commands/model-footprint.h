// What one model of a router (`keepwarm serve --models-dir`) takes at most once its server is loaded, for
// --models-memory: its weights (the file, as mapped), the KV cache and recurrent states of the context and slots its
// server is given, the RAM tier its server may fill, and a draft model's weights and KV (-md). Computed from the GGUF's
// header (inspect_model, no weights read) once at start-up. A server given no context size (-c 0) sizes its own from
// free memory at load; its footprint counts the most that sizing can choose: the model's trained context per slot, at
// most 131072 tokens. Threading: pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <string>

#include "commands/cache-budget-option.h"
#include "model/model-inspect.h"
#include "router/model-set.h"

namespace keepwarm {

// The serve options a model's server gets that size its memory: the router's own, then its [models.NAME] table's.
struct footprint_settings {
    uint64_t context_size = 0;  // -c: KV cells of every slot together; 0: sized by the server from free memory
    int slots = 2;              // --parallel
    int parked = 8;             // --cache-parked: recurrent states held besides the slots
    std::string cache_type_k = "f16";
    std::string cache_type_v = "f16";
    cache_budget cache_ram = uint64_t{4} << 30;  // --cache-ram; nullopt: -1, half of the machine's memory
    std::string draft_model;                     // -md (empty: none, or --spec-type none)
    std::string cache_type_k_draft = "f16";      // -ctkd
    std::string cache_type_v_draft = "f16";      // -ctvd
    bool mtp_heads = false;                      // --spec-type draft-mtp: an MTP context beside the model's
};

struct model_footprint {
    uint64_t weight_bytes = 0;     // the file's size
    uint64_t kv_bytes = 0;         // KV cells of the whole context + recurrent states
    uint64_t cache_ram_bytes = 0;  // its RAM tier
    uint64_t draft_bytes = 0;      // a draft model's weights and the KV of its context (as many cells as the model's)
    uint64_t mtp_bytes = 0;        // the MTP context's KV (--spec-type draft-mtp: as many cells as the model's)
    uint64_t context_size = 0;     // the context counted (every slot's)
    bool auto_context = false;     // -c 0: context_size is the most the server's own sizing can choose
    uint64_t total() const { return weight_bytes + kv_bytes + cache_ram_bytes + draft_bytes + mtp_bytes; }
};

// `base` with `m`'s table options (ctx-size, parallel, cache-parked, cache-type-k/v, cache-ram, spec-draft-model,
// spec-draft-type-k/v, spec-type none or draft-mtp) over it. Throws std::invalid_argument naming the model when one of
// them is not a number or a cache type serve takes.
footprint_settings footprint_settings_for(const footprint_settings& base, const router::model_entry& m);

// The footprint of `report`'s model served with `s`, and `draft`'s (s.draft_model's header) beside it when given.
// Throws std::invalid_argument for an unknown cache type.
model_footprint compute_footprint(const model_report& report, const footprint_settings& s,
                                  const model_report* draft = nullptr);

// The cache type `name` (f32, f16, bf16, q8_0, q4_0) as ggml's; throws std::invalid_argument naming `option`.
ggml_type parse_cache_type(const std::string& name, const std::string& option);

// "4.2 GiB (weights 1.1 GiB + KV 3.0 GiB for 65536 tokens + RAM tier 0 B)", for the banner; "+ draft model ..." when
// one is counted.
std::string describe_footprint(const model_footprint& f);

}  // namespace keepwarm

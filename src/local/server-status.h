// llama-server's GET /slots and GET /props bodies from what `keepwarm serve` knows: the engine's published slot
// states, its options and the model. Pure builders; the routes (local/local-status-routes) gather their inputs.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "sampling.h"

namespace keepwarm {

// GET /slots: one object per slot in llama-server's shape (id, n_ctx, speculative, is_processing; once the slot has
// served a request, n_prompt_tokens, n_prompt_tokens_processed (computed so far: prefill progress),
// n_prompt_tokens_cache (reused from the prefix cache) and next_token), plus keepwarm's own: state ("idle",
// "processing_prompt", "generating"), n_tokens_cached (the tokens whose KV the slot's sequence holds: what the next
// request can reuse in place), last_used (unix seconds) and request_id. Never prompt text. `viewer_tenant`: the
// tenant asking; a slot holding another tenant's tokens shows its numbers but not its request id.
nlohmann::ordered_json slots_json(const std::vector<slot_status>& slots, int slot_context_size,
                                  const std::string& viewer_tenant);

// What GET /props reports: only what holds for keepwarm.
struct server_props {
    int slot_context_size = 0;  // default_generation_settings.n_ctx: what one request may use
    int total_slots = 0;
    std::string model_alias;  // the served model's name (/v1/models)
    std::string model_path;
    std::string chat_template;  // the template requests are rendered with
    std::string bos_token, eos_token;
    std::string build_info;
    int default_max_tokens = -1;      // what a request that names no limit may generate
    common_params_sampling sampling;  // what a request that sets nothing samples with
};

// GET /props in llama-server's shape: default_generation_settings (n_ctx and params), total_slots, model_alias,
// model_path, modalities (all false: keepwarm takes text only), chat_template, bos_token, eos_token, build_info,
// endpoint_slots, endpoint_props (false: no POST /props), endpoint_metrics, is_sleeping (false: never).
nlohmann::ordered_json props_json(const server_props& props);

}  // namespace keepwarm

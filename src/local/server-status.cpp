// See server-status.h.
#include "local/server-status.h"

#include <chrono>

namespace keepwarm {

namespace {
using json = nlohmann::ordered_json;

const char* slot_state(const slot_status& s) {
    if (!s.busy) return "idle";
    return s.prompt_done < s.prompt_tokens ? "processing_prompt" : "generating";
}

// The sampling settings of llama-server's /props params (its task_params::to_json with only_metrics), where
// keepwarm has them.
json sampling_json(const common_params_sampling& s, int n_predict) {
    json samplers = json::array();
    for (const common_sampler_type type : s.samplers) samplers.push_back(common_sampler_type_to_str(type));
    return {{"n_predict", n_predict},
            {"max_tokens", n_predict},
            {"seed", s.seed},
            {"temperature", s.temp},
            {"dynatemp_range", s.dynatemp_range},
            {"dynatemp_exponent", s.dynatemp_exponent},
            {"top_k", s.top_k},
            {"top_p", s.top_p},
            {"min_p", s.min_p},
            {"top_n_sigma", s.top_n_sigma},
            {"xtc_probability", s.xtc_probability},
            {"xtc_threshold", s.xtc_threshold},
            {"typical_p", s.typ_p},
            {"repeat_last_n", s.penalty_last_n},
            {"repeat_penalty", s.penalty_repeat},
            {"presence_penalty", s.penalty_present},
            {"frequency_penalty", s.penalty_freq},
            {"dry_multiplier", s.dry_multiplier},
            {"dry_base", s.dry_base},
            {"dry_allowed_length", s.dry_allowed_length},
            {"dry_penalty_last_n", s.dry_penalty_last_n},
            {"mirostat", s.mirostat},
            {"mirostat_tau", s.mirostat_tau},
            {"mirostat_eta", s.mirostat_eta},
            {"ignore_eos", s.ignore_eos},
            {"min_keep", s.min_keep},
            {"samplers", samplers}};
}

}  // namespace

json slots_json(const std::vector<slot_status>& slots, int slot_context_size, const std::string& viewer_tenant) {
    json out = json::array();
    for (const slot_status& s : slots) {
        json slot = {{"id", s.id},
                     {"n_ctx", slot_context_size},
                     {"speculative", false},
                     {"is_processing", s.busy},
                     {"state", slot_state(s)},
                     {"n_tokens_cached", s.cached_tokens}};
        const bool served = s.last_used != std::chrono::system_clock::time_point{};
        if (served) {
            slot["n_prompt_tokens"] = s.prompt_tokens;
            slot["n_prompt_tokens_processed"] = s.prompt_done - s.prompt_reused;
            slot["n_prompt_tokens_cache"] = s.prompt_reused;
            slot["next_token"] = json::array({{{"has_next_token", s.busy}, {"n_decoded", s.generated}}});
            slot["last_used"] =
                std::chrono::duration_cast<std::chrono::seconds>(s.last_used.time_since_epoch()).count();
            if (!s.request_id.empty() && s.tenant == viewer_tenant) slot["request_id"] = s.request_id;
        }
        out.push_back(std::move(slot));
    }
    return out;
}

json props_json(const server_props& p) {
    return {{"default_generation_settings",
             {{"n_ctx", p.slot_context_size}, {"params", sampling_json(p.sampling, p.default_max_tokens)}}},
            {"total_slots", p.total_slots},
            {"model_alias", p.model_alias},
            {"model_path", p.model_path},
            {"modalities", {{"vision", false}, {"video", false}, {"audio", false}}},
            {"chat_template", p.chat_template},
            {"bos_token", p.bos_token},
            {"eos_token", p.eos_token},
            {"build_info", p.build_info},
            {"endpoint_slots", true},
            {"endpoint_props", false},
            {"endpoint_metrics", true},
            {"is_sleeping", false}};
}

}  // namespace keepwarm

// See model-footprint.h.
#include "commands/model-footprint.h"

#include <charconv>
#include <limits>
#include <map>
#include <stdexcept>

#include "model/context-sizing.h"

namespace keepwarm {

namespace {

uint64_t whole_number(const std::string& text, const std::string& what, uint64_t most) {
    uint64_t value = 0;
    const auto parsed = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || parsed.ec != std::errc() || parsed.ptr != text.data() + text.size() || value > most) {
        throw std::invalid_argument(what + " '" + text + "' is not a whole number up to " + std::to_string(most));
    }
    return value;
}

}  // namespace

ggml_type parse_cache_type(const std::string& name, const std::string& option) {
    static const std::map<std::string, ggml_type> types = {
        {"f32", GGML_TYPE_F32},   {"f16", GGML_TYPE_F16},   {"bf16", GGML_TYPE_BF16},
        {"q8_0", GGML_TYPE_Q8_0}, {"q4_0", GGML_TYPE_Q4_0},
    };
    const auto it = types.find(name);
    if (it == types.end()) {
        throw std::invalid_argument(option + " '" + name + "' is not one of f32, f16, bf16, q8_0, q4_0");
    }
    return it->second;
}

footprint_settings footprint_settings_for(const footprint_settings& base, const router::model_entry& m) {
    footprint_settings s = base;
    for (const auto& [key, values] : m.options) {
        if (values.size() != 1) continue;
        const std::string& v = values.front();
        const std::string what = "model " + m.name + "'s " + key;
        if (key == "ctx-size") {
            s.context_size = whole_number(v, what, uint64_t{1} << 40);
        } else if (key == "parallel") {
            s.slots = static_cast<int>(whole_number(v, what, 256));
        } else if (key == "cache-parked") {
            s.parked = static_cast<int>(whole_number(v, what, 240));
        } else if (key == "cache-type-k") {
            s.cache_type_k = v;
        } else if (key == "cache-type-v") {
            s.cache_type_v = v;
        } else if (key == "cache-ram") {
            s.cache_ram = parse_cache_budget(v, "model " + m.name + "'s cache-ram");
        } else if (key == "spec-draft-model" || key == "model-draft") {
            s.draft_model = v;
        } else if (key == "spec-draft-type-k" || key == "cache-type-k-draft") {
            s.cache_type_k_draft = v;
        } else if (key == "spec-draft-type-v" || key == "cache-type-v-draft") {
            s.cache_type_v_draft = v;
        } else if (key == "spec-type") {
            if (v == "none") s.draft_model.clear();  // no drafting: the draft model is not loaded
            s.mtp_heads = v == "draft-mtp";
        }
    }
    return s;
}

model_footprint compute_footprint(const model_report& report, const footprint_settings& s, const model_report* draft) {
    const ggml_type k = parse_cache_type(s.cache_type_k, "--cache-type-k");
    const ggml_type v = parse_cache_type(s.cache_type_v, "--cache-type-v");
    const int slots = std::max(s.slots, 1);
    const int sequences = slots + s.parked + 2;  // as serve counts recurrent states: slots, parked, scratch
    model_footprint f;
    f.weight_bytes = report.file_size;
    f.context_size = s.context_size;
    if (f.context_size == 0) {
        // The server sizes its context from free memory at load: with memory to spare it takes this, never more.
        const uint64_t plenty = std::numeric_limits<uint64_t>::max() / 4;
        f.context_size = static_cast<uint64_t>(
            choose_default_context(sizing_input_for(report, k, v, slots, sequences, plenty, 0)).context_size);
        f.auto_context = true;
    }
    const serving_layout layout{.weight_bytes = 0,
                                .cache_type_k = k,
                                .cache_type_v = v,
                                .context_size = f.context_size,
                                .sequences = static_cast<uint64_t>(sequences)};
    f.kv_bytes = estimate_serving_memory(report, layout).total_bytes;
    if (draft) {
        const serving_layout draft_layout{.weight_bytes = 0,
                                          .cache_type_k = parse_cache_type(s.cache_type_k_draft, "--spec-draft-type-k"),
                                          .cache_type_v = parse_cache_type(s.cache_type_v_draft, "--spec-draft-type-v"),
                                          .context_size = f.context_size,
                                          .sequences = 0};
        f.draft_bytes = draft->file_size + estimate_serving_memory(*draft, draft_layout).total_bytes;
    }
    if (s.mtp_heads) {
        f.mtp_bytes = f.context_size *
                      mtp_kv_bytes_per_cell(report, parse_cache_type(s.cache_type_k_draft, "--spec-draft-type-k"),
                                            parse_cache_type(s.cache_type_v_draft, "--spec-draft-type-v"));
    }
    f.cache_ram_bytes = s.cache_ram.value_or(half_of_physical_memory());
    return f;
}

std::string describe_footprint(const model_footprint& f) {
    return format_bytes(f.total()) + " (weights " + format_bytes(f.weight_bytes) + " + KV " + format_bytes(f.kv_bytes) +
           " for " + std::to_string(f.context_size) + " tokens" +
           (f.auto_context ? " (-c 0: the most it sizes itself)" : "") + " + RAM tier " +
           format_bytes(f.cache_ram_bytes) +
           (f.draft_bytes > 0 ? " + draft model " + format_bytes(f.draft_bytes) : std::string()) +
           (f.mtp_bytes > 0 ? " + MTP context " + format_bytes(f.mtp_bytes) : std::string()) + ")";
}

}  // namespace keepwarm

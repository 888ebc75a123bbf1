// See context-sizing.h.
#include "model/context-sizing.h"

#include <algorithm>
#include <fstream>
#include <sstream>

namespace keepwarm {

namespace {

uint64_t cache_bytes(const context_sizing_input& in, int slot_tokens) {
    return in.bytes_per_cell * static_cast<uint64_t>(slot_tokens) * static_cast<uint64_t>(in.slots) +
           in.bytes_per_sequence * static_cast<uint64_t>(in.sequences);
}

}  // namespace

context_choice choose_default_context(const context_sizing_input& in) {
    const int slots = std::max(in.slots, 1);
    const int trained =
        in.trained_tokens > 0 ? static_cast<int>(std::min<uint32_t>(in.trained_tokens, 1u << 30)) : agent_slot_tokens;
    const uint64_t budget = in.memory_for_cache / 4 * 3;
    const auto fits = [&](int tokens) { return cache_bytes(in, tokens) <= budget; };

    context_choice c;
    if (in.memory_for_cache == 0) {  // nothing known of the machine's memory: what agents need, no more
        c.slot_tokens = std::min(trained, agent_slot_tokens);
        c.context_size = c.slot_tokens * slots;
        c.cache_bytes = cache_bytes(in, c.slot_tokens);
        c.why = "auto: free memory unknown, " + std::to_string(c.slot_tokens) + " tokens per slot; -c sets another";
        return c;
    }
    int slot = std::min(trained, largest_default_slot_tokens);
    std::string why = slot == trained
                          ? "the model's trained " + std::to_string(trained) + " tokens per slot"
                          : "the largest default slot (the model is trained for " + std::to_string(trained) + ")";
    while (!fits(slot) && slot > agent_slot_tokens) {
        slot = std::max(slot / 2, std::min(agent_slot_tokens, trained));
        why = "what memory holds at most";
    }
    if (!fits(slot)) {
        const uint64_t per_slot =
            budget > in.bytes_per_sequence * static_cast<uint64_t>(in.sequences)
                ? (budget - in.bytes_per_sequence * static_cast<uint64_t>(in.sequences)) / static_cast<uint64_t>(slots)
                : 0;
        const uint64_t cells = in.bytes_per_cell > 0 ? per_slot / in.bytes_per_cell : per_slot;
        const int floor_tokens = std::min(smallest_default_slot_tokens, trained);
        slot = static_cast<int>(std::clamp<uint64_t>(cells / 1024 * 1024, static_cast<uint64_t>(floor_tokens),
                                                     static_cast<uint64_t>(slot)));
        why = slot < agent_slot_tokens && trained > slot
                  ? "memory is short: agents need 32768 per slot; free memory, use fewer --parallel slots or a "
                    "quantized KV cache (--cache-type-k/v q8_0)"
                  : "what memory holds at most";
    }
    c.slot_tokens = slot;
    c.context_size = slot * slots;
    c.cache_bytes = cache_bytes(in, slot);
    c.why = "auto: " + why + "; -c sets another";
    return c;
}

context_sizing_input sizing_input_for(const model_report& report, ggml_type type_k, ggml_type type_v, int slots,
                                      int sequences, uint64_t free_memory, uint64_t reserved) {
    context_sizing_input in;
    in.trained_tokens = report.n_ctx_train;
    in.slots = slots;
    in.sequences = sequences;
    serving_layout one_cell{.cache_type_k = type_k, .cache_type_v = type_v, .context_size = 1, .sequences = 0};
    in.bytes_per_cell = estimate_serving_memory(report, one_cell).total_bytes;
    in.bytes_per_sequence = report.recurrent_state_bytes;
    in.memory_for_cache = free_memory > reserved ? free_memory - reserved : 0;
    return in;
}

context_sizing_input with_draft_model(context_sizing_input in, const model_report& draft, ggml_type type_k,
                                      ggml_type type_v) {
    serving_layout one_cell{.cache_type_k = type_k, .cache_type_v = type_v, .context_size = 1, .sequences = 0};
    in.bytes_per_cell += estimate_serving_memory(draft, one_cell).total_bytes;
    // 0 means unknown (nothing is known of the machine's memory): a known memory stays known, if all but used up.
    if (in.memory_for_cache > 0)
        in.memory_for_cache =
            std::max<uint64_t>(in.memory_for_cache - std::min(in.memory_for_cache, draft.file_size), 1);
    return in;
}

context_sizing_input with_mtp_heads(context_sizing_input in, const model_report& report, ggml_type type_k,
                                    ggml_type type_v) {
    in.bytes_per_cell += mtp_kv_bytes_per_cell(report, type_k, type_v);
    return in;
}

uint64_t host_available_memory() {
    std::ifstream meminfo("/proc/meminfo");
    std::string line;
    while (std::getline(meminfo, line)) {
        if (line.rfind("MemAvailable:", 0) != 0) continue;
        std::istringstream fields(line.substr(13));
        uint64_t kib = 0;
        fields >> kib;
        return kib * 1024;
    }
    return 0;
}

}  // namespace keepwarm

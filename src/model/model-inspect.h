// Reads a GGUF's metadata (no weights) and works out what serving it costs: attention layout, KV bytes per token,
// recurrent state per sequence, memory at a given context length and of a whole server; and the metadata itself as
// JSON. Pure functions of the file's header, callable from any thread.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ggml.h"

namespace keepwarm {

enum class layer_kind { full_attention, sliding_window, recurrent };

// Cache element types a server can choose for the KV cache.
enum class kv_cache_type { f16, q8_0, q4_0 };

struct model_report {
    std::string path;
    uint64_t file_size = 0;
    std::string name;
    std::string architecture;
    bool random_weights = false;  // written by keepwarm mkmodel: output is noise
    bool has_chat_template = false;
    std::string weight_type;  // the tensor type holding most of the bytes, e.g. "q8_0"

    uint32_t n_layer = 0;       // the trunk's blocks: llama.cpp's n_layer(), the MTP heads' blocks after it not counted
    uint32_t n_mtp_layers = 0;  // multi-token prediction heads (<arch>.nextn_predict_layers), for --spec-type draft-mtp
    uint32_t n_embd = 0;
    uint32_t n_ff = 0;
    uint32_t n_ctx_train = 0;
    uint32_t n_vocab = 0;
    uint32_t n_head = 0;  // of the first attention layer
    uint32_t n_head_kv = 0;
    uint32_t head_dim_k = 0;
    uint32_t head_dim_v = 0;
    uint32_t sliding_window = 0;  // tokens an SWA layer keeps; 0 without SWA
    uint32_t n_expert = 0;
    uint32_t n_expert_used = 0;
    uint32_t n_ff_exp = 0;
    uint64_t n_params = 0;

    std::vector<layer_kind> layers;  // one per block
    // K and V values one token adds, per layer (0 for recurrent layers)
    std::vector<uint64_t> k_per_token;
    std::vector<uint64_t> v_per_token;
    uint64_t recurrent_state_bytes = 0;  // per sequence, f32 conv + ssm state over all recurrent layers
    // K and V values one token adds per MTP head: the context --spec-type draft-mtp makes beside the model's holds a
    // cell per cell of the model's context in these layers alone.
    std::vector<uint64_t> mtp_k_per_token;
    std::vector<uint64_t> mtp_v_per_token;

    uint32_t count(layer_kind kind) const;
    // Bytes one token adds to the KV cache of all layers (SWA layers counted like full ones).
    uint64_t kv_bytes_per_token(kv_cache_type type) const;
    // Cache memory of one sequence of n_ctx tokens: KV (SWA layers capped at their window) plus recurrent state.
    uint64_t memory_at(uint32_t n_ctx, kv_cache_type type) const;
    // e.g. "9 recurrent + 3 full attention (every 4th layer from 3)"
    std::string layer_summary() const;
};

// How a server holds a model, for serving_memory().
struct serving_layout {
    uint64_t weight_bytes = 0;  // the weights as loaded (llama_model_size)
    ggml_type cache_type_k = GGML_TYPE_F16;
    ggml_type cache_type_v = GGML_TYPE_F16;
    uint64_t context_size = 0;  // KV cells of the whole context, every slot's together
    uint64_t sequences = 1;     // recurrent states held at once (slots, parked conversations, scratch)
    int gpu_layers = 0;         // layers offloaded to a GPU; -1: all
    bool has_gpu = false;       // a GPU backend is present (else nothing is offloaded, whatever gpu_layers says)
};

struct serving_memory {
    uint64_t total_bytes = 0;  // weights + KV cells of the whole context (every layer, SWA ones too) + recurrent states
    uint64_t gpu_bytes = 0;    // the offloaded layers' share of total_bytes (the output layer counts as one more)
};

// The memory a server holding `report`'s model as `layout` says takes, as Ollama's /api/ps estimates its own. Quantized
// KV rows are counted in whole blocks.
serving_memory estimate_serving_memory(const model_report& report, const serving_layout& layout);

// Bytes one cell of the MTP context (--spec-type draft-mtp) takes, for its cache types; 0 for a model without heads.
uint64_t mtp_kv_bytes_per_cell(const model_report& report, ggml_type cache_type_k, ggml_type cache_type_v);

// Throws std::runtime_error if the file can't be read as GGUF or lacks the basic hyperparameters.
model_report inspect_model(const std::string& path);

// Bytes of n values stored as type (f16: 2 each; q8_0: 34 per 32; q4_0: 18 per 32, blocks rounded up).
uint64_t kv_type_bytes(kv_cache_type type, uint64_t n_values);

// Every key/value of a GGUF's header as one JSON object in the file's order, each value with its own type: integers,
// floats (a float32 written with the fewest digits that read back as the same float32, as Go prints one), booleans,
// strings, and arrays of these; an array longer than `max_array` values (a vocabulary, its merges) is null. Throws
// std::runtime_error if the file cannot be read as GGUF.
nlohmann::ordered_json read_gguf_metadata(const std::string& path, size_t max_array);

const char* to_string(layer_kind kind);
const char* to_string(kv_cache_type type);
ggml_type to_ggml_type(kv_cache_type type);

// Human-readable report; contexts lists the lengths to show memory for.
std::string format_report(const model_report& report, const std::vector<uint32_t>& contexts);
// The same as JSON (one object).
std::string format_report_json(const model_report& report, const std::vector<uint32_t>& contexts);

}  // namespace keepwarm

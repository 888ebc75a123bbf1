// GGUF metadata reading for `keepwarm inspect` and Ollama's /api/show and /api/ps: only the header is read, so a
// multi-gigabyte model is instant. The per-layer rules mirror llama.cpp's hparams loading for the layouts keepwarm
// serves (dense, MoE, hybrid).
#include "model/model-inspect.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "ggml-cpp.h"
#include "ggml.h"
#include "gguf.h"

namespace keepwarm {

namespace {

// Bytes of one scalar GGUF value (0 for strings and arrays, whose size is not fixed).
size_t gguf_type_size(gguf_type type) {
    switch (type) {
        case GGUF_TYPE_UINT8:
        case GGUF_TYPE_INT8:
        case GGUF_TYPE_BOOL:
            return 1;
        case GGUF_TYPE_UINT16:
        case GGUF_TYPE_INT16:
            return 2;
        case GGUF_TYPE_UINT32:
        case GGUF_TYPE_INT32:
        case GGUF_TYPE_FLOAT32:
            return 4;
        case GGUF_TYPE_UINT64:
        case GGUF_TYPE_INT64:
        case GGUF_TYPE_FLOAT64:
            return 8;
        default:
            return 0;
    }
}

class metadata {
public:
    explicit metadata(const gguf_context* ctx) : ctx_(ctx) {}

    std::optional<uint64_t> number(const std::string& key) const {
        const int64_t id = gguf_find_key(ctx_, key.c_str());
        if (id < 0) return std::nullopt;
        return scalar(gguf_get_kv_type(ctx_, id), gguf_get_val_data(ctx_, id));
    }

    uint64_t number_or(const std::string& key, uint64_t fallback) const { return number(key).value_or(fallback); }

    // Keys llama.cpp accepts either as one value for all layers or as an array with one value per layer.
    std::optional<std::vector<uint64_t>> per_layer(const std::string& key, uint32_t n_layer) const {
        const int64_t id = gguf_find_key(ctx_, key.c_str());
        if (id < 0) return std::nullopt;
        const gguf_type type = gguf_get_kv_type(ctx_, id);
        if (type != GGUF_TYPE_ARRAY) {
            return std::vector<uint64_t>(n_layer, scalar(type, gguf_get_val_data(ctx_, id)).value_or(0));
        }
        const gguf_type elem = gguf_get_arr_type(ctx_, id);
        const size_t n = gguf_get_arr_n(ctx_, id);
        const size_t size = elem == GGUF_TYPE_STRING ? 0 : gguf_type_size(elem);
        if (size == 0) return std::nullopt;
        const auto* data = static_cast<const uint8_t*>(gguf_get_arr_data(ctx_, id));
        std::vector<uint64_t> values(n_layer, 0);
        for (size_t i = 0; i < std::min<size_t>(n, n_layer); ++i) values[i] = scalar(elem, data + i * size).value_or(0);
        return values;
    }

    std::optional<std::string> text(const std::string& key) const {
        const int64_t id = gguf_find_key(ctx_, key.c_str());
        if (id < 0 || gguf_get_kv_type(ctx_, id) != GGUF_TYPE_STRING) return std::nullopt;
        return std::string(gguf_get_val_str(ctx_, id));
    }

    bool has(const std::string& key) const { return gguf_find_key(ctx_, key.c_str()) >= 0; }

    size_t array_size(const std::string& key) const {
        const int64_t id = gguf_find_key(ctx_, key.c_str());
        return id >= 0 && gguf_get_kv_type(ctx_, id) == GGUF_TYPE_ARRAY ? gguf_get_arr_n(ctx_, id) : 0;
    }

private:
    // Negative counts make no sense for any key read here, so they clamp to 0.
    static std::optional<uint64_t> scalar(gguf_type type, const void* p) {
        auto non_negative = [](auto v) { return v < 0 ? uint64_t(0) : uint64_t(v); };
        switch (type) {
            case GGUF_TYPE_UINT8:
                return *static_cast<const uint8_t*>(p);
            case GGUF_TYPE_INT8:
                return non_negative(*static_cast<const int8_t*>(p));
            case GGUF_TYPE_BOOL:
                return *static_cast<const int8_t*>(p) != 0 ? 1 : 0;
            case GGUF_TYPE_UINT16:
                return *static_cast<const uint16_t*>(p);
            case GGUF_TYPE_INT16:
                return non_negative(*static_cast<const int16_t*>(p));
            case GGUF_TYPE_UINT32:
                return *static_cast<const uint32_t*>(p);
            case GGUF_TYPE_INT32:
                return non_negative(*static_cast<const int32_t*>(p));
            case GGUF_TYPE_UINT64:
                return *static_cast<const uint64_t*>(p);
            case GGUF_TYPE_INT64:
                return non_negative(*static_cast<const int64_t*>(p));
            case GGUF_TYPE_FLOAT32:
                return non_negative(*static_cast<const float*>(p));
            case GGUF_TYPE_FLOAT64:
                return non_negative(*static_cast<const double*>(p));
            default:
                return std::nullopt;
        }
    }

    const gguf_context* ctx_;
};

std::string human_bytes(double bytes) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int unit = 0;
    while (bytes >= 1024.0 && unit < 4) {
        bytes /= 1024.0;
        ++unit;
    }
    char buf[32];
    std::snprintf(buf, sizeof(buf), unit == 0 ? "%.0f %s" : "%.1f %s", bytes, units[unit]);
    return buf;
}

std::string human_count(uint64_t n) {
    char buf[32];
    if (n >= 1000000000ULL)
        std::snprintf(buf, sizeof(buf), "%.2f B", double(n) / 1e9);
    else if (n >= 1000000ULL)
        std::snprintf(buf, sizeof(buf), "%.1f M", double(n) / 1e6);
    else
        std::snprintf(buf, sizeof(buf), "%llu", static_cast<unsigned long long>(n));
    return buf;
}

const kv_cache_type k_kv_types[] = {kv_cache_type::f16, kv_cache_type::q8_0, kv_cache_type::q4_0};

// Bytes of a row of n values stored as `type`, in whole blocks.
uint64_t row_bytes(ggml_type type, uint64_t n_values) {
    const auto block = uint64_t(ggml_blck_size(type));
    return block == 0 ? 0 : (n_values + block - 1) / block * uint64_t(ggml_type_size(type));
}

// As Go prints a float32: the fewest digits that read back as the same float32 ("1e-06", not 9.99999997e-07).
nlohmann::ordered_json float32_json(float f) {
    char buf[32];
    for (int digits = 1; digits <= 9; digits++) {
        std::snprintf(buf, sizeof buf, "%.*g", digits, double(f));
        if (std::strtof(buf, nullptr) == f) break;
    }
    return std::strtod(buf, nullptr);
}

// One GGUF value (a scalar, or one element of an array) as JSON, with its own type; null for any other type.
nlohmann::ordered_json gguf_value_json(gguf_type type, const void* data) {
    const auto read = [data]<typename T>(T value) {
        std::memcpy(&value, data, sizeof value);
        return value;
    };
    switch (type) {
        case GGUF_TYPE_UINT8:
            return read(uint8_t{});
        case GGUF_TYPE_INT8:
            return read(int8_t{});
        case GGUF_TYPE_UINT16:
            return read(uint16_t{});
        case GGUF_TYPE_INT16:
            return read(int16_t{});
        case GGUF_TYPE_UINT32:
            return read(uint32_t{});
        case GGUF_TYPE_INT32:
            return read(int32_t{});
        case GGUF_TYPE_UINT64:
            return read(uint64_t{});
        case GGUF_TYPE_INT64:
            return read(int64_t{});
        case GGUF_TYPE_FLOAT32:
            return float32_json(read(float{}));
        case GGUF_TYPE_FLOAT64:
            return read(double{});
        case GGUF_TYPE_BOOL:
            return read(bool{});
        default:
            return nullptr;
    }
}

}  // namespace

const char* to_string(layer_kind kind) {
    switch (kind) {
        case layer_kind::full_attention:
            return "full";
        case layer_kind::sliding_window:
            return "swa";
        case layer_kind::recurrent:
            return "recurrent";
    }
    return "?";
}

const char* to_string(kv_cache_type type) {
    switch (type) {
        case kv_cache_type::f16:
            return "f16";
        case kv_cache_type::q8_0:
            return "q8_0";
        case kv_cache_type::q4_0:
            return "q4_0";
    }
    return "?";
}

ggml_type to_ggml_type(kv_cache_type type) {
    switch (type) {
        case kv_cache_type::f16:
            return GGML_TYPE_F16;
        case kv_cache_type::q8_0:
            return GGML_TYPE_Q8_0;
        case kv_cache_type::q4_0:
            return GGML_TYPE_Q4_0;
    }
    return GGML_TYPE_F16;
}

uint64_t kv_type_bytes(kv_cache_type type, uint64_t n_values) {
    return row_bytes(to_ggml_type(type), n_values);
}

uint32_t model_report::count(layer_kind kind) const {
    return uint32_t(std::count(layers.begin(), layers.end(), kind));
}

uint64_t model_report::kv_bytes_per_token(kv_cache_type type) const {
    uint64_t total = 0;
    // Quantized blocks never span rows, and each layer stores one K row and one V row per token.
    for (size_t il = 0; il < layers.size(); ++il) {
        total += kv_type_bytes(type, k_per_token[il]) + kv_type_bytes(type, v_per_token[il]);
    }
    return total;
}

uint64_t model_report::memory_at(uint32_t n_ctx, kv_cache_type type) const {
    uint64_t total = recurrent_state_bytes;
    for (size_t il = 0; il < layers.size(); ++il) {
        uint64_t tokens = n_ctx;
        if (layers[il] == layer_kind::sliding_window && sliding_window > 0)
            tokens = std::min(tokens, uint64_t(sliding_window));
        total += tokens * (kv_type_bytes(type, k_per_token[il]) + kv_type_bytes(type, v_per_token[il]));
    }
    return total;
}

std::string model_report::layer_summary() const {
    std::vector<std::string> parts;
    for (layer_kind kind : {layer_kind::recurrent, layer_kind::sliding_window, layer_kind::full_attention}) {
        const uint32_t n = count(kind);
        if (n == 0) continue;
        std::string part = std::to_string(n) + " " +
                           (kind == layer_kind::full_attention   ? "full attention"
                            : kind == layer_kind::sliding_window ? "sliding window"
                                                                 : "recurrent");
        // Name where the minority kind sits when layers are mixed, since that is what differs between models.
        if (n != layers.size() && kind == layer_kind::full_attention) {
            std::vector<uint32_t> at;
            for (uint32_t il = 0; il < layers.size(); ++il)
                if (layers[il] == kind) at.push_back(il);
            const uint32_t step = at.size() > 1 ? at[1] - at[0] : 0;
            bool regular = step > 0;
            for (size_t i = 1; i < at.size(); ++i) regular = regular && at[i] - at[i - 1] == step;
            if (at.size() == 1) {
                part += " (layer " + std::to_string(at[0]) + ")";
            } else if (regular) {
                part += " (every " + std::to_string(step) +
                        (step == 2   ? "nd"
                         : step == 3 ? "rd"
                                     : "th") +
                        " layer from " + std::to_string(at[0]) + ")";
            } else {
                part += " (layers";
                for (size_t i = 0; i < at.size() && i < 16; ++i) part += (i ? ", " : " ") + std::to_string(at[i]);
                part += at.size() > 16 ? ", ...)" : ")";
            }
        }
        parts.push_back(part);
    }
    std::string out;
    for (const auto& p : parts) out += (out.empty() ? "" : " + ") + p;
    return out;
}

model_report inspect_model(const std::string& path) {
    gguf_init_params params{/*no_alloc =*/true, /*ctx =*/nullptr};
    gguf_context_ptr ctx(gguf_init_from_file(path.c_str(), params));
    if (!ctx) throw std::runtime_error("cannot read " + path + " as a GGUF file");
    const metadata md(ctx.get());

    model_report r;
    r.path = path;
    std::error_code ec;
    r.file_size = std::filesystem::file_size(path, ec);
    r.architecture = md.text("general.architecture").value_or("");
    if (r.architecture.empty()) throw std::runtime_error(path + " has no general.architecture");
    const std::string a = r.architecture + ".";
    r.name = md.text("general.name").value_or("");
    r.random_weights = md.number_or("keepwarm.random_weights", 0) != 0;
    r.has_chat_template = md.has("tokenizer.chat_template");

    const auto blocks = md.number(a + "block_count");
    if (!blocks || *blocks == 0) throw std::runtime_error(path + " has no " + a + "block_count");
    // Qwen3.5's, GLM-4.5's MTP heads are blocks after the trunk's, counted in block_count: llama.cpp's trunk and its
    // caches leave them out.
    const uint64_t mtp_layers = md.number_or(a + "nextn_predict_layers", 0);
    if (mtp_layers >= *blocks) {
        throw std::runtime_error(path + ": " + a + "nextn_predict_layers " + std::to_string(mtp_layers) +
                                 " leaves no trunk of its " + std::to_string(*blocks) + " blocks");
    }
    const auto n_blocks = uint32_t(*blocks);
    r.n_mtp_layers = uint32_t(mtp_layers);
    r.n_layer = n_blocks - r.n_mtp_layers;
    r.n_embd = uint32_t(md.number_or(a + "embedding_length", 0));
    r.n_ctx_train = uint32_t(md.number_or(a + "context_length", 0));
    r.n_vocab = uint32_t(md.number_or(a + "vocab_size", md.array_size("tokenizer.ggml.tokens")));
    r.n_expert = uint32_t(md.number_or(a + "expert_count", 0));
    r.n_expert_used = uint32_t(md.number_or(a + "expert_used_count", 0));
    r.n_ff_exp = uint32_t(md.number_or(a + "expert_feed_forward_length", 0));
    if (auto ff = md.per_layer(a + "feed_forward_length", r.n_layer))
        r.n_ff = uint32_t(*std::max_element(ff->begin(), ff->end()));

    const std::vector<uint64_t> heads =
        md.per_layer(a + "attention.head_count", n_blocks).value_or(std::vector<uint64_t>(n_blocks, 0));
    const std::vector<uint64_t> heads_kv = md.per_layer(a + "attention.head_count_kv", n_blocks).value_or(heads);
    const uint64_t first_heads = [&] {
        for (uint64_t h : heads)
            if (h) return h;
        return uint64_t(0);
    }();
    const uint64_t default_head = first_heads ? r.n_embd / first_heads : 0;
    const uint64_t head_k = md.number_or(a + "attention.key_length", default_head);
    const uint64_t head_v = md.number_or(a + "attention.value_length", default_head);
    const uint64_t head_k_swa = md.number_or(a + "attention.key_length_swa", head_k);
    const uint64_t head_v_swa = md.number_or(a + "attention.value_length_swa", head_v);
    r.head_dim_k = uint32_t(head_k);
    r.head_dim_v = uint32_t(head_v);

    // Recurrent layers, in llama.cpp's order of precedence: an explicit per-layer list, qwen3next/qwen35's
    // "every Nth layer is attention", or (Jamba, Granite hybrid, Mamba) layers without KV heads next to SSM keys.
    r.layers.assign(r.n_layer, layer_kind::full_attention);
    const bool has_ssm = md.has(a + "ssm.state_size") || md.has(a + "ssm.inner_size") || md.has(a + "wkv.head_size");
    if (auto recurrent = md.per_layer(a + "attention.recurrent_layers", r.n_layer)) {
        for (uint32_t il = 0; il < r.n_layer; ++il)
            if ((*recurrent)[il]) r.layers[il] = layer_kind::recurrent;
    } else if (auto interval = md.number(a + "full_attention_interval"); interval && *interval > 0) {
        for (uint32_t il = 0; il < r.n_layer; ++il) {
            if ((il + 1) % *interval != 0) r.layers[il] = layer_kind::recurrent;
        }
    } else if (has_ssm) {
        for (uint32_t il = 0; il < r.n_layer; ++il)
            if (heads_kv[il] == 0) r.layers[il] = layer_kind::recurrent;
    }

    // Sliding window: a per-layer pattern (array of flags, or N meaning "every Nth layer is full"), else all layers.
    // Architectures that hard-code their pattern in llama.cpp (Gemma 2/3, ...) show as all-SWA here.
    r.sliding_window = uint32_t(md.number_or(a + "attention.sliding_window", 0));
    if (r.sliding_window > 0) {
        std::vector<bool> swa(r.n_layer, true);
        const std::string pattern_key = a + "attention.sliding_window_pattern";
        if (md.array_size(pattern_key) > 0) {
            const auto flags = *md.per_layer(pattern_key, r.n_layer);
            for (uint32_t il = 0; il < r.n_layer; ++il) swa[il] = flags[il] != 0;
        } else if (auto n = md.number(pattern_key); n && *n > 0) {
            for (uint32_t il = 0; il < r.n_layer; ++il) swa[il] = il % *n < *n - 1;
        }
        for (uint32_t il = 0; il < r.n_layer; ++il) {
            if (swa[il] && r.layers[il] == layer_kind::full_attention) r.layers[il] = layer_kind::sliding_window;
        }
    }

    r.k_per_token.assign(r.n_layer, 0);
    r.v_per_token.assign(r.n_layer, 0);
    for (uint32_t il = 0; il < r.n_layer; ++il) {
        if (r.layers[il] == layer_kind::recurrent) continue;
        const bool swa = r.layers[il] == layer_kind::sliding_window;
        r.k_per_token[il] = heads_kv[il] * (swa ? head_k_swa : head_k);
        r.v_per_token[il] = heads_kv[il] * (swa ? head_v_swa : head_v);
        if (r.n_head == 0) {
            r.n_head = uint32_t(heads[il]);
            r.n_head_kv = uint32_t(heads_kv[il]);
        }
    }

    for (uint32_t il = r.n_layer; il < n_blocks; ++il) {  // the MTP heads: full attention
        r.mtp_k_per_token.push_back(heads_kv[il] * head_k);
        r.mtp_v_per_token.push_back(heads_kv[il] * head_v);
    }

    // Recurrent state is kept in f32 (llama.cpp's type_r/type_s): a conv window plus the SSM/delta-net state.
    const uint64_t d_conv = md.number_or(a + "ssm.conv_kernel", 0);
    const uint64_t d_inner = md.number_or(a + "ssm.inner_size", 0);
    const uint64_t d_state = md.number_or(a + "ssm.state_size", 0);
    const uint64_t n_group = md.number_or(a + "ssm.group_count", 0);
    const uint64_t conv_values = (d_conv > 0 ? d_conv - 1 : 0) * (d_inner + 2 * n_group * d_state);
    const uint64_t state_values = d_state * d_inner;
    r.recurrent_state_bytes = uint64_t(r.count(layer_kind::recurrent)) * (conv_values + state_values) * 4;

    std::map<int, uint64_t> bytes_by_type;
    for (int64_t i = 0; i < gguf_get_n_tensors(ctx.get()); ++i) {
        const int64_t* ne = gguf_get_tensor_ne(ctx.get(), i);
        uint64_t n = 1;
        for (int d = 0; d < GGML_MAX_DIMS; ++d) n *= uint64_t(ne[d]);
        r.n_params += n;
        bytes_by_type[gguf_get_tensor_type(ctx.get(), i)] += gguf_get_tensor_size(ctx.get(), i);
    }
    if (!bytes_by_type.empty()) {
        const auto top = std::max_element(bytes_by_type.begin(), bytes_by_type.end(),
                                          [](const auto& x, const auto& y) { return x.second < y.second; });
        r.weight_type = ggml_type_name(ggml_type(top->first));
    }
    return r;
}

serving_memory estimate_serving_memory(const model_report& r, const serving_layout& layout) {
    uint64_t kv_per_token = 0;
    for (size_t il = 0; il < r.layers.size(); ++il) {
        kv_per_token +=
            row_bytes(layout.cache_type_k, r.k_per_token[il]) + row_bytes(layout.cache_type_v, r.v_per_token[il]);
    }
    serving_memory m;
    m.total_bytes =
        layout.weight_bytes + kv_per_token * layout.context_size + r.recurrent_state_bytes * layout.sequences;
    const int layers = int(r.n_layer) + 1;  // llama.cpp counts the output layer as one more
    const int offloaded = !layout.has_gpu ? 0 : layout.gpu_layers < 0 ? layers : std::min(layout.gpu_layers, layers);
    m.gpu_bytes = uint64_t(double(m.total_bytes) * offloaded / layers);
    return m;
}

uint64_t mtp_kv_bytes_per_cell(const model_report& r, ggml_type cache_type_k, ggml_type cache_type_v) {
    uint64_t bytes = 0;
    for (size_t i = 0; i < r.mtp_k_per_token.size(); ++i) {
        bytes += row_bytes(cache_type_k, r.mtp_k_per_token[i]) + row_bytes(cache_type_v, r.mtp_v_per_token[i]);
    }
    return bytes;
}

nlohmann::ordered_json read_gguf_metadata(const std::string& path, size_t max_array) {
    using json = nlohmann::ordered_json;
    gguf_init_params params{/*no_alloc =*/true, /*ctx =*/nullptr};
    gguf_context_ptr gguf(gguf_init_from_file(path.c_str(), params));
    if (!gguf) throw std::runtime_error("cannot read " + path + " as a GGUF file");
    const gguf_context* g = gguf.get();
    json info = json::object();
    for (int64_t i = 0; i < gguf_get_n_kv(g); i++) {
        const std::string key = gguf_get_key(g, i);
        const gguf_type type = gguf_get_kv_type(g, i);
        if (type == GGUF_TYPE_STRING) {
            info[key] = gguf_get_val_str(g, i);
        } else if (type != GGUF_TYPE_ARRAY) {
            info[key] = gguf_value_json(type, gguf_get_val_data(g, i));
        } else if (const size_t n = gguf_get_arr_n(g, i); n > max_array) {
            info[key] = nullptr;
        } else {
            const gguf_type element = gguf_get_arr_type(g, i);
            json values = json::array();
            for (size_t j = 0; j < n; j++) {
                if (element == GGUF_TYPE_STRING) {
                    values.push_back(gguf_get_arr_str(g, i, j));
                } else {
                    const auto* data = static_cast<const uint8_t*>(gguf_get_arr_data(g, i));
                    values.push_back(gguf_value_json(element, data + j * gguf_type_size(element)));
                }
            }
            info[key] = std::move(values);
        }
    }
    return info;
}

std::string format_report(const model_report& r, const std::vector<uint32_t>& contexts) {
    std::ostringstream out;
    auto row = [&](const std::string& label, const std::string& value) {
        out << label << std::string(label.size() < 16 ? 16 - label.size() : 1, ' ') << value << "\n";
    };
    row("file", r.path + " (" + human_bytes(double(r.file_size)) + ")");
    if (!r.name.empty()) row("name", r.name);
    if (r.random_weights) row("weights", "RANDOM (generated by keepwarm mkmodel): output is noise");
    row("architecture", r.architecture);
    row("layers", std::to_string(r.n_layer) + ": " + r.layer_summary() +
                      (r.n_mtp_layers > 0 ? "; and " + std::to_string(r.n_mtp_layers) + " MTP head" +
                                                (r.n_mtp_layers > 1 ? "s" : "") + " (--spec-type draft-mtp)"
                                          : std::string()));
    row("width",
        std::to_string(r.n_embd) + " (ff " + std::to_string(r.n_ff) + ", vocab " + std::to_string(r.n_vocab) + ")");
    row("heads", std::to_string(r.n_head) + " query, " + std::to_string(r.n_head_kv) + " KV; head size " +
                     std::to_string(r.head_dim_k) + " (k) / " + std::to_string(r.head_dim_v) + " (v)");
    if (r.n_expert > 0) {
        row("experts", std::to_string(r.n_expert) + ", " + std::to_string(r.n_expert_used) + " used per token (ff " +
                           std::to_string(r.n_ff_exp) + ")");
    }
    if (r.sliding_window > 0) row("sliding window", std::to_string(r.sliding_window) + " tokens");
    row("parameters", human_count(r.n_params) + (r.weight_type.empty() ? "" : " (mostly " + r.weight_type + ")"));
    row("chat template", r.has_chat_template ? "yes" : "no");
    row("context", std::to_string(r.n_ctx_train) + " (trained)");

    std::string kv;
    for (kv_cache_type t : k_kv_types)
        kv += std::string(kv.empty() ? "" : ", ") + to_string(t) + " " + human_bytes(double(r.kv_bytes_per_token(t)));
    row("KV per token", kv);
    if (r.n_mtp_layers > 0) {
        std::string mtp;
        for (kv_cache_type t : k_kv_types) {
            mtp += std::string(mtp.empty() ? "" : ", ") + to_string(t) + " " +
                   human_bytes(double(mtp_kv_bytes_per_cell(r, to_ggml_type(t), to_ggml_type(t))));
        }
        row("MTP KV/token", mtp + " more with --spec-type draft-mtp");
    }
    if (r.count(layer_kind::recurrent) > 0) {
        row("recurrent state", human_bytes(double(r.recurrent_state_bytes)) + " per sequence (f32, any length)");
    }
    for (uint32_t n_ctx : contexts) {
        std::string mem;
        for (kv_cache_type t : k_kv_types)
            mem +=
                std::string(mem.empty() ? "" : ", ") + to_string(t) + " " + human_bytes(double(r.memory_at(n_ctx, t)));
        row("at " + std::to_string(n_ctx), mem + " per sequence");
    }
    return out.str();
}

std::string format_report_json(const model_report& r, const std::vector<uint32_t>& contexts) {
    using json = nlohmann::ordered_json;  // keep the fields in the order written
    json layers = json::array();
    for (layer_kind k : r.layers) layers.push_back(to_string(k));
    json kv = json::object();
    json mtp_kv = json::object();
    for (kv_cache_type t : k_kv_types) {
        kv[to_string(t)] = r.kv_bytes_per_token(t);
        mtp_kv[to_string(t)] = mtp_kv_bytes_per_cell(r, to_ggml_type(t), to_ggml_type(t));
    }
    json memory = json::array();
    for (uint32_t n_ctx : contexts) {
        json entry = {{"context", n_ctx}};
        for (kv_cache_type t : k_kv_types) entry[to_string(t)] = r.memory_at(n_ctx, t);
        memory.push_back(entry);
    }
    json out = {
        {"path", r.path},
        {"file_size", r.file_size},
        {"name", r.name},
        {"architecture", r.architecture},
        {"random_weights", r.random_weights},
        {"has_chat_template", r.has_chat_template},
        {"weight_type", r.weight_type},
        {"parameters", r.n_params},
        {"layers", r.n_layer},
        {"mtp_layers", r.n_mtp_layers},
        {"embedding_length", r.n_embd},
        {"feed_forward_length", r.n_ff},
        {"context_length", r.n_ctx_train},
        {"vocab_size", r.n_vocab},
        {"heads", r.n_head},
        {"kv_heads", r.n_head_kv},
        {"head_size_k", r.head_dim_k},
        {"head_size_v", r.head_dim_v},
        {"sliding_window", r.sliding_window},
        {"experts", r.n_expert},
        {"experts_used", r.n_expert_used},
        {"expert_feed_forward_length", r.n_ff_exp},
        {"layer_kinds", layers},
        {"layer_summary", r.layer_summary()},
        {"full_attention_layers", r.count(layer_kind::full_attention)},
        {"sliding_window_layers", r.count(layer_kind::sliding_window)},
        {"recurrent_layers", r.count(layer_kind::recurrent)},
        {"kv_bytes_per_token", kv},
        {"mtp_kv_bytes_per_token", mtp_kv},
        {"recurrent_state_bytes_per_sequence", r.recurrent_state_bytes},
        {"memory_per_sequence", memory},
    };
    return out.dump(2);
}

}  // namespace keepwarm

// See model-card.h.
#include "local/model-card.h"

#include <chrono>
#include <filesystem>

#include "cache/block-key.h"
#include "engine/llama-runtime.h"
#include "model/model-inspect.h"

namespace keepwarm {

namespace {

namespace ollama = api::ollama;
using json = nlohmann::ordered_json;

// GGUF arrays longer than this (the vocabulary, merges, scores) are null in model_info, as Ollama shows them.
constexpr size_t max_model_info_array = 256;

// Ollama's model_info: the GGUF's key/values with their types, without the chat template (that is /api/show's
// "template") and with the long tokenizer arrays as null.
json model_info(const std::string& path) {
    json info = read_gguf_metadata(path, max_model_info_array);
    for (auto it = info.begin(); it != info.end();) {
        it = it.key().starts_with("tokenizer.chat_template") ? info.erase(it) : std::next(it);
    }
    return info;
}

// Memory of the loaded model, as Ollama's /api/ps estimates its own: one recurrent state per sequence (slots, parked
// conversations, scratch); on a GPU, the offloaded layers' share.
void estimate_memory(const engine& llm, const model_report& report, ollama::model_card& card) {
    const engine_options& eo = llm.options();
    const serving_memory memory =
        estimate_serving_memory(report, {.weight_bytes = llama_model_size(llm.model()),
                                         .cache_type_k = eo.cache_type_k,
                                         .cache_type_v = eo.cache_type_v,
                                         .context_size = uint64_t(eo.context_size),
                                         .sequences = uint64_t(eo.slots + eo.cache_parked_sequences + 1),
                                         .gpu_layers = eo.gpu_layers,
                                         .has_gpu = !gpu_devices().empty()});
    card.memory_bytes = memory.total_bytes;
    card.vram_bytes = memory.gpu_bytes;
}

}  // namespace

ollama::model_card make_model_card(const engine& llm, const chat_renderer& renderer, const std::string& model_path,
                                   const std::string& model_id) {
    const llama_model* model = llm.model();
    const model_report report = inspect_model(model_path);
    ollama::model_card card;
    card.name = ollama::tagged_name(model_id);
    card.architecture = report.architecture;
    card.parameter_size = ollama::parameter_size(llama_model_n_params(model));
    card.quantization_level = ollama::quantization_level(llama_model_ftype(model));
    card.file_bytes = report.file_size;
    // Not Ollama's sha256 of a manifest (there is none): keepwarm's cheap fingerprint of the file, which also keys
    // its disk cache.
    card.digest = model_fingerprint(model_path, "");
    card.modified_at = std::chrono::file_clock::to_sys(std::filesystem::last_write_time(model_path));
    card.path = model_path;
    card.chat_template = renderer.source();
    card.model_info = model_info(model_path);
    if (!card.model_info.contains("general.parameter_count")) {
        card.model_info["general.parameter_count"] = llama_model_n_params(model);
    }
    card.capabilities = {"completion"};
    const auto caps = renderer.caps();
    if (auto it = caps.find("supports_tools"); it != caps.end() && it->second) card.capabilities.push_back("tools");
    if (renderer.supports_thinking()) card.capabilities.push_back("thinking");
    card.context_length = llm.slot_context_size();
    estimate_memory(llm, report, card);
    return card;
}

ollama::model_card make_embedding_model_card(const embedder& model, const std::string& model_path,
                                             const std::string& model_id) {
    const model_report report = inspect_model(model_path);
    ollama::model_card card;
    card.name = ollama::tagged_name(model_id);
    card.architecture = report.architecture;
    card.parameter_size = ollama::parameter_size(llama_model_n_params(model.model()));
    card.quantization_level = ollama::quantization_level(llama_model_ftype(model.model()));
    card.file_bytes = report.file_size;
    card.digest = model_fingerprint(model_path, "");
    card.modified_at = std::chrono::file_clock::to_sys(std::filesystem::last_write_time(model_path));
    card.path = model_path;
    card.model_info = model_info(model_path);
    if (!card.model_info.contains("general.parameter_count")) {
        card.model_info["general.parameter_count"] = llama_model_n_params(model.model());
    }
    card.capabilities = {"embedding"};  // Ollama's word for a model /api/embed serves
    card.context_length = model.context_size();
    card.memory_bytes = llama_model_size(model.model());  // the weights; the batch's KV and buffers are small
    card.vram_bytes = model.options().gpu_layers != 0 && !gpu_devices().empty() ? card.memory_bytes : 0;
    return card;
}

}  // namespace keepwarm

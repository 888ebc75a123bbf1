// Builds GGUF models with random weights but a real tokenizer and chat template, so the server, tests and benchmarks
// can run real llama.cpp architectures without downloading anything.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace keepwarm {

// Shape and provenance of a generated model. Zero means "derive" for head_dim (width / heads).
struct model_spec {
    std::string preset;          // only used to name the model; empty for a hand-made shape
    std::string arch = "qwen3";  // qwen3 (dense), qwen3moe (MoE), qwen35 (gated delta-net + attention hybrid),
                                 // qwen35moe (the qwen35 hybrid with experts and a shared expert),
                                 // gemma3 (dense, sliding-window attention with a full-attention layer every so often),
                                 // gpt-oss (MoE, sliding-window and full layers alternating, attention sinks)

    uint32_t n_layer = 4;
    uint32_t n_embd = 512;  // embedding_length ("width")
    uint32_t n_head = 8;
    uint32_t n_head_kv = 4;
    uint32_t head_dim = 0;  // 0: n_embd / n_head
    uint32_t n_ff = 1536;   // feed_forward_length; qwen35moe: the shared expert's
    uint32_t n_ctx_train = 32768;

    // qwen3moe, qwen35moe, gpt-oss
    uint32_t n_expert = 0;
    uint32_t n_expert_used = 0;
    uint32_t n_ff_exp = 0;  // expert_feed_forward_length

    // qwen35, qwen35moe: every full_attention_interval-th layer is attention, the others gated delta-net (recurrent)
    uint32_t full_attention_interval = 4;
    uint32_t ssm_conv_kernel = 4;
    uint32_t ssm_state_size = 128;    // head size of the linear-attention heads
    uint32_t ssm_group_count = 2;     // linear-attention key heads
    uint32_t ssm_time_step_rank = 4;  // linear-attention value heads; inner size = state size * value heads
    // qwen35, qwen35moe: multi-token prediction heads (nextn layers, <arch>.nextn_predict_layers) after the n_layer
    // blocks, as Qwen3.5 ships one: an attention block of the trunk's shape that reads the trunk's last hidden state
    // and the next token (serve --spec-type draft-mtp drafts with it). llama.cpp runs one.
    uint32_t n_mtp_layers = 0;

    // gemma3, gpt-oss: each layer attends to the last sliding_window positions, except every
    // sliding_window_pattern-th layer, which attends to all of them (Gemma 3: window 1024, one full layer in 6;
    // gpt-oss: window 128, every other layer full).
    uint32_t sliding_window = 512;
    uint32_t sliding_window_pattern = 6;

    // Embedding models: how llama.cpp pools a sequence's hidden states into one vector (<arch>.pooling_type): mean,
    // cls or last (Qwen3-Embedding's: the last token, with EOS appended to every input); rank: a reranker
    // (Qwen3-Reranker's: a yes/no classifier on the last token, and its prompt template). "" or none: a chat model.
    std::string pooling;

    std::string vocab = "qwen2";                    // models/ggml-vocab-<vocab>.gguf in the llama.cpp source tree
    std::string chat_template = "Qwen-Qwen3-0.6B";  // models/templates/<chat_template>.jinja
    std::string type = "q8_0";                      // f32 | f16 | q8_0 | q4_0
    uint64_t seed = 42;

    std::string llama_source_dir;  // empty: $KEEPWARM_LLAMA_SOURCE_DIR, else the tree keepwarm was built against

    uint32_t resolved_head_dim() const { return head_dim != 0 ? head_dim : (n_head != 0 ? n_embd / n_head : 0); }
};

// Names accepted by preset_spec(), in the order `mkmodel --help` lists them.
std::vector<std::string> preset_names();

// tiny, tiny-hybrid, tiny-moe, tiny-hybrid-moe, tiny-swa, tiny-gpt-oss, tiny-embed, tiny-rerank, tiny-draft,
// bench-dense, bench-hybrid, tiny-hybrid-mtp. Throws
// std::invalid_argument for other names.
model_spec preset_spec(const std::string& name);

// Throws std::invalid_argument naming the first problem (unknown arch/vocab/template/type, inconsistent heads, ...).
// Checks the llama.cpp source tree too, since the vocab and template files come from it.
void validate_spec(const model_spec& spec);

// general.name of the model build_model() writes, e.g. "keepwarm-random-qwen3-tiny".
std::string model_name(const model_spec& spec);

// Stable digest of everything that changes the bytes of the output (shape, vocab, template, type, seed).
std::string spec_hash(const model_spec& spec);

// Directory holding models/ggml-vocab-*.gguf and models/templates/*.jinja for this spec.
std::string llama_source_dir(const model_spec& spec);

struct build_result {
    std::string path;
    uint64_t file_size = 0;
    uint64_t n_params = 0;
    double seconds = 0;
};

// Validates, generates and writes the model to out_path atomically (temporary file in the same directory, then
// rename), so readers never see a half-written file. Same spec gives byte-identical files.
// Throws std::invalid_argument for a bad spec and std::runtime_error for I/O or llama.cpp failures.
build_result build_model(const model_spec& spec, const std::string& out_path);

}  // namespace keepwarm

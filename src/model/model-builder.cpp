// Random-weight GGUF generation: llama.cpp builds the model from our metadata and tensor list and asks us to fill
// each tensor from a seeded PRNG; we write the GGUF ourselves (so our own keys survive) and quantize with llama.cpp.
#include "model/model-builder.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <thread>

#include "engine/llama-runtime.h"
#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "ggml.h"
#include "gguf.h"
#include "llama-cpp.h"
#include "llama.h"

namespace keepwarm {

namespace fs = std::filesystem;

namespace {

// Bump when the generator changes what it writes for a given spec, so cached demo models are regenerated.
constexpr uint32_t k_generator_version = 1;

const std::vector<std::string> k_archs = {"qwen3", "qwen3moe", "qwen35", "qwen35moe", "gemma3", "gpt-oss"};
const std::vector<std::string> k_types = {"f32", "f16", "q8_0", "q4_0"};
// llama_pooling_type's values by name, as <arch>.pooling_type stores them (none: 0, mean: 1, cls: 2, last: 3, rank: 4).
const std::vector<std::string> k_poolings = {"none", "mean", "cls", "last", "rank"};

// Qwen3-Reranker's prompt, as its GGUF carries it (tokenizer.chat_template.rerank): llama-server puts the query and
// the document in, and the classifier head reads the last token's hidden state.
constexpr const char* k_rerank_template =
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n<Instruct>: Given a "
    "web "
    "search query, retrieve relevant passages that answer the query\n<Query>: {query}\n<Document>: "
    "{document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";

std::string join(const std::vector<std::string>& items) {
    std::string out;
    for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
    return out;
}

bool contains(const std::vector<std::string>& items, const std::string& item) {
    return std::find(items.begin(), items.end(), item) != items.end();
}

uint64_t fnv1a(const std::string& text, uint64_t hash = 0xcbf29ce484222325ULL) {
    for (unsigned char c : text) {
        hash ^= c;
        hash *= 0x100000001b3ULL;
    }
    return hash;
}

// Decorrelates nearby seeds (seed, seed+1, chunk indices) before they reach the Mersenne Twister.
uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

// Uniform in (0, 1] from 24 random bits: never 0, so log() stays finite (the tail is cut at 5.8 sd).
float uniform_open0(uint32_t bits) {
    return float((bits >> 8) + 1) * 0x1.0p-24f;
}

// Box-Muller by hand: std::normal_distribution's algorithm differs between standard libraries, and the same seed
// must give the same file everywhere. Float maths and one 64-bit draw per pair keep the 78M-value embedding table of
// the tiny preset under half a second per core.
void fill_normal(float* out, size_t n, std::mt19937_64& gen, float sd) {
    constexpr float two_pi = 6.2831853071795864769f;
    size_t i = 0;
    while (i < n) {
        const uint64_t bits = gen();
        const float radius = std::sqrt(-2.0f * std::log(uniform_open0(uint32_t(bits >> 32)))) * sd;
        const float angle = two_pi * uniform_open0(uint32_t(bits));
        out[i++] = radius * std::cos(angle);
        if (i < n) out[i++] = radius * std::sin(angle);
    }
}

// qwen35moe is qwen35's hybrid layout with qwen3moe-style routed experts plus a gated shared expert in each block;
// gpt-oss's blocks are all MoE too (its own tensor list: add_gpt_oss_layers).
bool is_hybrid(const std::string& arch) {
    return arch == "qwen35" || arch == "qwen35moe";
}
bool has_experts(const std::string& arch) {
    return arch == "qwen3moe" || arch == "qwen35moe" || arch == "gpt-oss";
}

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Values a trained model would have where plain noise would break the maths: RMSNorm gains of 1 keep activations
// at unit scale, and a negative delta-net decay keeps the recurrent state from growing without bound.
enum class init_kind { normal, ones, minus_ones };

init_kind kind_for_tensor(const std::string& name) {
    if (ends_with(name, "norm.weight")) return init_kind::ones;
    if (ends_with(name, ".ssm_a")) return init_kind::minus_ones;
    return init_kind::normal;
}

struct fill_state {
    uint64_t seed = 0;
    std::vector<ggml_tensor*> tensors;  // in creation order, which is deterministic for a given metadata
    std::string error;
};

// Chunks get their own PRNG stream so filling can use all cores while the bytes stay independent of the core count.
constexpr size_t k_fill_chunk = size_t(1) << 20;

void set_tensor_data(ggml_tensor* tensor, void* userdata) {
    auto* state = static_cast<fill_state*>(userdata);
    state->tensors.push_back(tensor);
    if (tensor->type != GGML_TYPE_F32 && tensor->type != GGML_TYPE_F16) {
        state->error = std::string("unexpected tensor type for ") + tensor->name;
        return;
    }
    const bool f16 = tensor->type == GGML_TYPE_F16;
    const size_t n = size_t(ggml_nelements(tensor));
    const size_t elem = f16 ? sizeof(ggml_fp16_t) : sizeof(float);
    // Fill in place when the weights live in RAM (always, as build_model loads on the CPU) to skip a copy.
    const bool host = ggml_backend_buffer_is_host(tensor->buffer);
    std::vector<uint8_t> staging(host ? 0 : ggml_nbytes(tensor));
    uint8_t* dst = host ? static_cast<uint8_t*>(tensor->data) : staging.data();

    const init_kind kind = kind_for_tensor(tensor->name);
    const uint64_t tensor_seed = splitmix64(state->seed ^ fnv1a(tensor->name));
    const size_t n_chunks = (n + k_fill_chunk - 1) / k_fill_chunk;
    std::atomic<size_t> next{0};
    auto worker = [&] {
        std::vector<float> values;
        for (size_t c = next++; c < n_chunks; c = next++) {
            const size_t begin = c * k_fill_chunk, count = std::min(k_fill_chunk, n - begin);
            values.resize(count);
            if (kind == init_kind::normal) {
                std::mt19937_64 gen(splitmix64(tensor_seed + c));
                fill_normal(values.data(), count, gen, 0.02f);
            } else {
                std::fill(values.begin(), values.end(), kind == init_kind::ones ? 1.0f : -1.0f);
            }
            if (f16) {
                ggml_fp32_to_fp16_row(values.data(), reinterpret_cast<ggml_fp16_t*>(dst + begin * elem),
                                      int64_t(count));
            } else {
                std::memcpy(dst + begin * elem, values.data(), count * elem);
            }
        }
    };
    const size_t n_threads = std::min<size_t>(n_chunks, std::max(1u, std::thread::hardware_concurrency()));
    std::vector<std::thread> threads;
    for (size_t t = 1; t < n_threads; ++t) threads.emplace_back(worker);
    worker();
    for (auto& t : threads) t.join();
    if (!host) ggml_backend_tensor_set(tensor, dst, 0, ggml_nbytes(tensor));
}

bool silent_progress(float, void*) {
    return true;
}

std::string read_file(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read " + path.string());
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
}

fs::path vocab_path(const model_spec& spec) {
    return fs::path(llama_source_dir(spec)) / "models" / ("ggml-vocab-" + spec.vocab + ".gguf");
}

fs::path template_path(const model_spec& spec) {
    return fs::path(llama_source_dir(spec)) / "models" / "templates" / (spec.chat_template + ".jinja");
}

// Names are file stems inside the source tree; anything path-like would escape it.
bool is_plain_name(const std::string& name) {
    return !name.empty() && name.find('/') == std::string::npos && name != "." && name != "..";
}

std::vector<std::string> list_stems(const fs::path& dir, const std::string& prefix, const std::string& ext) {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
        const std::string file = entry.path().filename().string();
        if (file.rfind(prefix, 0) == 0 && ends_with(file, ext)) {
            names.push_back(file.substr(prefix.size(), file.size() - prefix.size() - ext.size()));
        }
    }
    std::sort(names.begin(), names.end());
    return names;
}

void require(bool ok, const std::string& message) {
    if (!ok) throw std::invalid_argument(message);
}

// The four rope sections of qwen35's multimodal rope, for text-only use: split the rotary pairs over the first three.
std::vector<int32_t> rope_sections(uint32_t rope_dims) {
    const int32_t pairs = int32_t(rope_dims / 2);
    return {pairs / 3 + (pairs % 3 > 0), pairs / 3 + (pairs % 3 > 1), pairs / 3, 0};
}

void set_u32(gguf_context* ctx, const std::string& key, uint32_t value) {
    gguf_set_val_u32(ctx, key.c_str(), value);
}
void set_f32(gguf_context* ctx, const std::string& key, float value) {
    gguf_set_val_f32(ctx, key.c_str(), value);
}

// Tokenizer keys only: the vocab files also carry the hyperparameters of whatever model they came from.
void copy_tokenizer(gguf_context* meta, const model_spec& spec) {
    const fs::path path = vocab_path(spec);
    gguf_init_params params{/*no_alloc =*/true, /*ctx =*/nullptr};
    gguf_context_ptr vocab(gguf_init_from_file(path.c_str(), params));
    if (!vocab) throw std::runtime_error("cannot read vocab file " + path.string());

    gguf_context_ptr tokenizer(gguf_init_empty());
    gguf_set_kv(tokenizer.get(), vocab.get());
    for (int64_t i = gguf_get_n_kv(tokenizer.get()) - 1; i >= 0; --i) {
        const std::string key = gguf_get_key(tokenizer.get(), i);
        if (key.rfind("tokenizer.", 0) != 0 || key == "tokenizer.chat_template") {
            gguf_remove_key(tokenizer.get(), key.c_str());
        }
    }
    gguf_set_kv(meta, tokenizer.get());

    const int64_t tokens_id = gguf_find_key(meta, "tokenizer.ggml.tokens");
    if (tokens_id < 0) throw std::runtime_error(path.string() + " has no tokenizer.ggml.tokens");
    const size_t n_tokens = gguf_get_arr_n(meta, tokens_id);
    set_u32(meta, spec.arch + ".vocab_size", uint32_t(n_tokens));

    // Released Qwen chat models end a turn with <|im_end|> and use it as EOS; the vocab files keep the base model's
    // <|endoftext|>. Matching the released models makes the server stop where it would with real weights.
    for (size_t i = 0; i < n_tokens; ++i) {
        if (std::strcmp(gguf_get_arr_str(meta, tokens_id, i), "<|im_end|>") == 0) {
            gguf_set_val_u32(meta, "tokenizer.ggml.eos_token_id", uint32_t(i));
            gguf_set_val_bool(meta, "tokenizer.ggml.add_bos_token", false);
            break;
        }
    }
}

// An embedding model: its pooling type, and for last-token pooling Qwen3-Embedding's tokenizer, which appends
// <|endoftext|> to every input (the hidden state there is the embedding), so llama.cpp's tokenizer adds it as EOS. A
// reranker (rank): Qwen3-Reranker's classifier labels and its prompt (the head is cls.output, add_tensor_list).
void add_pooling(gguf_context* meta, const model_spec& spec) {
    const auto it = std::find(k_poolings.begin(), k_poolings.end(), spec.pooling);
    set_u32(meta, spec.arch + ".pooling_type", uint32_t(it - k_poolings.begin()));
    if (spec.pooling == "rank") {
        const char* labels[] = {"yes", "no"};  // llama.cpp's qwen3 head: a softmax over them; the score is "yes"
        gguf_set_arr_str(meta, (spec.arch + ".classifier.output_labels").c_str(), labels, 2);
        gguf_set_val_str(meta, "tokenizer.chat_template.rerank", k_rerank_template);
        return;
    }
    if (spec.pooling != "last") return;
    const int64_t tokens_id = gguf_find_key(meta, "tokenizer.ggml.tokens");
    const size_t n_tokens = gguf_get_arr_n(meta, tokens_id);
    for (size_t i = 0; i < n_tokens; ++i) {
        if (std::strcmp(gguf_get_arr_str(meta, tokens_id, i), "<|endoftext|>") == 0) {
            gguf_set_val_u32(meta, "tokenizer.ggml.eos_token_id", uint32_t(i));
            gguf_set_val_bool(meta, "tokenizer.ggml.add_eos_token", true);
            return;
        }
    }
}

// gpt-oss speaks harmony (<|start|>assistant<|channel|>analysis<|message|>...<|end|>), and its o200k_harmony
// tokenizer is not among llama.cpp's vocab files. The Qwen vocab gets harmony's special tokens appended as control
// tokens, so the template's markup tokenizes to single tokens and common/chat's harmony parser sees the same token
// stream as with the real tokenizer. llama-vocab.cpp finds them by their text: <|return|> and <|call|> end generation,
// and with both present it drops <|end|> from the end-of-generation set, as for the real gpt-oss (an answer goes on
// after its analysis message's <|end|>). EOS is <|return|> and BOS <|startoftext|>, as in released gpt-oss GGUFs;
// the template writes neither.
void add_harmony_tokens(gguf_context* meta, const model_spec& spec) {
    static const std::vector<std::string> harmony = {"<|startoftext|>", "<|return|>", "<|constrain|>", "<|channel|>",
                                                     "<|start|>",       "<|end|>",    "<|message|>",   "<|call|>"};
    constexpr int32_t control = 3;  // LLAMA_TOKEN_TYPE_CONTROL

    const int64_t tokens_id = gguf_find_key(meta, "tokenizer.ggml.tokens");
    const int64_t types_id = gguf_find_key(meta, "tokenizer.ggml.token_type");
    if (tokens_id < 0 || types_id < 0) throw std::runtime_error("the " + spec.vocab + " vocab has no token types");
    const size_t n_old = gguf_get_arr_n(meta, tokens_id);
    if (gguf_get_arr_type(meta, types_id) != GGUF_TYPE_INT32 || gguf_get_arr_n(meta, types_id) != n_old) {
        throw std::runtime_error("the " + spec.vocab + " vocab's token types do not match its tokens");
    }

    std::vector<std::string> texts;
    std::vector<int32_t> types;
    for (size_t i = 0; i < n_old; ++i) {
        texts.emplace_back(gguf_get_arr_str(meta, tokens_id, i));
        types.push_back(static_cast<const int32_t*>(gguf_get_arr_data(meta, types_id))[i]);
    }
    for (const auto& token : harmony) {
        if (std::find(texts.begin(), texts.end(), token) != texts.end()) {
            throw std::invalid_argument("the " + spec.vocab + " vocab already has " + token +
                                        ": gpt-oss takes a vocab without harmony's tokens (e.g. qwen2)");
        }
        texts.push_back(token);
        types.push_back(control);
    }
    std::vector<const char*> ptrs;
    for (const auto& t : texts) ptrs.push_back(t.c_str());
    gguf_set_arr_str(meta, "tokenizer.ggml.tokens", ptrs.data(), ptrs.size());
    gguf_set_arr_data(meta, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types.data(), types.size());
    if (const int64_t scores_id = gguf_find_key(meta, "tokenizer.ggml.scores"); scores_id >= 0) {
        std::vector<float> scores(static_cast<const float*>(gguf_get_arr_data(meta, scores_id)),
                                  static_cast<const float*>(gguf_get_arr_data(meta, scores_id)) + n_old);
        scores.resize(texts.size(), 0.0f);
        gguf_set_arr_data(meta, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores.data(), scores.size());
    }
    auto id_of = [&](const std::string& token) {
        return uint32_t(std::find(texts.begin(), texts.end(), token) - texts.begin());
    };
    gguf_set_val_u32(meta, "tokenizer.ggml.bos_token_id", id_of("<|startoftext|>"));
    gguf_set_val_u32(meta, "tokenizer.ggml.eos_token_id", id_of("<|return|>"));
    gguf_set_val_bool(meta, "tokenizer.ggml.add_bos_token", false);
    set_u32(meta, spec.arch + ".vocab_size", uint32_t(texts.size()));
}

// The type llama.cpp creates a tensor with before any quantization. Matrices start as F16 unless F32 was asked for:
// it halves the temporary file, and llama_model_quantize converts from F16 as readily as from F32. Vectors, the
// MoE router and the delta-net convolution stay F32, as in released GGUFs (ggml's ssm_conv needs F32), and so do
// biases, gpt-oss's per-expert ones included (a matrix of one bias row per expert).
ggml_type initial_type(const model_spec& spec, const std::string& name, size_t n_dims) {
    if (spec.type == "f32" || n_dims < 2 || ends_with(name, ".bias")) return GGML_TYPE_F32;
    if (name.find("ffn_gate_inp") != std::string::npos || name.find("ssm_conv1d") != std::string::npos) {
        return GGML_TYPE_F32;
    }
    return GGML_TYPE_F16;
}

void add_tensor_info(gguf_context* ctx, const model_spec& spec, const std::string& name,
                     std::initializer_list<int64_t> ne) {
    ggml_tensor t;
    std::memset(&t, 0, sizeof(t));
    t.type = initial_type(spec, name, ne.size());
    size_t dim = 0;
    for (int64_t n : ne) t.ne[dim++] = n;
    for (; dim < GGML_MAX_DIMS; ++dim) t.ne[dim] = 1;
    t.nb[0] = ggml_type_size(t.type);
    for (dim = 1; dim < GGML_MAX_DIMS; ++dim) t.nb[dim] = t.nb[dim - 1] * size_t(t.ne[dim - 1]);
    ggml_set_name(&t, name.c_str());
    gguf_add_tensor(ctx, &t);
}

// gpt-oss blocks: biased attention projections with a learned sink logit per head, a post-attention norm in place of
// the FFN norm, and biased experts (router included) with no shared FFN.
void add_gpt_oss_layers(gguf_context* m, const model_spec& s) {
    const int64_t n_embd = s.n_embd, hd = s.resolved_head_dim();
    const int64_t q_dim = hd * s.n_head, kv_dim = hd * s.n_head_kv;
    const int64_t n_exp = s.n_expert, ff_exp = s.n_ff_exp;
    for (uint32_t il = 0; il < s.n_layer; ++il) {
        const std::string blk = "blk." + std::to_string(il) + ".";
        auto add = [&](const std::string& name, std::initializer_list<int64_t> ne) {
            add_tensor_info(m, s, blk + name, ne);
        };
        add("attn_norm.weight", {n_embd});
        add("attn_q.weight", {n_embd, q_dim});
        add("attn_q.bias", {q_dim});
        add("attn_k.weight", {n_embd, kv_dim});
        add("attn_k.bias", {kv_dim});
        add("attn_v.weight", {n_embd, kv_dim});
        add("attn_v.bias", {kv_dim});
        add("attn_output.weight", {q_dim, n_embd});
        add("attn_output.bias", {n_embd});
        add("attn_sinks.weight", {s.n_head});
        add("post_attention_norm.weight", {n_embd});
        add("ffn_gate_inp.weight", {n_embd, n_exp});
        add("ffn_gate_inp.bias", {n_exp});
        add("ffn_gate_exps.weight", {n_embd, ff_exp, n_exp});
        add("ffn_gate_exps.bias", {ff_exp, n_exp});
        add("ffn_down_exps.weight", {ff_exp, n_embd, n_exp});
        add("ffn_down_exps.bias", {n_embd, n_exp});
        add("ffn_up_exps.weight", {n_embd, ff_exp, n_exp});
        add("ffn_up_exps.bias", {ff_exp, n_exp});
    }
}

// llama_model_init_from_user expects the metadata to list every tensor the model will have: it checks the count,
// takes each one's type from here, and leaves out optional tensors that are not listed (qwen35's fused qkv and
// gate projections are optional to the loader but needed by its graph). No output.weight: embeddings are tied, as in
// the small Qwen3 models, which keeps the file half the size; gpt-oss's loader requires its own.
void add_tensor_list(gguf_context* m, const model_spec& s) {
    const int64_t n_embd = s.n_embd, n_ff = s.n_ff, hd = s.resolved_head_dim();
    const int64_t q_dim = hd * s.n_head, kv_dim = hd * s.n_head_kv;
    const int64_t n_vocab = int64_t(gguf_get_val_u32(m, gguf_find_key(m, (s.arch + ".vocab_size").c_str())));
    add_tensor_info(m, s, "token_embd.weight", {n_embd, n_vocab});
    add_tensor_info(m, s, "output_norm.weight", {n_embd});
    if (s.pooling == "rank") add_tensor_info(m, s, "cls.output.weight", {n_embd, 2});  // the reranker's yes/no
    if (s.arch == "gpt-oss") {
        add_tensor_info(m, s, "output.weight", {n_embd, n_vocab});
        add_gpt_oss_layers(m, s);
        return;
    }
    // The MTP heads follow the trunk's blocks: attention blocks with the trunk's feed-forward part and the nextn
    // projections (the token's embedding and the trunk's hidden state, each normalized, concatenated and projected back
    // to the width). Their own embedding table, output norm and head are optional to llama.cpp, which then takes the
    // model's: left out, as the tied output is.
    for (uint32_t il = 0; il < s.n_layer + s.n_mtp_layers; ++il) {
        const std::string blk = "blk." + std::to_string(il) + ".";
        auto add = [&](const std::string& name, std::initializer_list<int64_t> ne) {
            add_tensor_info(m, s, blk + name, ne);
        };
        add("attn_norm.weight", {n_embd});
        const bool mtp_head = il >= s.n_layer;
        if (mtp_head) {
            add("nextn.eh_proj.weight", {2 * n_embd, n_embd});
            add("nextn.enorm.weight", {n_embd});
            add("nextn.hnorm.weight", {n_embd});
        }
        const bool recurrent = is_hybrid(s.arch) && !mtp_head && (il + 1) % s.full_attention_interval != 0;
        if (recurrent) {
            const int64_t state = s.ssm_state_size, v_heads = s.ssm_time_step_rank;
            const int64_t key_dim = state * s.ssm_group_count, value_dim = state * v_heads;
            add("attn_qkv.weight", {n_embd, 2 * key_dim + value_dim});
            add("attn_gate.weight", {n_embd, value_dim});
            add("ssm_conv1d.weight", {s.ssm_conv_kernel, 2 * key_dim + value_dim});
            add("ssm_dt.bias", {v_heads});
            add("ssm_a", {v_heads});
            add("ssm_beta.weight", {n_embd, v_heads});
            add("ssm_alpha.weight", {n_embd, v_heads});
            add("ssm_norm.weight", {state});
            add("ssm_out.weight", {value_dim, n_embd});
        } else {
            // qwen35 attention projects a per-head output gate together with the queries.
            add("attn_q.weight", {n_embd, is_hybrid(s.arch) ? 2 * q_dim : q_dim});
            add("attn_k.weight", {n_embd, kv_dim});
            add("attn_v.weight", {n_embd, kv_dim});
            add("attn_output.weight", {q_dim, n_embd});
            add("attn_q_norm.weight", {hd});
            add("attn_k_norm.weight", {hd});
        }
        if (is_hybrid(s.arch)) {
            add("post_attention_norm.weight", {n_embd});
        } else {
            add("ffn_norm.weight", {n_embd});
        }
        if (s.arch == "gemma3") {  // Gemma normalizes each sublayer's output too, before the residual add
            add("post_attention_norm.weight", {n_embd});
            add("post_ffw_norm.weight", {n_embd});
        }
        if (has_experts(s.arch)) {
            const int64_t n_exp = s.n_expert, ff_exp = s.n_ff_exp;
            add("ffn_gate_inp.weight", {n_embd, n_exp});
            add("ffn_gate_exps.weight", {n_embd, ff_exp, n_exp});
            add("ffn_down_exps.weight", {ff_exp, n_embd, n_exp});
            add("ffn_up_exps.weight", {n_embd, ff_exp, n_exp});
        }
        if (s.arch == "qwen35moe") {
            // The shared expert runs for every token, scaled by a sigmoid gate (one logit per token); ff is its size.
            add("ffn_gate_inp_shexp.weight", {n_embd});
            add("ffn_gate_shexp.weight", {n_embd, n_ff});
            add("ffn_down_shexp.weight", {n_ff, n_embd});
            add("ffn_up_shexp.weight", {n_embd, n_ff});
        }
        if (!has_experts(s.arch)) {
            add("ffn_gate.weight", {n_embd, n_ff});
            add("ffn_down.weight", {n_ff, n_embd});
            add("ffn_up.weight", {n_embd, n_ff});
        }
    }
}

gguf_context_ptr make_metadata(const model_spec& spec) {
    gguf_context_ptr meta(gguf_init_empty());
    gguf_context* m = meta.get();
    const std::string& a = spec.arch;
    const uint32_t head_dim = spec.resolved_head_dim();

    gguf_set_val_str(m, "general.architecture", a.c_str());
    gguf_set_val_str(m, "general.type", "model");
    gguf_set_val_str(m, "general.name", model_name(spec).c_str());
    gguf_set_val_str(m, "general.description", "random weights generated by keepwarm mkmodel: output is noise");
    gguf_set_val_bool(m, "keepwarm.random_weights", true);
    gguf_set_val_u64(m, "keepwarm.seed", spec.seed);
    gguf_set_val_str(m, "keepwarm.spec_hash", spec_hash(spec).c_str());
    if (!spec.preset.empty()) gguf_set_val_str(m, "keepwarm.preset", spec.preset.c_str());

    set_u32(m, a + ".context_length", spec.n_ctx_train);
    set_u32(m, a + ".embedding_length", spec.n_embd);
    set_u32(m, a + ".block_count", spec.n_layer + spec.n_mtp_layers);
    if (spec.n_mtp_layers > 0) set_u32(m, a + ".nextn_predict_layers", spec.n_mtp_layers);
    set_u32(m, a + ".feed_forward_length", spec.n_ff);
    set_u32(m, a + ".attention.head_count", spec.n_head);
    set_u32(m, a + ".attention.head_count_kv", spec.n_head_kv);
    set_u32(m, a + ".attention.key_length", head_dim);
    set_u32(m, a + ".attention.value_length", head_dim);
    set_f32(m, a + ".attention.layer_norm_rms_epsilon", a == "gpt-oss" ? 1e-5f : 1e-6f);
    set_f32(m, a + ".rope.freq_base", is_hybrid(a) ? 10000000.0f : a == "gpt-oss" ? 150000.0f : 1000000.0f);

    if (has_experts(a)) {
        set_u32(m, a + ".expert_count", spec.n_expert);
        set_u32(m, a + ".expert_used_count", spec.n_expert_used);
        set_u32(m, a + ".expert_feed_forward_length", spec.n_ff_exp);
    }
    if (a == "qwen35moe") set_u32(m, a + ".expert_shared_feed_forward_length", spec.n_ff);
    if (is_hybrid(a)) {
        // Qwen3.5 rotates a quarter of each head (partial_rotary_factor 0.25).
        const uint32_t rope_dims = head_dim / 4;
        const std::vector<int32_t> sections = rope_sections(rope_dims);
        set_u32(m, a + ".rope.dimension_count", rope_dims);
        gguf_set_arr_data(m, (a + ".rope.dimension_sections").c_str(), GGUF_TYPE_INT32, sections.data(),
                          sections.size());
        set_u32(m, a + ".full_attention_interval", spec.full_attention_interval);
        set_u32(m, a + ".ssm.conv_kernel", spec.ssm_conv_kernel);
        set_u32(m, a + ".ssm.state_size", spec.ssm_state_size);
        set_u32(m, a + ".ssm.group_count", spec.ssm_group_count);
        set_u32(m, a + ".ssm.time_step_rank", spec.ssm_time_step_rank);
        set_u32(m, a + ".ssm.inner_size", spec.ssm_state_size * spec.ssm_time_step_rank);
    }

    if (a == "gemma3") {
        // Local layers rotate with Gemma 3's own base; the full-attention layers keep the long-context one above.
        set_u32(m, a + ".attention.sliding_window", spec.sliding_window);
        set_u32(m, a + ".attention.sliding_window_pattern", spec.sliding_window_pattern);
        set_f32(m, a + ".rope.freq_base_swa", 10000.0f);
    }

    if (a == "gpt-oss") {
        // Both kinds of layer rotate with one base; gpt-oss stretches a 4096-token rope to its context with YaRN.
        set_u32(m, a + ".attention.sliding_window", spec.sliding_window);
        set_u32(m, a + ".attention.sliding_window_pattern", spec.sliding_window_pattern);
        gguf_set_val_str(m, (a + ".rope.scaling.type").c_str(), "yarn");
        set_f32(m, a + ".rope.scaling.factor", float(std::max(1u, spec.n_ctx_train / 4096)));
        set_u32(m, a + ".rope.scaling.original_context_length", std::min(4096u, spec.n_ctx_train));
    }

    copy_tokenizer(m, spec);
    if (a == "gpt-oss") add_harmony_tokens(m, spec);
    if (!spec.pooling.empty() && spec.pooling != "none") add_pooling(m, spec);
    gguf_set_val_str(m, "tokenizer.chat_template", read_file(template_path(spec)).c_str());
    add_tensor_list(m, spec);
    return meta;
}

llama_ftype ftype_for(const std::string& type) {
    if (type == "f16") return LLAMA_FTYPE_MOSTLY_F16;
    if (type == "q8_0") return LLAMA_FTYPE_MOSTLY_Q8_0;
    if (type == "q4_0") return LLAMA_FTYPE_MOSTLY_Q4_0;
    return LLAMA_FTYPE_ALL_F32;
}

std::atomic<uint64_t> g_temp_counter{0};

std::string temp_path_for(const fs::path& out, const std::string& tag) {
    return out.string() + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(g_temp_counter++) + tag;
}

// Removes whatever temporary files are still there when build_model leaves, by success or by exception.
struct temp_files {
    std::vector<std::string> paths;
    ~temp_files() {
        for (const auto& p : paths) {
            std::error_code ec;
            fs::remove(p, ec);
        }
    }
};

// Fails before minutes of work if the destination can't take the file.
void check_writable(const fs::path& out, const std::string& probe) {
    std::error_code ec;
    if (fs::is_directory(out, ec)) throw std::invalid_argument("output path " + out.string() + " is a directory");
    FILE* f = std::fopen(probe.c_str(), "wb");
    if (!f) {
        const fs::path dir = out.has_parent_path() ? out.parent_path() : fs::path(".");
        throw std::runtime_error("cannot write to " + dir.string() + ": " + std::strerror(errno));
    }
    std::fclose(f);
}

}  // namespace

std::vector<std::string> preset_names() {
    return {"tiny",       "tiny-hybrid", "tiny-moe",   "tiny-hybrid-moe", "tiny-swa",     "tiny-gpt-oss",
            "tiny-embed", "tiny-rerank", "tiny-draft", "bench-dense",     "bench-hybrid", "tiny-hybrid-mtp"};
}

model_spec preset_spec(const std::string& name) {
    model_spec spec;
    spec.preset = name;
    if (name == "tiny") {
        // Small enough to generate in about a second and prefill thousands of tokens per second on two cores; the
        // size is dominated by the 152K-token embedding table.
        return spec;
    }
    if (name == "tiny-moe") {
        spec.arch = "qwen3moe";
        spec.n_expert = 8;
        spec.n_expert_used = 2;
        spec.n_ff_exp = 256;
        return spec;
    }
    if (name == "tiny-hybrid") {
        spec.arch = "qwen35";
        spec.n_head_kv = 2;
        spec.vocab = "qwen35";
        spec.chat_template = "Qwen3.5-4B";
        return spec;
    }
    if (name == "tiny-hybrid-mtp") {
        // tiny-hybrid with Qwen3.5's multi-token prediction head (one nextn layer), for serve --spec-type draft-mtp.
        spec = preset_spec("tiny-hybrid");
        spec.preset = name;
        spec.n_mtp_layers = 1;
        return spec;
    }
    if (name == "tiny-hybrid-moe") {
        // Qwen3.5-35B-A3B / Qwen3-Next's layout (delta-net layers, full attention every 4th; 8 routed experts of which
        // 2 run per token, plus the shared expert) at tiny-hybrid's scale. As in those models, the shared expert is as
        // large as a routed one.
        spec.arch = "qwen35moe";
        spec.n_head_kv = 2;
        spec.n_ff = 256;
        spec.n_expert = 8;
        spec.n_expert_used = 2;
        spec.n_ff_exp = 256;
        spec.vocab = "qwen35";
        spec.chat_template = "Qwen3.5-4B";
        return spec;
    }
    if (name == "tiny-swa") {
        // Gemma 3's layout (five sliding-window layers, then one full) with a 512-token window, so prompts of a few
        // thousand tokens cross it many times; the Gemma 4 tokenizer and chat template (262K-token vocab).
        spec.arch = "gemma3";
        spec.n_layer = 6;
        spec.sliding_window = 512;
        spec.sliding_window_pattern = 6;
        spec.vocab = "gemma-4";
        spec.chat_template = "google-gemma-4-31B-it";
        return spec;
    }
    if (name == "tiny-gpt-oss") {
        // gpt-oss's layout (sliding-window and full layers alternating, window 128 as released, attention sinks, a
        // biased MoE of 4 experts in 32 shrunk to 2 in 8) with the harmony template; the Qwen tokenizer plus harmony's
        // special tokens stands in for o200k_harmony (see add_harmony_tokens).
        spec.arch = "gpt-oss";
        spec.n_head_kv = 2;
        spec.n_head = 8;
        spec.head_dim = 64;
        spec.n_expert = 8;
        spec.n_expert_used = 2;
        spec.n_ff_exp = 256;
        spec.sliding_window = 128;
        spec.sliding_window_pattern = 2;
        spec.chat_template = "openai-gpt-oss-120b";
        return spec;
    }
    if (name == "tiny-embed") {
        // Qwen3-Embedding's shape (qwen3, last-token pooling, EOS appended) at a width that keeps the file near 20 MB,
        // most of it the 152K-token embedding table.
        spec.n_layer = 2;
        spec.n_embd = 128;
        spec.n_head = 4;
        spec.n_head_kv = 2;
        spec.n_ff = 384;
        spec.pooling = "last";
        return spec;
    }
    if (name == "tiny-rerank") {
        // Qwen3-Reranker's shape: tiny-embed's with rank pooling, its prompt template and a yes/no classifier head on
        // the last token.
        spec = preset_spec("tiny-embed");
        spec.preset = name;
        spec.pooling = "rank";
        return spec;
    }
    if (name == "tiny-draft") {
        // A draft model for tiny and bench-dense (speculative decoding, serve -md): their tokenizer and chat template,
        // one narrow layer, so that a drafted token costs a fraction of the target's. Its weights are random too: it
        // agrees with the target only by chance.
        spec.n_layer = 1;
        spec.n_embd = 128;
        spec.n_head = 4;
        spec.n_head_kv = 2;
        spec.n_ff = 384;
        return spec;
    }
    if (name == "bench-dense" || name == "bench-hybrid") {
        // Attention shaped like Qwen3-0.6B (16 heads of 128, 8 KV heads), so per-token compute and KV bytes are
        // realistic; 12 layers keep it quick to generate.
        spec.n_layer = 12;
        spec.n_embd = 1024;
        spec.n_head = 16;
        spec.n_head_kv = 8;
        spec.head_dim = 128;
        spec.n_ff = 3072;
        if (name == "bench-hybrid") {
            spec.arch = "qwen35";
            spec.ssm_group_count = 16;
            spec.ssm_time_step_rank = 16;
            spec.vocab = "qwen35";
            spec.chat_template = "Qwen3.5-4B";
        }
        return spec;
    }
    throw std::invalid_argument("unknown preset '" + name + "' (known: " + join(preset_names()) + ")");
}

std::string llama_source_dir(const model_spec& spec) {
    if (!spec.llama_source_dir.empty()) return spec.llama_source_dir;
    if (const char* env = std::getenv("KEEPWARM_LLAMA_SOURCE_DIR"); env && *env) return env;
    return KEEPWARM_LLAMA_SOURCE_DIR;
}

void validate_spec(const model_spec& s) {
    require(contains(k_archs, s.arch), "unknown architecture '" + s.arch + "' (known: " + join(k_archs) + ")");
    require(contains(k_types, s.type), "unknown weight type '" + s.type + "' (known: " + join(k_types) + ")");

    require(s.n_layer >= 1 && s.n_layer <= 512, "layers must be between 1 and 512, got " + std::to_string(s.n_layer));
    require(s.n_embd >= 32 && s.n_embd % 32 == 0,
            "width must be a positive multiple of 32, got " + std::to_string(s.n_embd));
    require(s.n_head >= 1, "heads must be at least 1");
    require(s.n_head_kv >= 1, "kv-heads must be at least 1");
    require(s.n_head % s.n_head_kv == 0,
            "kv-heads (" + std::to_string(s.n_head_kv) + ") must divide heads (" + std::to_string(s.n_head) + ")");
    if (s.head_dim == 0) {
        require(s.n_embd % s.n_head == 0, "heads (" + std::to_string(s.n_head) + ") must divide width (" +
                                              std::to_string(s.n_embd) + "), or give --head-dim");
    }
    const uint32_t head_dim = s.resolved_head_dim();
    require(head_dim >= 8 && head_dim % 2 == 0,
            "head size must be even and at least 8, got " + std::to_string(head_dim));
    require(s.n_ff >= 1, "ff must be at least 1");
    require(s.n_ctx_train >= 16, "ctx must be at least 16, got " + std::to_string(s.n_ctx_train));

    const bool moe = has_experts(s.arch);
    if (moe) {
        require(s.n_expert >= 1 && s.n_expert <= 1024,
                s.arch + " needs experts between 1 and 1024, got " + std::to_string(s.n_expert));
        require(s.n_expert_used >= 1 && s.n_expert_used <= s.n_expert, "experts-used must be between 1 and experts (" +
                                                                           std::to_string(s.n_expert) + "), got " +
                                                                           std::to_string(s.n_expert_used));
        require(s.n_ff_exp >= 1, s.arch + " needs expert-ff of at least 1");
    } else {
        require(s.n_expert == 0 && s.n_expert_used == 0 && s.n_ff_exp == 0,
                "experts, experts-used and expert-ff only apply to qwen3moe, qwen35moe and gpt-oss, not " + s.arch);
    }
    if (is_hybrid(s.arch)) {
        require(head_dim % 8 == 0, s.arch + " needs a head size divisible by 8 (a quarter of it is rotated), got " +
                                       std::to_string(head_dim));
        require(s.full_attention_interval >= 1 && s.full_attention_interval <= s.n_layer,
                "full attention interval must be between 1 and layers (" + std::to_string(s.n_layer) + ")");
        require(s.ssm_conv_kernel >= 2, "ssm conv kernel must be at least 2");
        require(s.ssm_state_size >= 1 && s.ssm_group_count >= 1 && s.ssm_time_step_rank >= 1,
                "ssm state size, group count and time step rank must be at least 1");
        require(s.ssm_time_step_rank % s.ssm_group_count == 0,
                "ssm value heads (time step rank) must be a multiple of the key heads (group count)");
        // llama.cpp's qwen35 and qwen35moe graphs run a single MTP block.
        require(s.n_mtp_layers <= 1, s.arch + " takes at most 1 MTP head, got " + std::to_string(s.n_mtp_layers));
    } else {
        require(s.n_mtp_layers == 0, "MTP heads only apply to qwen35 and qwen35moe, not " + s.arch);
    }
    if (s.arch == "gemma3" || s.arch == "gpt-oss") {
        require(s.sliding_window >= 1, s.arch + " needs a sliding window of at least 1 token");
        require(s.sliding_window_pattern >= 1, s.arch + " needs a sliding window pattern of at least 1");
    }
    if (s.type == "q8_0" || s.type == "q4_0") {
        // Rows are quantized in blocks of 32; llama.cpp would silently fall back to another type otherwise.
        auto block = [&](uint64_t n, const std::string& what) {
            require(n % 32 == 0, what + " (" + std::to_string(n) + ") must be a multiple of 32 for " + s.type);
        };
        block(uint64_t(s.n_head) * head_dim, "heads x head size");
        if (!moe || s.arch == "qwen35moe") block(s.n_ff, s.arch == "qwen35moe" ? "ff (the shared expert's)" : "ff");
        if (moe) block(s.n_ff_exp, "expert-ff");
        if (is_hybrid(s.arch)) block(uint64_t(s.ssm_state_size) * s.ssm_time_step_rank, "ssm inner size");
    }

    require(s.pooling.empty() || contains(k_poolings, s.pooling),
            "unknown pooling '" + s.pooling + "' (known: " + join(k_poolings) + ")");

    require(is_plain_name(s.vocab), "vocab must be a name like qwen2, got '" + s.vocab + "'");
    require(is_plain_name(s.chat_template),
            "template must be a name like Qwen-Qwen3-0.6B, got '" + s.chat_template + "'");
    const fs::path source = llama_source_dir(s);
    std::error_code ec;
    if (!fs::is_directory(source / "models", ec)) {
        throw std::invalid_argument("llama.cpp source tree not found at " + source.string() +
                                    " (vocab and template files come from its models/ folder); set "
                                    "KEEPWARM_LLAMA_SOURCE_DIR or --llama-source");
    }
    if (!fs::is_regular_file(vocab_path(s), ec)) {
        throw std::invalid_argument("unknown vocab '" + s.vocab +
                                    "' (known: " + join(list_stems(source / "models", "ggml-vocab-", ".gguf")) + ")");
    }
    if (!fs::is_regular_file(template_path(s), ec)) {
        throw std::invalid_argument("unknown template '" + s.chat_template + "': no " + template_path(s).string());
    }
}

std::string model_name(const model_spec& spec) {
    return "keepwarm-random-" + spec.arch + "-" + (spec.preset.empty() ? "custom" : spec.preset);
}

std::string spec_hash(const model_spec& s) {
    std::ostringstream text;
    text << k_generator_version << '|' << s.arch << '|' << s.n_layer << '|' << s.n_embd << '|' << s.n_head << '|'
         << s.n_head_kv << '|' << s.resolved_head_dim() << '|' << s.n_ff << '|' << s.n_ctx_train << '|' << s.n_expert
         << '|' << s.n_expert_used << '|' << s.n_ff_exp << '|' << s.full_attention_interval << '|' << s.ssm_conv_kernel
         << '|' << s.ssm_state_size << '|' << s.ssm_group_count << '|' << s.ssm_time_step_rank << '|' << s.vocab << '|'
         << s.chat_template << '|' << s.type << '|' << s.seed << '|' << s.preset;
    // Only where it applies, so the digests (and cached files) of the other architectures stay what they were.
    if (s.arch == "gemma3" || s.arch == "gpt-oss") text << '|' << s.sliding_window << '|' << s.sliding_window_pattern;
    if (!s.pooling.empty()) text << "|pooling=" << s.pooling;
    if (s.n_mtp_layers > 0) text << "|mtp=" << s.n_mtp_layers;
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(fnv1a(text.str())));
    return hex;
}

build_result build_model(const model_spec& spec, const std::string& out_path) {
    const auto start = std::chrono::steady_clock::now();
    validate_spec(spec);
    if (out_path.empty()) throw std::invalid_argument("no output path given");
    const fs::path out(out_path);

    temp_files temps;
    // Weights as llama.cpp created them (F32, or F16 matrices); the output itself unless quantizing.
    const std::string initial_path = temp_path_for(out, spec.type == "f32" ? ".f32" : ".f16");
    temps.paths.push_back(initial_path);
    check_writable(out, initial_path);

    gguf_context_ptr meta = make_metadata(spec);

    init_llama_runtime();
    // CPU only: the weights are written out straight away, and a GPU would only add copies.
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!cpu) throw std::runtime_error("llama.cpp has no CPU backend loaded");
    ggml_backend_dev_t devices[] = {cpu, nullptr};
    llama_model_params params = llama_model_default_params();
    params.devices = devices;
    params.n_gpu_layers = 0;
    params.progress_callback = silent_progress;
    params.load_mtp = spec.n_mtp_layers > 0;  // else llama.cpp skips the MTP heads' tensors

    fill_state state;
    state.seed = spec.seed;
    uint64_t n_params = 0;
    {
        llama_model_ptr model(llama_model_init_from_user(meta.get(), set_tensor_data, &state, params));
        if (!model) throw std::runtime_error("llama.cpp could not create a " + spec.arch + " model of this shape");
        if (!state.error.empty()) throw std::runtime_error(state.error);

        gguf_context_ptr file(gguf_init_empty());
        gguf_set_kv(file.get(), meta.get());
        gguf_set_val_u32(file.get(), "general.file_type",
                         spec.type == "f32" ? LLAMA_FTYPE_ALL_F32 : LLAMA_FTYPE_MOSTLY_F16);
        // A tied output matrix comes back as a second tensor named token_embd.weight holding the same values.
        std::set<std::string> seen;
        for (ggml_tensor* t : state.tensors) {
            if (!seen.insert(t->name).second) continue;
            gguf_add_tensor(file.get(), t);
            n_params += uint64_t(ggml_nelements(t));
        }
        if (!gguf_write_to_file(file.get(), initial_path.c_str(), false)) {
            throw std::runtime_error("failed to write " + initial_path + ": " + std::strerror(errno));
        }
    }

    std::string final_tmp = initial_path;
    if (spec.type != "f32" && spec.type != "f16") {
        final_tmp = temp_path_for(out, "." + spec.type);
        temps.paths.push_back(final_tmp);
        llama_model_quantize_params qparams = llama_model_quantize_default_params();
        qparams.ftype = ftype_for(spec.type);
        qparams.nthread = int32_t(std::max(1u, std::thread::hardware_concurrency()));
        // Every matrix gets the requested type (llama-quantize would mix in Q6_K/Q4_1), so --type alone decides
        // the size and the compute cost of the model.
        qparams.pure = true;
        if (llama_model_quantize(initial_path.c_str(), final_tmp.c_str(), &qparams) != 0) {
            throw std::runtime_error("llama.cpp failed to quantize to " + spec.type + " (see its log above)");
        }
    }

    std::error_code ec;
    fs::rename(final_tmp, out, ec);
    if (ec) throw std::runtime_error("cannot move " + final_tmp + " to " + out.string() + ": " + ec.message());

    build_result result;
    result.path = out.string();
    result.file_size = fs::file_size(out, ec);
    result.n_params = n_params;
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return result;
}

}  // namespace keepwarm

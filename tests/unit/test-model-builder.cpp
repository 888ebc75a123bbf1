// Tests of the random-weight model generator (mkmodel), GGUF inspection and the demo model: determinism, that each
// architecture loads and decodes in llama.cpp, and that inspect's KV and state sizes match what llama.cpp stores.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/llama-runtime.h"
#include "ggml-cpp.h"
#include "gguf.h"
#include "llama-cpp.h"
#include "llama.h"
#include "model/demo-model.h"
#include "model/model-builder.h"
#include "model/model-inspect.h"

namespace fs = std::filesystem;
using namespace keepwarm;

namespace {

fs::path test_dir() {
    const fs::path dir = fs::path(KEEPWARM_TEST_MODELS_DIR) / "unit-model-builder";
    fs::create_directories(dir);
    return dir;
}

std::string read_bytes(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The preset models are shared between tests (each runs in its own process under ctest), and rebuilt whenever the
// test binary is newer than the file, so a change to the generator is always what gets tested.
std::string shared_model(const model_spec& spec) {
    const fs::path path = test_dir() / (model_name(spec) + "-" + spec.type + "-" + spec_hash(spec) + ".gguf");
    std::error_code ec;
    const auto exe_time = fs::last_write_time("/proc/self/exe", ec);
    if (fs::exists(path) && (ec || fs::last_write_time(path) >= exe_time)) return path.string();
    return build_model(spec, path.string()).path;
}

// A shape small enough to build in well under a second (the 152K-token embedding table still dominates).
model_spec small_spec() {
    model_spec spec = preset_spec("tiny");
    spec.preset.clear();
    spec.n_layer = 1;
    spec.n_embd = 64;
    spec.n_head = 2;
    spec.n_head_kv = 1;
    spec.n_ff = 64;
    spec.type = "f16";
    return spec;
}

struct loaded_model {
    llama_model_ptr model;
    llama_context_ptr ctx;
};

bool quiet_progress(float, void*) {
    return true;
}

llama_model_params cpu_model_params() {
    init_llama_runtime();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.progress_callback = quiet_progress;  // llama.cpp's default prints dots
    return mp;
}

loaded_model load(const std::string& path, uint32_t n_ctx = 256) {
    const llama_model_params mp = cpu_model_params();
    loaded_model m;
    m.model.reset(llama_model_load_from_file(path.c_str(), mp));
    if (!m.model) throw std::runtime_error("llama.cpp failed to load " + path);
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_ctx;
    cp.n_ubatch = n_ctx;
    cp.n_seq_max = 1;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    cp.type_k = GGML_TYPE_F16;
    cp.type_v = GGML_TYPE_F16;
    m.ctx.reset(llama_init_from_model(m.model.get(), cp));
    if (!m.ctx) throw std::runtime_error("llama.cpp failed to create a context for " + path);
    return m;
}

std::vector<llama_token> tokenize(const llama_model* model, const std::string& text) {
    const llama_vocab* vocab = llama_model_get_vocab(model);
    std::vector<llama_token> tokens(text.size() + 8);
    const int32_t n = llama_tokenize(vocab, text.c_str(), int32_t(text.size()), tokens.data(), int32_t(tokens.size()),
                                     /*add_special =*/true, /*parse_special =*/true);
    tokens.resize(n > 0 ? size_t(n) : 0);
    return tokens;
}

// Decodes the prompt, then a few greedy tokens; every logit of every step must be finite.
// The model's own chat template (from the preset, not the vocab file) is in the file and holds `marker`.
void expect_chat_template(const std::string& path, const std::string& marker) {
    llama_model_params mp = cpu_model_params();
    mp.vocab_only = true;
    llama_model_ptr model(llama_model_load_from_file(path.c_str(), mp));
    ASSERT_TRUE(model);
    const char* tmpl = llama_model_chat_template(model.get(), nullptr);
    ASSERT_NE(tmpl, nullptr);
    EXPECT_NE(std::string(tmpl).find(marker), std::string::npos) << path;
}

void expect_decodes(const std::string& path) {
    loaded_model m = load(path);
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(m.model.get()));
    ASSERT_GT(n_vocab, 100000);

    std::vector<llama_token> prompt = tokenize(m.model.get(), "hello world");
    ASSERT_FALSE(prompt.empty());
    llama_token next = 0;
    for (int step = 0; step < 4; ++step) {
        llama_batch batch =
            step == 0 ? llama_batch_get_one(prompt.data(), int32_t(prompt.size())) : llama_batch_get_one(&next, 1);
        ASSERT_EQ(llama_decode(m.ctx.get(), batch), 0) << "step " << step;
        const float* logits = llama_get_logits_ith(m.ctx.get(), -1);
        ASSERT_NE(logits, nullptr);
        int32_t best = 0;
        for (int32_t i = 0; i < n_vocab; ++i) {
            ASSERT_TRUE(std::isfinite(logits[i])) << "logit " << i << " at step " << step;
            if (logits[i] > logits[best]) best = i;
        }
        next = best;
    }
}

std::string run_binary(const std::string& args, int* status) {
    const std::string command = std::string(KEEPWARM_BINARY) + " " + args + " 2>&1";
    FILE* pipe = popen(command.c_str(), "r");
    std::string output;
    if (!pipe) return output;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) output.append(buf, n);
    const int raw = pclose(pipe);
    *status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
    return output;
}

template <typename Exception>
void expect_error(const model_spec& spec, const std::string& fragment, const std::string& out = "") {
    try {
        build_model(spec, out.empty() ? (test_dir() / "never-written.gguf").string() : out);
        ADD_FAILURE() << "no exception; expected one mentioning '" << fragment << "'";
    } catch (const Exception& e) {
        EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << "message: " << e.what();
    }
}

}  // namespace

TEST(ModelBuilder, SameSeedGivesIdenticalFiles) {
    // The shared copy was built by this same binary (see shared_model), in another process or an earlier run.
    const model_spec tiny = preset_spec("tiny");
    const std::string shared = shared_model(tiny);
    const fs::path a = test_dir() / "determinism-a.gguf";
    build_model(tiny, a.string());
    const std::string bytes_a = read_bytes(a);
    EXPECT_GT(bytes_a.size(), 50u << 20);
    EXPECT_TRUE(bytes_a == read_bytes(shared)) << "two builds of the tiny preset with seed 42 differ";

    model_spec other = small_spec();
    const fs::path c = test_dir() / "determinism-c.gguf", d = test_dir() / "determinism-d.gguf";
    other.seed = 1;
    build_model(other, c.string());
    other.seed = 2;
    build_model(other, d.string());
    const std::string bytes_c = read_bytes(c), bytes_d = read_bytes(d);
    EXPECT_EQ(bytes_c.size(), bytes_d.size());
    EXPECT_FALSE(bytes_c == bytes_d) << "seeds 1 and 2 gave the same file";

    for (const auto& p : {a, c, d}) fs::remove(p);
    // No temporary files are left next to the outputs. (Only ours: other tests build into this folder in parallel.)
    for (const auto& entry : fs::directory_iterator(test_dir())) {
        const std::string name = entry.path().filename().string();
        if (name.rfind("determinism-", 0) != 0) continue;
        EXPECT_EQ(name.find(".tmp-"), std::string::npos) << entry.path();
    }
}

TEST(ModelBuilder, DenseModelHasTokenizerAndTemplateAndDecodes) {
    const std::string path = shared_model(preset_spec("tiny"));
    {
        llama_model_params mp = cpu_model_params();
        mp.vocab_only = true;
        llama_model_ptr model(llama_model_load_from_file(path.c_str(), mp));
        ASSERT_TRUE(model);
        const char* tmpl = llama_model_chat_template(model.get(), nullptr);
        ASSERT_NE(tmpl, nullptr);
        EXPECT_NE(std::string(tmpl).find("<|im_start|>"), std::string::npos);
        EXPECT_NE(std::string(tmpl).find("enable_thinking"), std::string::npos);  // Qwen3's, not the vocab file's
        const std::vector<llama_token> tokens = tokenize(model.get(), "hello world");
        EXPECT_EQ(tokens.size(), 2u);  // "hello", " world" in the Qwen vocabulary, no BOS
        const llama_vocab* vocab = llama_model_get_vocab(model.get());
        char piece[64] = {};
        llama_token_to_piece(vocab, llama_vocab_eos(vocab), piece, sizeof(piece) - 1, 0, true);
        EXPECT_STREQ(piece, "<|im_end|>");
    }
    EXPECT_TRUE(model_has_random_weights(path));
    expect_decodes(path);
}

TEST(ModelBuilder, MoeModelDecodes) {
    const std::string path = shared_model(preset_spec("tiny-moe"));
    const model_report r = inspect_model(path);
    EXPECT_EQ(r.architecture, "qwen3moe");
    EXPECT_EQ(r.n_expert, 8u);
    EXPECT_EQ(r.n_expert_used, 2u);
    EXPECT_EQ(r.n_ff_exp, 256u);
    expect_decodes(path);
}

TEST(ModelBuilder, HybridModelDecodes) {
    const std::string path = shared_model(preset_spec("tiny-hybrid"));
    expect_chat_template(path, "<|im_start|>");
    expect_decodes(path);
}

// Qwen3.5-35B-A3B / Qwen3-Next's layout: tiny-hybrid's delta-net and attention layers, with routed experts and a gated
// shared expert in place of the dense feed-forward. The recurrent state and KV cache are tiny-hybrid's, byte for byte.
TEST(ModelBuilder, HybridMoeModelHasExpertsAndSharedExpertAndDecodes) {
    const std::string path = shared_model(preset_spec("tiny-hybrid-moe"));
    const model_report r = inspect_model(path);
    EXPECT_EQ(r.architecture, "qwen35moe");
    EXPECT_EQ(r.n_expert, 8u);
    EXPECT_EQ(r.n_expert_used, 2u);
    EXPECT_EQ(r.n_ff_exp, 256u);
    EXPECT_EQ(r.layer_summary(), "3 recurrent + 1 full attention (layer 3)");
    const model_report hybrid = inspect_model(shared_model(preset_spec("tiny-hybrid")));
    EXPECT_EQ(r.recurrent_state_bytes, hybrid.recurrent_state_bytes);
    EXPECT_EQ(r.kv_bytes_per_token(kv_cache_type::f16), hybrid.kv_bytes_per_token(kv_cache_type::f16));

    gguf_init_params params{/*no_alloc =*/true, /*ctx =*/nullptr};
    gguf_context_ptr gguf(gguf_init_from_file(path.c_str(), params));
    ASSERT_TRUE(gguf);
    for (const char* name :
         {"blk.0.ffn_gate_exps.weight", "blk.3.ffn_up_exps.weight", "blk.0.ffn_gate_inp_shexp.weight",
          "blk.3.ffn_down_shexp.weight", "blk.0.ssm_conv1d.weight", "blk.3.attn_q.weight"}) {
        EXPECT_GE(gguf_find_tensor(gguf.get(), name), 0) << name;
    }
    EXPECT_LT(gguf_find_tensor(gguf.get(), "blk.0.ffn_up.weight"), 0) << "no dense feed-forward";
    const int64_t shared_ff = gguf_find_key(gguf.get(), "qwen35moe.expert_shared_feed_forward_length");
    ASSERT_GE(shared_ff, 0);
    EXPECT_EQ(gguf_get_val_u32(gguf.get(), shared_ff), 256u);
    expect_chat_template(path, "<|im_start|>");
    expect_decodes(path);

    // llama.cpp stores what inspect says: the attention layer's KV plus the delta-net state.
    loaded_model m = load(path);
    std::vector<llama_token> tokens(64, 1000);
    ASSERT_EQ(llama_decode(m.ctx.get(), llama_batch_get_one(tokens.data(), int32_t(tokens.size()))), 0);
    const size_t state = llama_state_seq_get_size(m.ctx.get(), 0);
    const uint64_t expected = r.memory_at(uint32_t(tokens.size()), kv_cache_type::f16);
    EXPECT_GE(state, expected);
    EXPECT_LT(state, expected + tokens.size() * 16 + 4096) << "state " << state << " vs KV + recurrent " << expected;
}

// Gemma 3's layout: five sliding-window layers then one full, with the Gemma 4 tokenizer and template. Decoding past
// the window proves llama.cpp built its sliding-window cache for it, not a plain one.
TEST(ModelBuilder, SlidingWindowModelHasGemmaTokenizerAndDecodesPastItsWindow) {
    const std::string path = shared_model(preset_spec("tiny-swa"));
    const model_report r = inspect_model(path);
    EXPECT_EQ(r.architecture, "gemma3");
    EXPECT_EQ(r.sliding_window, 512u);
    ASSERT_EQ(r.layers.size(), 6u);
    for (uint32_t il = 0; il < 5; ++il) EXPECT_EQ(r.layers[il], layer_kind::sliding_window) << il;
    EXPECT_EQ(r.layers[5], layer_kind::full_attention);
    EXPECT_EQ(r.layer_summary(), "5 sliding window + 1 full attention (layer 5)");

    loaded_model m = load(path, 1024);
    const char* tmpl = llama_model_chat_template(m.model.get(), nullptr);
    ASSERT_NE(tmpl, nullptr);
    EXPECT_NE(std::string(tmpl).find("<|turn>"), std::string::npos);
    const llama_vocab* vocab = llama_model_get_vocab(m.model.get());
    const std::vector<llama_token> turn_end = tokenize(m.model.get(), "<turn|>");
    ASSERT_FALSE(turn_end.empty());
    EXPECT_TRUE(llama_vocab_is_eog(vocab, turn_end.back())) << "a Gemma 4 turn ends generation";
    EXPECT_TRUE(llama_model_n_swa(m.model.get()) == 512);

    // 700 tokens then 4 greedy steps: every logit finite.
    std::vector<llama_token> prompt;
    for (int i = 0; i < 700; ++i) prompt.push_back(1000 + i % 5000);
    ASSERT_EQ(llama_decode(m.ctx.get(), llama_batch_get_one(prompt.data(), int32_t(prompt.size()))), 0);
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    EXPECT_GT(n_vocab, 200000);
    for (int step = 0; step < 4; ++step) {
        const float* logits = llama_get_logits_ith(m.ctx.get(), -1);
        ASSERT_NE(logits, nullptr);
        llama_token best = 0;
        for (int32_t i = 0; i < n_vocab; ++i) {
            ASSERT_TRUE(std::isfinite(logits[i])) << "logit " << i << " at step " << step;
            if (logits[i] > logits[best]) best = i;
        }
        ASSERT_EQ(llama_decode(m.ctx.get(), llama_batch_get_one(&best, 1)), 0) << "step " << step;
    }
}

// gpt-oss's layout: sliding-window (128) and full layers alternating, sinks, biased MoE, harmony template and tokens.
// The harmony markup must be single control tokens with llama.cpp's gpt-oss end-of-generation rules (<|return|> and
// <|call|> end an answer, <|end|> does not), or common/chat's harmony parser would not see what a real model writes.
TEST(ModelBuilder, GptOssModelSpeaksHarmonyAndDecodesPastItsWindow) {
    const std::string path = shared_model(preset_spec("tiny-gpt-oss"));
    const model_report r = inspect_model(path);
    EXPECT_EQ(r.architecture, "gpt-oss");
    EXPECT_EQ(r.sliding_window, 128u);
    EXPECT_EQ(r.n_expert, 8u);
    EXPECT_EQ(r.n_expert_used, 2u);
    ASSERT_EQ(r.layers.size(), 4u);
    for (uint32_t il = 0; il < 4; ++il) {
        EXPECT_EQ(r.layers[il], il % 2 == 0 ? layer_kind::sliding_window : layer_kind::full_attention) << il;
    }

    loaded_model m = load(path, 1024);
    EXPECT_EQ(llama_model_n_swa(m.model.get()), 128);
    const char* tmpl = llama_model_chat_template(m.model.get(), nullptr);
    ASSERT_NE(tmpl, nullptr);
    EXPECT_NE(std::string(tmpl).find("<|channel|>analysis"), std::string::npos);
    const llama_vocab* vocab = llama_model_get_vocab(m.model.get());
    auto single = [&](const std::string& text) {
        const std::vector<llama_token> tokens = tokenize(m.model.get(), text);
        EXPECT_EQ(tokens.size(), 1u) << text;
        return tokens.empty() ? LLAMA_TOKEN_NULL : tokens[0];
    };
    for (const char* text : {"<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"}) {
        EXPECT_FALSE(llama_vocab_is_eog(vocab, single(text))) << text;
    }
    EXPECT_FALSE(llama_vocab_is_eog(vocab, single("<|end|>"))) << "an analysis message's end goes on to the answer";
    EXPECT_TRUE(llama_vocab_is_eog(vocab, single("<|return|>")));
    EXPECT_TRUE(llama_vocab_is_eog(vocab, single("<|call|>")));
    EXPECT_EQ(llama_vocab_eos(vocab), single("<|return|>"));
    EXPECT_EQ(tokenize(m.model.get(), "<|start|>assistant<|channel|>final<|message|>hello world<|end|>").size(), 8u);

    // 300 tokens (the window more than twice over) then 4 greedy steps: every logit finite.
    std::vector<llama_token> prompt;
    for (int i = 0; i < 300; ++i) prompt.push_back(1000 + i % 5000);
    ASSERT_EQ(llama_decode(m.ctx.get(), llama_batch_get_one(prompt.data(), int32_t(prompt.size()))), 0);
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    for (int step = 0; step < 4; ++step) {
        const float* logits = llama_get_logits_ith(m.ctx.get(), -1);
        ASSERT_NE(logits, nullptr);
        llama_token best = 0;
        for (int32_t i = 0; i < n_vocab; ++i) {
            ASSERT_TRUE(std::isfinite(logits[i])) << "logit " << i << " at step " << step;
            if (logits[i] > logits[best]) best = i;
        }
        ASSERT_EQ(llama_decode(m.ctx.get(), llama_batch_get_one(&best, 1)), 0) << "step " << step;
    }
}

TEST(ModelInspect, DenseKnownShape) {
    model_spec spec = small_spec();
    spec.n_layer = 3;
    spec.n_embd = 256;
    spec.n_head = 4;
    spec.n_head_kv = 2;
    spec.head_dim = 48;  // not width / heads, as in Qwen3 where head size is set on its own
    spec.n_ff = 512;
    spec.n_ctx_train = 4096;
    const std::string path = shared_model(spec);
    const model_report r = inspect_model(path);

    EXPECT_EQ(r.architecture, "qwen3");
    EXPECT_TRUE(r.random_weights);
    EXPECT_TRUE(r.has_chat_template);
    EXPECT_EQ(r.weight_type, "f16");
    EXPECT_EQ(r.n_layer, 3u);
    EXPECT_EQ(r.n_embd, 256u);
    EXPECT_EQ(r.n_head, 4u);
    EXPECT_EQ(r.n_head_kv, 2u);
    EXPECT_EQ(r.head_dim_k, 48u);
    EXPECT_EQ(r.head_dim_v, 48u);
    EXPECT_EQ(r.n_ctx_train, 4096u);
    EXPECT_EQ(r.n_vocab, 151936u);
    EXPECT_EQ(r.count(layer_kind::full_attention), 3u);
    EXPECT_EQ(r.recurrent_state_bytes, 0u);
    EXPECT_EQ(r.file_size, fs::file_size(path));

    // Per token and layer: K and V rows of 2 KV heads x 48 = 96 values each.
    EXPECT_EQ(r.kv_bytes_per_token(kv_cache_type::f16), 3u * 2 * 96 * 2);
    EXPECT_EQ(r.kv_bytes_per_token(kv_cache_type::q8_0), 3u * 2 * (96 / 32) * 34);
    EXPECT_EQ(r.kv_bytes_per_token(kv_cache_type::q4_0), 3u * 2 * (96 / 32) * 18);
    EXPECT_EQ(r.memory_at(1000, kv_cache_type::f16), 1000u * 1152);

    // Embeddings (tied) + final norm + per layer: norms, q/k/v/o and the three FFN matrices.
    const uint64_t per_layer = 256 + 256 + 48 + 48 + 256 * 192 + 2 * 256 * 96 + 192 * 256 + 3 * 256 * 512;
    EXPECT_EQ(r.n_params, 151936ull * 256 + 256 + 3 * per_layer);

    // llama.cpp's own KV cache holds what inspect says: a sequence of n tokens saves n times the per-token bytes
    // plus a little bookkeeping.
    loaded_model m = load(path);
    std::vector<llama_token> tokens(64, 1000);
    ASSERT_EQ(llama_decode(m.ctx.get(), llama_batch_get_one(tokens.data(), int32_t(tokens.size()))), 0);
    const size_t state = llama_state_seq_get_size(m.ctx.get(), 0);
    const uint64_t expected = tokens.size() * r.kv_bytes_per_token(kv_cache_type::f16);
    EXPECT_GE(state, expected);
    EXPECT_LT(state, expected + tokens.size() * 16 + 4096) << "state " << state << " vs KV " << expected;
}

TEST(ModelInspect, HybridRecurrentLayers) {
    const std::string path = shared_model(preset_spec("tiny-hybrid"));
    const model_report r = inspect_model(path);
    EXPECT_EQ(r.architecture, "qwen35");
    ASSERT_EQ(r.layers.size(), 4u);
    EXPECT_EQ(r.layers[0], layer_kind::recurrent);
    EXPECT_EQ(r.layers[1], layer_kind::recurrent);
    EXPECT_EQ(r.layers[2], layer_kind::recurrent);
    EXPECT_EQ(r.layers[3], layer_kind::full_attention);
    EXPECT_EQ(r.layer_summary(), "3 recurrent + 1 full attention (layer 3)");
    EXPECT_EQ(r.n_head, 8u);
    EXPECT_EQ(r.n_head_kv, 2u);
    EXPECT_EQ(r.head_dim_k, 64u);

    // One attention layer: K and V rows of 2 x 64 values.
    EXPECT_EQ(r.kv_bytes_per_token(kv_cache_type::f16), 2u * 128 * 2);
    // Three delta-net layers, f32: conv window (kernel 4 - 1) x (q, k of 2 heads x 128 + v of 4 heads x 128) and the
    // 128 x 128 state of each of the 4 value heads.
    const uint64_t conv = 3 * (2 * 256 + 512), ssm = 128 * 512;
    EXPECT_EQ(r.recurrent_state_bytes, 3 * (conv + ssm) * 4);
    EXPECT_EQ(r.memory_at(100, kv_cache_type::f16), r.recurrent_state_bytes + 100 * 512);

    loaded_model m = load(path);
    std::vector<llama_token> tokens(64, 1000);
    ASSERT_EQ(llama_decode(m.ctx.get(), llama_batch_get_one(tokens.data(), int32_t(tokens.size()))), 0);
    const size_t state = llama_state_seq_get_size(m.ctx.get(), 0);
    const uint64_t expected = r.memory_at(uint32_t(tokens.size()), kv_cache_type::f16);
    EXPECT_GE(state, expected);
    EXPECT_LT(state, expected + tokens.size() * 16 + 4096) << "state " << state << " vs KV + recurrent " << expected;
}

// Qwen3.5's multi-token prediction head (serve --spec-type draft-mtp): one nextn layer after the four blocks, with
// the tensors and metadata llama.cpp's qwen35 and qwen35moe loaders read; llama.cpp loads it with its MTP tensors,
// makes an MTP context for it, and the model without heads stays byte for byte what it was.
TEST(ModelBuilder, HybridMtpModelHasANextnLayerLlamaCppLoads) {
    for (const std::string arch : {"qwen35", "qwen35moe"}) {
        model_spec spec = preset_spec(arch == "qwen35" ? "tiny-hybrid-mtp" : "tiny-hybrid-moe");
        spec.n_mtp_layers = 1;
        const std::string path = shared_model(spec);
        const auto meta = read_gguf_metadata(path, 16);
        EXPECT_EQ(meta.value(arch + ".nextn_predict_layers", 0), 1) << arch;
        EXPECT_EQ(meta.value(arch + ".block_count", 0), 5) << arch;
        gguf_init_params params{/*no_alloc =*/true, /*ctx =*/nullptr};
        gguf_context_ptr gguf(gguf_init_from_file(path.c_str(), params));
        ASSERT_TRUE(gguf);
        for (const char* name :
             {"blk.4.nextn.eh_proj.weight", "blk.4.nextn.enorm.weight", "blk.4.nextn.hnorm.weight",
              "blk.4.attn_q.weight", "blk.4.attn_k_norm.weight", "blk.4.post_attention_norm.weight"}) {
            EXPECT_GE(gguf_find_tensor(gguf.get(), name), 0) << arch << " " << name;
        }
        EXPECT_LT(gguf_find_tensor(gguf.get(), "blk.4.ssm_conv1d.weight"), 0) << "the head is an attention block";

        init_llama_runtime();
        llama_model_params mparams = llama_model_default_params();
        mparams.n_gpu_layers = 0;
        mparams.load_mtp = true;
        llama_model_ptr model(llama_model_load_from_file(path.c_str(), mparams));
        ASSERT_TRUE(model) << arch;
        EXPECT_EQ(llama_model_n_layer_nextn(model.get()), 1) << arch;
        EXPECT_EQ(llama_model_n_layer(model.get()), 4) << arch << ": the trunk's blocks";
        llama_context_params cparams = llama_context_default_params();
        cparams.n_ctx = 256;
        cparams.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
        llama_context_ptr mtp(llama_init_from_model(model.get(), cparams));
        EXPECT_TRUE(mtp) << arch << ": llama.cpp made no MTP context";

        // keepwarm inspect, -c 0 and the router's footprints count the trunk as llama.cpp does (its caches leave the
        // head out), and the head's attention apart: what the MTP context adds per cell.
        model_spec without = spec;
        without.n_mtp_layers = 0;
        const model_report trunk = inspect_model(shared_model(without));
        const model_report r = inspect_model(path);
        EXPECT_EQ(r.n_layer, 4u) << arch;
        EXPECT_EQ(r.n_mtp_layers, 1u) << arch;
        EXPECT_EQ(r.layers, trunk.layers) << arch;
        EXPECT_EQ(r.recurrent_state_bytes, trunk.recurrent_state_bytes) << arch << ": the head is no recurrent layer";
        EXPECT_EQ(r.kv_bytes_per_token(kv_cache_type::f16), trunk.kv_bytes_per_token(kv_cache_type::f16)) << arch;
        EXPECT_EQ(mtp_kv_bytes_per_cell(trunk, GGML_TYPE_F16, GGML_TYPE_F16), 0u);
        EXPECT_EQ(mtp_kv_bytes_per_cell(r, GGML_TYPE_F16, GGML_TYPE_F16), trunk.kv_bytes_per_token(kv_cache_type::f16))
            << arch << ": one attention block, as the trunk's only one";
    }
    EXPECT_NE(spec_hash(preset_spec("tiny-hybrid")), spec_hash(preset_spec("tiny-hybrid-mtp")));
    model_spec dense = preset_spec("tiny");
    dense.n_mtp_layers = 1;
    expect_error<std::invalid_argument>(dense, "MTP heads only apply to qwen35 and qwen35moe");
}

TEST(ModelBuilder, PresetsAreValid) {
    for (const auto& name : preset_names()) {
        EXPECT_NO_THROW(validate_spec(preset_spec(name))) << name;
        EXPECT_NE(model_name(preset_spec(name)).find("random"), std::string::npos);
    }
    EXPECT_EQ(preset_spec("bench-dense").n_layer, 12u);
    EXPECT_EQ(preset_spec("bench-hybrid").arch, "qwen35");
    EXPECT_EQ(preset_spec("tiny-gpt-oss").arch, "gpt-oss");
    EXPECT_EQ(preset_spec("tiny-hybrid-moe").arch, "qwen35moe");
    EXPECT_NE(spec_hash(preset_spec("tiny-hybrid")), spec_hash(preset_spec("tiny-hybrid-moe")));
    EXPECT_NE(spec_hash(preset_spec("tiny")), spec_hash(preset_spec("tiny-hybrid")));
}

// Qwen3-Embedding's shape: qwen3 with <arch>.pooling_type last (3), and <|endoftext|> as an EOS the tokenizer appends
// to every input; a chat model's file has neither key, so its digest and bytes are what they were.
TEST(ModelBuilder, EmbeddingModelDeclaresItsPoolingAndAppendsEos) {
    model_spec spec = small_spec();
    spec.pooling = "last";
    const auto meta = read_gguf_metadata(shared_model(spec), 16);
    EXPECT_EQ(meta.value("qwen3.pooling_type", -1), 3);
    EXPECT_EQ(meta.value("tokenizer.ggml.add_eos_token", false), true);
    EXPECT_EQ(meta.value("tokenizer.ggml.eos_token_id", 0), 151643);  // <|endoftext|> in the qwen2 vocab
    const auto chat = read_gguf_metadata(shared_model(small_spec()), 16);
    EXPECT_FALSE(chat.contains("qwen3.pooling_type"));
    EXPECT_NE(spec_hash(spec), spec_hash(small_spec()));
    spec.pooling = "mean";
    EXPECT_EQ(read_gguf_metadata(shared_model(spec), 16).value("qwen3.pooling_type", -1), 1);
    EXPECT_EQ(preset_spec("tiny-embed").pooling, "last");
    // A reranker: Qwen3-Reranker's yes/no labels, its prompt with {query} and {document}, and the classifier head.
    spec.pooling = "rank";
    const std::string reranker = shared_model(spec);
    const auto rank = read_gguf_metadata(reranker, 16);
    EXPECT_EQ(rank.value("qwen3.pooling_type", -1), 4);
    EXPECT_EQ(rank["qwen3.classifier.output_labels"], nlohmann::ordered_json({"yes", "no"}));
    EXPECT_NE(rank.value("tokenizer.chat_template.rerank", "").find("{document}"), std::string::npos);
    EXPECT_EQ(inspect_model(reranker).file_size, fs::file_size(reranker));
    spec.pooling = "max";
    expect_error<std::invalid_argument>(spec, "unknown pooling 'max'");
}

TEST(ModelBuilder, BadArgumentsAreClearErrors) {
    EXPECT_THROW(preset_spec("huge"), std::invalid_argument);
    auto with = [](auto change) {
        model_spec spec = small_spec();
        change(spec);
        return spec;
    };
    expect_error<std::invalid_argument>(with([](model_spec& s) { s.arch = "llama9"; }), "unknown architecture");
    expect_error<std::invalid_argument>(with([](model_spec& s) { s.vocab = "klingon"; }), "unknown vocab 'klingon'");
    expect_error<std::invalid_argument>(with([](model_spec& s) { s.chat_template = "nope"; }), "unknown template");
    expect_error<std::invalid_argument>(with([](model_spec& s) { s.chat_template = "../../etc"; }), "template");
    expect_error<std::invalid_argument>(with([](model_spec& s) { s.type = "q5_k"; }), "unknown weight type");
    expect_error<std::invalid_argument>(with([](model_spec& s) { s.n_head = 3; }), "heads (3) must divide width");
    expect_error<std::invalid_argument>(with([](model_spec& s) {
                                            s.n_head_kv = 3;
                                            s.n_head = 4;
                                            s.n_embd = 128;
                                        }),
                                        "kv-heads (3) must divide heads (4)");
    expect_error<std::invalid_argument>(with([](model_spec& s) { s.n_embd = 100; }), "multiple of 32");
    expect_error<std::invalid_argument>(with([](model_spec& s) { s.n_layer = 0; }), "layers");
    expect_error<std::invalid_argument>(with([](model_spec& s) { s.n_expert = 4; }), "only apply to qwen3moe");
    expect_error<std::invalid_argument>(with([](model_spec& s) {
                                            s.arch = "qwen3moe";
                                            s.n_expert = 4;
                                            s.n_expert_used = 5;
                                            s.n_ff_exp = 64;
                                        }),
                                        "experts-used");
    expect_error<std::invalid_argument>(with([](model_spec& s) { s.arch = "gpt-oss"; }), "gpt-oss needs experts");
    model_spec harmony_twice = preset_spec("tiny-gpt-oss");
    harmony_twice.vocab = "phi-3";  // has <|end|> already
    expect_error<std::invalid_argument>(harmony_twice, "vocab already has <|end|>");
    expect_error<std::invalid_argument>(with([](model_spec& s) { s.llama_source_dir = "/nonexistent/llama.cpp"; }),
                                        "llama.cpp source tree not found");
    expect_error<std::runtime_error>(small_spec(), "cannot write", "/nonexistent-dir/model.gguf");
    expect_error<std::invalid_argument>(small_spec(), "is a directory", test_dir().string());
}

TEST(ModelBuilder, CommandLine) {
    int status = 0;
    std::string out = run_binary("mkmodel --arch gpt5 -o " + (test_dir() / "x.gguf").string(), &status);
    EXPECT_EQ(status, 1);
    EXPECT_NE(out.find("unknown architecture 'gpt5'"), std::string::npos) << out;

    // --arch alone starts from that architecture's tiny preset (experts and all), so only the bad vocab is wrong.
    out = run_binary("mkmodel --arch qwen35moe --vocab klingon -o " + (test_dir() / "x.gguf").string(), &status);
    EXPECT_EQ(status, 1);
    EXPECT_NE(out.find("unknown vocab 'klingon'"), std::string::npos) << out;

    out = run_binary("mkmodel --preset tiny --kv-heads 3 -o " + (test_dir() / "x.gguf").string(), &status);
    EXPECT_EQ(status, 1);
    EXPECT_NE(out.find("kv-heads (3) must divide heads (8)"), std::string::npos) << out;

    const std::string path = shared_model(preset_spec("tiny-hybrid"));
    out = run_binary("inspect --json --ctx 1000 " + path, &status);
    EXPECT_EQ(status, 0) << out;
    EXPECT_NE(out.find("\"recurrent_layers\": 3"), std::string::npos) << out;
    EXPECT_NE(out.find("\"random_weights\": true"), std::string::npos) << out;

    out = run_binary("inspect " + (test_dir() / "missing.gguf").string(), &status);
    EXPECT_EQ(status, 1);
    EXPECT_NE(out.find("cannot read"), std::string::npos) << out;
}

TEST(DemoModel, GeneratedOnceAndFlaggedRandom) {
    const fs::path cache = test_dir() / "cache";
    setenv("KEEPWARM_CACHE_DIR", cache.c_str(), 1);
    const std::string first = ensure_demo_model();
    EXPECT_EQ(fs::path(first).parent_path(), cache / "models");
    EXPECT_EQ(fs::path(first).filename().string().rfind("demo-qwen3-", 0), 0u);
    const auto written = fs::last_write_time(first);
    EXPECT_EQ(ensure_demo_model(), first);
    EXPECT_EQ(fs::last_write_time(first), written);  // served from the cache, not rebuilt
    EXPECT_TRUE(model_has_random_weights(first));
    unsetenv("KEEPWARM_CACHE_DIR");

    EXPECT_FALSE(model_has_random_weights(std::string(KEEPWARM_LLAMA_SOURCE_DIR) + "/models/ggml-vocab-qwen2.gguf"));
    EXPECT_FALSE(model_has_random_weights((test_dir() / "missing.gguf").string()));
}

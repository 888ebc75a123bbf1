// See embedder.h. One llama_decode per batch of whole inputs, each its own sequence, the KV cache cleared before each
// call; the pooled vector of each sequence normalised as llama-server's send_embedding does (common_embd_normalize).
#include "engine/embedder.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "base/logger.h"
#include "base/request-error.h"
#include "common.h"
#include "engine/llama-runtime.h"
#include "gguf.h"

namespace keepwarm {

namespace {

// A default context for one input: long documents fit, and a physical batch of it stays a modest compute buffer.
constexpr int default_max_context = 8192;

struct gguf_closer {
    void operator()(gguf_context* g) const { gguf_free(g); }
};

}  // namespace

enum llama_pooling_type model_file_pooling(const std::string& path) {
    gguf_init_params params{/*no_alloc =*/true, /*ctx =*/nullptr};
    std::unique_ptr<gguf_context, gguf_closer> g(gguf_init_from_file(path.c_str(), params));
    if (!g) throw std::runtime_error("cannot read " + path + " as a GGUF file");
    const int64_t arch_id = gguf_find_key(g.get(), "general.architecture");
    if (arch_id < 0 || gguf_get_kv_type(g.get(), arch_id) != GGUF_TYPE_STRING) return LLAMA_POOLING_TYPE_NONE;
    const std::string key = std::string(gguf_get_val_str(g.get(), arch_id)) + ".pooling_type";
    const int64_t id = gguf_find_key(g.get(), key.c_str());
    if (id < 0) return LLAMA_POOLING_TYPE_NONE;
    int64_t value = -1;
    switch (gguf_get_kv_type(g.get(), id)) {
        case GGUF_TYPE_UINT32:
            value = gguf_get_val_u32(g.get(), id);
            break;
        case GGUF_TYPE_INT32:
            value = gguf_get_val_i32(g.get(), id);
            break;
        default:
            break;
    }
    if (value < LLAMA_POOLING_TYPE_NONE || value > LLAMA_POOLING_TYPE_RANK) return LLAMA_POOLING_TYPE_NONE;
    return static_cast<enum llama_pooling_type>(value);
}

const char* pooling_name(enum llama_pooling_type pooling) {
    switch (pooling) {
        case LLAMA_POOLING_TYPE_MEAN:
            return "mean";
        case LLAMA_POOLING_TYPE_CLS:
            return "cls";
        case LLAMA_POOLING_TYPE_LAST:
            return "last";
        case LLAMA_POOLING_TYPE_RANK:
            return "rank";
        default:
            return "none";
    }
}

struct embedder::job {
    std::vector<std::vector<llama_token>> inputs;
    int normalize = euclidean_norm;
    // Guarded by embedder::mu_.
    std::vector<std::vector<float>> vectors;
    size_t next = 0;  // the next input a batch takes
    size_t done = 0;  // inputs computed
    bool cancelled = false;
    std::string error;  // non-empty: the request failed (status below)
    int error_status = 500;
};

embedder::embedder(embedder_options options) : options_(std::move(options)) {
    init_llama_runtime(options_.verbose);
    if (options_.max_sequences < 1 || options_.max_sequences > 256) {
        throw std::invalid_argument("inputs per batch must be from 1 to 256");
    }
    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = options_.gpu_layers;
    mparams.load_mode = options_.load_mode;
    model_.reset(llama_model_load_from_file(options_.model_path.c_str(), mparams));
    if (!model_) throw std::runtime_error("failed to load model from '" + options_.model_path + "'");

    if (options_.context_size <= 0) {
        options_.context_size = std::min<int>(llama_model_n_ctx_train(model_.get()), default_max_context);
    }
    options_.batch_size = std::max(options_.batch_size, options_.context_size);
    const int threads = options_.threads > 0 ? options_.threads : common_cpu_get_num_math();
    options_.threads = threads;

    llama_context_params cparams = llama_context_default_params();
    cparams.embeddings = true;
    cparams.pooling_type = options_.pooling;
    // Every call computes whole inputs in one physical batch (mean and cls pooling need a sequence whole), and the
    // cache only ever holds that call's tokens.
    cparams.n_ctx = uint32_t(options_.batch_size);
    cparams.n_batch = uint32_t(options_.batch_size);
    cparams.n_ubatch = uint32_t(options_.batch_size);
    cparams.n_seq_max = uint32_t(options_.max_sequences);
    cparams.kv_unified = true;
    cparams.n_threads = threads;
    cparams.n_threads_batch = threads;
    cparams.flash_attn_type = options_.flash_attn;
    cparams.no_perf = true;
    ctx_.reset(llama_init_from_model(model_.get(), cparams));
    if (!ctx_) {
        throw std::runtime_error("failed to create the embedding context (batch of " +
                                 std::to_string(options_.batch_size) + " tokens)");
    }
    pooling_ = llama_pooling_type(ctx_.get());
    if (pooling_ == LLAMA_POOLING_TYPE_NONE || pooling_ == LLAMA_POOLING_TYPE_UNSPECIFIED) {
        throw std::invalid_argument("'" + options_.model_path +
                                    "' declares no pooling type, so it makes no single vector per input: give "
                                    "--pooling mean, cls or last (what the model was trained with)");
    }
    // A reranker's pooled output is its classifier's scores (llama-server's score is the first), not a vector.
    n_embd_ = pooling_ == LLAMA_POOLING_TYPE_RANK ? int(llama_model_n_cls_out(model_.get()))
                                                  : llama_model_n_embd_out(model_.get());
    if (n_embd_ < 1) throw std::invalid_argument("'" + options_.model_path + "' has a rank pooling but no classifier");
    const llama_vocab* v = vocab();
    if (llama_vocab_type(v) == LLAMA_VOCAB_TYPE_SPM || llama_vocab_type(v) == LLAMA_VOCAB_TYPE_BPE) {
        for (llama_token t = 0; t < llama_vocab_n_tokens(v); ++t) {
            char piece[512];
            const int n = llama_token_to_piece(v, t, piece, sizeof piece, 0, /*special=*/true);
            longest_piece_bytes_ = std::max(longest_piece_bytes_, size_t(n < 0 ? -n : n));
        }
    }
    pool_ = std::make_unique<cpu_threadpool>(threads);
    if (pool_->get()) llama_attach_threadpool(ctx_.get(), pool_->get(), nullptr);
    worker_ = std::thread([this] { run(); });
}

embedder::~embedder() {
    {
        std::lock_guard lock(mu_);
        stopping_ = true;
    }
    work_cv_.notify_all();
    if (worker_.joinable()) worker_.join();
    std::lock_guard lock(mu_);
    for (const auto& j : queue_) {
        j->error = "the server is stopping";
        j->error_status = 503;
    }
    queue_.clear();
    done_cv_.notify_all();
}

embedder::counters embedder::stats() const {
    std::lock_guard lock(mu_);
    return counters_;
}

std::vector<std::vector<float>> embedder::embed(const std::vector<std::vector<llama_token>>& inputs, int normalize,
                                                const std::function<bool()>& client_gone) {
    const int32_t n_vocab = llama_vocab_n_tokens(vocab());
    for (size_t i = 0; i < inputs.size(); ++i) {
        const auto& tokens = inputs[i];
        if (tokens.empty()) throw request_error(400, "input " + std::to_string(i) + " is empty");
        if (tokens.size() > size_t(options_.context_size)) {
            throw request_error(400,
                                "input " + std::to_string(i) + " has " + std::to_string(tokens.size()) +
                                    " tokens, more than the " + std::to_string(options_.context_size) +
                                    " one input may have (the server's --ctx-size)",
                                "exceed_context_size_error");
        }
        for (const llama_token t : tokens) {
            if (t < 0 || t >= n_vocab) {
                throw request_error(400, "input " + std::to_string(i) + " has token id " + std::to_string(t) +
                                             ", outside the vocab (0 to " + std::to_string(n_vocab - 1) + ")");
            }
        }
    }
    auto j = std::make_shared<job>();
    j->inputs = inputs;
    j->normalize = normalize;
    j->vectors.resize(inputs.size());
    if (inputs.empty()) return {};

    std::unique_lock lock(mu_);
    if (stopping_) throw request_error(503, "the server is stopping", "unavailable_error");
    if (options_.max_queue > 0 && queue_.size() >= size_t(options_.max_queue)) {
        throw request_error(503, "the embedding queue is full (" + std::to_string(options_.max_queue) + " requests)",
                            "unavailable_error", 1);
    }
    queue_.push_back(j);
    ++counters_.requests;
    work_cv_.notify_one();
    while (j->done < j->inputs.size() && j->error.empty()) {
        done_cv_.wait_for(lock, std::chrono::milliseconds(50));
        if (!client_gone) continue;
        lock.unlock();
        const bool gone = client_gone();
        lock.lock();
        if (gone) {
            j->cancelled = true;
            queue_.erase(std::remove(queue_.begin(), queue_.end(), j), queue_.end());
            return {};
        }
    }
    if (!j->error.empty()) throw request_error(j->error_status, j->error, "server_error");
    lock.unlock();
    if (client_gone && client_gone()) return {};  // nobody will read them
    return std::move(j->vectors);
}

std::vector<embedder::batch_entry> embedder::next_batch() {
    std::vector<batch_entry> batch;
    size_t tokens = 0;
    bool full = false;
    // One input per job in turn, in arrival order, until the next one does not fit.
    for (bool took = true; took && !full;) {
        took = false;
        for (const auto& j : queue_) {
            if (j->cancelled || !j->error.empty() || j->next >= j->inputs.size()) continue;
            const size_t n = j->inputs[j->next].size();
            if (batch.size() >= size_t(options_.max_sequences) || tokens + n > size_t(options_.batch_size)) {
                full = true;
                break;
            }
            batch.push_back({j, j->next++});
            tokens += n;
            took = true;
        }
    }
    queue_.erase(
        std::remove_if(queue_.begin(), queue_.end(),
                       [](const auto& j) { return j->cancelled || !j->error.empty() || j->next >= j->inputs.size(); }),
        queue_.end());
    return batch;
}

void embedder::run() {
    for (;;) {
        std::vector<batch_entry> batch;
        {
            std::unique_lock lock(mu_);
            work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
            if (stopping_) return;
            batch = next_batch();
        }
        if (!batch.empty()) compute(batch);
    }
}

void embedder::compute(const std::vector<batch_entry>& batch) {
    size_t n_tokens = 0;
    for (const auto& e : batch) n_tokens += e.owner->inputs[e.input].size();
    llama_batch b = llama_batch_init(int32_t(n_tokens), 0, 1);
    for (size_t s = 0; s < batch.size(); ++s) {
        const auto& tokens = batch[s].owner->inputs[batch[s].input];
        for (size_t i = 0; i < tokens.size(); ++i) {
            const int32_t k = b.n_tokens++;
            b.token[k] = tokens[i];
            b.pos[k] = llama_pos(i);
            b.n_seq_id[k] = 1;
            b.seq_id[k][0] = llama_seq_id(s);
            b.logits[k] = true;  // an embedding context outputs every row anyway
        }
    }
    if (llama_memory_t mem = llama_get_memory(ctx_.get())) llama_memory_clear(mem, true);
    const int rc = llama_decode(ctx_.get(), b);
    llama_batch_free(b);

    std::vector<std::vector<float>> vectors(batch.size());
    std::string error;
    if (rc != 0) {
        error = "llama_decode failed (" + std::to_string(rc) + ") computing " + std::to_string(batch.size()) +
                " inputs of " + std::to_string(n_tokens) + " tokens";
        log::error("embedder", "{}", error);
    } else {
        for (size_t s = 0; s < batch.size(); ++s) {
            const float* pooled = llama_get_embeddings_seq(ctx_.get(), llama_seq_id(s));
            if (!pooled) {
                error = "llama.cpp returned no pooled embedding";
                break;
            }
            vectors[s].resize(size_t(n_embd_));
            const int normalize = pooling_ == LLAMA_POOLING_TYPE_RANK ? -1 : batch[s].owner->normalize;
            common_embd_normalize(pooled, vectors[s].data(), n_embd_, normalize);
        }
    }

    std::lock_guard lock(mu_);
    ++counters_.decodes;
    for (size_t s = 0; s < batch.size(); ++s) {
        job& j = *batch[s].owner;
        if (!error.empty()) {
            j.error = error;
            j.error_status = 500;
            continue;
        }
        j.vectors[batch[s].input] = std::move(vectors[s]);
        ++j.done;
        ++counters_.inputs;
        counters_.tokens += j.inputs[batch[s].input].size();
    }
    done_cv_.notify_all();
}

}  // namespace keepwarm

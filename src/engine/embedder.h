// The embedding engine: an embedding model loaded with its own llama_context (embeddings on, the model's pooling),
// and one thread that turns queued inputs (token ids) into one pooled, normalised vector each, computing the inputs
// of every waiting request together: as many whole inputs per llama_decode as fit in its batch (tokens) and its
// sequences, taken one per request in turn, so a request of many inputs does not hold back a request of one.
// Threading: embed() from any thread (it blocks until its inputs are computed, and throws request_error for what
// cannot be served); the worker thread alone touches the llama_context. model() and vocab() are read-only and safe to
// share (tokenizing happens on the caller's thread).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/cpu-threadpool.h"
#include "llama-cpp.h"
#include "llama.h"

namespace keepwarm {

// The pooling type a GGUF file declares (<arch>.pooling_type), read from its header alone; LLAMA_POOLING_TYPE_NONE
// when it declares none (a chat model). Throws std::runtime_error when the file is not a readable GGUF.
enum llama_pooling_type model_file_pooling(const std::string& path);

// "mean", "cls", "last", "rank", "none".
const char* pooling_name(enum llama_pooling_type pooling);

struct embedder_options {
    std::string model_path;
    // Tokens one input may have (each input is computed whole in one physical batch, as mean and cls pooling need);
    // 0: the model's trained context, at most 8192.
    int context_size = 0;
    // Tokens one llama_decode computes, several inputs together (n_batch = n_ubatch, and the KV cells: the cache is
    // cleared after each call); raised to context_size when smaller.
    int batch_size = 2048;
    int max_sequences = 16;  // inputs one llama_decode computes together (n_seq_max)
    int threads = 0;         // 0: one per physical core
    int gpu_layers = -1;
    llama_flash_attn_type flash_attn = LLAMA_FLASH_ATTN_TYPE_AUTO;
    llama_load_mode load_mode = LLAMA_LOAD_MODE_AUTO;
    enum llama_pooling_type pooling = LLAMA_POOLING_TYPE_UNSPECIFIED;  // unspecified: the model's own
    int max_queue = 64;  // requests that may wait; one more gets a 503 with Retry-After (0: no limit)
    bool verbose = false;
};

// How embed() scales each vector, as llama-server's embd_normalize: -1 none, 0 max absolute (int16 range), 2
// Euclidean (the default), p > 2 the p-norm.
constexpr int euclidean_norm = 2;

class embedder {
public:
    // Loads the model and starts the worker thread. Throws std::invalid_argument for a model that does not pool (no
    // pooling type and none given), std::runtime_error when the model or context cannot be made. A reranker (rank
    // pooling) is served too: its "vector" is its classifier's scores, never normalised (the first is the relevance).
    explicit embedder(embedder_options options);
    ~embedder();  // stops the worker; requests still waiting end with a 503
    embedder(const embedder&) = delete;
    embedder& operator=(const embedder&) = delete;

    // One vector of n_embd() floats per input, in order, scaled by `normalize` (see euclidean_norm). Each input must
    // be non-empty, at most context_size() tokens, of ids in the vocab (request_error 400 otherwise); a full queue
    // is a 503. `client_gone` is polled while waiting and at the end: true drops the request's inputs not yet computed
    // and embed() returns no vectors.
    std::vector<std::vector<float>> embed(const std::vector<std::vector<llama_token>>& inputs,
                                          int normalize = euclidean_norm,
                                          const std::function<bool()>& client_gone = nullptr);

    const llama_model* model() const { return model_.get(); }
    const llama_vocab* vocab() const { return llama_model_get_vocab(model_.get()); }
    const embedder_options& options() const { return options_; }  // context and batch sizes as resolved
    int context_size() const { return options_.context_size; }
    int n_embd() const { return n_embd_; }  // values per vector (a reranker: its classifier's labels)
    enum llama_pooling_type pooling() const { return pooling_; }
    // The fewest tokens `bytes` of text can make (BPE and SPM vocabs: no piece is longer than the longest; 0 for
    // others), so a text that cannot fit is refused, or cut, before it is tokenized.
    size_t min_tokens_for_text(size_t bytes) const {
        return longest_piece_bytes_ == 0 ? 0 : (bytes + longest_piece_bytes_ - 1) / longest_piece_bytes_;
    }
    size_t longest_piece_bytes() const { return longest_piece_bytes_; }

    // Counters for /metrics and tests (any thread).
    struct counters {
        uint64_t requests = 0;
        uint64_t inputs = 0;
        uint64_t tokens = 0;
        uint64_t decodes = 0;  // llama_decode calls
    };
    counters stats() const;

private:
    struct job;
    void run();
    // Takes the next batch's inputs from the waiting jobs, one per job in turn. Caller holds mu_.
    struct batch_entry {
        std::shared_ptr<job> owner;
        size_t input = 0;
    };
    std::vector<batch_entry> next_batch();
    void compute(const std::vector<batch_entry>& batch);

    embedder_options options_;
    llama_model_ptr model_;
    llama_context_ptr ctx_;  // worker thread only
    std::unique_ptr<cpu_threadpool> pool_;
    int n_embd_ = 0;
    enum llama_pooling_type pooling_ = LLAMA_POOLING_TYPE_NONE;
    size_t longest_piece_bytes_ = 0;

    mutable std::mutex mu_;
    std::condition_variable work_cv_;         // a job arrived, or stop
    std::condition_variable done_cv_;         // a batch was computed
    std::deque<std::shared_ptr<job>> queue_;  // guarded by mu_: jobs with inputs not yet taken
    counters counters_;                       // guarded by mu_
    bool stopping_ = false;                   // guarded by mu_
    std::thread worker_;
};

}  // namespace keepwarm

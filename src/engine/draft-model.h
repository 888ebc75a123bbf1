// A draft model for speculative decoding (serve -md FILE, llama-server's meaning): loaded beside the target model
// through llama.cpp's common (common_speculative_init_from_params, as llama-server does), with a context of one
// sequence per slot, and drafting with common's draft-simple (greedy over the draft model's top tokens, stopping
// under --spec-draft-p-min).
// keepwarm's target context holds more than the slots (parked conversations, a prefix cache restored from RAM and
// disk), so the draft context does not mirror its batches as llama-server's does: each sequence keeps the tokens its
// KV holds, and a request taken into one keeps the longest prefix it shares with them (the free sequence holding the
// most of the prompt is chosen) and computes the rest in the draft model before its first draft, a bounded piece per
// step. After each draft the draft's own rows stay as far as the target accepted them.
// Threading: engine thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/cpu-threadpool.h"
#include "llama-cpp.h"

struct common_params;
struct common_speculative;
struct ggml_threadpool;
struct common_speculative_init_result;

namespace keepwarm {

// What llama-server gives common for a drafting context beside the model's context `target_ctx` (a draft model's,
// or the MTP heads'): `slots` sequences and `target_ctx`'s batch sizes and threads, no perf counters.
void drafting_params_beside(common_params& params, llama_context* target_ctx, int slots);

struct draft_model_options {
    std::string path;     // the draft model's GGUF (-md); empty: no draft model
    int gpu_layers = -1;  // -ngld: layers of the draft model on a GPU (-1: all)
    float p_min = 0;      // --spec-draft-p-min: a draft stops at a token the draft model gives less than this
    // -td / -tbd: threads of the draft context's one-token steps and of its batches (catching up with a prompt);
    // 0: the model's own --threads / --threads-batch, as llama-server takes them.
    int threads = 0;
    int threads_batch = 0;
    ggml_type cache_type_k = GGML_TYPE_F16;  // -ctkd
    ggml_type cache_type_v = GGML_TYPE_F16;  // -ctvd
    // -devd: the devices the draft model's layers go to, llama-server's syntax (DEV1,DEV2 or none: none, the CPU);
    // empty: llama.cpp's default, every GPU.
    std::string devices;
    // -otd: PATTERN=BUFFER_TYPE,... (each given value may list several): the draft model's tensors whose names match
    // PATTERN go to that buffer type (CPU, CUDA0, ...), as llama-server's --override-tensor-draft.
    std::vector<std::string> tensor_overrides;
    // Tokens of a request's prompt the draft context computes per draft call while it catches up with the sequence
    // (the rest waits for the next step): bounds what one step of the engine spends in the draft model.
    int catch_up_tokens = 512;
};

// What the draft model did, for the log and the tests. Engine thread only.
struct draft_model_stats {
    uint64_t reused_tokens = 0;    // prompt tokens a request found in its draft sequence's KV
    uint64_t computed_tokens = 0;  // tokens the draft context computed to catch up with a sequence
    uint64_t drafted_tokens = 0;   // tokens the draft model proposed
    double catch_up_ms = 0;
    double draft_ms = 0;
};

class draft_model {
public:
    // Loads the draft model and its context (the target's context size, `slots` sequences, the target context's
    // batch sizes; the target's threads and thread pools unless -td/-tbd say otherwise). Throws std::runtime_error
    // when the file does not load, when its vocabulary is not the target's (llama.cpp's check in common, as
    // llama-server refuses it), or when its KV cannot be cut at a position (a recurrent or hybrid draft model); and
    // std::invalid_argument, naming the flag, for a device or buffer type llama.cpp does not have (-devd, -otd).
    draft_model(const draft_model_options& options, llama_model* target, llama_context* target_ctx, int slots,
                ggml_threadpool* decode_pool, ggml_threadpool* prompt_pool);
    ~draft_model();
    draft_model(const draft_model&) = delete;
    draft_model& operator=(const draft_model&) = delete;

    // A sequence for a request whose prompt is `prompt`: of the free ones, the one whose KV holds the longest prefix
    // of it. At most `slots` are taken at once.
    int acquire(std::span<const llama_token> prompt);
    void release(int seq);

    // Up to `max_tokens` tokens to follow `tokens` (the request's tokens so far) in sequence `seq`. First brings the
    // sequence's KV to all of `tokens` but the last (common's n_past and id_last), at most catch_up_tokens of them per
    // call: empty while it is behind, or when the draft model has nothing it is sure enough of.
    std::vector<llama_token> draft(int seq, const std::vector<llama_token>& tokens, std::size_t max_tokens);

    // What a drafted token costs in the draft model, averaged over recent drafts (0: none yet).
    double ms_per_token() const { return ms_per_token_; }
    const draft_model_stats& stats() const { return stats_; }
    llama_context* context() const;

private:
    bool catch_up(int seq, std::span<const llama_token> tokens, std::size_t limit);

    draft_model_options options_;
    // The draft's own CPU thread pools where -td/-tbd differ from the model's (else it shares the model's).
    std::unique_ptr<cpu_threadpool> decode_pool_, prompt_pool_;
    std::unique_ptr<common_speculative_init_result> loaded_;  // the draft model and its context
    common_speculative* spec_ = nullptr;
    llama_batch batch_{};
    int batch_size_ = 0;
    std::vector<std::vector<llama_token>> held_;  // per sequence: the tokens its KV holds, in position order
    std::vector<bool> taken_;
    std::vector<llama_token> result_;
    double ms_per_token_ = 0;
    draft_model_stats stats_;
};

}  // namespace keepwarm

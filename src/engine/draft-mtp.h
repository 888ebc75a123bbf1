// Drafting with the model's own multi-token prediction heads (serve --spec-type draft-mtp, llama-server's meaning;
// Qwen3.5's nextn layer): through llama.cpp's common (common_speculative's draft-mtp, as llama-server drafts with
// it), an MTP context beside the model's with a sequence per slot. The model's context outputs each row's hidden
// state before the output norm; every batch it decodes is fed to the MTP context (process), which computes its own
// KV for the slots' rows from them, and a draft runs the head from the last accepted token.
// keepwarm's prefix cache restores a conversation's KV into a slot from other sequences, RAM or disk, which the MTP
// context never saw: a sequence keeps the rows it computed while the slot's tokens stay the same (a later turn of the
// same conversation in the same slot keeps its prefix), and starts over where a request's first rows do not follow
// them. The head then attends to less than the whole conversation: weaker drafts, never other answers (the model
// verifies every draft token).
// Threading: engine thread only.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "llama-cpp.h"

struct common_speculative;
struct common_speculative_init_result;

namespace keepwarm {

// Throws std::invalid_argument naming --spec-type draft-mtp, `model_name` and the architecture's nextn_predict_layers
// key when `model` has no MTP heads.
void require_mtp_heads(const llama_model* model, const std::string& model_name);

// What the MTP heads did, for the log and the tests. Engine thread only.
struct mtp_stats {
    uint64_t fed_tokens = 0;  // rows of the model's batches the MTP context computed
    uint64_t restarts = 0;    // sequences started over (another conversation, or rows it never saw before)
    uint64_t drafted_tokens = 0;
    uint64_t failed_batches = 0;  // batches the MTP context could not compute (its sequences started over)
    double process_ms = 0;        // computing the model's rows
    double draft_ms = 0;          // drafting
};

class mtp_heads {
public:
    // Makes the MTP context for `target` (the model's context size and batch sizes, `slots` sequences, KV of
    // `cache_type_k`/`cache_type_v`) and has `target_ctx` output the hidden states it reads. A draft computes up to
    // `max_tokens` tokens (the most a step verifies), stopping at one the head gives less than `p_min`. Throws
    // std::invalid_argument naming --spec-type draft-mtp when the model has no MTP heads, std::runtime_error when
    // llama.cpp makes no MTP context.
    mtp_heads(llama_model* target, llama_context* target_ctx, int slots, int max_tokens, float p_min,
              ggml_type cache_type_k, ggml_type cache_type_v, ggml_threadpool* decode_pool,
              ggml_threadpool* prompt_pool);
    ~mtp_heads();
    mtp_heads(const mtp_heads&) = delete;
    mtp_heads& operator=(const mtp_heads&) = delete;

    // A request whose prompt is `prompt` takes `slot`: its sequence keeps the prefix it shares with the prompt.
    void begin(int slot, std::span<const llama_token> prompt);
    // The model's context just decoded `batch`'s first `rows` rows (every row a slot's sequence): the MTP context
    // computes them. Never throws: on a failure the batch's sequences start over.
    void decoded(const llama_batch& batch, int rows);
    // Up to `max_tokens` tokens to follow `last` at position `position` of `slot` (the position of the token the next
    // batch decodes; the sequence holds the rows before it).
    std::vector<llama_token> draft(int slot, llama_pos position, llama_token last, std::size_t max_tokens);
    // The model accepted `accepted` tokens of the draft that followed `position`: the rejected rows leave the MTP
    // context and the next draft starts from the last accepted row's hidden state.
    void accepted(int slot, llama_pos position, std::size_t accepted);

    double ms_per_token() const { return ms_per_token_; }
    const mtp_stats& stats() const { return stats_; }
    llama_context* context() const;

private:
    // Rows of a slot's sequence: positions [first, first + tokens.size()) are in the MTP context's KV.
    struct sequence {
        llama_pos first = 0;
        std::vector<llama_token> tokens;
        llama_pos end() const { return first + static_cast<llama_pos>(tokens.size()); }
    };
    void cut(int slot, llama_pos from);  // drops the rows at and after `from`
    void restart(int slot);              // drops all its rows

    std::unique_ptr<common_speculative_init_result> loaded_;  // the MTP context
    common_speculative* spec_ = nullptr;
    std::vector<sequence> sequences_;
    std::vector<bool> drafted_;  // per slot: common made a draft for it (its accept needs one)
    std::vector<llama_token> result_, no_prompt_;
    double ms_per_token_ = 0;
    mtp_stats stats_;
};

}  // namespace keepwarm

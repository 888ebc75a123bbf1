// See draft-mtp.h.
#include "engine/draft-mtp.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

#include "base/logger.h"
#include "common.h"
#include "engine/draft-model.h"
#include "speculative.h"

namespace keepwarm {

namespace {

using clock = std::chrono::steady_clock;

// The engine verifies at most this many draft tokens per step (--draft-max's bound); each call asks for fewer.
constexpr int32_t draft_limit = 256;

}  // namespace

void require_mtp_heads(const llama_model* model, const std::string& model_name) {
    if (llama_model_n_layer_nextn(model) > 0) return;
    char arch[64] = {};
    llama_model_meta_val_str(model, "general.architecture", arch, sizeof arch);
    throw std::invalid_argument("--spec-type draft-mtp drafts with the model's multi-token prediction heads, and " +
                                model_name + " has none (" + arch +
                                ".nextn_predict_layers is 0 or missing): use another --spec-type, or a model that "
                                "ships MTP heads (e.g. Qwen3.5)");
}

mtp_heads::mtp_heads(llama_model* target, llama_context* target_ctx, int slots, int max_tokens, float p_min,
                     ggml_type cache_type_k, ggml_type cache_type_v, ggml_threadpool* decode_pool,
                     ggml_threadpool* prompt_pool) {
    require_mtp_heads(target, "this model");
    // llama-server's route: its options as common_params, the MTP context made by common beside the model's.
    common_params params;
    drafting_params_beside(params, target_ctx, slots);
    params.kv_unified = true;  // one cell pool, as the model's: a slot's sequence may hold more than a share of it
    params.speculative.types = {COMMON_SPECULATIVE_TYPE_DRAFT_MTP};
    common_params_speculative_draft& d = params.speculative.draft;
    // common's draft-mtp decodes up to its n_max tokens whatever a call asks for (the call's bound only cuts the
    // result): the most a step verifies, not more.
    d.n_max = std::clamp(max_tokens, 1, draft_limit);
    d.n_min = 0;  // the engine applies --spec-draft-n-min to what it verifies
    d.p_min = p_min;
    d.cache_type_k = cache_type_k;
    d.cache_type_v = cache_type_v;
    common_params mtp_params = common_base_params_to_speculative(params);
    loaded_ = common_speculative_init_from_params(mtp_params, target, target_ctx);
    llama_context* ctx = loaded_->context();
    if (!ctx) throw std::runtime_error("llama.cpp made no MTP context for this model (see its log above)");
    if (decode_pool) llama_attach_threadpool(ctx, decode_pool, prompt_pool);
    d.ctx_tgt = target_ctx;
    d.ctx_dft = ctx;
    // Sets the model's context to output the hidden states (llama_set_embeddings_nextn) the MTP context reads.
    spec_ = common_speculative_init(params.speculative, static_cast<uint32_t>(slots));
    if (!spec_) throw std::runtime_error("llama.cpp made no MTP drafter for this model");
    sequences_.resize(static_cast<size_t>(slots));
    drafted_.assign(static_cast<size_t>(slots), false);
}

mtp_heads::~mtp_heads() {
    log::info("speculative",
              "MTP heads: {} rows computed in {} ms, {} tokens drafted in {} ms, {} restarts, {} failed batches",
              stats_.fed_tokens, log::fixed(stats_.process_ms, 1), stats_.drafted_tokens,
              log::fixed(stats_.draft_ms, 1), stats_.restarts, stats_.failed_batches);
    if (spec_) common_speculative_free(spec_);
}

llama_context* mtp_heads::context() const {
    return loaded_->context();
}

void mtp_heads::cut(int slot, llama_pos from) {
    sequence& s = sequences_[static_cast<size_t>(slot)];
    if (from <= s.first) {
        restart(slot);
        return;
    }
    if (from >= s.end()) return;
    if (!llama_memory_seq_rm(llama_get_memory(context()), slot, from, -1)) {
        restart(slot);
        return;
    }
    s.tokens.resize(static_cast<size_t>(from - s.first));
}

void mtp_heads::restart(int slot) {
    sequence& s = sequences_[static_cast<size_t>(slot)];
    if (!s.tokens.empty()) stats_.restarts++;
    llama_memory_seq_rm(llama_get_memory(context()), slot, -1, -1);
    s.first = 0;
    s.tokens.clear();
}

void mtp_heads::begin(int slot, std::span<const llama_token> prompt) {
    if (slot < 0 || static_cast<size_t>(slot) >= sequences_.size()) return;
    const sequence& s = sequences_[static_cast<size_t>(slot)];
    if (s.first != 0) {
        restart(slot);
        return;
    }
    size_t shared = 0;
    while (shared < std::min(prompt.size(), s.tokens.size()) && prompt[shared] == s.tokens[shared]) ++shared;
    cut(slot, static_cast<llama_pos>(shared));
}

void mtp_heads::decoded(const llama_batch& batch, int rows) {
    if (rows <= 0 || batch.token == nullptr) return;
    // common's draft-mtp takes each sequence's rows as one run of consecutive positions, one sequence a row.
    std::vector<int> first_row(sequences_.size(), -1);
    for (int k = 0; k < rows; ++k) {
        const llama_seq_id seq = batch.seq_id[k][0];
        if (batch.n_seq_id[k] != 1 || seq < 0 || static_cast<size_t>(seq) >= sequences_.size()) return;
        if (first_row[static_cast<size_t>(seq)] < 0) first_row[static_cast<size_t>(seq)] = k;
    }
    // Each sequence's rows must follow those it holds: rows it holds from there on are gone from the model's
    // sequence (a rejected draft, a new request), and rows it never saw (a prefix the cache restored) start it over.
    for (size_t seq = 0; seq < sequences_.size(); ++seq) {
        if (first_row[seq] < 0) continue;
        const llama_pos p = batch.pos[first_row[seq]];
        const int slot = static_cast<int>(seq);
        sequence& s = sequences_[seq];
        if (!s.tokens.empty() && (p < s.first || p > s.end())) restart(slot);
        if (!s.tokens.empty()) cut(slot, p);
        if (s.tokens.empty()) s.first = p;
    }
    llama_batch view = batch;
    view.n_tokens = rows;
    bool ok = false;
    const auto started = clock::now();
    try {
        ok = common_speculative_process(spec_, view);
    } catch (const std::exception&) {
        ok = false;
    }
    stats_.process_ms += std::chrono::duration<double, std::milli>(clock::now() - started).count();
    if (!ok) {
        stats_.failed_batches++;
        for (size_t seq = 0; seq < sequences_.size(); ++seq) {
            if (first_row[seq] >= 0) restart(static_cast<int>(seq));
        }
        return;
    }
    for (int k = 0; k < rows; ++k) sequences_[static_cast<size_t>(batch.seq_id[k][0])].tokens.push_back(batch.token[k]);
    stats_.fed_tokens += static_cast<uint64_t>(rows);
}

std::vector<llama_token> mtp_heads::draft(int slot, llama_pos position, llama_token last, size_t max_tokens) {
    if (slot < 0 || static_cast<size_t>(slot) >= sequences_.size() || max_tokens == 0) return {};
    const sequence& s = sequences_[static_cast<size_t>(slot)];
    // The head reads the hidden state of the row before `position`: the MTP context must have computed it.
    if (s.tokens.empty() || s.end() != position) return {};
    try {
        const auto started = clock::now();
        result_.clear();
        common_speculative_get_draft_params(spec_, slot) = {
            /* .drafting = */ true,
            /* .n_max    = */ static_cast<int32_t>(std::min<size_t>(max_tokens, draft_limit)),
            /* .n_past   = */ position,
            /* .id_last  = */ last,
            /* .prompt   = */ &no_prompt_,
            /* .result   = */ &result_,
        };
        common_speculative_draft(spec_);
        // Drafting computed `last` and the draft's tokens in the MTP context: the model's verifying batch brings
        // its own rows for them, with its hidden states.
        llama_memory_seq_rm(llama_get_memory(context()), slot, position, -1);
        const double ms = std::chrono::duration<double, std::milli>(clock::now() - started).count();
        const double per_token = ms / static_cast<double>(std::max<size_t>(1, result_.size()));
        ms_per_token_ = ms_per_token_ == 0 ? per_token : 0.8 * ms_per_token_ + 0.2 * per_token;
        stats_.drafted_tokens += result_.size();
        stats_.draft_ms += ms;
        if (!result_.empty()) drafted_[static_cast<size_t>(slot)] = true;
        if (result_.size() > max_tokens) result_.resize(max_tokens);
        return result_;
    } catch (const std::exception&) {
        restart(slot);
        return {};
    }
}

void mtp_heads::accepted(int slot, llama_pos position, size_t accepted) {
    if (slot < 0 || static_cast<size_t>(slot) >= sequences_.size()) return;
    // common keeps the hidden state of the last accepted row for the next draft (a sequence that never drafted has
    // none to keep: common asserts on it).
    if (drafted_[static_cast<size_t>(slot)]) {
        common_speculative_accept(spec_, slot, static_cast<uint16_t>(std::min<size_t>(accepted, draft_limit)));
    }
    cut(slot, position + 1 + static_cast<llama_pos>(accepted));
}

}  // namespace keepwarm

// See draft-model.h.
#include "engine/draft-model.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "common.h"
#include "engine/backend-placement.h"
#include "speculative.h"

namespace keepwarm {

namespace {

using clock = std::chrono::steady_clock;

double ms_since(clock::time_point t) {
    return std::chrono::duration<double, std::milli>(clock::now() - t).count();
}

size_t shared_prefix(std::span<const llama_token> a, std::span<const llama_token> b) {
    const size_t n = std::min(a.size(), b.size());
    size_t i = 0;
    while (i < n && a[i] == b[i]) ++i;
    return i;
}

// The engine verifies at most this many draft tokens per step (--spec-draft-n-max's bound); each call asks for fewer.
constexpr int32_t draft_limit = 256;

// Why `draft`'s tokens cannot stand for `target`'s ("": they can), by the rules of common's draft-simple
// (common_speculative_are_compatible, file-static there): the same vocabulary type, the same BOS/EOS where added,
// sizes within 128 tokens, the same text for every token from id 5 on. Checked here first because draft-simple's
// constructor throws on a mismatch after allocating its batch, which then leaks.
std::string vocab_mismatch(const llama_model* target, const llama_model* draft) {
    const llama_vocab* t = llama_model_get_vocab(target);
    const llama_vocab* d = llama_model_get_vocab(draft);
    if (llama_vocab_type(t) != llama_vocab_type(d)) return "another kind of tokenizer";
    if (llama_vocab_get_add_bos(t) != llama_vocab_get_add_bos(d) ||
        (llama_vocab_get_add_bos(t) && llama_vocab_bos(t) != llama_vocab_bos(d))) {
        return "another beginning-of-text token";
    }
    if (llama_vocab_get_add_eos(t) != llama_vocab_get_add_eos(d) ||
        (llama_vocab_get_add_eos(t) && llama_vocab_eos(t) != llama_vocab_eos(d))) {
        return "another end-of-text token";
    }
    const int n_target = llama_vocab_n_tokens(t);
    const int n_draft = llama_vocab_n_tokens(d);
    if (std::abs(n_target - n_draft) > 128) {
        return std::to_string(n_draft) + " tokens against the model's " + std::to_string(n_target);
    }
    for (llama_token id = 5; id < std::min(n_target, n_draft); ++id) {
        if (std::strcmp(llama_vocab_get_text(t, id), llama_vocab_get_text(d, id)) != 0) {
            return "token " + std::to_string(id) + " is another text";
        }
    }
    return {};
}

}  // namespace

void drafting_params_beside(common_params& params, llama_context* target_ctx, int slots) {
    params.n_parallel = slots;
    params.n_batch = static_cast<int32_t>(llama_n_batch(target_ctx));
    params.n_ubatch = static_cast<int32_t>(llama_n_ubatch(target_ctx));
    params.cpuparams.n_threads = llama_n_threads(target_ctx);
    params.cpuparams_batch.n_threads = llama_n_threads_batch(target_ctx);
    params.no_perf = true;
}

draft_model::draft_model(const draft_model_options& options, llama_model* target, llama_context* target_ctx, int slots,
                         ggml_threadpool* decode_pool, ggml_threadpool* prompt_pool)
    : options_(options) {
    // llama-server's route: its options as common_params, turned into the draft's by common, loaded by common.
    common_params params;
    drafting_params_beside(params, target_ctx, slots);
    params.speculative.types = {COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE};
    common_params_speculative_draft& d = params.speculative.draft;
    d.mparams.path = options.path;
    d.n_gpu_layers = options.gpu_layers;
    d.p_min = options.p_min;
    d.n_max = draft_limit;
    d.n_min = 0;  // the engine applies --spec-draft-n-min to what it verifies
    // llama-server's defaults (arg.cpp's postprocess_cpu_params): -td unset takes the model's threads, -tbd unset the
    // model's batch threads.
    d.cpuparams = params.cpuparams;
    d.cpuparams_batch = params.cpuparams_batch;
    if (options.threads > 0) d.cpuparams.n_threads = options.threads;
    if (options.threads_batch > 0) d.cpuparams_batch.n_threads = options.threads_batch;
    d.cache_type_k = options.cache_type_k;
    d.cache_type_v = options.cache_type_v;
    if (!options.devices.empty()) d.devices = parse_device_list(options.devices, "-devd/--spec-draft-device");
    const tensor_overrides placement(options.tensor_overrides, "-otd/--spec-draft-override-tensor");
    d.tensor_buft_overrides = placement.list();
    common_params draft_params = common_base_params_to_speculative(params);
    loaded_ = common_speculative_init_from_params(draft_params, target, target_ctx);
    if (!loaded_->model()) throw std::runtime_error("the draft model " + options.path + " did not load");
    llama_context* ctx = loaded_->context();
    if (!ctx) throw std::runtime_error("no context could be made for the draft model " + options.path);
    // A rejected draft token must leave the draft's sequence as it leaves the target's: a recurrent state cannot.
    if (common_context_can_seq_rm(ctx) != COMMON_CONTEXT_SEQ_RM_TYPE_PART) {
        throw std::runtime_error("the draft model " + options.path +
                                 " keeps a recurrent state that cannot drop rejected draft tokens (a hybrid or "
                                 "recurrent model); use a transformer as the draft model");
    }
    // The model's pools where the draft runs on the model's threads; its own otherwise (a pool caps the threads a
    // context attached to it computes on at the pool's size).
    const int threads = d.cpuparams.n_threads;
    const int threads_batch = d.cpuparams_batch.n_threads;
    if (threads != params.cpuparams.n_threads || threads_batch != params.cpuparams_batch.n_threads) {
        decode_pool_ = std::make_unique<cpu_threadpool>(threads);
        if (threads_batch != threads) prompt_pool_ = std::make_unique<cpu_threadpool>(threads_batch);
        decode_pool = decode_pool_->get();
        prompt_pool = prompt_pool_ ? prompt_pool_->get() : nullptr;
    }
    if (decode_pool) llama_attach_threadpool(ctx, decode_pool, prompt_pool);

    if (const std::string why = vocab_mismatch(target, llama_get_model(ctx)); !why.empty()) {
        throw std::runtime_error("the draft model " + options.path +
                                 " cannot draft for this model: its vocabulary has " + why +
                                 " (the two need the same tokenizer: a smaller model of the same family)");
    }
    d.ctx_tgt = target_ctx;
    d.ctx_dft = ctx;
    try {
        spec_ = common_speculative_init(params.speculative, static_cast<uint32_t>(slots));
    } catch (const std::exception& e) {
        // common's draft-simple refuses a draft whose vocabulary is not the target's (type, BOS/EOS, size within 128,
        // each token's text): its drafts' token ids would mean other text.
        throw std::runtime_error("the draft model " + options.path + " cannot draft for this model: " + e.what() +
                                 " (the two need the same tokenizer: a smaller model of the same family)");
    }
    if (!spec_) throw std::runtime_error("llama.cpp made no drafter for the draft model " + options.path);
    batch_size_ = static_cast<int>(llama_n_batch(ctx));
    batch_ = llama_batch_init(batch_size_, 0, 1);
    held_.resize(static_cast<size_t>(slots));
    taken_.assign(static_cast<size_t>(slots), false);
}

draft_model::~draft_model() {
    if (spec_) common_speculative_free(spec_);
    if (batch_size_ > 0) llama_batch_free(batch_);
}

llama_context* draft_model::context() const {
    return loaded_->context();
}

int draft_model::acquire(std::span<const llama_token> prompt) {
    int best = -1;
    size_t best_length = 0;
    for (size_t seq = 0; seq < held_.size(); ++seq) {
        if (taken_[seq]) continue;
        const size_t length = shared_prefix(held_[seq], prompt);
        if (best < 0 || length > best_length) {
            best = static_cast<int>(seq);
            best_length = length;
        }
    }
    if (best >= 0) {
        taken_[static_cast<size_t>(best)] = true;
        stats_.reused_tokens += best_length;
    }
    return best;
}

void draft_model::release(int seq) {
    if (seq >= 0 && static_cast<size_t>(seq) < taken_.size()) taken_[static_cast<size_t>(seq)] = false;
}

// Makes sequence `seq` hold `tokens`: keeps what it shares with them, drops the rest, and computes up to `limit` of
// the missing ones. True once it holds them all.
bool draft_model::catch_up(int seq, std::span<const llama_token> tokens, size_t limit) {
    llama_memory_t memory = llama_get_memory(loaded_->context());
    std::vector<llama_token>& held = held_[static_cast<size_t>(seq)];
    const size_t shared = shared_prefix(held, tokens);
    if (shared < held.size()) {
        if (!llama_memory_seq_rm(memory, seq, static_cast<llama_pos>(shared), -1)) {
            llama_memory_seq_rm(memory, seq, -1, -1);
            held.clear();
        }
        held.resize(std::min(held.size(), shared));
    }
    const size_t end = std::min(tokens.size(), held.size() + limit);
    while (held.size() < end) {
        const size_t n = std::min(end - held.size(), static_cast<size_t>(batch_size_));
        common_batch_clear(batch_);
        for (size_t k = 0; k < n; ++k) {
            const size_t pos = held.size() + k;
            common_batch_add(batch_, tokens[pos], static_cast<llama_pos>(pos), {seq}, false);
        }
        if (!common_speculative_process(spec_, batch_)) {
            // E.g. the draft context is full: start the sequence over rather than draft from holes.
            llama_memory_seq_rm(memory, seq, -1, -1);
            held.clear();
            return false;
        }
        held.insert(held.end(), tokens.begin() + static_cast<std::ptrdiff_t>(held.size()),
                    tokens.begin() + static_cast<std::ptrdiff_t>(held.size() + n));
        stats_.computed_tokens += n;
    }
    return held.size() == tokens.size();
}

std::vector<llama_token> draft_model::draft(int seq, const std::vector<llama_token>& tokens, size_t max_tokens) {
    if (seq < 0 || tokens.size() < 2 || max_tokens == 0) return {};
    // A draft is an optimization: whatever goes wrong in common, the request decodes on without one, and the sequence
    // starts over at the next proposal.
    try {
        const auto catch_up_started = clock::now();
        const std::span<const llama_token> before_last(tokens.data(), tokens.size() - 1);
        const bool ready = catch_up(seq, before_last, static_cast<size_t>(std::max(1, options_.catch_up_tokens)));
        stats_.catch_up_ms += ms_since(catch_up_started);
        if (!ready) return {};

        const auto draft_started = clock::now();
        std::vector<llama_token>& held = held_[static_cast<size_t>(seq)];
        result_.clear();
        common_speculative_get_draft_params(spec_, seq) = {
            /* .drafting = */ true,
            /* .n_max    = */ static_cast<int32_t>(std::min<size_t>(max_tokens, draft_limit)),
            /* .n_past   = */ static_cast<llama_pos>(held.size()),
            /* .id_last  = */ tokens.back(),
            /* .prompt   = */ &held,
            /* .result   = */ &result_,
        };
        common_speculative_draft(spec_);
        const double ms = ms_since(draft_started);
        stats_.draft_ms += ms;
        stats_.drafted_tokens += result_.size();
        const double per_token = ms / static_cast<double>(std::max<size_t>(1, result_.size()));
        ms_per_token_ = ms_per_token_ == 0 ? per_token : 0.8 * ms_per_token_ + 0.2 * per_token;

        // Drafting computed the last token and the draft's tokens but its last: the sequence holds them, and the next
        // call keeps those the target accepted (the rest differ from the tokens it is given then).
        const llama_pos pos_max = llama_memory_seq_pos_max(llama_get_memory(loaded_->context()), seq);
        held.push_back(tokens.back());
        for (const llama_token t : result_) held.push_back(t);
        held.resize(std::min(held.size(), static_cast<size_t>(std::max(pos_max + 1, 0))));
        if (result_.size() > max_tokens) result_.resize(max_tokens);
        return result_;
    } catch (const std::exception&) {
        llama_memory_seq_rm(llama_get_memory(loaded_->context()), seq, -1, -1);
        held_[static_cast<size_t>(seq)].clear();
        return {};
    }
}

}  // namespace keepwarm

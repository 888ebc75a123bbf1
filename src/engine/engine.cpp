// See engine.h. The decode loop: admit queued requests into free slots (reusing each slot's cached prefix),
// then each step decodes one token for every generating slot plus as much pending prompt as fits in the batch.
#include "engine/engine.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <stdexcept>

#include "base/logger.h"
#include "base/request-error.h"
#include "cache/block-key.h"
#include "common.h"
#include "engine/cpu-threadpool.h"
#include "engine/draft-control.h"
#include "engine/draft-mtp.h"
#include "engine/llama-runtime.h"
#include "engine/text-stream.h"
#include "ggml-backend.h"

namespace keepwarm {

namespace {
using clock = std::chrono::steady_clock;

double ms_between(clock::time_point a, clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

// ggml's CPU flash attention computes 64 query rows at a time, and a batch of fewer takes a row-by-row path several
// to many times slower per token: beside a stream, a 12K prompt in 47-token chunks took 19.2 s to prefill, in whole
// tiles 9.0 s (alone 6.2-6.7 s); on a 2-core Zen host 16K deep, 16 rows took 1.5 s and 64 rows 0.42 s. Prompt chunks
// that ride along with generating slots are sized in whole tiles, and a batch under a tile is filled up to one where
// that costs less (engine::tile_padding_rows).
constexpr int attention_tile = 64;
// Shallower than this, a step's cost is more the weights' than attention's, and its cost per position of depth says
// little (see engine::tile_padding_rows).
constexpr int padding_min_depth = 2048;
// Prompt rows of a step that measures what rows cost row by row (engine::row_probe); as few as that cost is learnt
// from (engine::learn_row_costs), so that the weights' share, read once a step, stays small beside the rows'.
constexpr size_t row_probe_rows = 4;

// A running average of noisy step costs that follows a slow change (a prompt's depth): half of it is the newest value.
void update_average(double& average, double value) {
    constexpr double weight = 0.5;
    average = average > 0 ? average + weight * (value - average) : value;
}

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now().time_since_epoch()).count();
}

size_t common_prefix_length(const std::vector<llama_token>& a, const std::vector<llama_token>& b) {
    const size_t n = std::min(a.size(), b.size());
    size_t i = 0;
    while (i < n && a[i] == b[i]) ++i;
    return i;
}
}  // namespace

int recurrent_rollback_snapshots(const engine_options& options) {
    if (options.spec_type == "none" || options.draft_max <= 0 || options.exact_reuse) return 0;
    // llama.cpp keeps a verifying step's last 1 + n rows of a sequence in one physical batch, which must be longer.
    const int ubatch = std::min(options.ubatch_size, options.batch_size);
    return std::max(0, std::min({options.draft_max, options.rollback_tokens, ubatch - 2}));
}

const char* draft_source_name(draft_source source) {
    switch (source) {
        case draft_source::request:
            return "request";
        case draft_source::history:
            return "history";
        case draft_source::llama:
            return "llama";
        case draft_source::draft_model:
            return "draft_model";
        case draft_source::mtp:
            return "mtp";
    }
    return "unknown";
}

void generation_stream::push(generation_event event) {
    {
        std::lock_guard lock(mu_);
        events_.push_back(std::move(event));
    }
    cv_.notify_one();
}

std::optional<generation_event> generation_stream::pop(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
    generation_event merged = std::move(events_.front());
    events_.pop_front();
    while (!merged.done && !events_.empty()) {
        generation_event next = std::move(events_.front());
        events_.pop_front();
        next.text = merged.text + next.text;
        if (!next.progress) next.progress = std::move(merged.progress);
        merged = std::move(next);
    }
    return merged;
}

struct engine::slot {
    int id = 0;
    std::vector<llama_token> cached;  // tokens whose KV sequence `id` holds, in position order
    std::string tenant;               // whose tokens those are
    std::shared_ptr<generation_request> request;
    cache_restore restored;   // what the prefix cache supplied for this request
    std::vector<int> cuts;    // checkpointed models: a token before each message start, where a checkpoint is taken
    int follow = -1;          // waits for this slot to compute a prompt prefix shared with it ...
    size_t follow_until = 0;  // ... up to here, then takes it from the cache instead of computing it twice
    token_sampler_ptr sampler;
    std::unique_ptr<text_stream> text;
    size_t prompt_done = 0;  // prompt tokens in the KV (reused + computed)
    int reused = 0;
    llama_token pending = -1;  // sampled but not yet decoded
    int batch_index = -1;      // index in the current batch whose logits belong to this slot
    int generated = 0;
    double sampling_ms = 0;                  // in the sampler, over every sampled token
    double sampling_max_ms = 0;              // ... the longest one
    std::vector<llama_token> generated_ids;  // sampled tokens, for the final event
    std::vector<std::vector<float>> logits;  // request->keep_logits first positions
    // Speculative decoding: the request's draft source, the draft this step verifies (empty: none), a draft that was
    // not sent (it did not pay) and is checked against the tokens that follow (shadow_at of them so far), how long
    // drafts should be, and the request's counts.
    std::unique_ptr<slot_drafter> drafter;
    draft_proposal draft;
    std::vector<llama_token> shadow;
    size_t shadow_at = 0;
    draft_control control;
    int draft_tokens = 0, draft_accepted = 0, draft_steps = 0, decode_steps = 0;
    int steps_since_probe = 0;  // a costly drafter's steps without a draft (see add_draft)
    clock::time_point admitted, prompt_started, first_token;
    clock::time_point last_used;
    // For /slots, kept after the request leaves: its id and prompt size, and when it entered or left (wall clock).
    std::string request_id;
    int prompt_tokens = 0;
    std::chrono::system_clock::time_point last_used_at{};

    bool busy() const { return request != nullptr; }
    bool prefilling() const { return request && prompt_done < request->prompt.size(); }
};

engine::engine(engine_options options) : options_(std::move(options)) {
    init_llama_runtime(options_.verbose);
    if (options_.slots < 1) throw std::invalid_argument("--parallel must be at least 1");
    if (options_.context_size < 16 * options_.slots) {
        throw std::invalid_argument("--ctx-size must be at least 16 tokens per slot");
    }
    if (options_.batch_size < 1 || options_.ubatch_size < 1) throw std::invalid_argument("batch sizes must be >= 1");

    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = options_.gpu_layers;
    mparams.load_mode = options_.load_mode;
    // The MTP heads' tensors are loaded only to draft with them.
    mparams.load_mtp = options_.spec_type == draft_sources::mtp_type;
    // llama.cpp reads the patterns while loading only; the list ends with a null pattern.
    const std::vector<std::string> host_experts = expert_tensor_patterns(options_.cpu_moe_layers);
    std::vector<llama_model_tensor_buft_override> placement;
    if (!host_experts.empty()) {
        ggml_backend_buffer_type_t host =
            ggml_backend_dev_buffer_type(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU));
        for (const std::string& pattern : host_experts) placement.push_back({pattern.c_str(), host});
        placement.push_back({nullptr, nullptr});
        mparams.tensor_buft_overrides = placement.data();
    }
    model_.reset(llama_model_load_from_file(options_.model_path.c_str(), mparams));
    if (!model_) throw std::runtime_error("failed to load model from '" + options_.model_path + "'");
    if (const int heads = llama_model_n_layer_nextn(model_.get()); heads > 0 && !mparams.load_mtp) {
        log::info("engine", "the model's {} MTP head(s) are not loaded: --spec-type draft-mtp drafts with them", heads);
    }

    const int threads = options_.threads > 0 ? options_.threads : common_cpu_get_num_math();
    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = options_.context_size;
    cparams.n_batch = options_.batch_size;
    cparams.n_ubatch = std::min(options_.ubatch_size, options_.batch_size);
    prompt_cache_options cache_options{.slots = options_.slots,
                                       .parked_sequences = options_.cache_parked_sequences,
                                       .block_tokens = options_.cache_block_tokens,
                                       .ram_budget = options_.cache_ram_bytes,
                                       .disk_dir = options_.cache_dir,
                                       .disk_budget = options_.cache_disk_bytes,
                                       .model_fingerprint = {},
                                       .block_observer = options_.cache_block_observer};
    const bool sliding_window = llama_model_n_swa(model_.get()) > 0 && !llama_model_is_recurrent(model_.get()) &&
                                !llama_model_is_hybrid(model_.get());
    // Exact reuse cuts a prompt's KV back to whole batches, which a windowed SWA cache cannot do (the window before
    // the cut may be gone).
    const bool swa_full = sliding_window && (options_.swa_full || options_.exact_reuse);
    cache_options.guard_window_cells = swa_full;
    cache_options.windowed_swa = sliding_window && !swa_full;
    if (prompt_cache::sequences_needed(cache_options) + 1 > 256) {
        throw std::invalid_argument("--parallel plus --cache-parked must stay below 256 sequences");
    }
    cparams.n_seq_max = static_cast<uint32_t>(prompt_cache::sequences_needed(cache_options));
    // Padding rows need a sequence of their own. Recurrent layers split a batch of several sequences into equal
    // parts (no tile to fill), and a GPU's attention has no row-by-row path.
    const bool gpu = options_.gpu_layers != 0 && ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_GPU) != nullptr;
    if (options_.exact_reuse && (llama_model_is_recurrent(model_.get()) || llama_model_is_hybrid(model_.get()) ||
                                 options_.batch_size % std::min(options_.ubatch_size, options_.batch_size) != 0)) {
        throw std::invalid_argument(
            "--exact-reuse needs a batch size that is a multiple of the physical batch size and a model whose KV can "
            "be cut (not hybrid or recurrent)");
    }
    // Padding rows change the batch a prompt's rows are computed in: never in exact reuse.
    if (!options_.exact_reuse && options_.pad_to_tile != engine_options::tile_padding::off && !gpu &&
        !llama_model_is_recurrent(model_.get()) && !llama_model_is_hybrid(model_.get()) &&
        std::min(options_.ubatch_size, options_.batch_size) >= attention_tile) {
        padding_seq_ = static_cast<llama_seq_id>(cparams.n_seq_max++);
    }
    prompt_rows_apart_ = llama_model_is_recurrent(model_.get()) || llama_model_is_hybrid(model_.get());
    cparams.kv_unified = true;  // one cell pool for all slots: sequences can later share a common prefix's cells
    // Sliding-window layers keep every position's KV (--swa-full), or about a window per sequence, the prefix cache
    // keeping windows as checkpoints (docs/sliding-window.md).
    cparams.swa_full = swa_full;
    cparams.n_threads = threads;
    cparams.n_threads_batch = options_.threads_batch > 0 ? options_.threads_batch : threads;
    cparams.type_k = options_.cache_type_k;
    cparams.type_v = options_.cache_type_v;
    cparams.flash_attn_type = options_.flash_attn;
    cparams.no_perf = true;
    // A draft's rejected tokens leave a recurrent state through snapshots llama.cpp keeps per sequence (its
    // recurrent memory holds 1 + n_rs_seq states for every sequence of the context, parked ones included:
    // docs/speculative.md#hybrid-models), where the architecture supports it. A hybrid drafts that many tokens at
    // most (draft_cap_).
    if (llama_model_is_recurrent(model_.get()) || llama_model_is_hybrid(model_.get())) {
        cparams.n_rs_seq = static_cast<uint32_t>(recurrent_rollback_snapshots(options_));
    }
    ctx_.reset(llama_init_from_model(model_.get(), cparams));
    if (!ctx_) {
        throw std::runtime_error("failed to create the llama context (context size " +
                                 std::to_string(options_.context_size) + "; quantized V cache needs flash attention)");
    }
    decode_pool_ = std::make_unique<cpu_threadpool>(threads);
    if (static_cast<int>(cparams.n_threads_batch) != threads) {
        prompt_pool_ = std::make_unique<cpu_threadpool>(static_cast<int>(cparams.n_threads_batch));
    }
    if (decode_pool_->get()) {
        llama_attach_threadpool(ctx_.get(), decode_pool_->get(), prompt_pool_ ? prompt_pool_->get() : nullptr);
    }
    // Called between graph nodes (CPU backend): a heartbeat for /health during a long decode, and how stop() cuts
    // one short.
    llama_set_abort_callback(ctx_.get(), &engine::abort_decode, this);
    options_.threads = threads;
    options_.threads_batch = cparams.n_threads_batch;
    options_.context_size = static_cast<int>(llama_n_ctx(ctx_.get()));
    if (options_.checkpoint_interval <= 0) {
        // Each checkpoint ends a prompt chunk, so the interval sets the batches a checkpointed prompt is computed in:
        // a GPU wants whole logical batches; a CPU whole physical ones (every 256 tokens, half a physical batch, made
        // a cold 8K prefill on tiny-hybrid 1.6x as long as llama-server's). An SWA window checkpoint holds a window of
        // KV: one per window at most, so that they hold no more than a full-size SWA cache would. Rounded up to whole
        // blocks, so that every checkpoint ends a block and a restore of blocks can end there.
        const bool on_gpu = options_.gpu_layers != 0 && !gpu_devices().empty();
        int batch = on_gpu ? options_.batch_size : std::min(options_.ubatch_size, options_.batch_size);
        if (cache_options.windowed_swa) batch = std::max(batch, llama_model_n_swa(model_.get()));
        const int block = options_.cache_block_tokens;
        options_.checkpoint_interval = std::max(1, (batch + block - 1) / block) * block;
    }
    slot_context_size_ = options_.context_size / options_.slots;
    if (!cache_options.disk_dir.empty()) {
        // Serialized KV depends on the model and the cache types, and what an entry covers on the block size;
        // entries written under any other are never loaded. Without flash attention V is stored transposed, and a
        // state saved one way cannot be read the other. Auto turns it on where the backend supports it (the CPU's
        // does), so only "off" is named: existing caches keep theirs.
        cache_options.model_fingerprint = model_fingerprint(
            options_.model_path,
            std::string("k=") + ggml_type_name(options_.cache_type_k) + " v=" + ggml_type_name(options_.cache_type_v) +
                " block=" + std::to_string(options_.cache_block_tokens) + " state=llama.cpp-80fb11a" +
                (options_.flash_attn == LLAMA_FLASH_ATTN_TYPE_DISABLED ? " fa=off" : "") +
                (cache_options.windowed_swa ? " swa=windowed" : ""));
    }
    cache_ = std::make_unique<prompt_cache>(ctx_.get(), std::move(cache_options));
    if (options_.draft_max < 0 || options_.draft_min < 0 || options_.draft_max > 256) {
        throw std::invalid_argument("--draft-max must be 0 to 256 and --draft-min at least 0");
    }
    if (options_.spec_type != "none" &&
        (options_.spec_type == draft_sources::draft_model_type) == options_.draft_model.path.empty()) {
        // A draft model drafts alone: refused at start rather than loaded and left unused.
        throw std::invalid_argument(options_.draft_model.path.empty()
                                        ? "--spec-type draft-simple needs a draft model (-md FILE)"
                                        : "a draft model (-md) drafts with --spec-type draft-simple (or none), not " +
                                              options_.spec_type);
    }
    // As llama-server refuses to make an MTP context for it, before anything else is set up.
    if (options_.spec_type == draft_sources::mtp_type) require_mtp_heads(model_.get(), options_.model_path);
    if (options_.spec_type != "none" && options_.draft_max > 0) {
        if (options_.exact_reuse) {
            // A verifying step computes its rows together, and on several threads ggml's attention sums a lone row's
            // KV in another order than several rows' (docs/speculative.md): not the batches a cold run computes.
            log::info("engine", "speculative decoding is off: --exact-reuse computes every answer token alone");
        } else if (cache_->droppable_draft_tokens() == 0) {
            // A draft's rejected tokens would stay in the recurrent state: llama.cpp keeps no snapshots to roll it
            // back to for this architecture (or --spec-rollback-tokens 0). (A windowed SWA cache drops them: the
            // cells its verifying step took were outside the window before the step, which the rollback returns to.)
            log::info("engine",
                      "speculative decoding is off: this model's recurrent state cannot drop a draft's rejected tokens "
                      "({})",
                      cparams.n_rs_seq == 0 ? "--spec-rollback-tokens is 0, or --ubatch-size under 3"
                                            : "llama.cpp keeps no recurrent-state snapshots for this architecture");
        } else {
            if (!cache_->can_truncate()) {
                draft_cap_ = cache_->droppable_draft_tokens();
                log::info("engine",
                          "speculative decoding on a hybrid model: drafts of up to {} tokens, dropped through as many "
                          "recurrent-state snapshots per sequence ({} sequences)",
                          draft_cap_, cparams.n_seq_max);
            }
            std::unique_ptr<draft_model> drafter_model;
            if (!options_.draft_model.path.empty()) {
                drafter_model =
                    std::make_unique<draft_model>(options_.draft_model, model_.get(), ctx_.get(), options_.slots,
                                                  decode_pool_->get(), prompt_pool_ ? prompt_pool_->get() : nullptr);
                log::info("engine", "draft model {} loaded: {} layers, a sequence per slot", options_.draft_model.path,
                          llama_model_n_layer(llama_get_model(drafter_model->context())));
            }
            std::unique_ptr<mtp_heads> mtp;
            if (options_.spec_type == draft_sources::mtp_type) {
                mtp = std::make_unique<mtp_heads>(model_.get(), ctx_.get(), options_.slots,
                                                  std::min(options_.draft_max, draft_cap_), options_.draft_model.p_min,
                                                  options_.draft_model.cache_type_k, options_.draft_model.cache_type_v,
                                                  decode_pool_->get(), prompt_pool_ ? prompt_pool_->get() : nullptr);
                log::info("engine", "drafting with the model's {} MTP head(s): an MTP context of a sequence per slot",
                          llama_model_n_layer_nextn(model_.get()));
            }
            drafts_ =
                std::make_unique<draft_sources>(options_.spec_type, options_.slots, options_.spec_history_tokens,
                                                std::move(drafter_model), cache_->model_fingerprint(), std::move(mtp));
            drafts_->recall(*cache_);  // the conversations the disk tier held before this run
            // A windowed SWA cache places a physical batch's rows in cells outside the window of its sequences'
            // positions before that batch. A draft in a second physical batch could take cells inside the window its
            // rollback returns to: every draft row goes in the first.
            draft_room_ = options_.batch_size / 2;
            if (cache_->needs_checkpoints()) draft_room_ = std::min(draft_room_, static_cast<int>(cparams.n_ubatch));
        }
    }

    const llama_vocab* vocab = llama_model_get_vocab(model_.get());
    const bool pieces_bound_text =
        llama_vocab_type(vocab) == LLAMA_VOCAB_TYPE_SPM || llama_vocab_type(vocab) == LLAMA_VOCAB_TYPE_BPE;
    for (llama_token t = 0; t < llama_vocab_n_tokens(vocab); ++t) {
        if (llama_vocab_is_eog(vocab, t)) eog_tokens_.push_back(t);
        if (pieces_bound_text) {
            char piece[512];
            const int n = llama_token_to_piece(vocab, t, piece, sizeof piece, 0, /*special=*/true);
            longest_piece_bytes_ = std::max(longest_piece_bytes_, static_cast<size_t>(n < 0 ? -n : n));
        }
    }

    batch_ = llama_batch_init(options_.batch_size, 0, 1);
    for (int i = 0; i < options_.slots; ++i) {
        auto s = std::make_unique<slot>();
        s->id = i;
        slot_status_.push_back(status_of(*s));
        slots_.push_back(std::move(s));
    }
}

engine::~engine() {
    stop();
    llama_batch_free(batch_);
    for (auto& s : slots_) s->drafter.reset();  // a draft model's drafter gives its sequence back
    drafts_.reset();  // a draft model's context: before the target's, which it was made beside, and the pools
    ctx_.reset();     // before the thread pools it uses
    prompt_pool_.reset();
    decode_pool_.reset();
}

void engine::start() {
    std::lock_guard lock(mu_);
    if (thread_.joinable()) return;
    stopping_ = false;
    abort_decode_ = false;
    thread_ = std::thread([this] { run(); });
}

void engine::stop() {
    {
        std::lock_guard lock(mu_);
        stopping_ = true;
    }
    abort_decode_ = true;
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
    std::deque<std::shared_ptr<generation_request>> orphans;
    {
        std::lock_guard lock(mu_);
        orphans.swap(queue_);
    }
    for (auto& r : orphans) {
        r->output.push({.text = {}, .done = true, .reason = finish_reason::error, .error = "server shutting down"});
    }
}

void engine::submit(std::shared_ptr<generation_request> request) {
    request->submitted = clock::now();
    if (const std::string& grammar = common_grammar_value(request->sampling.grammar); !grammar.empty()) {
        if (const std::optional<double> ms = costly_grammars_.cost_of(grammar)) {
            counters_.costly_grammar_refused++;
            char why[320];
            std::snprintf(why, sizeof why,
                          "the request's grammar (response format or tools) took %.0f ms to sample one token before "
                          "(the limit is %.0f ms: --max-sample-ms; refused for 10 minutes after that); fewer enum "
                          "values or alternatives make it cheaper",
                          *ms, options_.sample_ms_limit);
            throw request_error(400, why);
        }
    }
    {
        std::lock_guard lock(mu_);
        if (options_.max_queue > 0 && queue_.size() >= static_cast<size_t>(options_.max_queue)) {
            throw request_error(503,
                                "the server is busy: " + std::to_string(queue_.size()) +
                                    " requests are waiting for a slot (--max-queue); try again shortly",
                                "server_error", /*retry_after_s=*/1);
        }
        queue_.push_back(std::move(request));
    }
    wake_.notify_one();
}

std::vector<uint8_t> engine::kv_bytes(int slot, int p0, int p1) {
    if (slot < 0 || slot >= options_.slots || p0 < 0 || p1 < p0) throw std::out_of_range("kv_bytes: no such span");
    std::lock_guard lock(mu_);  // the engine thread waits for mu_ before it looks for work
    if (!queue_.empty() || std::any_of(slot_status_.begin(), slot_status_.end(), [](auto& s) { return s.busy; })) {
        throw std::logic_error("kv_bytes needs an idle engine");
    }
    return cache_->kv_bytes(slot, p0, p1);
}

request_latencies engine::latencies() const {
    std::lock_guard lock(latencies_mu_);
    return latencies_;
}

int engine::queued() const {
    std::lock_guard lock(mu_);
    return static_cast<int>(queue_.size());
}

std::vector<slot_status> engine::slots() const {
    std::lock_guard lock(mu_);
    return slot_status_;
}

slot_status engine::status_of(const slot& s) {
    return {.id = s.id,
            .busy = s.busy(),
            .cached_tokens = static_cast<int>(s.cached.size()),
            .tenant = s.tenant,
            .request_id = s.request_id,
            .prompt_tokens = s.prompt_tokens,
            .prompt_reused = s.reused,
            .prompt_done = static_cast<int>(s.prompt_done),
            .generated = s.generated,
            .last_used = s.last_used_at};
}

void engine::publish_slot_status() {
    std::lock_guard lock(mu_);
    for (auto& s : slots_) slot_status_[s->id] = status_of(*s);
}

engine_health engine::health() const {
    engine_health h;
    const int64_t started = step_started_ns_.load();
    if (started == 0) return h;
    const int64_t now = now_ns();
    h.seconds_in_step = static_cast<double>(now - started) / 1e9;
    h.seconds_since_progress = static_cast<double>(now - std::max(started, progress_ns_.load())) / 1e9;
    h.stalled = h.seconds_since_progress >= options_.stall_seconds;
    return h;
}

bool engine::abort_decode(void* self) {
    auto* e = static_cast<engine*>(self);
    e->progress_ns_.store(now_ns(), std::memory_order_relaxed);
    return e->abort_decode_.load(std::memory_order_relaxed);
}

// Every request still in a slot ends with `why`; used when a step failed in a way no single request explains.
void engine::fail_busy_slots(const std::string& why) {
    for (auto& s : slots_) {
        if (!s->busy()) continue;
        try {
            finish(*s, finish_reason::error, why);
        } catch (const std::exception&) {
            // finish() itself failed (e.g. out of memory): the slot is freed whatever it had got to, and the client
            // gets a final event if finish() had not yet taken the request.
            try {
                if (s->request) {
                    s->request->output.push({.text = {}, .done = true, .reason = finish_reason::error, .error = why});
                }
                cache_->release_slot(s->id, true);
            } catch (const std::exception&) {
            }
            s->request.reset();
            s->sampler.reset();
            s->cached.clear();
        }
    }
}

void engine::run() {
    for (;;) {
        {
            std::unique_lock lock(mu_);
            const auto any_busy = [&] {
                return std::any_of(slots_.begin(), slots_.end(), [](const auto& s) { return s->busy(); });
            };
            // An unfinished make_way goes on while nothing else is to be done.
            wake_.wait(lock, [&] { return stopping_ || !queue_.empty() || any_busy() || making_way_; });
            if (stopping_) break;
        }
        const auto turn_started = clock::now();
        const int64_t started = now_ns();
        progress_ns_ = started;
        step_started_ns_ = started;
        turn_ = {};
        // A request's own failures end that request (admit, sample); whatever escapes them ends the requests in the
        // slots, never the engine thread: an exception out of here would be std::terminate.
        try {
            admit_queued();
            publish_slot_status();  // before a step that may take long, /health should show who is in the slots
            for (auto& s : slots_) {
                if (s->busy() && s->request->cancelled.load()) finish(*s, finish_reason::cancelled);
            }
            step();
            cache_->report_pending_blocks();  // what this turn's admissions changed, now that their step ran
        } catch (const std::exception& e) {
            log::error("engine", "step failed: {}", e.what());
            fail_busy_slots(std::string("engine step failed: ") + e.what());
        }
        account(turn_, ms_between(turn_started, clock::now()));
        step_started_ns_ = 0;
        publish_slot_status();
    }
    fail_busy_slots("server shutting down");
    try {
        cache_->persist_all();  // so that a restarted server starts where this one stopped
    } catch (const std::exception& e) {
        log::error("engine", "could not persist the prefix cache: {}", e.what());
    }
}

// Places queued requests into free slots, one at a time.
void engine::admit_queued() {
    for (;;) {
        std::shared_ptr<generation_request> request;
        {
            std::lock_guard lock(mu_);
            if (queue_.empty()) return;
            if (std::none_of(slots_.begin(), slots_.end(), [](const auto& s) { return !s->busy(); })) return;
            request = std::move(queue_.front());
            queue_.pop_front();
        }
        if (request->cancelled.load()) {
            counters_.cancelled++;
            request->output.push({.text = {}, .done = true, .reason = finish_reason::cancelled});
            continue;
        }
        try {
            admit(request);
        } catch (const std::exception& e) {
            // This request could not be set up (e.g. its sampler would not build): it ends, the others go on.
            const std::string why = std::string("could not start the generation: ") + e.what();
            auto in_slot = std::find_if(slots_.begin(), slots_.end(), [&](auto& s) { return s->request == request; });
            if (in_slot != slots_.end()) {
                finish(**in_slot, finish_reason::error, why);
            } else {
                counters_.errors++;
                request->output.push({.text = {}, .done = true, .reason = finish_reason::error, .error = why});
            }
        }
    }
}

// Puts one request into the free slot whose cached tokens share the longest prefix with its prompt (ties: least
// recently used), and trims that slot's KV to the shared prefix.
void engine::admit(std::shared_ptr<generation_request> request) {
    const auto& prompt = request->prompt;
    if (prompt.empty() || static_cast<int>(prompt.size()) >= slot_context_size_) {
        counters_.errors++;
        request->output.push({.text = {},
                              .done = true,
                              .reason = finish_reason::error,
                              .error = prompt.empty() ? "empty prompt"
                                                      : "prompt has " + std::to_string(prompt.size()) +
                                                            " tokens; the context holds " +
                                                            std::to_string(slot_context_size_) + " per slot"});
        return;
    }

    // Any slot can take any cached prefix (sequences share cells); one whose own content matches saves parking it.
    slot* best = nullptr;
    size_t best_len = 0;
    for (auto& s : slots_) {
        if (s->busy()) continue;
        // Another tenant's content never counts as a match: the choice must not depend on what others sent.
        const size_t len = s->tenant == request->tenant ? common_prefix_length(s->cached, prompt) : 0;
        if (!best || len > best_len || (len == best_len && s->last_used < best->last_used)) {
            best = s.get();
            best_len = len;
        }
    }
    slot& s = *best;
    // Normally built by the HTTP thread; a request submitted without one (tests, internal callers) gets it here,
    // where a failure throws to admit_queued() and ends only this request.
    s.sampler = request->sampler ? std::move(request->sampler)
                                 : std::make_unique<token_sampler>(model_.get(), request->sampling);
    s.text = std::make_unique<text_stream>(request->stop);
    s.pending = -1;
    s.batch_index = -1;
    s.generated = 0;
    s.sampling_ms = s.sampling_max_ms = 0;
    s.generated_ids.clear();
    s.draft = {};
    s.shadow.clear();
    s.shadow_at = 0;
    s.control = {};
    s.draft_tokens = s.draft_accepted = s.draft_steps = s.decode_steps = s.steps_since_probe = 0;
    s.drafter.reset();
    if (drafts_) drafts_->seat(s.id, prompt);
    if (drafts_ && request->draft_max != 0) s.drafter = drafts_->begin(s.id, request->tenant, prompt);
    s.admitted = clock::now();
    s.prompt_started = {};
    s.request_id = request->request_id;
    s.prompt_tokens = static_cast<int>(prompt.size());
    s.last_used_at = std::chrono::system_clock::now();
    s.request = std::move(request);
    s.cuts.clear();
    if (cache_->needs_checkpoints()) {
        // Message starts: one token before each token the rendered prompt opens a turn with (e.g. <|im_start|>).
        // One before, because the last prompt token is always computed: a later prompt that ends where a message
        // starts (a continued answer the template renders as nothing, a retry without the generation prompt) needs
        // the state one token short of it, and one that goes on past the start computes one token more.
        const llama_vocab* vocab = llama_model_get_vocab(model_.get());
        const size_t first = prompt.size() > 1 && prompt[0] == llama_vocab_bos(vocab) ? 1 : 0;
        const llama_token turn_start = prompt[first];
        // A control token, or a user-defined one (llama.cpp makes gpt-oss's <|start|> one).
        if (llama_vocab_get_attr(vocab, turn_start) & (LLAMA_TOKEN_ATTR_CONTROL | LLAMA_TOKEN_ATTR_USER_DEFINED)) {
            for (size_t i = first + 2; i < prompt.size(); ++i) {
                if (s.request->prompt[i] == turn_start) s.cuts.push_back(static_cast<int>(i - 1));
            }
        }
        // And the last whole block's end: the same prompt asked again after a demotion or a restart gets its blocks
        // back up to there (the tail past it ends at the last prompt token, which is always computed), so its
        // recurrent state must be known there however far apart the interval's checkpoints are.
        const int block = cache_->block_tokens();
        const int last_block_end = static_cast<int>((prompt.size() - 1) / static_cast<size_t>(block)) * block;
        if (last_block_end > 0) {
            const auto at = std::lower_bound(s.cuts.begin(), s.cuts.end(), last_block_end);
            if (at == s.cuts.end() || *at != last_block_end) s.cuts.insert(at, last_block_end);
        }
    }
    restore_prefix(s);
    follow_shared_prefills(s);
    counters_.requests++;
    report_progress(s);
}

void engine::report_progress(const slot& s) {
    if (!s.request->report_progress) return;
    generation_event event;
    event.progress = prompt_progress{.total = static_cast<int>(s.request->prompt.size()),
                                     .cache = s.reused,
                                     .processed = static_cast<int>(s.prompt_done),
                                     .time_ms = ms_between(s.admitted, clock::now())};
    s.request->output.push(std::move(event));
}

// For the log: `diverged at token N: "...text before" + "prompt's text" where the cache has "cached text"`.
std::string engine::describe_divergence(const std::vector<llama_token>& prompt, const cache_restore& r) const {
    const auto text = [&](auto first, auto last) {
        std::string out;
        for (auto it = first; it != last; ++it) out += common_token_to_piece(ctx_.get(), *it, true);
        std::string escaped;
        for (const char c : out) escaped += c == '\n' ? std::string("\\n") : std::string(1, c);
        return escaped;
    };
    const auto pos = static_cast<size_t>(r.divergence_pos);
    const size_t context = 8;
    const auto before = prompt.begin() + static_cast<std::ptrdiff_t>(pos > context ? pos - context : 0);
    const auto at = prompt.begin() + static_cast<std::ptrdiff_t>(pos);
    const auto after = prompt.begin() + static_cast<std::ptrdiff_t>(std::min(prompt.size(), pos + context));
    return "diverged at token " + std::to_string(pos) + ": \"" + text(before, at) + "\" + \"" + text(at, after) +
           "\" where the cache has \"" + text(r.cached_continuation.begin(), r.cached_continuation.end()) + "\"";
}

// Fills the slot's sequence with the longest cached prefix of its prompt (the last prompt token is always decoded:
// its logits give the first generated token).
void engine::restore_prefix(slot& s) {
    const auto& prompt = s.request->prompt;
    const auto started = clock::now();
    const int unit = exact_unit();
    // Exact reuse: up to a whole physical batch before the last prompt token, so that what is computed starts where
    // a cold run's batch starts.
    const int limit = (static_cast<int>(prompt.size()) - 1) / unit * unit;
    s.restored = cache_->acquire(s.id, prompt, limit, s.request->tenant);
    if (const int cut = s.restored.reused / unit * unit; cut < s.restored.reused) {
        // Blocks that end inside a batch (a block size that does not divide it): back to the batch's start.
        cache_->trim(s.id, cut);
        int excess = s.restored.reused - cut;
        for (int* tier : {&s.restored.disk, &s.restored.ram, &s.restored.device}) {
            const int less = std::min(*tier, excess);
            *tier -= less;
            excess -= less;
        }
        s.restored.reused = cut;
    }
    turn_.restore_ms += ms_between(started, clock::now());
    turn_.restored_tokens += s.restored.ram + s.restored.disk;
    s.tenant = s.request->tenant;
    s.cached.assign(prompt.begin(), prompt.begin() + s.restored.reused);
    const int to_compute = static_cast<int>(prompt.size()) - s.restored.reused;
    if (options_.idle_to_ram_tokens > 0 && to_compute >= options_.idle_to_ram_tokens) making_way_ = true;
    s.prompt_done = static_cast<size_t>(s.restored.reused);
    s.reused = s.restored.reused;
}

// Two requests with the same new prefix: the later one waits for the earlier to compute it, then shares it.
void engine::follow_shared_prefills(slot& s) {
    s.follow = -1;
    const auto& prompt = s.request->prompt;
    for (auto& other : slots_) {
        if (other.get() == &s || !other->prefilling() || other->request->tenant != s.request->tenant) continue;
        const size_t shared = common_prefix_length(other->request->prompt, prompt);
        const size_t limit = std::min(shared, prompt.size() - 1);
        if (limit > s.prompt_done + 16 && other->prompt_done < limit) {
            s.follow = other->id;
            s.follow_until = limit;
            if (cache_->needs_checkpoints()) {
                other->cuts.insert(std::upper_bound(other->cuts.begin(), other->cuts.end(), static_cast<int>(limit)),
                                   static_cast<int>(limit));
            }
            return;
        }
    }
}

// Where the slot's next prompt chunk must end: hybrid models stop at every checkpoint interval and message start,
// so that the recurrent state there can be kept as a checkpoint.
int engine::next_cut(const slot& s) const {
    const int total = static_cast<int>(s.request->prompt.size());
    if (!cache_->needs_checkpoints()) return total;
    const int done = static_cast<int>(s.prompt_done);
    const int b = options_.checkpoint_interval;
    int cut = std::min(total, (done / b + 1) * b);
    auto it = std::upper_bound(s.cuts.begin(), s.cuts.end(), done);
    if (it != s.cuts.end()) cut = std::min(cut, *it);
    return cut;
}

void engine::finish(slot& s, finish_reason reason, const std::string& error) {
    auto request = std::move(s.request);
    s.request.reset();
    const auto now = clock::now();

    generation_event event;
    event.done = true;
    event.reason = reason;
    event.error = error;
    if (reason == finish_reason::stop || reason == finish_reason::length) event.text = s.text->finish();
    event.generated = std::move(s.generated_ids);
    s.generated_ids.clear();
    event.logits = std::move(s.logits);
    s.logits.clear();

    const bool started = s.prompt_started != clock::time_point{};
    const bool sampled = s.first_token != clock::time_point{} && s.generated > 0;
    generation_stats& st = event.stats;
    st.slot = s.id;
    if (reason == finish_reason::stop) st.stop_sequence = s.text->matched_stop();
    st.prompt_tokens = static_cast<int>(request->prompt.size());
    st.reused_tokens = s.reused;
    st.reused_device = s.restored.device;
    st.reused_ram = s.restored.ram;
    st.reused_disk = s.restored.disk;
    st.checkpoint_pos = s.restored.checkpoint_pos;
    st.matched_tokens = s.restored.matched;
    if (s.restored.divergence_pos >= 0) st.divergence = describe_divergence(request->prompt, s.restored);
    st.setup_ms = started ? ms_between(request->received, s.prompt_started) : 0;
    st.prepare_ms = ms_between(request->received, request->submitted);
    st.computed_tokens = static_cast<int>(s.prompt_done) - s.reused;
    st.generated_tokens = s.generated;
    st.queued_ms = ms_between(request->submitted, s.admitted);
    st.prompt_ms = started ? ms_between(s.prompt_started, sampled ? s.first_token : now) : 0;
    st.generation_ms = sampled ? ms_between(s.first_token, now) : 0;
    st.sampling_ms = s.sampling_ms;
    st.sampling_max_ms = s.sampling_max_ms;
    st.draft_tokens = s.draft_tokens;
    st.draft_accepted = s.draft_accepted;
    st.draft_steps = s.draft_steps;
    st.decode_steps = s.decode_steps;

    counters_.prompt_tokens += st.prompt_tokens;
    counters_.reused_tokens += st.reused_tokens;
    counters_.computed_tokens += st.computed_tokens;
    counters_.generated_tokens += st.generated_tokens;
    counters_.prefill_us += static_cast<uint64_t>(st.prompt_ms * 1000);
    counters_.decode_us += static_cast<uint64_t>(st.generation_ms * 1000);
    {
        std::lock_guard lock(latencies_mu_);
        latencies_.queue_wait.record(st.queued_ms / 1000);
        if (sampled) latencies_.time_to_first_token.record((st.setup_ms + st.prompt_ms) / 1000);
    }
    if (reason == finish_reason::cancelled) counters_.cancelled++;
    if (reason == finish_reason::error) {
        counters_.errors++;
        s.cached.clear();
    }
    if (const size_t unit = static_cast<size_t>(exact_unit()); unit > 1 && reason != finish_reason::error) {
        // Exact reuse keeps only what a cold run computes the same way: the prompt's whole physical batches. Its last
        // partial one and the answer (decoded a row at a time) would be computed in larger batches by the next turn.
        const size_t exact_end = s.prompt_done / unit * unit;
        if (s.cached.size() > exact_end) {
            cache_->trim(s.id, static_cast<int>(exact_end));
            s.cached.resize(exact_end);
        }
    }
    // The KV of a failed step is in an unknown state: forget it. Otherwise prompt + generated tokens stay cached.
    if (drafts_ && reason != finish_reason::error && s.prompt_done == request->prompt.size()) {
        // What this request added to its conversation: the prompt it computed and its answer.
        std::vector<llama_token> added(request->prompt.begin() + s.reused, request->prompt.end());
        added.insert(added.end(), event.generated.begin(), event.generated.end());
        drafts_->remember(request->tenant, added);
    }
    cache_->release_slot(s.id, reason == finish_reason::error);
    s.follow = -1;
    s.drafter.reset();
    s.draft = {};

    s.sampler.reset();
    s.text.reset();
    s.pending = -1;
    s.batch_index = -1;
    s.last_used = now;
    s.last_used_at = std::chrono::system_clock::now();
    {
        // Published before the final event, so whoever sees the answer end also sees the slot free.
        std::lock_guard lock(mu_);
        slot_status_[s.id] = status_of(s);
    }
    request->output.push(std::move(event));
}

// One llama_decode: a token for each generating slot first (so decoding never starves behind a long prompt),
// then prompt chunks until the batch is full. Returns false if there was nothing to do.
bool engine::step() {
    const auto step_started = clock::now();
    if (making_way_) make_way();
    common_batch_clear(batch_);
    probing_rows_ = false;
    struct contribution {
        slot* s;
        int first;  // batch index of its first token
        int count;
    };
    std::vector<contribution> parts;
    int draft_rows = 0;
    // Time in the drafters (a draft model's decodes): not part of what a step of the model costs, which sizes drafts
    // against what they cost (add_draft counts a drafter's time per token on its own).
    double drafting_ms = 0;
    // Exact reuse: a prompt chunk is computed alone, as in a cold run, while generated tokens wait a step (in a batch
    // with other rows, ggml may take other kernel paths for the chunk's rows).
    const auto waits_for_leader = [&](const slot& s) {
        if (s.follow < 0) return false;
        const slot& leader = *slots_[static_cast<size_t>(s.follow)];
        return leader.prefilling() && leader.prompt_done < s.follow_until;
    };
    const bool prompt_alone = options_.exact_reuse && std::any_of(slots_.begin(), slots_.end(), [&](auto& sp) {
                                  return sp->prefilling() && !waits_for_leader(*sp);
                              });

    // While another request's prompt is computed, no drafts: their rows would take the step's room from its prompt
    // chunks (a 12K prefill beside a drafting stream took 1.9x as long on a 2-core host, and the stream's longest
    // gap grew from 157 to 237 ms), and the stream's tokens already come at the step's pace.
    const bool prompt_waits =
        std::any_of(slots_.begin(), slots_.end(), [&](auto& sp) { return sp->prefilling() && !waits_for_leader(*sp); });

    for (auto& sp : slots_) {
        slot& s = *sp;
        s.batch_index = -1;
        s.draft = {};
        if (!s.busy() || s.pending < 0 || prompt_alone) continue;
        common_batch_add(batch_, s.pending, static_cast<llama_pos>(s.cached.size()), {s.id}, true);
        s.batch_index = batch_.n_tokens - 1;
        parts.push_back({&s, s.batch_index, 1});  // the pending token; a draft's rows follow it, settled at sampling
        if (!prompt_waits) {
            const auto drafting_started = clock::now();
            draft_rows += add_draft(s, draft_room_ - batch_.n_tokens);
            drafting_ms += ms_between(drafting_started, clock::now());
        }
    }
    const int decode_tokens = batch_.n_tokens;
    const int budget = decode_tokens + prompt_budget(decode_tokens);
    for (auto& sp : slots_) {
        slot& s = *sp;
        if (!s.prefilling() || batch_.n_tokens >= budget) continue;
        if (s.follow >= 0) {
            if (waits_for_leader(s)) continue;  // it is computing our prefix
            s.follow = -1;
            if (s.prompt_done < s.follow_until) {
                const int before = s.reused;
                restore_prefix(s);  // now in the cache: take it from there
                if (s.reused < before) follow_shared_prefills(s);
            }
            if (!s.prefilling()) continue;
        }
        if (s.prompt_started == clock::time_point{}) s.prompt_started = clock::now();
        const auto& prompt = s.request->prompt;
        const size_t cut = static_cast<size_t>(next_cut(s));
        const size_t left = cut - s.prompt_done;
        size_t n = prompt_chunk(left, static_cast<size_t>(budget - batch_.n_tokens), decode_tokens,
                                static_cast<size_t>(options_.batch_size - batch_.n_tokens), prompt_rows_apart_);
        n = row_probe(n, batch_.n_tokens, s.prompt_done + n - 1);
        if (options_.exact_reuse) {
            // From a multiple of the physical batch (restore_prefix), in whole ones but the prompt's last: the
            // batches a cold run computes these positions in (one at least: alone, a step takes a logical batch).
            const size_t unit = static_cast<size_t>(exact_unit());
            n = std::min(left, std::max(unit, static_cast<size_t>(budget) / unit * unit));
        }
        const int first = batch_.n_tokens;
        for (size_t k = 0; k < n; ++k) {
            const size_t i = s.prompt_done + k;
            const bool last = i + 1 == prompt.size();
            common_batch_add(batch_, prompt[i], static_cast<llama_pos>(i), {s.id}, last);
            if (last) s.batch_index = batch_.n_tokens - 1;
        }
        parts.push_back({&s, first, static_cast<int>(n)});
        if (options_.exact_reuse) break;  // one prompt per step, alone in its batches
    }
    if (batch_.n_tokens == 0) return false;

    turn_.generated_tokens = decode_tokens - draft_rows;
    turn_.prompt_tokens = batch_.n_tokens - decode_tokens;
    turn_.deepest = static_cast<int>(*std::max_element(batch_.pos, batch_.pos + batch_.n_tokens));
    turn_.padding = tile_padding_rows(batch_.n_tokens, turn_.prompt_tokens, turn_.deepest);
    for (int k = 0; k < turn_.padding; ++k) common_batch_add(batch_, batch_.token[0], k, {padding_seq_}, false);
    if (turn_.padding > 0) counters_.padded_steps++;
    const auto decode_started = clock::now();
    cache_->before_decode();
    int rc = llama_decode(ctx_.get(), batch_);
    while (rc == 1 && cache_->make_room()) {  // KV full: free idle cells
        cache_->before_decode();
        rc = llama_decode(ctx_.get(), batch_);
    }
    if (turn_.padding > 0) llama_memory_seq_rm(llama_get_memory(ctx_.get()), padding_seq_, -1, -1);
    counters_.decode_steps++;
    counters_.decode_step_slots += parts.size();
    if (parts.size() > 1) counters_.shared_decode_steps++;
    if (rc != 0) {
        const std::string why = rc == 1                           ? "no room left in the KV cache"
                                : rc == 2 && abort_decode_.load() ? "server shutting down"
                                                                  : "llama_decode failed (" + std::to_string(rc) + ")";
        turn_.decode_ms = ms_between(decode_started, clock::now());
        for (auto& p : parts) finish(*p.s, finish_reason::error, why);
        return true;
    }
    // The MTP heads compute the slots' rows from the hidden states this decode output (not the padding's).
    if (drafts_) drafts_->decoded(batch_, batch_.n_tokens - turn_.padding);

    for (auto& p : parts) {
        slot& s = *p.s;
        const std::span<const llama_token> decoded(batch_.token + p.first, static_cast<size_t>(p.count));
        s.cached.insert(s.cached.end(), decoded.begin(), decoded.end());
        if (s.cached.size() > counters_.longest_sequence) counters_.longest_sequence = s.cached.size();
        cache_->append(s.id, decoded);
        if (s.pending >= 0) {
            s.pending = -1;  // the generated token is now in the KV
        } else {
            s.prompt_done += p.count;
            const bool at_cut = std::binary_search(s.cuts.begin(), s.cuts.end(), static_cast<int>(s.prompt_done)) ||
                                s.prompt_done % static_cast<size_t>(options_.checkpoint_interval) == 0;
            // Also at the prompt's end, where the next turn's prompt leaves this path (its tail is kept there).
            const bool prompt_end = s.prompt_done == s.request->prompt.size();
            if (cache_->needs_checkpoints() && ((s.prefilling() && at_cut) || prompt_end) &&
                !cache_->checkpoint(s.id)) {
                finish(s, finish_reason::error, "the prompt's sliding-window KV could not be kept");
                continue;
            }
            if (prompt_end && options_.cache_hints && s.request->hinted_tokens > 0) {
                cache_->hint(s.id, s.request->hinted_tokens, s.request->hint_ttl);
            }
            report_progress(s);
        }
    }

    llama_synchronize(ctx_.get());  // so that the sampling clock below counts sampling, not a decode finishing late
    const auto sampling_started = clock::now();
    turn_.decode_ms = ms_between(decode_started, sampling_started);
    for (auto& p : parts) {
        slot& s = *p.s;
        if (s.batch_index < 0 || !s.busy()) continue;
        try {
            sample(s);
        } catch (const std::exception& e) {
            // E.g. a grammar that reaches a dead end: this request ends, the other slots keep their tokens.
            if (s.busy()) finish(s, finish_reason::error, std::string("sampling failed: ") + e.what());
        }
        progress_ns_ = now_ns();
    }
    turn_.sample_ms = ms_between(sampling_started, clock::now());
    // What a generating slot waited for its next token: the batch, the decode and the sampling. Padding rows cost
    // what prompt rows do.
    const double step_ms = ms_between(step_started, clock::now());
    measure_step(batch_.n_tokens - decode_tokens, decode_tokens, draft_rows, step_ms - drafting_ms, turn_.decode_ms);
    learn_row_costs(batch_.n_tokens, turn_.prompt_tokens, turn_.deepest, turn_.decode_ms);
    return true;
}

// Moves idle conversations to RAM for a long prompt (prompt_cache::make_way): all at once when nobody generates,
// else a share of each step's time target, so that the streams do not wait for it.
void engine::make_way() {
    const auto started = clock::now();
    const bool generating = std::any_of(slots_.begin(), slots_.end(), [](auto& sp) { return sp->pending >= 0; });
    const auto budget = generating && options_.step_ms_target > 0
                            ? std::chrono::duration_cast<clock::duration>(
                                  std::chrono::duration<double, std::milli>(options_.step_ms_target / 4))
                            : clock::duration::max() / 2;
    std::vector<int> emptied;
    making_way_ = !cache_->make_way(budget, emptied);
    for (const int id : emptied) slots_[static_cast<size_t>(id)]->cached.clear();
    turn_.make_way_ms = ms_between(started, clock::now());
}

// Adds a turn of the engine loop to /metrics, and logs one that held a generating slot for long with what it spent
// its time on, so that a stall a client saw can be traced to its cause.
void engine::account(const loop_turn& turn, double total_ms) {
    const auto us = [](double ms) { return static_cast<uint64_t>(ms * 1000); };
    counters_.loop_us += us(total_ms);
    counters_.restore_us += us(turn.restore_ms);
    counters_.make_way_us += us(turn.make_way_ms);
    counters_.batch_decode_us += us(turn.decode_ms);
    counters_.sample_us += us(turn.sample_ms);
    if (turn.generated_tokens == 0) return;
    {
        std::lock_guard lock(latencies_mu_);
        latencies_.stream_step.record(total_ms / 1000);
    }
    if (options_.slow_step_log_ms <= 0 || total_ms < options_.slow_step_log_ms) return;
    counters_.slow_stream_steps++;
    const double other_ms = total_ms - turn.restore_ms - turn.make_way_ms - turn.decode_ms - turn.sample_ms;
    const auto ms = [](double v) { return log::fixed{v, 0}; };
    log::info(
        "engine",
        "a step held {} generating slot(s) {} ms: decode {} ms ({} prompt + {} generated tokens + {} padding rows, "
        "up to position {}), restore {} ms ({} tokens from RAM or disk), make way {} ms, sampling {} ms, other {} "
        "ms",
        turn.generated_tokens, ms(total_ms), ms(turn.decode_ms), turn.prompt_tokens, turn.generated_tokens,
        turn.padding, turn.deepest, ms(turn.restore_ms), turn.restored_tokens, ms(turn.make_way_ms), ms(turn.sample_ms),
        ms(other_ms));
}

// How many of the `left` prompt tokens before the next cut go in this step, given `room` in the step's budget and
// `space` in the batch. Every step that carries a prompt chunk should fill whole attention tiles (see attention_tile):
// a partial tile costs a whole one, and a batch of under one tile takes the slow path. The decode rows ride in the
// same tiles, so a tile holds `unit` = 64 - decode_tokens prompt tokens beside them. The piece that does not fill a
// unit goes first, while the prompt is shallow and attention cheap; after it, chunks are whole units, and the
// step that ends the prompt fills its tiles like the others. (The last piece used to go with the last chunk, for
// one tile more: with a one-tile budget at 12K deep, that step held a stream 148 ms where the others took 75-85.)
size_t engine::prompt_chunk(size_t left, size_t room, int decode_tokens, size_t space, bool rows_apart) {
    if (left <= room) return left;
    if (rows_apart && decode_tokens > 0) {
        // The chunk's first row goes with the generated rows, one row per sequence; the rest are a physical batch of
        // their own: whole tiles. (Shaped for a shared batch, a one-tile budget made it 1 + 62 rows, both under a
        // tile, and a hybrid prefill beside a stream took 2.6x as long as alone.) Each step takes one row more than
        // its tiles, so there is no fixed odd piece to send first: a last piece under a tile goes with the chunk
        // before it.
        const size_t tile = attention_tile;
        if (room < 1 + tile) return std::min(room, space);
        const size_t chunk = 1 + (room - 1) / tile * tile;
        if (left - chunk <= tile && left <= space) return left;  // what would be left: under a tile beside the lead
        return chunk;
    }
    const size_t unit = static_cast<size_t>(attention_tile - std::min(decode_tokens, attention_tile / 2));
    const size_t odd = left % unit;
    if (room >= odd + unit) return odd + (room - odd) / unit * unit;
    if (odd > 0 && room >= odd) return odd;  // alone, through the slow path, but never again as shallow as now
    // A budget under one unit: whatever fits, and a last piece under one tile goes with this chunk (alone it would take
    // the slow path: a 37-token last chunk held a stream 128 ms where whole tiles took 60-75).
    if (left - room < static_cast<size_t>(attention_tile) && left <= space) return left;
    return room;
}

// How many prompt tokens the next step may carry besides `decode_tokens` generated ones. Alone, a prompt goes in
// whole logical batches. While other requests wait or generate, a step is one physical batch in all, so that a long
// prefill delays them by one ubatch rather than by a whole logical batch; and while a slot generates, only as many
// tokens as fit in the step time target at the last measured cost, so that its stream keeps flowing (chunked
// prefill, as vLLM and SGLang schedule it).
int engine::prompt_budget(int decode_tokens) const {
    const int busy = static_cast<int>(std::count_if(slots_.begin(), slots_.end(), [](auto& sp) { return sp->busy(); }));
    if (busy <= 1 && queued() == 0) return options_.batch_size;
    // The generated rows share the prompt's tiles, or (prompt_rows_apart_) take one prompt row into their own
    // physical batch.
    const int beside = prompt_rows_apart_ ? 0 : decode_tokens;
    const int lead = prompt_lead_rows(decode_tokens);
    int total = std::min(options_.ubatch_size, options_.batch_size);
    if (decode_tokens > 0 && options_.step_ms_target > 0 && ms_per_prompt_token_ > 0) {
        // Whole attention tiles (see attention_tile), one at least.
        const double fits = beside + (options_.step_ms_target - generation_step_ms_) / ms_per_prompt_token_;
        const int tiles = static_cast<int>(std::min(fits, static_cast<double>(total))) / attention_tile;
        total = std::min(total, std::max(1, tiles) * attention_tile);
    }
    // Some prompt in every step, however many slots generate.
    constexpr int fewest = 16;
    return std::min(std::max(total - beside + lead, fewest), options_.batch_size - decode_tokens);
}

// Learns what steps cost, as step time = generation step + prompt tokens x cost per prompt token. A step of
// generated tokens only costs about what reading the weights does (and sampling); prompt tokens riding along share
// that read and add their own compute, which grows with the depth they attend over. Averaged over the last few
// steps, as a prompt's depth changes slowly and a single step may be slowed by anything else on the machine.
void engine::measure_step(int prompt_tokens, int decode_tokens, int draft_rows, double ms, double decode_ms) {
    if (prompt_tokens == 0) {
        // A draft row's cost is its share of the decode: sampling costs the same per emitted token with or without
        // drafts (each position is sampled once), and a costly grammar must not make drafts look dear.
        if (draft_rows == 0) {
            if (decode_tokens > 0) update_average(generation_step_ms_, ms);
            if (decode_tokens > 0) update_average(generation_decode_ms_, decode_ms);
        } else if (generation_decode_ms_ > 0) {
            update_average(ms_per_draft_row_, std::max(decode_ms - generation_decode_ms_, 0.0) / draft_rows);
        }
        return;
    }
    constexpr int enough = 8;  // fewer tell too little over the step's fixed cost
    // Under a tile, attention takes the row-by-row path: that cost says nothing about the tiles a budget is made of.
    const int tiled_rows =
        prompt_rows_apart_ ? prompt_tokens - prompt_lead_rows(decode_tokens) : prompt_tokens + decode_tokens;
    if (prompt_tokens < enough || tiled_rows < attention_tile) return;
    const double fixed = decode_tokens > 0 ? generation_step_ms_ + draft_rows * ms_per_draft_row_ : 0;
    update_average(ms_per_prompt_token_, std::max(ms - fixed, 0.01 * ms) / prompt_tokens);
}

// How many throwaway rows fill a batch of `rows` (`prompt_rows` of them prompt tokens, up to position `deepest`) to a
// whole attention tile, given what a row cost per 1K positions of depth in the steps before, under a tile and in whole
// tiles (0: not seen yet): none unless the rows would cost clearly more row by row than a tile does. Attention is most
// of a deep step's cost; shallower than 2K the weights' share makes a per-depth cost mislead, and there is little to
// win.
int engine::tile_padding(int rows, int prompt_rows, int deepest, double sub_tile_row_cost, double tile_row_cost) {
    if (rows >= attention_tile || prompt_rows == 0 || deepest < padding_min_depth) return 0;
    if (sub_tile_row_cost <= 0 || tile_row_cost <= 0) return 0;
    constexpr double margin = 1.25;  // the costs are averages of noisy steps: pad where it clearly pays
    return rows * sub_tile_row_cost > margin * attention_tile * tile_row_cost ? attention_tile - rows : 0;
}

int engine::tile_padding_rows(int rows, int prompt_rows, int deepest) {
    if (padding_seq_ < 0 || rows >= attention_tile) return 0;
    if (options_.pad_to_tile == engine_options::tile_padding::on) return attention_tile - rows;
    if (probing_rows_) return 0;
    const int fill = tile_padding(rows, prompt_rows, deepest, sub_tile_row_cost_, tile_row_cost_);
    if (fill > 0) ++padded_since_probe_;
    return fill;
}

// How many of the `n` prompt tokens a step would carry, after `rows_before` rows and up to position `deepest`, it
// does carry: a probe of a few where the batch would be under a tile, deep enough to fill up, and what a row costs
// row by row is not known (the first such batch after a start) or was last measured 32 filled batches ago (a cost
// measured in a slow spell, or on a machine that got faster, must not decide for good). The probe goes row by row
// and is measured; the rest of the chunk goes in the next step, filled up to a tile if the probe says so. Computing
// the whole batch row by row to learn the cost took 1.7-1.9 s for a warm turn's 26 new tokens 16K deep on a 2-core
// host, where a probe of 4 costs about 0.25 s. Without a tile's cost to compare with, nothing to probe.
size_t engine::row_probe(size_t n, int rows_before, size_t deepest) {
    if (padding_seq_ < 0 || options_.pad_to_tile != engine_options::tile_padding::automatic) return n;
    constexpr uint64_t remeasure_after = 32;
    const bool due = tile_row_cost_ > 0 && (sub_tile_row_cost_ <= 0 || padded_since_probe_ >= remeasure_after);
    const bool under_a_tile = static_cast<size_t>(rows_before) + n < static_cast<size_t>(attention_tile);
    if (!due || n <= row_probe_rows || !under_a_tile || deepest < static_cast<size_t>(padding_min_depth)) return n;
    probing_rows_ = true;
    return row_probe_rows;
}

// Learns what a row of a decode that carries prompt tokens costs per 1K positions of depth, under a tile (row by
// row) and in whole tiles (a partial tile costs a whole one), from the decode's time of the steps 2K deep or more.
void engine::learn_row_costs(int rows, int prompt_rows, int deepest, double ms) {
    // Prompt rows: a step of generated tokens alone reads the weights for few rows.
    if (prompt_rows < static_cast<int>(row_probe_rows) || deepest < padding_min_depth) return;
    const bool tiled = rows >= attention_tile;
    const int counted = tiled ? (rows + attention_tile - 1) / attention_tile * attention_tile : rows;
    update_average(tiled ? tile_row_cost_ : sub_tile_row_cost_, ms / counted / (deepest / 1024.0));
    if (!tiled) padded_since_probe_ = 0;
}

// Samples the slot's next token from the last decode's logits and hands its text to the request. With a draft, the
// rows after the pending token hold the draft's tokens: each position is sampled with the request's own sampler
// (grammar included) and the draft is accepted up to the first token the sampler did not pick, so the answer is the
// one decoding without the draft gives (at temperature 0 the same tokens; with sampling, the same distribution).
void engine::sample(slot& s) {
    if (s.generated > 0) {
        s.decode_steps++;
        counters_.answer_steps++;
    }
    const std::vector<llama_token>& draft = s.draft.tokens;
    std::vector<llama_token> picked;
    for (size_t i = 0; i <= draft.size(); ++i) {
        const std::optional<llama_token> token = draw(s, s.batch_index + static_cast<int>(i), i);
        if (!token) return;  // the request ended (finish() dropped the draft's cells with the slot's KV)
        picked.push_back(*token);
        if (i == draft.size() || *token != draft[i] || llama_vocab_is_eog(vocab(), *token)) break;
    }
    if (!settle_draft(s, picked.size() - 1)) {
        finish(s, finish_reason::error, "a draft's rejected tokens could not be dropped from the KV");
        return;
    }
    for (const llama_token token : picked) {
        if (!emit(s, token)) return;
    }
}

std::optional<llama_token> engine::draw(slot& s, int row, size_t ahead) {
    const llama_vocab* vocab = llama_model_get_vocab(model_.get());
    if (static_cast<int>(s.logits.size()) < s.request->keep_logits) {
        const float* logits = llama_get_logits_ith(ctx_.get(), row);
        s.logits.emplace_back(logits, logits + llama_vocab_n_tokens(vocab));
    }
    if (const auto& forced = s.request->forced_answer; !forced.empty()) {
        const size_t at = static_cast<size_t>(s.generated) + ahead;  // emit() ends the answer after the last one
        return at < forced.size() ? forced[at] : forced.back();
    }
    const auto sample_started = clock::now();
    // The engine thread serves every slot: a request whose grammar costs this much per token would hold them all.
    // A plain grammar's checks stop at the limit (token_sampler gives up); a lazy one's cannot be interrupted inside
    // one token, so its request ends after the first token that took too long.
    const auto deadline =
        sample_started + std::chrono::duration_cast<clock::duration>(
                             std::chrono::duration<double, std::milli>(std::min(options_.sample_ms_limit, 1e9)));
    const llama_token token = s.sampler->sample(ctx_.get(), row, deadline);
    const double took = ms_between(sample_started, clock::now());
    s.sampling_ms += took;
    s.sampling_max_ms = std::max(s.sampling_max_ms, took);
    if (token == LLAMA_TOKEN_NULL || took > options_.sample_ms_limit) {
        counters_.sampling_too_slow++;
        const std::string& grammar_text = common_grammar_value(s.request->sampling.grammar);
        const bool grammar = !grammar_text.empty();
        if (grammar) costly_grammars_.remember(grammar_text, took);  // the next request with it is refused at once
        char why[256];
        std::snprintf(why, sizeof why, "sampling one token took %.0f ms%s (the limit is %.0f ms: --max-sample-ms)",
                      took, grammar ? " under the request's grammar (response format or tools)" : "",
                      options_.sample_ms_limit);
        finish(s, finish_reason::error, why);
        return std::nullopt;
    }
    s.sampler->accept(token);
    return token;
}

bool engine::emit(slot& s, llama_token token) {
    const llama_vocab* vocab = llama_model_get_vocab(model_.get());
    if (s.generated == 0) s.first_token = clock::now();
    s.generated++;
    if (s.drafter) {
        s.drafter->push(std::span<const llama_token>(&token, 1));
        // A draft that was not sent, checked against what the model produced instead: recorded once it is wrong or
        // used up.
        const bool shadow_goes_on =
            !s.shadow.empty() && token == s.shadow[s.shadow_at] && ++s.shadow_at < s.shadow.size();
        if (!s.shadow.empty() && !shadow_goes_on) {
            s.control.record(s.shadow.size(), s.shadow_at);
            s.shadow.clear();
            s.shadow_at = 0;
        }
    }

    if (llama_vocab_is_eog(vocab, token)) {
        finish(s, finish_reason::stop);
        return false;
    }
    s.generated_ids.push_back(token);
    const bool special = s.request->render_special.count(token) > 0;
    const std::string piece = common_token_to_piece(ctx_.get(), token, special);
    std::string text = s.text->push(piece);
    // The first token is announced even when its text is held back (a possible stop string, half a UTF-8
    // character): the client's first event, and so its measured TTFT, should not wait for the next step.
    if (!text.empty() || s.generated == 1) s.request->output.push({.text = std::move(text)});
    if (s.text->stopped()) {
        finish(s, finish_reason::stop);
        return false;
    }
    if (s.generated >= answer_limit(*s.request)) {
        finish(s, finish_reason::length);
        return false;
    }
    if (static_cast<int>(s.cached.size()) + 1 >= slot_context_size_) {
        finish(s, finish_reason::length);
        return false;
    }
    s.pending = token;
    // A long answer's attention spans the idle conversations' cells too: out of its way, as for a long prompt
    // (seq_rm moves the cache's head down, so the answer's next tokens fill the cells they leave).
    if (options_.idle_to_ram_tokens > 0 && s.generated == options_.idle_to_ram_tokens) making_way_ = true;
    return true;
}

// The tokens a request may generate: its max_tokens, the server's default, or the bench's forced answer's length.
int engine::answer_limit(const generation_request& request) const {
    if (!request.forced_answer.empty()) return static_cast<int>(request.forced_answer.size());
    const int limit = request.max_tokens >= 0 ? request.max_tokens : options_.default_max_tokens;
    return limit >= 0 ? limit : std::numeric_limits<int>::max();
}

int engine::add_draft(slot& s, int room) {
    if (!s.drafter) return 0;  // s.draft was cleared by step()
    // Every draft token verified is one more token sampled: within the answer's limit and the slot's context, with
    // the pending token's own next one.
    const int request_max =
        s.request->draft_max < 0 ? options_.draft_max : std::min(s.request->draft_max, options_.draft_max);
    const int left =
        std::min(answer_limit(*s.request) - s.generated, slot_context_size_ - 2 - static_cast<int>(s.cached.size()));
    const int limit = std::min({request_max, left - 1, room, draft_cap_});
    if (limit < std::max(1, options_.draft_min)) return 0;
    // A drafter whose tokens cost real time (a draft model's decodes) is asked for no more than pay for themselves
    // and their rows; where none do, a short draft now and then is checked against the answer (a shadow, never sent)
    // so that drafting resumes when the draft model starts agreeing with the target.
    const double drafter_ms = options_.whole_drafts ? 0 : s.drafter->ms_per_token();
    const double row_ms = ms_per_draft_row_ + drafter_ms;
    size_t ask = static_cast<size_t>(limit);
    if (drafter_ms > 0) {
        ask = draft_control::best_length(s.control.acceptance(), generation_step_ms_, row_ms, ask);
        if (ask == 0) {
            constexpr int probe_every = 32;  // steps; a probe of 4 tokens costs about 1/8 of a draft token a step
            if (!s.shadow.empty() || ++s.steps_since_probe < probe_every) return 0;
            s.steps_since_probe = 0;
            s.shadow = s.drafter->propose(std::min<size_t>(static_cast<size_t>(limit), 4)).tokens;
            count_draft_model();
            return 0;
        }
    }
    draft_proposal proposal = s.drafter->propose(ask);
    count_draft_model();
    const size_t length =
        options_.whole_drafts
            ? proposal.tokens.size()
            : draft_control::best_length(s.control.acceptance(), generation_step_ms_, row_ms, proposal.tokens.size());
    if (length == 0 || length < static_cast<size_t>(options_.draft_min)) {
        if (s.shadow.empty() && !proposal.tokens.empty()) s.shadow = std::move(proposal.tokens);
        return 0;
    }
    proposal.tokens.resize(length);
    const auto first = static_cast<llama_pos>(s.cached.size()) + 1;  // the pending token is at cached.size()
    for (size_t i = 0; i < length; ++i) {
        common_batch_add(batch_, proposal.tokens[i], first + static_cast<llama_pos>(i), {s.id}, true);
    }
    s.draft = std::move(proposal);
    return static_cast<int>(length);
}

void engine::count_draft_model() {
    if (const draft_model* m = drafts_->model()) {
        counters_.draft_model_reused = m->stats().reused_tokens;
        counters_.draft_model_computed = m->stats().computed_tokens;
        counters_.draft_model_drafted = m->stats().drafted_tokens;
    }
}

bool engine::settle_draft(slot& s, size_t accepted) {
    const std::vector<llama_token>& draft = s.draft.tokens;
    if (draft.empty()) return true;
    const std::span<const llama_token> kept(draft.data(), accepted);
    s.cached.insert(s.cached.end(), kept.begin(), kept.end());
    cache_->append(s.id, kept);
    if (!cache_->drop_draft(s.id, static_cast<int>(s.cached.size()))) return false;
    s.control.record(draft.size(), accepted);
    s.drafter->accepted(accepted);
    s.draft_tokens += static_cast<int>(draft.size());
    s.draft_accepted += static_cast<int>(accepted);
    s.draft_steps++;
    auto& counts = counters_.drafts[static_cast<size_t>(s.draft.source)];
    counts.drafts++;
    counts.tokens += draft.size();
    counts.accepted += accepted;
    s.draft = {};
    return true;
}

}  // namespace keepwarm

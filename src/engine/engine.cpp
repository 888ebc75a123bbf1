// See engine.h. The decode loop: admit queued requests into free slots (reusing each slot's cached prefix),
// then each step decodes one token for every generating slot plus as much pending prompt as fits in the batch.
#include "engine/engine.h"

#include <algorithm>
#include <stdexcept>

#include "common.h"
#include "engine/cpu-threadpool.h"
#include "engine/llama-runtime.h"
#include "engine/text-stream.h"

namespace keepwarm {

namespace {
using clock = std::chrono::steady_clock;

double ms_between(clock::time_point a, clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

size_t common_prefix_length(const std::vector<llama_token>& a, const std::vector<llama_token>& b) {
    const size_t n = std::min(a.size(), b.size());
    size_t i = 0;
    while (i < n && a[i] == b[i]) ++i;
    return i;
}
}  // namespace

const char* finish_reason_name(finish_reason reason) {
    switch (reason) {
        case finish_reason::stop:
            return "stop";
        case finish_reason::length:
            return "length";
        case finish_reason::cancelled:
            return "cancelled";
        case finish_reason::error:
            return "error";
    }
    return "error";
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
        merged = std::move(next);
    }
    return merged;
}

struct engine::slot {
    int id = 0;
    std::vector<llama_token> cached;  // tokens whose KV sequence `id` holds, in position order
    std::shared_ptr<generation_request> request;
    common_sampler_ptr sampler;
    std::unique_ptr<text_stream> text;
    size_t prompt_done = 0;  // prompt tokens in the KV (reused + computed)
    int reused = 0;
    llama_token pending = -1;  // sampled but not yet decoded
    int batch_index = -1;      // index in the current batch whose logits belong to this slot
    int generated = 0;
    clock::time_point admitted, prompt_started, first_token;
    clock::time_point last_used;

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
    model_.reset(llama_model_load_from_file(options_.model_path.c_str(), mparams));
    if (!model_) throw std::runtime_error("failed to load model from '" + options_.model_path + "'");

    const int threads = options_.threads > 0 ? options_.threads : common_cpu_get_num_math();
    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = options_.context_size;
    cparams.n_batch = options_.batch_size;
    cparams.n_ubatch = std::min(options_.ubatch_size, options_.batch_size);
    cparams.n_seq_max = options_.slots;
    cparams.kv_unified = true;  // one cell pool for all slots: sequences can later share a common prefix's cells
    cparams.n_threads = threads;
    cparams.n_threads_batch = options_.threads_batch > 0 ? options_.threads_batch : threads;
    cparams.type_k = options_.cache_type_k;
    cparams.type_v = options_.cache_type_v;
    cparams.no_perf = true;
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
    options_.threads = threads;
    options_.threads_batch = cparams.n_threads_batch;
    options_.context_size = static_cast<int>(llama_n_ctx(ctx_.get()));
    slot_context_size_ = options_.context_size / options_.slots;
    can_truncate_memory_ = !llama_model_is_recurrent(model_.get()) && !llama_model_is_hybrid(model_.get());

    const llama_vocab* vocab = llama_model_get_vocab(model_.get());
    for (llama_token t = 0; t < llama_vocab_n_tokens(vocab); ++t) {
        if (llama_vocab_is_eog(vocab, t)) eog_tokens_.push_back(t);
    }

    batch_ = llama_batch_init(options_.batch_size, 0, 1);
    for (int i = 0; i < options_.slots; ++i) {
        auto s = std::make_unique<slot>();
        s->id = i;
        slots_.push_back(std::move(s));
        slot_status_.push_back({i, false, 0});
    }
}

engine::~engine() {
    stop();
    llama_batch_free(batch_);
    ctx_.reset();  // before the thread pools it uses
    prompt_pool_.reset();
    decode_pool_.reset();
}

void engine::start() {
    std::lock_guard lock(mu_);
    if (thread_.joinable()) return;
    stopping_ = false;
    thread_ = std::thread([this] { run(); });
}

void engine::stop() {
    {
        std::lock_guard lock(mu_);
        stopping_ = true;
    }
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
    {
        std::lock_guard lock(mu_);
        queue_.push_back(std::move(request));
    }
    wake_.notify_one();
}

int engine::queued() const {
    std::lock_guard lock(mu_);
    return static_cast<int>(queue_.size());
}

std::vector<slot_status> engine::slots() const {
    std::lock_guard lock(mu_);
    return slot_status_;
}

void engine::run() {
    for (;;) {
        {
            std::unique_lock lock(mu_);
            const auto any_busy = [&] {
                return std::any_of(slots_.begin(), slots_.end(), [](const auto& s) { return s->busy(); });
            };
            wake_.wait(lock, [&] { return stopping_ || !queue_.empty() || any_busy(); });
            if (stopping_) break;
        }
        admit_queued();
        for (auto& s : slots_) {
            if (s->busy() && s->request->cancelled.load()) finish(*s, finish_reason::cancelled);
        }
        step();
        std::lock_guard lock(mu_);
        for (auto& s : slots_) slot_status_[s->id] = {s->id, s->busy(), static_cast<int>(s->cached.size())};
    }
    for (auto& s : slots_) {
        if (s->busy()) finish(*s, finish_reason::error, "server shutting down");
    }
}

// Places queued requests into free slots, picking for each the free slot whose cached tokens share the
// longest prefix with its prompt (ties: least recently used), and trims that slot's KV to the shared prefix.
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
            continue;
        }

        slot* best = nullptr;
        size_t best_len = 0;
        for (auto& s : slots_) {
            if (s->busy()) continue;
            const size_t len = common_prefix_length(s->cached, prompt);
            if (!best || len > best_len || (len == best_len && s->last_used < best->last_used)) {
                best = s.get();
                best_len = len;
            }
        }

        slot& s = *best;
        // The last prompt token is always decoded: its logits give the first generated token.
        size_t reuse = std::min(best_len, prompt.size() - 1);
        llama_memory_t mem = llama_get_memory(ctx_.get());
        if (reuse < s.cached.size()) {
            if (!can_truncate_memory_ || !llama_memory_seq_rm(mem, s.id, static_cast<llama_pos>(reuse), -1)) {
                llama_memory_seq_rm(mem, s.id, -1, -1);
                reuse = 0;
            }
            s.cached.resize(reuse);
        }

        s.sampler.reset(common_sampler_init(model_.get(), request->sampling));
        if (!s.sampler) {
            counters_.errors++;
            request->output.push({.text = {},
                                  .done = true,
                                  .reason = finish_reason::error,
                                  .error = "could not initialize sampling (invalid grammar?)"});
            continue;
        }
        s.text = std::make_unique<text_stream>(request->stop);
        s.request = std::move(request);
        s.prompt_done = reuse;
        s.reused = static_cast<int>(reuse);
        s.pending = -1;
        s.batch_index = -1;
        s.generated = 0;
        s.admitted = clock::now();
        s.prompt_started = {};
        counters_.requests++;
    }
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

    const bool started = s.prompt_started != clock::time_point{};
    const bool sampled = s.first_token != clock::time_point{} && s.generated > 0;
    generation_stats& st = event.stats;
    st.slot = s.id;
    st.prompt_tokens = static_cast<int>(request->prompt.size());
    st.reused_tokens = s.reused;
    st.computed_tokens = static_cast<int>(s.prompt_done) - s.reused;
    st.generated_tokens = s.generated;
    st.queued_ms = ms_between(request->received, s.admitted);
    st.prompt_ms = started ? ms_between(s.prompt_started, sampled ? s.first_token : now) : 0;
    st.generation_ms = sampled ? ms_between(s.first_token, now) : 0;

    counters_.prompt_tokens += st.prompt_tokens;
    counters_.reused_tokens += st.reused_tokens;
    counters_.computed_tokens += st.computed_tokens;
    counters_.generated_tokens += st.generated_tokens;
    counters_.prefill_us += static_cast<uint64_t>(st.prompt_ms * 1000);
    counters_.decode_us += static_cast<uint64_t>(st.generation_ms * 1000);
    if (reason == finish_reason::cancelled) counters_.cancelled++;
    if (reason == finish_reason::error) {
        counters_.errors++;
        // The KV of a failed step is in an unknown state: forget it.
        llama_memory_seq_rm(llama_get_memory(ctx_.get()), s.id, -1, -1);
        s.cached.clear();
    }

    s.sampler.reset();
    s.text.reset();
    s.pending = -1;
    s.batch_index = -1;
    s.last_used = now;
    {
        // Published before the final event, so whoever sees the answer end also sees the slot free.
        std::lock_guard lock(mu_);
        slot_status_[s.id] = {s.id, false, static_cast<int>(s.cached.size())};
    }
    request->output.push(std::move(event));
}

// One llama_decode: a token for each generating slot first (so decoding never starves behind a long prompt),
// then prompt chunks until the batch is full. Returns false if there was nothing to do.
bool engine::step() {
    common_batch_clear(batch_);
    struct contribution {
        slot* s;
        int first;  // batch index of its first token
        int count;
    };
    std::vector<contribution> parts;

    for (auto& sp : slots_) {
        slot& s = *sp;
        s.batch_index = -1;
        if (!s.busy() || s.pending < 0) continue;
        common_batch_add(batch_, s.pending, static_cast<llama_pos>(s.cached.size()), {s.id}, true);
        s.batch_index = batch_.n_tokens - 1;
        parts.push_back({&s, s.batch_index, 1});
    }
    for (auto& sp : slots_) {
        slot& s = *sp;
        if (!s.prefilling() || batch_.n_tokens >= options_.batch_size) continue;
        if (s.prompt_started == clock::time_point{}) s.prompt_started = clock::now();
        const auto& prompt = s.request->prompt;
        const size_t n =
            std::min(prompt.size() - s.prompt_done, static_cast<size_t>(options_.batch_size - batch_.n_tokens));
        const int first = batch_.n_tokens;
        for (size_t k = 0; k < n; ++k) {
            const size_t i = s.prompt_done + k;
            const bool last = i + 1 == prompt.size();
            common_batch_add(batch_, prompt[i], static_cast<llama_pos>(i), {s.id}, last);
            if (last) s.batch_index = batch_.n_tokens - 1;
        }
        parts.push_back({&s, first, static_cast<int>(n)});
    }
    if (batch_.n_tokens == 0) return false;

    const int rc = llama_decode(ctx_.get(), batch_);
    counters_.decode_steps++;
    if (parts.size() > 1) counters_.shared_decode_steps++;
    if (rc != 0) {
        const std::string why =
            rc == 1 ? "no room left in the KV cache" : "llama_decode failed (" + std::to_string(rc) + ")";
        for (auto& p : parts) finish(*p.s, finish_reason::error, why);
        return true;
    }

    for (auto& p : parts) {
        slot& s = *p.s;
        for (int k = 0; k < p.count; ++k) s.cached.push_back(batch_.token[p.first + k]);
        if (s.pending >= 0) {
            s.pending = -1;  // the generated token is now in the KV
        } else {
            s.prompt_done += p.count;
        }
    }

    const llama_vocab* vocab = llama_model_get_vocab(model_.get());
    for (auto& p : parts) {
        slot& s = *p.s;
        if (s.batch_index < 0 || !s.busy()) continue;
        const llama_token token = common_sampler_sample(s.sampler.get(), ctx_.get(), s.batch_index);
        common_sampler_accept(s.sampler.get(), token, true);
        if (s.generated == 0) s.first_token = clock::now();
        s.generated++;

        if (llama_vocab_is_eog(vocab, token)) {
            finish(s, finish_reason::stop);
            continue;
        }
        const bool special = s.request->render_special.count(token) > 0;
        const std::string piece = common_token_to_piece(ctx_.get(), token, special);
        std::string text = s.text->push(piece);
        if (!text.empty()) s.request->output.push({.text = std::move(text)});
        if (s.text->stopped()) {
            finish(s, finish_reason::stop);
        } else if (s.request->max_tokens >= 0 && s.generated >= s.request->max_tokens) {
            finish(s, finish_reason::length);
        } else if (static_cast<int>(s.cached.size()) + 1 >= slot_context_size_) {
            finish(s, finish_reason::length);
        } else {
            s.pending = token;
        }
    }
    return true;
}

}  // namespace keepwarm

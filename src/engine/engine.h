// The inference engine: owns the model and the llama_context, and runs the decode loop on its own thread.
// Requests from HTTP threads wait in a queue until a slot (one KV sequence) is free; all busy slots decode
// together in one batch per step (continuous batching) on a unified KV cache.
// Threading: public methods are safe from any thread; everything else runs on the engine thread.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/latency-histogram.h"
#include "cache/prompt-cache.h"
#include "engine/costly-grammars.h"
#include "engine/cpu-threadpool.h"
#include "engine/draft-sources.h"
#include "engine/generation.h"
#include "llama-cpp.h"

namespace keepwarm {

// Where a draft of speculative decoding came from: the suffix drafter's match in the request's own tokens or in its
// tenant's earlier conversations (spec/suffix-drafter.h), one of llama.cpp's n-gram drafters (--spec-type), or a
// draft model (-md), or the model's own MTP heads (--spec-type draft-mtp).
enum class draft_source { request, history, llama, draft_model, mtp };
inline constexpr size_t draft_source_count = 5;
const char* draft_source_name(draft_source source);

struct engine_options {
    std::string model_path;
    int context_size = 8192;  // total KV cells; each slot may use context_size / slots
    int slots = 2;            // sequences decoded together (--parallel)
    int batch_size = 2048;    // logical batch: tokens per llama_decode call
    int ubatch_size = 512;    // physical batch
    int threads = 0;          // 0: one per physical core (decode)
    int threads_batch = 0;    // 0: same as threads (prefill)
    ggml_type cache_type_k = GGML_TYPE_F16;
    ggml_type cache_type_v = GGML_TYPE_F16;
    int gpu_layers = -1;                                            // -1: all that fit (no effect on CPU-only machines)
    llama_flash_attn_type flash_attn = LLAMA_FLASH_ATTN_TYPE_AUTO;  // -fa on|off|auto, as llama-server
    llama_load_mode load_mode = LLAMA_LOAD_MODE_AUTO;               // how the model file is read (--no-mmap, --mlock)
    // MoE models: the expert weights of the first N blocks stay in host memory and the CPU computes them, so a model
    // larger than the GPU's memory still runs on it (llama-server's --n-cpu-moe; -1: all blocks, --cpu-moe).
    int cpu_moe_layers = 0;
    bool verbose = false;
    // Prefix cache (see cache/prompt-cache.h).
    int cache_parked_sequences = 8;
    int cache_block_tokens = 256;
    // Sliding-window models: the SWA layers keep every position's KV (llama-server's --swa-full), so a prompt may
    // branch from any position of a cached conversation and reuse all before it, at the cost of a full context of KV
    // in the SWA layers and of attention that walks all of it. false (llama-server's default): they keep about a
    // window per sequence, and the prefix cache keeps the window as checkpoints (docs/sliding-window.md).
    // --exact-reuse implies it.
    bool swa_full = false;
    // Checkpointed models (hybrid; sliding-window without swa_full): a prompt's recurrent state or SWA window is kept
    // every this many tokens (and at message starts and its end); a restore recomputes at most this many. Each one
    // ends a prefill batch there, which a CPU hardly notices and a GPU does (256-token batches ran the hybrid bench
    // model's cold prefill at a third of llama-server's speed). 0: the physical batch on a CPU, the logical batch when
    // the model runs on a GPU, at least the sliding window, rounded up to whole blocks. Set to the effective value.
    int checkpoint_interval = 0;
    uint64_t cache_ram_bytes = 4ull << 30;
    std::string cache_dir;  // empty: no disk tier
    uint64_t cache_disk_bytes = 16ull << 30;
    // Clients' cache hints (generation_request::hinted_tokens) order eviction; false: they are ignored.
    bool cache_hints = true;
    // Told the prefix cache's reusable blocks (serve --kv-events; prompt_cache_options::block_observer). Not owned: it
    // outlives the engine.
    kv_block_observer* cache_block_observer = nullptr;
    // A reused prefix gives the answer a fresh server with the same flags gives, bit for bit (serve --exact-reuse).
    // Without it, a warm turn computes only the prompt past its cached prefix, in batches that a cold run cuts
    // elsewhere, and ggml's kernels sum a row's floats in an order that depends on the batch the row is in (a batch
    // under an attention tile takes another path): the logits differ in their last bits, and a greedy answer may part
    // from the cold one at a near tie. With it, a prompt is computed from a multiple of the physical batch
    // (ubatch_size) in logical batches, alone in its step (generating slots wait a step; no padding rows), and KV is
    // reused and kept only in a prompt's whole physical batches: its last partial batch and the answer's tokens are
    // recomputed by the next turn, up to a physical batch plus the answer per warm turn. A cold run cuts a prompt
    // longer than a logical batch at multiples of it (without the mode the piece past whole attention tiles goes
    // first). Needs batch_size a multiple of ubatch_size and a model whose KV can be cut (not hybrid or recurrent).
    // Measured bit for bit one request at a time, idle conversations parked beside it included; a prompt computed
    // while another slot streams still differs (its cells lie elsewhere among the other sequences', which attention
    // walks in tiles), and so does that stream (tests/unit/test-reuse-exactness.cpp).
    bool exact_reuse = false;
    // Limits that keep one request from holding the engine thread (each has a serve flag an operator can raise).
    // Tokens generated when a request names no limit (-1: until end of generation or a full context). 4096 covers a
    // long answer or a large tool call, and caps a runaway at minutes on a CPU rather than at the context's end.
    int default_max_tokens = 4096;
    // One token's sampling may take this long; a grammar whose every step costs more ends its request with an
    // error, so the other slots are not held up behind it. Grammar sampling with Claude Code's 25 tools on a
    // 151K-token vocab takes milliseconds per token; a 2,000-string enum takes seconds.
    double sample_ms_limit = 1000;
    // Largest grammar text (GBNF, from a response format or tools) a request may bring; bounds the work of parsing
    // it. Claude Code's 25 tools with tool_choice any make a grammar of 66 KB.
    size_t grammar_max_bytes = 256 * 1024;
    // The most alternatives one grammar rule may offer (an enum's values, a oneOf's branches): the grammar's per-token
    // cost grows with them faster than linearly (a 2,000-string enum: 8 s per token). Claude Code's tools need 266.
    size_t grammar_max_alternatives = 1024;
    // While a slot is generating, one step (its next token plus other slots' prompt chunks) aims to take at most
    // this long: prompt chunks are cut to the size that fits, measured from the steps before, so that a long prefill
    // never holds a stream's next token for longer (chunked prefill). 0: no time limit, one physical batch of
    // prompt per step.
    double step_ms_target = 75;
    // ggml's CPU flash attention computes a batch of 64 query rows or more in tiles, and a smaller one row by row,
    // which deep in a context costs many times more per row (see attention_tile in engine.cpp): a warm turn's
    // 28 new tokens 20K deep took 3.1 s where a whole tile takes about 0.45. A batch under a tile can be filled up
    // with throwaway rows of a sequence of their own, removed after the step. automatic: when the steps before
    // say a tile costs less than those rows do (dense models, attention on the CPU, 2K deep or more); on: every
    // batch under a tile (to measure it); off: never.
    enum class tile_padding { off, automatic, on };
    tile_padding pad_to_tile = tile_padding::automatic;
    // A prompt that computes at least this many tokens first moves the idle conversations on the device to RAM, out
    // of its attention's way (prompt_cache::make_way), and so does an answer once it has generated this many; they
    // come back from RAM on their next turn. 0: never.
    int idle_to_ram_tokens = 1024;
    // A step that holds a generating slot this long (its stream's reader waits as long for a token) is logged with
    // what it spent its time on (restores, making way, decode, sampling), and counted in /metrics. 0: never.
    double slow_step_log_ms = 1000;
    // /health reports the engine stalled when a step has made no progress for this long.
    double stall_seconds = 10;
    // Requests that may wait for a slot (0: no limit). One more is refused at once with a 503 and Retry-After, so a
    // burst cannot pile up work that its clients will have given up on before it starts.
    int max_queue = 64;
    // Speculative decoding (docs/speculative.md). "suffix": keepwarm's drafter over the request and its tenant's
    // earlier conversations; one of llama.cpp's n-gram types (ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod,
    // ngram-cache), through common; "none": off. Hybrid models draft up to rollback_tokens a step where llama.cpp
    // keeps recurrent-state snapshots for their architecture (Qwen3.5 and a few others), others not (their state
    // cannot drop rejected tokens), nor does exact_reuse (a verifying step's rows are not the batches a cold run
    // computes).
    // "draft-simple": a draft model (draft_model.path, serve -md), through common as llama-server drafts with one.
    // "draft-mtp": the model's own multi-token prediction heads (Qwen3.5's nextn layer), through common likewise;
    // a model without them is refused.
    std::string spec_type = "suffix";
    draft_model_options draft_model;
    int draft_max = 16;  // draft tokens one step may verify per slot (llama-server's --draft-max)
    int draft_min = 0;   // a shorter draft is not verified (--draft-min)
    // Hybrid models: the draft tokens a step may verify, and the recurrent-state snapshots llama.cpp keeps for each
    // sequence of the context to drop them (n_rs_seq: its recurrent memory grows 1 + this times).
    int rollback_tokens = 4;
    // Benchmarks and tests: verify each proposal whole (up to draft_max) instead of sizing it by the acceptance and
    // costs measured so far, so that what is drafted does not depend on the machine's speed or load.
    bool whole_drafts = false;
    size_t spec_history_tokens = size_t{1} << 20;  // earlier conversations' tokens the suffix drafter keeps
};

// The recurrent-state snapshots per sequence a hybrid or recurrent model's context is asked for with these options
// (llama_context_params::n_rs_seq; llama.cpp keeps none for an architecture it cannot roll back): drafts of up to
// that many tokens, where speculative decoding is on. Its recurrent memory is 1 + this many states a sequence.
int recurrent_rollback_snapshots(const engine_options& options);

// What /health says about the engine thread. Read from any thread.
struct engine_health {
    bool stalled = false;        // inside one step with no progress for engine_options::stall_seconds
    double seconds_in_step = 0;  // how long the current step has run (0: between steps, or idle)
    double seconds_since_progress = 0;
};

// Monotonic counters for /metrics. Read from any thread.
struct engine_counters {
    std::atomic<uint64_t> requests{0};
    std::atomic<uint64_t> prompt_tokens{0};
    std::atomic<uint64_t> reused_tokens{0};
    std::atomic<uint64_t> computed_tokens{0};
    std::atomic<uint64_t> generated_tokens{0};
    std::atomic<uint64_t> prefill_us{0};
    std::atomic<uint64_t> decode_us{0};
    std::atomic<uint64_t> decode_steps{0};         // llama_decode calls
    std::atomic<uint64_t> shared_decode_steps{0};  // ... that carried tokens of more than one slot
    std::atomic<uint64_t> decode_step_slots{0};    // slots whose tokens the llama_decode calls carried, summed
    std::atomic<uint64_t> longest_sequence{0};     // the most tokens one slot's sequence has held (prompt + answer)
    std::atomic<uint64_t> cancelled{0};
    std::atomic<uint64_t> errors{0};
    std::atomic<uint64_t> sampling_too_slow{0};       // requests ended because one token's sampling passed the limit
    std::atomic<uint64_t> costly_grammar_refused{0};  // requests refused for a grammar that passed it before
    // Where the engine thread's time goes, turn by turn of its loop (engine::loop_turn): restoring admitted
    // requests' prefixes from RAM or disk, moving idle conversations out of a long prompt's way, llama_decode, and
    // sampling; the rest (admission, cancellations, status) is the total minus these.
    std::atomic<uint64_t> loop_us{0};
    std::atomic<uint64_t> restore_us{0};
    std::atomic<uint64_t> make_way_us{0};
    std::atomic<uint64_t> batch_decode_us{0};
    std::atomic<uint64_t> sample_us{0};
    std::atomic<uint64_t> slow_stream_steps{0};  // turns that held a generating slot slow_step_log_ms or longer
    std::atomic<uint64_t> padded_steps{0};       // batches filled up to a whole attention tile (pad_to_tile)
    // Speculative decoding, by where a draft came from (draft_source): drafts the model verified, their tokens, and
    // the tokens it accepted. Accepted tokens per verifying step = 1 + accepted / drafts.
    struct draft_counts {
        std::atomic<uint64_t> drafts{0};
        std::atomic<uint64_t> tokens{0};
        std::atomic<uint64_t> accepted{0};
    };
    std::array<draft_counts, draft_source_count> drafts;
    // A draft model (-md): prompt tokens a request found in its draft sequence's KV, and tokens the draft context
    // computed to catch up with a sequence (a prompt's rest, or a whole one restored by the target's prefix cache).
    std::atomic<uint64_t> draft_model_reused{0};
    std::atomic<uint64_t> draft_model_computed{0};
    std::atomic<uint64_t> draft_model_drafted{0};  // tokens it proposed, verified or not
    std::atomic<uint64_t> answer_steps{0};  // steps that sampled answer tokens after a request's first, per request
};

// How long finished requests waited, for /metrics: for a slot (queue), and from their arrival to their first token.
struct request_latencies {
    latency_histogram queue_wait{latency_histogram::request_bounds_seconds};
    latency_histogram time_to_first_token{latency_histogram::request_bounds_seconds};
    // Every turn of the engine loop that carried a generated token: how long a stream waited for that token (the
    // batch's prompt chunks, restores and sampling included). The gaps its reader sees, less the HTTP's share.
    latency_histogram stream_step{latency_histogram::request_bounds_seconds};
};

// One slot as /health, /metrics and /slots see it, published by the engine thread at every step's start and end.
// The request fields describe the request in the slot, else the last one it served (zero and empty before the first).
struct slot_status {
    int id = 0;
    bool busy = false;
    int cached_tokens = 0;   // tokens whose KV this slot's sequence holds (prompt and generated)
    std::string tenant;      // whose tokens those are
    std::string request_id;  // the request's x-request-id (generation_request::request_id)
    int prompt_tokens = 0;   // the request's prompt
    int prompt_reused = 0;   // of them, taken from the prefix cache at admission
    int prompt_done = 0;     // of them, in the KV so far (reused + computed): prefill progress
    int generated = 0;       // tokens generated so far
    // When a request last entered or left the slot; the epoch: never.
    std::chrono::system_clock::time_point last_used{};
};

class engine {
public:
    // Loads the model and creates the context. Throws std::runtime_error with the reason on failure.
    explicit engine(engine_options options);
    ~engine();  // stops the engine thread; pending requests end with an error
    engine(const engine&) = delete;
    engine& operator=(const engine&) = delete;

    void start();
    void stop();

    // Queues a request; its events arrive on request->output. Never blocks on the engine.
    void submit(std::shared_ptr<generation_request> request);

    const llama_model* model() const { return model_.get(); }
    const llama_vocab* vocab() const { return llama_model_get_vocab(model_.get()); }
    // End-of-generation token ids, found once at load (a scan of the whole vocabulary).
    const std::vector<llama_token>& eog_tokens() const { return eog_tokens_; }
    // The fewest tokens `bytes` of text can become: no token stands for more bytes than the vocab's longest piece
    // (found at load, in the same scan). 0 where the tokenizer may shrink text before splitting it (WPM lowercases
    // and strips accents, UGM normalizes), so nothing follows from piece lengths.
    size_t min_tokens_for_text(size_t bytes) const {
        return longest_piece_bytes_ == 0 ? 0 : (bytes + longest_piece_bytes_ - 1) / longest_piece_bytes_;
    }
    size_t longest_piece_bytes() const { return longest_piece_bytes_; }
    const engine_options& options() const { return options_; }
    // Recurrent-state snapshots llama.cpp keeps for every sequence of the context, so that a hybrid model's rejected
    // draft tokens can be dropped (0: none; a model without recurrent layers, drafting off, or an architecture
    // llama.cpp cannot roll back), and how many sequences the context has (slots, parked conversations, scratch).
    int rollback_snapshots() const { return static_cast<int>(llama_n_rs_seq(ctx_.get())); }
    int sequences() const { return static_cast<int>(llama_n_seq_max(ctx_.get())); }
    int slot_context_size() const { return slot_context_size_; }  // max tokens (prompt + generated) per request
    int queued() const;
    std::vector<slot_status> slots() const;
    const engine_counters& counters() const { return counters_; }
    request_latencies latencies() const;
    engine_health health() const;
    cache_snapshot cache_stats() const { return cache_->snapshot(); }
    // The blocks the prefix cache last reported to cache_block_observer (GET /v1/cache/blocks). Any thread.
    std::vector<kv_listed_block> cache_blocks() const { return cache_->listed_blocks(); }
    // Test only: the KV of positions [p0, p1) that `slot`'s sequence holds, serialized as a RAM or disk block holds
    // it, to compare restored KV with computed KV byte for byte. Call while the engine is idle (nothing queued, no
    // slot busy, idle_to_ram_tokens 0): it reads the context from the calling thread. Throws std::logic_error if busy.
    std::vector<uint8_t> kv_bytes(int slot, int p0, int p1);

    // How many of `left` prompt tokens (before the next cut) the next step carries, with `room` left in its budget,
    // `decode_tokens` generated tokens in it and `space` left in the batch: chunks fill whole attention tiles beside
    // the decode rows, the piece that does not goes first (see engine.cpp). `rows_apart`: the model's memory splits a
    // batch by sequence (recurrent and hybrid models), so the chunk's rows after its first are a physical batch of
    // their own, and fill whole tiles there.
    static size_t prompt_chunk(size_t left, size_t room, int decode_tokens, size_t space, bool rows_apart = false);
    // How many throwaway rows fill a batch of `rows` under an attention tile to a whole one (0: none): where, at the
    // costs per row and per 1K positions of depth the steps before measured, a tile costs clearly less (see
    // engine_options::pad_to_tile).
    static int tile_padding(int rows, int prompt_rows, int deepest, double sub_tile_row_cost, double tile_row_cost);

private:
    struct slot;
    // What one turn of the engine loop (run()) spent its time on, for /metrics and the log line of a slow step.
    struct loop_turn {
        double restore_ms = 0;  // restoring admitted requests' prefixes (from RAM and disk: the tokens below)
        int restored_tokens = 0;
        double make_way_ms = 0;  // moving idle conversations to RAM
        double decode_ms = 0;    // llama_decode of the batch
        double sample_ms = 0;    // every slot's next token
        int prompt_tokens = 0;   // in the batch
        int padding = 0;         // throwaway rows that filled it to a whole tile
        int generated_tokens = 0;
        int deepest = 0;  // the highest position in the batch: what its attention spans
    };
    void run();
    void account(const loop_turn& turn, double total_ms);
    void admit_queued();
    void admit(std::shared_ptr<generation_request> request);
    void sample(slot& s);
    // sample()'s parts: the token of the batch row `row` (the sampler's, or the bench's forced one `ahead` tokens past
    // those emitted), or nothing when the request ended on it; then handing a token to the request (false: it ended).
    std::optional<llama_token> draw(slot& s, int row, size_t ahead);
    bool emit(slot& s, llama_token token);
    // Speculative decoding: adds the slot's draft to the batch after its pending token, as long as it pays (at most
    // `room` rows); then, once sampled, keeps the accepted draft tokens' KV and drops the rest.
    int add_draft(slot& s, int room);
    int answer_limit(const generation_request& request) const;
    bool settle_draft(slot& s, size_t accepted);  // false: the rejected rows could not be dropped
    void count_draft_model();                     // a draft model's reuse and catch-up, into counters_
    void fail_busy_slots(const std::string& why);
    void publish_slot_status();
    static slot_status status_of(const slot& s);
    static bool abort_decode(void* self);
    void restore_prefix(slot& s);
    void follow_shared_prefills(slot& s);
    // A prompt_progress event for a request that asked for them (generation_request::report_progress).
    void report_progress(const slot& s);
    void finish(slot& s, finish_reason reason, const std::string& error = {});
    bool step();
    void make_way();
    int prompt_budget(int decode_tokens) const;
    int tile_padding_rows(int rows, int prompt_rows, int deepest);
    size_t row_probe(size_t n, int rows_before, size_t deepest);
    void learn_row_costs(int rows, int prompt_rows, int deepest, double ms);
    void measure_step(int prompt_tokens, int decode_tokens, int draft_rows, double ms, double decode_ms);
    int next_cut(const slot& s) const;
    // Exact reuse: the physical batch size, the unit in which KV is reused and prompts are computed (1: not exact).
    int exact_unit() const { return options_.exact_reuse ? std::min(options_.ubatch_size, options_.batch_size) : 1; }
    std::string describe_divergence(const std::vector<llama_token>& prompt, const cache_restore& r) const;

    engine_options options_;
    llama_model_ptr model_;
    llama_context_ptr ctx_;
    int slot_context_size_ = 0;
    std::vector<llama_token> eog_tokens_;
    size_t longest_piece_bytes_ = 0;  // see min_tokens_for_text()
    int draft_room_ = 0;              // rows a step's answers and drafts may take together (see the constructor)
    int draft_cap_ = std::numeric_limits<int>::max();  // draft tokens a slot's step may verify (hybrid: its snapshots)
    llama_token turn_start_token_ = LLAMA_TOKEN_NULL;  // hybrid checkpoints go before each of these (message starts)
    std::unique_ptr<prompt_cache> cache_;              // engine thread only (snapshot() from any)

    // CPU thread pools kept for the context's lifetime: generation, and prompts when --threads-batch differs.
    std::unique_ptr<cpu_threadpool> decode_pool_;
    std::unique_ptr<cpu_threadpool> prompt_pool_;

    std::vector<std::unique_ptr<slot>> slots_;  // engine thread only
    llama_batch batch_{};                       // engine thread only
    // What a step costs, learnt from the steps before (0: not seen yet), to size the prompt chunks that ride along
    // with generating slots (engine_options::step_ms_target): a step of generated tokens only, and what each prompt
    // token adds to it. Engine thread only.
    double generation_step_ms_ = 0;
    double ms_per_prompt_token_ = 0;
    double generation_decode_ms_ = 0;  // ... of which llama_decode
    double ms_per_draft_row_ = 0;      // what a row of draft tokens to verify adds to a step's llama_decode
    // Speculative decoding (null: off, by --spec-type none or for a model whose state cannot drop rejected tokens).
    std::unique_ptr<draft_sources> drafts_;
    // What a row of a step that carries prompt tokens costs per 1K positions of depth, under a tile and in whole
    // tiles, to choose whether to fill a batch up to a tile (engine_options::pad_to_tile). 0: not seen yet.
    double sub_tile_row_cost_ = 0;
    double tile_row_cost_ = 0;
    llama_seq_id padding_seq_ = -1;  // the throwaway rows' sequence (-1: no padding for this model)
    // Recurrent and hybrid models: llama.cpp splits a batch into physical batches of as many rows from each sequence
    // (split_equal), so a step's generated rows and the first row of a prompt chunk are one physical batch, and the
    // chunk's other rows another.
    bool prompt_rows_apart_ = false;
    // The prompt rows that go in the generated rows' physical batch (prompt_rows_apart_): one while any generate.
    int prompt_lead_rows(int decode_tokens) const { return prompt_rows_apart_ && decode_tokens > 0 ? 1 : 0; }
    uint64_t padded_since_probe_ = 0;  // batches filled up since a batch under a tile was last measured
    bool probing_rows_ = false;        // this step's prompt chunk was cut to measure the row-by-row cost
    // A long prompt was admitted: idle conversations are being moved to RAM, out of its way. Engine thread only.
    bool making_way_ = false;
    loop_turn turn_;  // the current turn's accounts; engine thread only

    mutable std::mutex mu_;
    std::condition_variable wake_;
    std::deque<std::shared_ptr<generation_request>> queue_;  // guarded by mu_
    bool stopping_ = false;                                  // guarded by mu_
    std::vector<slot_status> slot_status_;                   // guarded by mu_, published by the engine thread

    engine_counters counters_;
    costly_grammars costly_grammars_;  // any thread: filled by sample(), read by submit()
    mutable std::mutex latencies_mu_;
    request_latencies latencies_;  // guarded by latencies_mu_
    // Heartbeat, in steady-clock nanoseconds: when the current step began (0: not in a step) and when it last moved
    // (a graph node computed, a token sampled). Written by the engine and compute threads, read by /health.
    std::atomic<int64_t> step_started_ns_{0};
    std::atomic<int64_t> progress_ns_{0};
    std::atomic<bool> abort_decode_{false};  // set by stop(): a running llama_decode returns at its next graph node
    std::thread thread_;
};

}  // namespace keepwarm

// What an HTTP thread hands the engine (a generation_request: tokens, sampling, limits) and what comes back
// (generation_events on the request's own stream). The only types shared between the two sides.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/finish-reason.h"
#include "base/prompt-progress.h"
#include "engine/token-sampler.h"
#include "sampling.h"

namespace keepwarm {

// The engine's per-request accounting, in tokens and milliseconds. local/ turns it into the neutral report every
// response is written from (chat/generation-report.h).
struct generation_stats {
    int prompt_tokens = 0;    // tokens in the prompt
    int reused_tokens = 0;    // prompt tokens whose KV was already cached and not recomputed
    int reused_device = 0;    // ... of which found in the context's own KV cells (shared, no copy)
    int reused_ram = 0;       // ... restored from host RAM
    int reused_disk = 0;      // ... restored from the disk cache
    int checkpoint_pos = -1;  // models that cannot roll back: position of the state checkpoint restored (-1: none)
    int matched_tokens = 0;   // prompt tokens found in the prefix cache's tree, whether or not their KV was usable
    // Where the prompt departs from a cached path that continues differently: the position and the text on both
    // sides (empty when the prompt only extends what was cached).
    std::string divergence;
    int computed_tokens = 0;   // prompt tokens computed for this request (prompt_tokens - reused_tokens)
    int generated_tokens = 0;  // tokens sampled
    double queued_ms = 0;      // in the engine queue, waiting for a free slot
    double setup_ms = 0;       // from receiving the request to the first model call with its tokens
    double prepare_ms = 0;     // ... of which before the engine got it (parse, render, tokenize)
    double prompt_ms = 0;      // computing the prompt, up to the first sampled token
    double generation_ms = 0;  // after the first sampled token
    // In the sampler, over every sampled token: a grammar's checks of candidate tokens (response format, tools) are
    // part of it, and so is the engine thread's time that other slots' tokens waited behind it.
    double sampling_ms = 0;
    double sampling_max_ms = 0;  // the longest one token's sampling took
    int slot = -1;               // which slot served it
    std::string stop_sequence;   // the stop string that ended the generation (empty: none did)
    // Speculative decoding (docs/speculative.md): draft tokens the model verified (llama-server's draft_n), how many
    // of them it accepted (draft_n_accepted), and the steps that verified a draft. Each accepted draft token is a
    // generated token that took no step of its own.
    int draft_tokens = 0;
    int draft_accepted = 0;
    int draft_steps = 0;
    int decode_steps = 0;  // steps that produced this request's answer tokens after the first (drafting or not)
};

struct generation_event {
    std::string text;  // new, stop-safe, valid UTF-8 text; may be empty (the first sampled token always has an event)
    bool done = false;
    finish_reason reason = finish_reason::stop;  // valid when done
    std::string error;                           // set when reason == error
    generation_stats stats;                      // final numbers when done
    std::vector<llama_token> generated;          // when done: every sampled token but a final end-of-generation
    std::vector<std::vector<float>> logits;      // when done: see generation_request::keep_logits
    // report_progress: where the prompt's processing stands (once when the slot takes the request, then after every
    // prompt chunk). Merged events keep the latest.
    std::optional<prompt_progress> progress;
};

// Single producer (engine thread), single consumer (the request's HTTP thread).
class generation_stream {
public:
    void push(generation_event event);
    // Waits up to `timeout` for events; returns what is queued (possibly nothing), merged into one event whose
    // text is the concatenation; `done` set if the last one is final.
    std::optional<generation_event> pop(std::chrono::milliseconds timeout);

private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<generation_event> events_;  // guarded by mu_
};

struct generation_request {
    std::vector<llama_token> prompt;
    std::string prompt_text;  // what `prompt` spells (the rendered prompt), for the prompt tokenizer's index
    // Whose cache this request may reuse and extend: the tenant of its API key ("": the shared one). A tenant's
    // requests never match another tenant's cached prefixes, whatever tier holds them.
    std::string tenant;
    std::string request_id;  // the HTTP request's x-request-id, for /slots; may be empty
    // The first `hinted_tokens` prompt tokens are a prefix the client asked to keep cached (chat_request::hint): once
    // the prompt is computed, the prefix cache evicts them after unmarked entries until `hint_ttl` from then. 0: none.
    int hinted_tokens = 0;
    std::chrono::seconds hint_ttl{0};
    common_params_sampling sampling;
    // The sampler made from `sampling`, built by the HTTP thread before submitting (a grammar that cannot be built is
    // that request's 400, not the engine's problem). Null: the engine builds it at admission.
    token_sampler_ptr sampler;
    int max_tokens = -1;                   // -1: the server's default (engine_options::default_max_tokens)
    std::vector<std::string> stop;         // stop strings; the matched stop string is not returned
    std::set<llama_token> render_special;  // special tokens rendered as text (e.g. <tool_call>, <think>)
    bool report_progress = false;          // events carry prompt_progress while the prompt is processed
    int keep_logits = 0;  // the raw logits of this many first sampled positions come back with the final event
    // The most draft tokens one step may verify for this request (llama-server's speculative.n_max): -1, the server's
    // --draft-max; 0, no drafting. Never more than the server's.
    int draft_max = -1;
    // Bench only (keepwarm bench spec, in process; no API sets it): the answer's tokens, emitted in place of what the
    // sampler would pick (teacher forcing), so that drafting is verified against a recorded model's answer. The
    // answer ends after the last one. Empty: sample.
    std::vector<llama_token> forced_answer;
    std::chrono::steady_clock::time_point received = std::chrono::steady_clock::now();
    std::chrono::steady_clock::time_point submitted;  // set by engine::submit

    std::atomic<bool> cancelled{false};  // set by the HTTP thread when the client goes away
    generation_stream output;
};

}  // namespace keepwarm

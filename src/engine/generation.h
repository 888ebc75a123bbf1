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

#include "sampling.h"

namespace keepwarm {

enum class finish_reason { stop, length, cancelled, error };

const char* finish_reason_name(finish_reason reason);  // "stop", "length", "cancelled", "error"

// Per-request accounting, in tokens and milliseconds. Every response reports these.
struct generation_stats {
    int prompt_tokens = 0;     // tokens in the prompt
    int reused_tokens = 0;     // prompt tokens whose KV was already cached and not recomputed
    int computed_tokens = 0;   // prompt tokens computed for this request (prompt_tokens - reused_tokens)
    int generated_tokens = 0;  // tokens sampled
    double queued_ms = 0;      // waiting for a free slot
    double prompt_ms = 0;      // computing the prompt, up to the first sampled token
    double generation_ms = 0;  // after the first sampled token
    int slot = -1;             // which slot served it
};

struct generation_event {
    std::string text;  // new, stop-safe, valid UTF-8 text; may be empty
    bool done = false;
    finish_reason reason = finish_reason::stop;  // valid when done
    std::string error;                           // set when reason == error
    generation_stats stats;                      // final numbers when done
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
    common_params_sampling sampling;
    int max_tokens = -1;                   // -1: until end of generation or the slot's context is full
    std::vector<std::string> stop;         // stop strings; the matched stop string is not returned
    std::set<llama_token> render_special;  // special tokens rendered as text (e.g. <tool_call>, <think>)
    std::chrono::steady_clock::time_point received = std::chrono::steady_clock::now();

    std::atomic<bool> cancelled{false};  // set by the HTTP thread when the client goes away
    generation_stream output;
};

}  // namespace keepwarm

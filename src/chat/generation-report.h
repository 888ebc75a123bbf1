// What one request's answer reports, whoever generated it: a generation_report, in tokens and milliseconds, is the
// neutral per-request account at the seam between the routes and a backend. This server's engine keeps its own
// accounting (engine/generation.h generation_stats), which local/ turns into a report once (local/engine-report.h);
// the proxy fills one from an upstream's usage. The routes and the cache-buster detector read only this type. Here
// too: the report turned into the neutral usage_info and timings_info once, with the operator's reuse-hiding rule
// applied; each dialect (api/) only formats these numbers in its own fields and units. Pure functions, callable from
// any thread.
#pragma once

#include <string>

#include "chat/chat-request.h"

namespace keepwarm {

struct generation_report {
    int prompt_tokens = 0;    // tokens in the prompt
    int reused_tokens = 0;    // prompt tokens whose KV was already cached and not recomputed
    int reused_device = 0;    // ... of which found in the context's own KV cells (shared, no copy)
    int reused_ram = 0;       // ... restored from host RAM
    int reused_disk = 0;      // ... restored from the disk cache
    int checkpoint_pos = -1;  // models that cannot roll back: position of the state checkpoint restored (-1: none)
    int matched_tokens = 0;   // prompt tokens found in the prefix cache's tree, whether or not their KV was usable
    // Where the prompt departs from a cached path that continues differently: the position and the text on both
    // sides (empty when the prompt only extends what was cached, or when whoever generated it does not say).
    std::string divergence;
    int computed_tokens = 0;     // prompt tokens computed for this request (prompt_tokens - reused_tokens)
    int generated_tokens = 0;    // tokens sampled
    double queued_ms = 0;        // waiting for a free slot
    double setup_ms = 0;         // from receiving the request to the first model call with its tokens
    double prepare_ms = 0;       // ... of which before the engine got it (parse, render, tokenize)
    double prompt_ms = 0;        // computing the prompt, up to the first sampled token
    double generation_ms = 0;    // after the first sampled token
    double sampling_ms = 0;      // in the sampler over every sampled token (a grammar's checks included)
    double sampling_max_ms = 0;  // the longest one token's sampling took
    int slot = -1;               // which of this server's slots served it (-1: none, or an upstream did)
    std::string stop_sequence;   // the stop string that ended the generation (empty: none did)
    int draft_tokens = 0;        // speculative decoding: draft tokens verified (llama-server's draft_n)
    int draft_accepted = 0;      // ... of them accepted (draft_n_accepted)
    // The operator turned reuse reports off (--no-reuse-report): responses say nothing was reused, so a client cannot
    // read from them what the cache holds. The log and the cache-buster detector still see the real numbers.
    bool reuse_hidden = false;
};

// The numbers a response may show: `report` itself, or, when the operator turned reuse reports off
// (report.reuse_hidden), as if nothing was reused: no reused tokens in any tier, no checkpoint, no prefix match, every
// prompt token computed.
generation_report shown_report(const generation_report& report);

// Token counts of a response, from shown_report(report): prompt (reused included), completion, reused and their tiers.
usage_info usage_of(const generation_report& report);

// llama-server's timings of a response, from shown_report(report): prompt tokens computed and reused, the time
// computing the prompt and generating, the tiers, and keepwarm's setup, queue and preparation times.
timings_info timings_of(const generation_report& report);

}  // namespace keepwarm

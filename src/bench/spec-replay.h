// `keepwarm bench spec` without --offline: recorded agent trajectories replayed through an in-process engine with
// teacher forcing (generation_request::forced_answer), each assistant turn twice, drafting off and on, so that the
// engine does the real work of drafting, verifying and rejecting at the acceptance the recorded model would have had.
// Each turn's prompt is the conversation so far rendered by the model's own chat template as the API renders a chat
// request (chat/chat-renderer.h, generation prompt added); its forced answer is the recorded assistant text as the
// template puts it after that prompt, then the end-of-turn token. The two passes run on tenants of their own, so
// neither the prefix cache nor the drafter's per-tenant history carries one into the other.
// Threading: the replay runs on the calling thread, which submits one request at a time and waits for it; the engine
// runs on its own thread.
#pragma once

#include <cstddef>
#include <ostream>
#include <string>
#include <vector>

#include "bench/spec-bench.h"
#include "chat/chat-renderer.h"
#include "llama.h"

namespace keepwarm::bench {

// One assistant turn ready to submit: the prompt (text and tokens) and the recorded answer's tokens, ending with the
// end-of-turn token.
struct replay_turn {
    std::string prompt_text;
    std::vector<llama_token> prompt;
    std::vector<llama_token> forced_answer;
};

// The turns of `trajectory`, up to `max_turns` (0: all), while prompt and answer fit in `max_tokens`. A turn the
// template refuses, or cannot render as a prefix of its answer (the continuation render does not start with the
// prompt), is skipped and counted in `skipped`; so is every turn from the first that does not fit.
std::vector<replay_turn> render_replay_turns(const chat_renderer& renderer, const llama_vocab* vocab,
                                             const trajectory_text& trajectory, std::size_t max_turns,
                                             std::size_t max_tokens, std::size_t& skipped);

struct spec_replay_options {
    std::string traces_path = "../shared/data/agent-traces/swe-agent-gemini3pro-400.jsonl.xz";
    std::string model_path;
    // Sized to run in under 10 minutes on bench-dense with 2 CPU threads: ~4.6K answer tokens and ~11K prompt tokens
    // per pass on the shared trajectories.
    std::size_t trajectories = 2;
    std::size_t turns = 8;  // per trajectory, from its start (0: all)
    int context_size = 32768;
    int threads = 0;  // 0: the engine's default
    std::string spec_type = "suffix";
    int draft_max = 16;         // the engine's --draft-max: the drafting pass's per-request limit
    bool whole_drafts = false;  // engine_options::whole_drafts: drafts not sized by this machine's measured costs
};

// One pass over the turns (drafting off or on).
struct spec_mode_result {
    std::string mode;                  // "off" or "on"
    std::size_t answers = 0;           // turns replayed
    std::size_t verbatim = 0;          // ... whose generated tokens were the forced answer's
    std::size_t answer_tokens = 0;     // generated, first tokens included
    std::size_t decode_tokens = 0;     // generated after each answer's first (which comes from the prefill)
    double generation_ms = 0;          // the engine's time after each answer's first token
    std::size_t decode_steps = 0;      // steps that produced those tokens
    std::size_t draft_tokens = 0;      // verified
    std::size_t draft_accepted = 0;    // of them, accepted
    std::size_t draft_steps = 0;       // steps that verified a draft
    std::vector<double> turn_seconds;  // per turn, from submit to the final event
    std::string error;                 // the first failed turn's error (the pass stops there)

    double decode_tokens_per_second() const;
    double tokens_per_step() const;  // decode tokens per decode step
};

struct spec_replay_report {
    spec_replay_options options;
    std::size_t conversations = 0;
    std::size_t turns = 0;          // replayed per pass
    std::size_t skipped_turns = 0;  // not rendered as a prefix of their answer, or past the slot's context
    std::size_t prompt_tokens = 0;  // summed over the turns
    spec_mode_result off;
    spec_mode_result on;

    double speedup() const;  // decode tokens/s, on / off
};

// Loads the model into an engine and replays. Progress goes to `progress`. Throws std::runtime_error on a file that
// cannot be read or a model that cannot be loaded.
spec_replay_report run_spec_replay(const spec_replay_options& options, std::ostream& progress);

std::string format_spec_replay_table(const spec_replay_report& report);
std::string format_spec_replay_json(const spec_replay_report& report);

}  // namespace keepwarm::bench

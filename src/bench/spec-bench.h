// `keepwarm bench spec --offline`: how many tokens per model step speculative decoding would give on recorded agent
// trajectories, with teacher forcing and no model: each assistant answer is replayed token by token; at each step a
// drafter proposes a continuation of the conversation so far, the accepted length is its longest prefix equal to the
// recorded answer, and the step advances that many tokens plus the one the model samples itself. keepwarm's drafter
// (spec/suffix-drafter.h, with the earlier trajectories of the run as the tenant's history) beside llama.cpp's n-gram
// drafters from `common` (common/speculative.h), on the same token streams.
// Threading: the command runs on the thread that parses the command line, as CLI11 calls it back; everything here is
// single-threaded.
#pragma once

#include <CLI/CLI.hpp>

#include <cstddef>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "spec/suffix-drafter.h"

namespace keepwarm::bench {

// One recorded conversation as text: its messages in order (role, content).
struct trajectory_text {
    struct message {
        std::string role;
        std::string content;
    };
    std::string id;
    std::vector<message> messages;
};

// Reads up to `limit` trajectories from a JSON-lines file ({"id", "messages": [{"role", "content"}]} per line); a
// path ending in .xz is decompressed with `xz -dc`. Throws std::runtime_error naming the file and line on a bad one.
std::vector<trajectory_text> read_trajectories(const std::string& path, std::size_t limit);

// One assistant turn of a conversation: its prompt is the conversation's first prompt_tokens tokens (every message
// before it, then the assistant header), and the answer the model recorded (ending with its end-of-turn token) the
// answer_tokens after them. A conversation only grows, so every turn is a span of the conversation's tokens.
struct spec_turn {
    std::size_t prompt_tokens = 0;
    std::size_t answer_tokens = 0;
};

struct spec_conversation {
    std::string id;
    std::vector<spec::token> tokens;  // the whole conversation, as the tenant's history keeps it afterwards
    std::vector<spec_turn> turns;
};

// A drafter as the replay drives it: a fresh turn, then per step a draft of the context so far (the turn's prompt
// and the answer accepted so far, append-only within a turn) and how much of it was accepted.
class offline_drafter {
public:
    virtual ~offline_drafter() = default;
    virtual std::string name() const = 0;
    virtual void begin_turn(std::span<const spec::token> prompt) = 0;
    virtual std::vector<spec::token> draft(std::span<const spec::token> context, std::size_t max_tokens) = 0;
    virtual void accept(std::size_t n_accepted) = 0;
    // The conversation is over: keepwarm's drafter keeps it as the tenant's history.
    virtual void end_conversation(std::span<const spec::token> /*tokens*/) {}
};

struct spec_drafter_result {
    std::string drafter;
    std::size_t answer_tokens = 0;
    std::size_t steps = 0;         // model steps: the first token of each answer (from the prefill), then one per draft
    std::size_t drafts = 0;        // steps with a non-empty draft
    std::size_t draft_tokens = 0;  // proposed
    std::size_t accepted_tokens = 0;  // of those, equal to the recorded answer
    double draft_seconds = 0;         // time spent in the drafter (lookups, indexing)
    std::string error;                // the drafter could not run (then the counts are 0)

    double tokens_per_step() const;
    double acceptance() const;         // accepted / proposed
    double mean_draft_length() const;  // proposed / drafts
};

// The replay of `conversations` by `drafter`, drafts at most `max_draft` tokens long.
spec_drafter_result replay_conversations(offline_drafter& drafter, const std::vector<spec_conversation>& conversations,
                                         std::size_t max_draft);

// keepwarm's drafter; its history holds the earlier conversations under one tenant (the run), or nothing (then it
// drafts from the request alone: what the history adds).
std::unique_ptr<offline_drafter> make_keepwarm_drafter(const spec::suffix_draft_options& options,
                                                       std::size_t key_tokens, bool with_history = true);
// llama.cpp's n-gram drafter `type_name` (ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache) with
// llama-server's default settings, one sequence, kept for the whole run as a server slot keeps it (or started afresh
// for each conversation). Throws std::invalid_argument for another name.
std::unique_ptr<offline_drafter> make_llama_ngram_drafter(const std::string& type_name, bool fresh_per_conversation);

struct spec_bench_options {
    // The recorded trajectories beside the repository (the project's shared data), from the repository's root.
    std::string traces_path = "../shared/data/agent-traces/swe-agent-gemini3pro-400.jsonl.xz";
    std::string model_path;  // its vocabulary tokenizes the trajectories
    std::size_t trajectories = 20;
    std::size_t max_draft = 16;
    std::vector<std::string> drafters = {"keepwarm", "ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache"};
    spec::suffix_draft_options keepwarm;
    std::size_t key_tokens = 1;
    bool llama_fresh_per_trajectory = false;
};

struct spec_bench_report {
    spec_bench_options options;
    std::size_t conversations = 0;
    std::size_t turns = 0;
    std::size_t answer_tokens = 0;
    std::size_t conversation_tokens = 0;
    std::vector<spec_drafter_result> results;
};

// Tokenizes the trajectories with the model's vocabulary (ChatML turns, as qwen-family templates render them) and
// replays them with each drafter. Progress goes to `progress`. Throws std::runtime_error on a file that can't be read.
spec_bench_report run_spec_bench(const spec_bench_options& options, std::ostream& progress);

std::string format_spec_table(const spec_bench_report& report);
std::string format_spec_json(const spec_bench_report& report);

// Adds `spec` under the `bench` command: --offline here, the replay through the engine in bench/spec-replay.h.
void add_spec_bench_command(CLI::App& bench);

}  // namespace keepwarm::bench

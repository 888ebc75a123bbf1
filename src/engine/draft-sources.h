// Speculative decoding's draft sources, one per request in a slot: fed the request's tokens as they become known
// (its prompt at admission, then every token the model produces), asked after each step for what is likely to
// follow. The engine verifies a draft with the model and tells the source how much of it was right.
// - suffix: keepwarm's drafter (spec/suffix-drafter.h) over the request's own tokens and its tenant's earlier
//   conversations (a spec::token_history the engine keeps and feeds).
// - llama.cpp's n-gram drafters (ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache) through
//   common/speculative.h, driven as llama-server drives them: one common_speculative for all slots, a sequence each.
// - draft-simple: a draft model (serve -md FILE; engine/draft-model.h), a sequence of its context per request.
// - draft-mtp: the model's own multi-token prediction heads (engine/draft-mtp.h), a sequence of their context per
//   slot, fed every batch the model decodes (decoded()).
// Threading: engine thread only.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cache/prompt-cache.h"
#include "engine/draft-model.h"
#include "engine/draft-mtp.h"
#include "llama-cpp.h"
#include "spec/token-history.h"

struct common_speculative;

namespace keepwarm {

enum class draft_source;

struct draft_proposal {
    std::vector<llama_token> tokens;  // empty: nothing worth proposing
    draft_source source{};
};

class slot_drafter {
public:
    virtual ~slot_drafter() = default;
    // Tokens of the request in order: the prompt first, then each token the model produced.
    virtual void push(std::span<const llama_token> tokens) = 0;
    // At most `max_tokens` tokens to follow those pushed so far.
    virtual draft_proposal propose(std::size_t max_tokens) = 0;
    // The model accepted the first `n` tokens of the last proposal that was verified.
    virtual void accepted(std::size_t n) = 0;
    // What a proposed token costs the drafter, in milliseconds of the engine thread (0: next to nothing, as an index
    // lookup; a draft model's decodes are not).
    virtual double ms_per_token() const { return 0; }
};

// The engine's drafting, whatever its type: makes each request's drafter and keeps what they share.
class draft_sources {
public:
    // `type`: "suffix", one of llama.cpp's n-gram type names, "draft-simple" with `model` (a draft model: it and
    // only it), or "draft-mtp" with `mtp` (the model's MTP heads: they and only they); throws std::invalid_argument
    // for anything else, naming the accepted ones. `slots`: sequences drafted for at once.
    // `model_fingerprint`: the prefix cache's (prompt_cache::model_fingerprint): the history files each tenant's
    // streams under the root key of its chains there, so that conversations recalled from the cache's disk tier
    // join the history of the tenant whose requests name it.
    draft_sources(const std::string& type, int slots, std::size_t history_tokens,
                  std::unique_ptr<draft_model> model = nullptr, std::string model_fingerprint = {},
                  std::unique_ptr<mtp_heads> mtp = nullptr);
    ~draft_sources();

    // A request whose prompt is `prompt` takes `slot`, drafting or not: the MTP heads' sequence of the slot keeps
    // what it shares with the prompt (the model's rows of the slot reach them through decoded() either way).
    void seat(int slot, std::span<const llama_token> prompt);
    // A drafter for the request in `slot` of `tenant`, fed `prompt` already.
    std::unique_ptr<slot_drafter> begin(int slot, const std::string& tenant, std::span<const llama_token> prompt);
    // The model just decoded the first `rows` rows of `batch` (each a slot's sequence): the MTP heads compute them.
    void decoded(const llama_batch& batch, int rows);
    // A request of `tenant` ended normally: what it added to its conversation (the prompt tokens it computed and
    // its answer) joins the tenant's history, for the suffix drafter of its later requests.
    void remember(const std::string& tenant, std::span<const llama_token> tokens);
    // Conversations the prefix cache held before this run (prompt_cache::conversations at start-up: its disk tier),
    // newest first, join their tenants' histories as older than anything remember() adds later. Call before the
    // first remember(). Returns the tokens kept.
    std::size_t recall(std::span<const cached_conversation> newest_first);
    // The same for what `cache` holds (prompt_cache::conversations, newest first up to --spec-history's budget), with
    // a log line saying what joined and how long it took.
    std::size_t recall(const prompt_cache& cache);
    // Whether drafts come from the history (the suffix drafter): else remember() and recall() do nothing.
    bool keeps_history() const { return !llama_ && !model_ && !mtp_; }

    const std::string& type() const { return type_; }
    const spec::token_history_stats& history_stats() const { return history_.stats(); }

    // The draft model (null: none).
    const draft_model* model() const { return model_.get(); }
    // The model's MTP heads (null: not drafting with them).
    const mtp_heads* mtp() const { return mtp_.get(); }

    // The types --spec-type accepts besides "none": "suffix", then llama.cpp's n-gram types, draft-simple (a draft
    // model, -md) and draft-mtp (the model's MTP heads).
    static std::vector<std::string> types();
    static constexpr const char* draft_model_type = "draft-simple";
    static constexpr const char* mtp_type = "draft-mtp";

private:
    // The history's name for `tenant`: the root key of its chains in the prefix cache, as the disk tier files them.
    std::string history_tenant(const std::string& tenant) const;

    std::string type_;
    std::string model_fingerprint_;
    spec::token_history history_;
    common_speculative* llama_ = nullptr;  // llama.cpp's n-gram types (null: suffix or a draft model)
    std::unique_ptr<draft_model> model_;
    std::unique_ptr<mtp_heads> mtp_;
};

}  // namespace keepwarm

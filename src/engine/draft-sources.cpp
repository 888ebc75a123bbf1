// See draft-sources.h.
#include "engine/draft-sources.h"

#include <chrono>
#include <set>
#include <stdexcept>
#include <utility>

#include "base/logger.h"
#include "engine/engine.h"
#include "spec/suffix-drafter.h"
#include "speculative.h"

namespace keepwarm {

namespace {

constexpr std::size_t llama_draft_limit = 1024;  // common_speculative_accept counts in 16 bits; --draft-max is far less

class suffix_slot_drafter final : public slot_drafter {
public:
    suffix_slot_drafter(const spec::token_history& history, const std::string& tenant) : drafter_(history, tenant) {}

    void push(std::span<const llama_token> tokens) override { drafter_.append(tokens); }

    draft_proposal propose(std::size_t max_tokens) override {
        spec::suffix_draft d = drafter_.propose(max_tokens);
        return {.tokens = std::move(d.tokens),
                .source = d.from_history ? draft_source::history : draft_source::request};
    }

    void accepted(std::size_t /*n*/) override {}

private:
    spec::suffix_drafter drafter_;
};

// One sequence of llama.cpp's common_speculative: the tokens so far, all but the last of which the drafter sees as the
// target's cache (llama-server's n_past and id_last).
class llama_slot_drafter final : public slot_drafter {
public:
    llama_slot_drafter(common_speculative* spec, llama_seq_id seq, std::span<const llama_token> prompt)
        : spec_(spec), seq_(seq), tokens_(prompt.begin(), prompt.end()) {
        common_speculative_begin(spec_, seq_, tokens_);
    }

    void push(std::span<const llama_token> tokens) override {
        tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
    }

    draft_proposal propose(std::size_t max_tokens) override {
        draft_proposal out{.tokens = {}, .source = draft_source::llama};
        if (tokens_.size() < 2 || max_tokens == 0) return out;
        const llama_token last = tokens_.back();
        tokens_.pop_back();
        result_.clear();
        common_speculative_get_draft_params(spec_, seq_) = {
            /* .drafting = */ true,
            /* .n_max    = */ static_cast<int32_t>(std::min(max_tokens, llama_draft_limit)),
            /* .n_past   = */ static_cast<llama_pos>(tokens_.size()),
            /* .id_last  = */ last,
            /* .prompt   = */ &tokens_,
            /* .result   = */ &result_,
        };
        common_speculative_draft(spec_);
        tokens_.push_back(last);
        out.tokens.assign(result_.begin(),
                          result_.begin() + static_cast<std::ptrdiff_t>(std::min(result_.size(), max_tokens)));
        return out;
    }

    void accepted(std::size_t n) override {
        common_speculative_accept(spec_, seq_, static_cast<uint16_t>(std::min(n, llama_draft_limit)));
    }

private:
    common_speculative* spec_;
    llama_seq_id seq_;
    llama_tokens tokens_;
    llama_tokens result_;
};

// A request's sequence in the draft model's context: all its tokens so far, the draft context catching up with them
// at each proposal.
class draft_model_slot_drafter final : public slot_drafter {
public:
    draft_model_slot_drafter(draft_model& model, std::span<const llama_token> prompt)
        : model_(model), seq_(model.acquire(prompt)), tokens_(prompt.begin(), prompt.end()) {}
    ~draft_model_slot_drafter() override { model_.release(seq_); }

    void push(std::span<const llama_token> tokens) override {
        tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
    }

    draft_proposal propose(std::size_t max_tokens) override {
        return {.tokens = model_.draft(seq_, tokens_, max_tokens), .source = draft_source::draft_model};
    }

    // The next proposal keeps the draft's rows in the draft context as far as they match the tokens pushed since.
    void accepted(std::size_t /*n*/) override {}

    double ms_per_token() const override { return model_.ms_per_token(); }

private:
    draft_model& model_;
    int seq_;
    std::vector<llama_token> tokens_;
};

// A slot's sequence of the MTP heads: the request's tokens so far (their count and the last), all but the last of
// which the model's KV holds.
class mtp_slot_drafter final : public slot_drafter {
public:
    mtp_slot_drafter(mtp_heads& heads, int slot, std::span<const llama_token> prompt) : heads_(heads), slot_(slot) {
        push(prompt);
    }

    void push(std::span<const llama_token> tokens) override {
        if (tokens.empty()) return;
        count_ += tokens.size();
        last_ = tokens.back();
    }

    draft_proposal propose(std::size_t max_tokens) override {
        draft_proposal out{.tokens = {}, .source = draft_source::mtp};
        if (count_ < 2) return out;
        position_ = static_cast<llama_pos>(count_ - 1);
        out.tokens = heads_.draft(slot_, position_, last_, max_tokens);
        return out;
    }

    void accepted(std::size_t n) override { heads_.accepted(slot_, position_, n); }

    double ms_per_token() const override { return heads_.ms_per_token(); }

private:
    mtp_heads& heads_;
    int slot_;
    std::size_t count_ = 0;
    llama_token last_ = 0;
    llama_pos position_ = 0;  // of the last proposal's first token's predecessor (`last_` then)
};

const std::vector<common_speculative_type>& llama_ngram_types() {
    static const std::vector<common_speculative_type> types = {
        COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE, COMMON_SPECULATIVE_TYPE_NGRAM_MAP_K,
        COMMON_SPECULATIVE_TYPE_NGRAM_MAP_K4V, COMMON_SPECULATIVE_TYPE_NGRAM_MOD, COMMON_SPECULATIVE_TYPE_NGRAM_CACHE};
    return types;
}

}  // namespace

std::vector<std::string> draft_sources::types() {
    std::vector<std::string> names{"suffix"};
    for (const common_speculative_type t : llama_ngram_types()) names.push_back(common_speculative_type_to_str(t));
    names.emplace_back(draft_model_type);
    names.emplace_back(mtp_type);
    return names;
}

draft_sources::draft_sources(const std::string& type, int slots, std::size_t history_tokens,
                             std::unique_ptr<draft_model> model, std::string model_fingerprint,
                             std::unique_ptr<mtp_heads> mtp)
    : type_(type),
      model_fingerprint_(std::move(model_fingerprint)),
      history_(spec::token_history_options{.token_budget = history_tokens, .key_tokens = 1}),
      model_(std::move(model)),
      mtp_(std::move(mtp)) {
    if ((type == mtp_type) != (mtp_ != nullptr)) {
        throw std::invalid_argument(mtp_ ? "the model's MTP heads draft with --spec-type " + std::string(mtp_type) +
                                               ", not " + type
                                         : "--spec-type " + type + " needs the model's MTP heads");
    }
    if (mtp_) return;
    if ((type == draft_model_type) != (model_ != nullptr)) {
        throw std::invalid_argument(model_ ? "a draft model (-md) drafts with --spec-type " +
                                                 std::string(draft_model_type) + " (or none), not " + type
                                           : "--spec-type " + type + " needs a draft model (-md FILE)");
    }
    if (type == "suffix" || model_) return;
    for (const common_speculative_type t : llama_ngram_types()) {
        if (common_speculative_type_to_str(t) != type) continue;
        common_params_speculative params;  // llama-server's defaults for the type
        params.types = {t};
        llama_ = common_speculative_init(params, static_cast<uint32_t>(slots));
        if (!llama_) throw std::runtime_error("llama.cpp made no drafter of type " + type);
        return;
    }
    std::string known = "none";
    for (const std::string& name : types()) known += ", " + name;
    throw std::invalid_argument("unknown --spec-type '" + type + "' (" + known + ")");
}

draft_sources::~draft_sources() {
    if (llama_) common_speculative_free(llama_);
}

void draft_sources::seat(int slot, std::span<const llama_token> prompt) {
    if (mtp_) mtp_->begin(slot, prompt);
}

void draft_sources::decoded(const llama_batch& batch, int rows) {
    if (mtp_) mtp_->decoded(batch, rows);
}

std::unique_ptr<slot_drafter> draft_sources::begin(int slot, const std::string& tenant,
                                                   std::span<const llama_token> prompt) {
    if (mtp_) return std::make_unique<mtp_slot_drafter>(*mtp_, slot, prompt);
    if (llama_) return std::make_unique<llama_slot_drafter>(llama_, static_cast<llama_seq_id>(slot), prompt);
    if (model_) return std::make_unique<draft_model_slot_drafter>(*model_, prompt);
    auto drafter = std::make_unique<suffix_slot_drafter>(history_, history_tenant(tenant));
    drafter->push(prompt);
    return drafter;
}

void draft_sources::remember(const std::string& tenant, std::span<const llama_token> tokens) {
    if (keeps_history()) history_.add_stream(history_tenant(tenant), tokens);
}

std::size_t draft_sources::recall(std::span<const cached_conversation> newest_first) {
    if (!keeps_history()) return 0;
    const std::size_t before = history_.stats().tokens;
    // Oldest first, so that the newest is the last the budget evicts.
    for (auto c = newest_first.rbegin(); c != newest_first.rend(); ++c) {
        history_.add_stream(c->tenant_root.hex(), c->tokens);
    }
    const std::size_t after = history_.stats().tokens;
    return after > before ? after - before : 0;  // the budget may have evicted what was there
}

std::size_t draft_sources::recall(const prompt_cache& cache) {
    if (!keeps_history()) return 0;
    const auto started = std::chrono::steady_clock::now();
    const std::vector<cached_conversation> held = cache.conversations(history_.token_budget());
    if (held.empty()) return 0;
    const std::size_t kept = recall(held);
    std::set<block_key> tenants;
    for (const cached_conversation& c : held) tenants.insert(c.tenant_root);
    log::info(
        "speculative", "history: {} tokens of {} conversations ({} tenants) from the prefix cache in {} ms", kept,
        held.size(), tenants.size(),
        log::fixed(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count(), 1));
    return kept;
}

std::string draft_sources::history_tenant(const std::string& tenant) const {
    return tenant_root_block_key(model_fingerprint_, tenant).hex();
}

}  // namespace keepwarm

// See raw-generation.h.
#include "local/raw-generation.h"

#include <utility>

#include "backend/client-identity.h"
#include "base/request-error.h"
#include "json-schema-to-grammar.h"
#include "local/prompt-preparation.h"

namespace keepwarm {

namespace {

// llama-server's tokenize_mixed: each text piece tokenized (the special tokens it spells parsed), BOS added only
// before a first piece that is text; token ids taken as they are once checked against the vocab.
std::vector<llama_token> tokenize_pieces(const local_model& model, const std::vector<prompt_piece>& pieces) {
    const llama_vocab* vocab = model.llm->vocab();
    const int n_vocab = llama_vocab_n_tokens(vocab);
    const size_t limit = static_cast<size_t>(model.llm->slot_context_size());
    std::vector<llama_token> tokens;
    for (size_t i = 0; i < pieces.size(); ++i) {
        const prompt_piece& piece = pieces[i];
        if (piece.token != LLAMA_TOKEN_NULL) {
            if (piece.token < 0 || piece.token >= n_vocab) throw request_error(400, "Prompt contains invalid tokens");
            tokens.push_back(piece.token);
        } else if (model.llm->min_tokens_for_text(piece.text.size()) < limit) {
            const std::vector<llama_token> part = common_tokenize(vocab, piece.text, i == 0, true);
            tokens.insert(tokens.end(), part.begin(), part.end());
        } else {
            tokens.resize(limit);  // that text alone cannot fit: refused below without tokenizing it
        }
        if (tokens.size() >= limit) {
            throw request_error(400,
                                "the prompt has at least " + std::to_string(tokens.size()) +
                                    " tokens but the context holds " + std::to_string(limit) + " tokens per request",
                                "exceed_context_size_error");
        }
    }
    if (tokens.empty()) throw request_error(400, "the prompt is empty");
    return tokens;
}

// The bytes of `text` that can make its last (keep_end) or first `tokens` tokens, cut at a UTF-8 character's start:
// a long text the FIM prompt keeps only part of is not tokenized whole (tokenizing takes about 2 s per MB).
std::string_view bounded_text(const local_model& model, std::string_view text, size_t tokens, bool keep_end) {
    const size_t bytes_per_token = model.llm->longest_piece_bytes();
    if (bytes_per_token == 0) return text;
    const size_t keep = (tokens + 1) * bytes_per_token;
    if (text.size() <= keep) return text;
    size_t at = keep_end ? text.size() - keep : keep;
    while (at > 0 && at < text.size() && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) keep_end ? ++at : --at;
    return keep_end ? text.substr(at) : text.substr(0, at);
}

std::vector<llama_token> tokenize_text(const llama_vocab* vocab, std::string_view text) {
    return common_tokenize(vocab, std::string(text), false, false);
}

// llama-server's format_prompt_infill (repo-level FIM): [FIM_REP]myproject\n, each extra file as
// [FIM_SEP]name\ntext, [FIM_SEP]filename\n, then [FIM_PRE]prefix prompt[FIM_SUF]suffix[FIM_MID]. The prefix and the
// suffix share one batch 3:1, the extra files fill the context that is left, latest kept. No FIM tokens: 501 as there.
std::vector<llama_token> infill_prompt(const local_model& model, const infill_parts& parts, const std::string& prompt,
                                       int max_tokens) {
    const llama_vocab* vocab = model.llm->vocab();
    std::string missing;
    if (llama_vocab_fim_pre(vocab) == LLAMA_TOKEN_NULL) missing += "prefix token is missing. ";
    if (llama_vocab_fim_suf(vocab) == LLAMA_TOKEN_NULL) missing += "suffix token is missing. ";
    if (llama_vocab_fim_mid(vocab) == LLAMA_TOKEN_NULL) missing += "middle token is missing. ";
    if (!missing.empty()) {
        throw request_error(501, "Infill is not supported by this model: " + missing, "not_supported_error");
    }
    const int n_batch = model.llm->options().batch_size;
    const int n_ctx = model.llm->slot_context_size();
    const int n_predict = max_tokens >= 0 ? max_tokens : model.llm->options().default_max_tokens;
    const llama_token sep = llama_vocab_fim_sep(vocab);

    const size_t prompt_limit = static_cast<size_t>(n_batch / 4);
    const std::vector<llama_token> tokens_prompt =
        common_tokenize(vocab, std::string(bounded_text(model, prompt, prompt_limit, false)), false, true);
    const size_t prefix_take_max = static_cast<size_t>(3 * (n_batch / 4));
    const size_t suffix_take_max = static_cast<size_t>(std::max<int>(0, n_batch / 4 - (2 + int(tokens_prompt.size()))));
    std::vector<llama_token> prefix = tokenize_text(vocab, bounded_text(model, parts.prefix, prefix_take_max, true));
    std::vector<llama_token> suffix = tokenize_text(vocab, bounded_text(model, parts.suffix, suffix_take_max, false));

    const size_t extra_limit = static_cast<size_t>(std::max(0, n_ctx - n_batch - 2 * n_predict));
    std::vector<llama_token> extra;
    if (llama_vocab_fim_rep(vocab) != LLAMA_TOKEN_NULL) {
        extra.push_back(llama_vocab_fim_rep(vocab));
        const auto repo = tokenize_text(vocab, "myproject\n");
        extra.insert(extra.end(), repo.begin(), repo.end());
    }
    for (const infill_parts::file& file : parts.extra) {
        if (sep != LLAMA_TOKEN_NULL) {
            extra.push_back(sep);
            const auto name = tokenize_text(vocab, bounded_text(model, file.name + "\n", extra_limit, false));
            extra.insert(extra.end(), name.begin(), name.end());
        } else {
            const auto marker = tokenize_text(vocab, "\n\n--- snippet ---\n\n");
            extra.insert(extra.end(), marker.begin(), marker.end());
        }
        const auto text = tokenize_text(vocab, bounded_text(model, file.text, extra_limit, false));
        extra.insert(extra.end(), text.begin(), text.end());
        // Only the last extra_limit tokens are kept: what is older than that can go now.
        if (extra.size() > 2 * extra_limit + 1024)
            extra.erase(extra.begin(), extra.end() - static_cast<std::ptrdiff_t>(extra_limit));
    }
    if (sep != LLAMA_TOKEN_NULL) {
        extra.push_back(sep);
        const auto name = tokenize_text(vocab, "filename\n");
        extra.insert(extra.end(), name.begin(), name.end());
    }

    const size_t prefix_take = std::min(prefix.size(), prefix_take_max);
    const size_t suffix_take = std::min(suffix.size(), suffix_take_max);
    const size_t extra_take = std::min(extra.size(), extra_limit);
    prefix.erase(prefix.begin(), prefix.end() - static_cast<std::ptrdiff_t>(prefix_take));
    suffix.resize(suffix_take);
    prefix.insert(prefix.begin(), llama_vocab_fim_pre(vocab));
    prefix.insert(prefix.end(), tokens_prompt.begin(), tokens_prompt.end());
    suffix.insert(suffix.begin(), llama_vocab_fim_suf(vocab));

    std::vector<llama_token> tokens;
    tokens.insert(tokens.end(), extra.end() - static_cast<std::ptrdiff_t>(extra_take), extra.end());
    if (llama_vocab_get_add_bos(vocab)) tokens.push_back(llama_vocab_bos(vocab));
    tokens.insert(tokens.end(), prefix.begin(), prefix.end());
    tokens.insert(tokens.end(), suffix.begin(), suffix.end());
    tokens.push_back(llama_vocab_fim_mid(vocab));
    if (static_cast<int>(tokens.size()) >= n_ctx) {
        throw request_error(400,
                            "the infill prompt has " + std::to_string(tokens.size()) +
                                " tokens but the context holds " + std::to_string(n_ctx) + " tokens per request",
                            "exceed_context_size_error");
    }
    return tokens;
}

// The raw completion's prompt into gen.prompt and gen.prompt_text (with gen.tenant's prompt index for plain text).
void set_raw_prompt(const local_model& model, generation_request& gen, raw_completion& raw, int max_tokens) {
    if (raw.infill) {
        gen.prompt = infill_prompt(model, *raw.infill, raw.prompt, max_tokens);
        gen.prompt_text = common_detokenize(model.llm->vocab(), gen.prompt, true);
    } else if (raw.pieces.empty()) {
        set_prompt(model, gen, std::move(raw.prompt));
    } else {
        gen.prompt = tokenize_pieces(model, raw.pieces);
        gen.prompt_text = common_detokenize(model.llm->vocab(), gen.prompt, true);
    }
}

}  // namespace

raw_generation::raw_generation(frontend_context& front, local_model& model, const http::request& req,
                               raw_completion raw, const request_clock& clock, http::response_writer& w, std::string id)
    : params_(std::move(raw.params)), id_(std::move(id)) {
    gen_->received = clock.received;
    gen_->tenant = req.tenant;
    gen_->request_id = req.id;
    apply_raw_completion_policy(*front.policy, req, params_, id_, headers_);
    message_.role = "assistant";
    set_raw_prompt(model, *gen_, raw, params_.max_tokens.value_or(-1));
    gen_->report_progress = params_.return_progress && params_.stream;
    gen_->sampling = to_sampling_params(params_.sampling, model.default_sampling);
    if (!params_.json_schema.empty()) {
        try {
            gen_->sampling.grammar = common_grammar(COMMON_GRAMMAR_TYPE_USER,
                                                    json_schema_to_grammar(common_json::parse(params_.json_schema)));
        } catch (const std::exception& e) {
            throw request_error(400, "'" + raw.grammar_field + "' schema cannot be used: " + e.what());
        }
    }
    prepare_sampling(model, *gen_, raw.grammar_field);
    gen_->max_tokens = params_.max_tokens.value_or(-1);
    gen_->draft_max = params_.draft_max.value_or(-1);
    gen_->stop = params_.stop;
    model.llm->submit(gen_);
    relay_.emplace(*gen_, w, front, model, id_);  // from here on, destroying this object cancels the generation
}

std::optional<generation_source::update> raw_generation::next() {
    auto ev = relay_->next();
    if (!ev) return std::nullopt;
    update u;
    if (!ev->text.empty()) {
        common_chat_msg_diff diff;
        diff.content_delta = ev->text;
        u.diffs.push_back(std::move(diff));
        message_.content += ev->text;
    }
    u.done = ev->done;
    u.reason = ev->reason;
    u.error = ev->error;
    u.report = relay_->report(*ev);
    u.progress = std::move(ev->progress);
    if (ev->done) u.generated = std::move(ev->generated);
    return u;
}

raw_prompt_renderer local_raw_prompt(frontend_context& front, local_model& model) {
    return [&front, &model](const http::request& req, raw_completion raw) {
        // As the constructor's policy call, but not logged: a router asks for every request it routes.
        front.policy->apply(raw.params, {.client = client_name(req), .headers = &req.headers, .tenant = req.tenant},
                            policy::policy_use::counting);
        generation_request gen;
        gen.tenant = req.tenant;
        set_raw_prompt(model, gen, raw, raw.params.max_tokens.value_or(-1));
        return std::move(gen.prompt);
    };
}

raw_generation_opener local_raw_generation(frontend_context& front, local_model& model) {
    return [&front, &model](const http::request& req, raw_completion raw, const request_clock& clock,
                            http::response_writer& w, std::string id) -> generation_source_ptr {
        return std::make_unique<raw_generation>(front, model, req, std::move(raw), clock, w, std::move(id));
    };
}

}  // namespace keepwarm

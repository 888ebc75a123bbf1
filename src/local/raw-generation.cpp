// See raw-generation.h.
#include "local/raw-generation.h"

#include <utility>

#include "base/request-error.h"
#include "json-schema-to-grammar.h"
#include "local/prompt-preparation.h"

namespace keepwarm {

raw_generation::raw_generation(frontend_context& front, local_model& model, const http::request& req,
                               raw_completion raw, const request_clock& clock, http::response_writer& w, std::string id)
    : params_(std::move(raw.params)), id_(std::move(id)) {
    gen_->received = clock.received;
    gen_->tenant = req.tenant;
    gen_->request_id = req.id;
    apply_raw_completion_policy(*front.policy, req, params_, id_, headers_);
    message_.role = "assistant";
    set_prompt(model, *gen_, std::move(raw.prompt));
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
    u.stats = ev->stats;
    return u;
}

raw_generation_opener local_raw_generation(frontend_context& front, local_model& model) {
    return [&front, &model](const http::request& req, raw_completion raw, const request_clock& clock,
                            http::response_writer& w, std::string id) -> generation_source_ptr {
        return std::make_unique<raw_generation>(front, model, req, std::move(raw), clock, w, std::move(id));
    };
}

}  // namespace keepwarm

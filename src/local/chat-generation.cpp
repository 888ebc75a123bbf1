// See chat-generation.h.
#include "local/chat-generation.h"

#include <utility>
#include "backend/cache-busters.h"
#include "backend/client-identity.h"
#include "base/logger.h"
#include "local/prompt-preparation.h"

namespace keepwarm {

chat_generation::chat_generation(frontend_context& front, local_model& model, const http::request& req,
                                 chat_request chat, const request_clock& clock, http::response_writer& w,
                                 std::string id)
    : front_(front), model_(model), chat_(std::move(chat)), id_(std::move(id)) {
    gen_->received = clock.received;
    gen_->tenant = req.tenant;
    gen_->request_id = req.id;
    if (policy::policy_outcome outcome = apply_request_policy(*front_.policy, req, chat_, id_, headers_);
        outcome.ping) {
        ping_.emplace(std::move(outcome.ping_reply));
        return;
    }
    refuse_chat_that_cannot_fit(model_, chat_);
    rendered_ = model_.renderer->render(chat_);
    set_prompt(model_, *gen_, std::move(rendered_.prompt));  // kept in gen_->prompt_text from here on
    // Before the engine has it: in auto detect mode a random id's rule may rewrite this very request (see
    // adopt_cache_buster_rule), which is then rendered again.
    if (front_.busters) {
        buster_ = front_.busters->inspect({client_name(req), id_, chat_.api, req.tenant}, gen_->prompt_text,
                                          chat_.messages, policy::locate_tokens(model_.llm->vocab(), gen_->prompt));
        if (buster_ && adopt_cache_buster_rule(front_, *buster_, chat_.messages)) {
            rendered_ = model_.renderer->render(chat_);
            set_prompt(model_, *gen_, std::move(rendered_.prompt));
        }
    }
    set_cache_hint(model_, chat_, *gen_);
    gen_->sampling = to_sampling_params(chat_.sampling, model_.default_sampling);
    chat_renderer::apply_to_sampling(rendered_, gen_->sampling, model_.llm->vocab());
    prepare_sampling(model_, *gen_, grammar_field(chat_, gen_->sampling));
    gen_->render_special = gen_->sampling.preserved_tokens;
    gen_->max_tokens = chat_.max_tokens.value_or(-1);
    gen_->draft_max = chat_.draft_max.value_or(-1);
    gen_->stop = rendered_.stop;
    gen_->report_progress = chat_.return_progress && chat_.stream;

    model_.llm->submit(gen_);  // first: building the output parser costs milliseconds the engine need not wait for
    relay_.emplace(*gen_, w, front_, model_, id_);  // from here on, destroying this object cancels the generation
    parser_.emplace(model_.renderer->parser_params(rendered_, chat_));
    if (!chat_.parallel_tool_calls.value_or(true)) parser_->limit_tool_calls(1);
}

chat_generation::~chat_generation() {
    if (!relay_ || !parser_) return;
    // The client went away mid-answer (or a write failed): it kept what was streamed, and may send it back, e.g. to
    // have it continued.
    if (const std::optional<generation_event> last = relay_->cancel(); last && last->reason != finish_reason::error) {
        record_delivered(last->generated, parser_->message(), false);
    }
}

// The client may get the answer with whitespace trimmed or bytes replaced: when that text comes back in the next
// turn's history, it should still map to the tokens the KV cache holds. Only plain content qualifies: reasoning and
// tool calls come back in the template's own markup. A continuation's content starts with the prefilled text, which
// the model did not write.
void chat_generation::record_delivered(const std::vector<llama_token>& generated, const common_chat_msg& answer,
                                       bool complete) {
    if (!answer.tool_calls.empty() || !answer.reasoning_content.empty() || answer.content.empty()) return;
    if (rendered_.continuation) return;
    model_.tokenizer_for(gen_->tenant)
        .record_delivered(gen_->prompt_text, gen_->prompt, generated, answer.content, complete);
}

generation_opener local_generation(frontend_context& front, local_model& model) {
    return [&front, &model](const http::request& req, chat_request chat, const request_clock& clock,
                            http::response_writer& w, std::string id) -> generation_source_ptr {
        return std::make_unique<chat_generation>(front, model, req, std::move(chat), clock, w, std::move(id));
    };
}

chat_prompt_renderer local_chat_prompt(frontend_context& front, local_model& model) {
    return [&front, &model](const http::request& req, chat_request chat) {
        return chat_generation::prompt_of(front, model, req, std::move(chat));
    };
}

token_counter local_token_counter(frontend_context& front, local_model& model) {
    return [&front, &model](const http::request& req, const chat_request& chat) {
        return chat_generation::count_prompt_tokens(front, model, chat, req.tenant);
    };
}

std::optional<generation_source::update> chat_generation::next() {
    if (ping_) return ping_->next();
    auto ev = relay_->next();
    if (!ev) return std::nullopt;
    update u;
    u.diffs = parser_->push(ev->text);
    // parallel_tool_calls false and a second call begun: the answer is complete; the engine stops at its next step.
    if (parser_->tool_calls_overflowed()) gen_->cancelled = true;
    u.done = ev->done;
    u.reason = ev->reason;
    u.error = ev->error;
    u.report = relay_->report(*ev);
    u.progress = std::move(ev->progress);
    if (ev->done && buster_ && ev->reason != finish_reason::error) {
        confirm_cache_buster(front_, *std::exchange(buster_, std::nullopt), u.report);
    }
    if (ev->done && ev->reason != finish_reason::error) {
        std::vector<common_chat_msg_diff> final_diffs;
        const common_chat_msg answer = parser_->finish(&final_diffs);
        u.diffs.insert(u.diffs.end(), final_diffs.begin(), final_diffs.end());
        record_delivered(ev->generated, answer, true);
    }
    return u;
}

int chat_generation::count_prompt_tokens(const frontend_context& front, const local_model& model,
                                         const chat_request& chat, const std::string& tenant) {
    return static_cast<int>(counted_prompt(front, model, chat, {}, tenant).size());
}

std::vector<llama_token> chat_generation::prompt_of(const frontend_context& front, const local_model& model,
                                                    const http::request& req, chat_request chat) {
    // Not logged as a generation's policy is: a router asks for every request it routes.
    return counted_prompt(front, model, std::move(chat),
                          {.client = client_name(req), .headers = &req.headers, .tenant = req.tenant}, req.tenant);
}

std::vector<llama_token> chat_generation::counted_prompt(const frontend_context& front, const local_model& model,
                                                         chat_request chat, const policy::request_origin& origin,
                                                         const std::string& tenant) {
    front.policy->apply(chat, origin, policy::policy_use::counting);
    refuse_chat_that_cannot_fit(model, chat);
    return tokenize_prompt(model, model.renderer->render(chat).prompt, tenant);
}

}  // namespace keepwarm

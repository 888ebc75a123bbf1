// See chat-generation.h.
#include "local/chat-generation.h"

#include "base/logger.h"
#include "routes/client-identity.h"

namespace keepwarm {

chat_generation::chat_generation(server_context& ctx, const http::request& req, chat_request chat,
                                 std::shared_ptr<generation_request> gen, http::response_writer& w, std::string id)
    : ctx_(ctx), chat_(std::move(chat)), gen_(std::move(gen)), id_(std::move(id)) {
    if (policy::policy_outcome outcome = apply_request_policy(*ctx_.policy, req, chat_, id_, headers_); outcome.ping) {
        common_chat_msg reply;
        reply.role = "assistant";
        reply.content = std::move(outcome.ping_reply);
        ping_reply_ = std::move(reply);
        return;
    }
    refuse_chat_that_cannot_fit(ctx_, chat_);
    rendered_ = ctx_.renderer->render(chat_);
    set_prompt(ctx_, *gen_, rendered_.prompt);
    gen_->sampling = to_sampling_params(chat_.sampling, common_params_sampling{});
    chat_renderer::apply_to_sampling(rendered_, gen_->sampling, ctx_.llm->vocab());
    prepare_sampling(ctx_, *gen_, grammar_field(chat_, gen_->sampling));
    gen_->render_special = gen_->sampling.preserved_tokens;
    gen_->max_tokens = chat_.max_tokens.value_or(-1);
    gen_->stop = rendered_.stop;

    ctx_.llm->submit(gen_);  // first: building the output parser costs milliseconds the engine need not wait for
    relay_.emplace(*gen_, w, ctx_, id_);  // from here on, destroying this object cancels the generation
    parser_.emplace(ctx_.renderer->parser_params(rendered_, chat_));
    if (ctx_.busters) {
        buster_ = ctx_.busters->inspect({client_name(req), id_, chat_.api, req.tenant}, rendered_.prompt,
                                        chat_.messages, policy::locate_tokens(ctx_.llm->vocab(), gen_->prompt));
    }
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
    ctx_.tokenizer_for(gen_->tenant)
        .record_delivered(gen_->prompt_text, gen_->prompt, generated, answer.content, complete);
}

generation_opener local_generation(server_context& ctx) {
    return [&ctx](const http::request& req, chat_request chat, const std::shared_ptr<generation_request>& gen,
                  http::response_writer& w, std::string id) -> generation_source_ptr {
        return std::make_unique<chat_generation>(ctx, req, std::move(chat), gen, w, std::move(id));
    };
}

policy::policy_outcome apply_request_policy(const policy::request_policy& policy, const http::request& req,
                                            chat_request& chat, const std::string& id,
                                            http::header_list& headers) {
    const std::string client = client_name(req);
    policy::policy_outcome outcome = policy.apply(chat, {.client = client, .headers = &req.headers});
    if (!outcome.fired.empty()) {
        const std::string rules = outcome.header_value();
        headers.emplace_back("x-keepwarm-policy", rules);
        log::info("policy", "{} policy ({} via {}): {}", id, client, chat.api, rules);
    }
    return outcome;
}

void confirm_cache_buster(server_context& ctx, policy::cache_buster_report report, const generation_stats& stats,
                          const std::vector<common_chat_msg>& messages) {
    const policy::detect_policy& detect = ctx.policy->config().detect;
    std::optional<policy::span_rule> rule;
    if (detect.mode == policy::detect_mode::automatic) rule = policy::auto_span_rule(report, messages);
    if (rule) {
        const auto in_force = ctx.policy->span_rules();
        size_t automatic = 0;
        bool known = false;
        for (const policy::span_rule& r : in_force->rules()) {
            automatic += r.origin() == policy::span_origin::automatic;
            known = known || r.name() == rule->name();
        }
        if (known || automatic >= detect.max_auto_rules) rule.reset();
    }
    if (rule) report.adopted_rule = rule->name();
    if (!ctx.busters->confirm(std::move(report), stats) || !rule) return;
    ctx.policy->add_span_rule(*rule);
    // The pattern holds the prompt's literal text around the span: logged only when the operator asked.
    log::info("policy",
              "detect auto: span rule {} (pattern '{}', replace with '{}', roles {}) in force from the next request",
              rule->name(), ctx.log_prompts ? rule->pattern() : "(not logged)",
              ctx.log_prompts ? rule->replacement() : "(not logged)", policy::role_names(rule->roles()).front());
}

std::optional<generation_source::update> chat_generation::next() {
    if (ping_reply_) {
        // The whole answer at once: the reply text, then done with zero token counts (nothing was computed).
        update u;
        u.done = true;
        if (!ping_answered_) {
            common_chat_msg_diff diff;
            diff.content_delta = ping_reply_->content;
            u.diffs.push_back(std::move(diff));
            ping_answered_ = true;
        }
        return u;
    }
    auto ev = relay_->next();
    if (!ev) return std::nullopt;
    update u;
    u.diffs = parser_->push(ev->text);
    u.done = ev->done;
    u.reason = ev->reason;
    u.error = ev->error;
    u.stats = ev->stats;
    if (ev->done && buster_ && ev->reason != finish_reason::error) {
        confirm_cache_buster(ctx_, *std::exchange(buster_, std::nullopt), ev->stats, chat_.messages);
    }
    if (ev->done && ev->reason != finish_reason::error) {
        std::vector<common_chat_msg_diff> final_diffs;
        const common_chat_msg answer = parser_->finish(&final_diffs);
        u.diffs.insert(u.diffs.end(), final_diffs.begin(), final_diffs.end());
        record_delivered(ev->generated, answer, true);
    }
    return u;
}

int chat_generation::count_prompt_tokens(server_context& ctx, const chat_request& chat,
                                         const std::string& tenant) {
    chat_request served = chat;
    ctx.policy->apply(served, {}, policy::policy_use::counting);
    refuse_chat_that_cannot_fit(ctx, served);
    return static_cast<int>(tokenize_prompt(ctx, ctx.renderer->render(served).prompt, tenant).size());
}

}  // namespace keepwarm

// See chat-generation.h.
#include "server/chat-generation.h"

#include "server/client-identity.h"

namespace keepwarm {

chat_generation::chat_generation(server_context& ctx, const http::request& req, api::chat_request chat,
                                 std::shared_ptr<generation_request> gen, http::response_writer& w, std::string id)
    : ctx_(ctx), chat_(std::move(chat)), gen_(std::move(gen)), id_(std::move(id)) {
    rendered_ = ctx_.renderer->render(chat_);
    gen_->prompt = tokenize_prompt(ctx_, rendered_.prompt);
    gen_->sampling = api::to_sampling_params(chat_.sampling, common_params_sampling{});
    api::chat_renderer::apply_to_sampling(rendered_, gen_->sampling, ctx_.llm->vocab());
    bind_to_vocab(ctx_, gen_->sampling);
    gen_->render_special = gen_->sampling.preserved_tokens;
    gen_->max_tokens = chat_.max_tokens.value_or(-1);
    gen_->stop = rendered_.stop;

    ctx_.llm->submit(gen_);  // first: building the output parser costs milliseconds the engine need not wait for
    relay_.emplace(*gen_, w, ctx_, id_);  // from here on, destroying this object cancels the generation
    parser_.emplace(ctx_.renderer->parser_params(rendered_, chat_));
    if (ctx_.busters) {
        buster_ = ctx_.busters->inspect({client_name(req), id_, chat_.api}, rendered_.prompt, chat_.messages,
                                        policy::locate_tokens(ctx_.llm->vocab(), gen_->prompt));
    }
}

std::optional<chat_generation::update> chat_generation::next() {
    auto ev = relay_->next();
    if (!ev) return std::nullopt;
    update u;
    u.diffs = parser_->push(ev->text);
    u.done = ev->done;
    u.reason = ev->reason;
    u.error = ev->error;
    u.stats = ev->stats;
    if (ev->done && buster_ && ev->reason != finish_reason::error) {
        ctx_.busters->confirm(*std::exchange(buster_, std::nullopt), ev->stats);
    }
    if (ev->done && ev->reason != finish_reason::error) {
        std::vector<common_chat_msg_diff> final_diffs;
        parser_->finish(&final_diffs);
        u.diffs.insert(u.diffs.end(), final_diffs.begin(), final_diffs.end());
    }
    return u;
}

int chat_generation::count_prompt_tokens(server_context& ctx, const api::chat_request& chat) {
    return static_cast<int>(tokenize_prompt(ctx, ctx.renderer->render(chat).prompt).size());
}

}  // namespace keepwarm

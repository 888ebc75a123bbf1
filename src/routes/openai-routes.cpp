// See openai-routes.h. Each handler runs on its connection's thread: parse and validate the body, render the
// chat template, tokenize, hand a generation_request to the engine, then relay its events to the client
// (whole or as server-sent events), cancelling the generation if the client goes away. What the model read and
// wrote goes back to the prompt tokenizer, so the next turn's prompt reuses those exact token ids.
#include "routes/openai-routes.h"

#include <nlohmann/json.hpp>

#include "api/openai-api.h"
#include "chat/generation-report.h"
#include "local/chat-generation.h"
#include "routes/generation-relay.h"

namespace keepwarm {

namespace {
using json = nlohmann::ordered_json;

bool write_sse(http::response_writer& w, const json& data) {
    return w.write_chunk("data: " + data.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n");
}

// Maps an engine error that happened before anything was sent to an HTTP error.
[[noreturn]] void throw_generation_error(const std::string& error) {
    throw request_error(500, error.empty() ? "generation failed" : error, "server_error");
}

void handle_chat(const generation_opener& open, server_context& ctx, const http::request& req, http::response_writer& w,
                 const std::shared_ptr<generation_request>& gen) {
    ctx.http.chat_completions++;
    chat_request request = api::parse_chat_request(parse_json_body(req));
    const bool stream = request.stream, include_usage = request.include_usage;
    const generation_source_ptr source = open(req, std::move(request), gen, w, api::gen_chat_completion_id());
    generation_source& chat = *source;
    const std::string& id = chat.id();
    const int64_t created = unix_now();

    if (!stream) {
        for (;;) {
            auto u = chat.next();
            if (!u) return;
            if (!u->done) continue;
            if (u->reason == finish_reason::error) throw_generation_error(u->error);
            const std::string reason = api::chat_finish_reason(chat.message(), u->reason == finish_reason::length);
            w.send(200, "application/json",
                   api::chat_completion_json(id, ctx.model_id, created, chat.message(), reason, usage_of(u->stats),
                                             timings_of(u->stats))
                       .dump(-1, ' ', false, json::error_handler_t::replace),
                   chat.response_headers());
            return;
        }
    }

    if (!w.begin_stream(200, "text/event-stream", chat.response_headers())) return;
    bool first = true;
    for (;;) {
        auto u = chat.next();
        if (!u) return;
        if (!u->diffs.empty() || first) {
            for (const json& chunk : api::chat_chunk_json(id, ctx.model_id, created, u->diffs, first)) {
                if (!write_sse(w, chunk)) {
                    ctx.http.disconnects++;
                    return;
                }
            }
            first = false;
        }
        if (!u->done) continue;
        if (u->reason == finish_reason::error) {
            write_sse(w, json::parse(http::openai_error_body(500, "server_error", u->error)));
        } else {
            const std::string reason = api::chat_finish_reason(chat.message(), u->reason == finish_reason::length);
            write_sse(
                w, api::chat_final_chunk_json(id, ctx.model_id, created, chat.message(), reason, timings_of(u->stats)));
            if (include_usage) {
                write_sse(
                    w, api::chat_usage_chunk_json(id, ctx.model_id, created, usage_of(u->stats), timings_of(u->stats)));
            }
        }
        w.write_chunk("data: [DONE]\n\n");
        w.end_stream();
        return;
    }
}

void handle_completion(server_context& ctx, const http::request& req, http::response_writer& w,
                       const std::shared_ptr<generation_request>& gen) {
    ctx.http.completions++;
    const completion_request comp = api::parse_completion_request(parse_json_body(req));

    set_prompt(ctx, *gen, comp.prompt);
    gen->sampling = to_sampling_params(comp.sampling, common_params_sampling{});
    prepare_sampling(ctx, *gen, "grammar");
    gen->max_tokens = comp.max_tokens.value_or(-1);
    gen->stop = comp.stop;
    const std::string id = api::gen_completion_id();
    const int64_t created = unix_now();
    ctx.llm->submit(gen);
    generation_relay events(*gen, w, ctx, id);

    std::string text;
    if (!comp.stream) {
        for (;;) {
            auto ev = events.next();
            if (!ev) return;
            text += ev->text;
            if (!ev->done) continue;
            if (ev->reason == finish_reason::error) throw_generation_error(ev->error);
            w.send(200, "application/json",
                   api::completion_json(id, ctx.model_id, created, text, finish_reason_name(ev->reason),
                                        usage_of(ev->stats), timings_of(ev->stats))
                       .dump(-1, ' ', false, json::error_handler_t::replace));
            return;
        }
    }

    if (!w.begin_stream(200, "text/event-stream")) {
        gen->cancelled = true;
        return;
    }
    for (;;) {
        auto ev = events.next();
        if (!ev) return;
        if (!ev->text.empty() || ev->done) {
            std::optional<std::string> reason;
            std::optional<timings_info> timings;
            if (ev->done && ev->reason != finish_reason::error) {
                reason = finish_reason_name(ev->reason);
                timings = timings_of(ev->stats);
            }
            if (!write_sse(w, api::completion_chunk_json(id, ctx.model_id, created, ev->text, reason, timings))) {
                gen->cancelled = true;
                ctx.http.disconnects++;
                return;
            }
        }
        if (!ev->done) continue;
        if (ev->reason == finish_reason::error) {
            write_sse(w, json::parse(http::openai_error_body(500, "server_error", ev->error)));
        } else if (comp.include_usage) {
            write_sse(w, api::completion_usage_chunk_json(id, ctx.model_id, created, usage_of(ev->stats),
                                                          timings_of(ev->stats)));
        }
        w.write_chunk("data: [DONE]\n\n");
        w.end_stream();
        return;
    }
}

}  // namespace

void register_openai_routes(http::http_server& server, server_context& ctx, generation_opener open,
                            generation_handler completion) {
    if (!open) open = local_generation(ctx);
    const auto chat = [open](server_context& c, const http::request& req, http::response_writer& w,
                             const std::shared_ptr<generation_request>& gen) { handle_chat(open, c, req, w, gen); };
    server.add_route("POST", "/v1/chat/completions", generation_route(ctx, chat));
    server.add_route("POST", "/chat/completions", generation_route(ctx, chat));
    if (!completion) completion = handle_completion;
    server.add_route("POST", "/v1/completions", generation_route(ctx, completion));
    server.add_route("POST", "/completions", generation_route(ctx, completion));
}

}  // namespace keepwarm

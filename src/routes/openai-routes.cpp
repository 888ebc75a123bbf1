// See openai-routes.h. Each handler runs on its connection's thread: parse and validate the body into the neutral
// request model, open a generation_source on the backend, then write what comes back in OpenAI's shape (whole or as
// server-sent events). The source cancels its generation if the client goes away.
#include "routes/openai-routes.h"

#include <nlohmann/json.hpp>

#include "api/openai-api.h"
#include "base/unix-time.h"
#include "chat/generation-report.h"
#include "routes/responses-routes.h"
#include "routes/stream-keepalive.h"

namespace keepwarm {

namespace {
using json = nlohmann::ordered_json;

bool write_sse(http::response_writer& w, const json& data) {
    return w.write_chunk("data: " + data.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n");
}

// An SSE comment: clients skip it, idle timers see bytes.
keepalive_writer with_keepalive(http::response_writer& client, const frontend_context& ctx) {
    return keepalive_writer(
        client, [] { return std::string(": keep-alive\n\n"); }, ctx.stream_keepalive);
}

void handle_chat(const generation_opener& open, frontend_context& ctx, const http::request& req,
                 http::response_writer& client, const request_clock& clock) {
    ctx.http.chat_completions++;
    keepalive_writer w = with_keepalive(client, ctx);
    chat_request request = api::parse_chat_request(parse_json_body(req));
    const bool stream = request.stream, include_usage = request.include_usage;
    const generation_source_ptr source = open(req, std::move(request), clock, w, api::gen_chat_completion_id());
    generation_source& chat = *source;
    const std::string& id = chat.id();
    const int64_t created = unix_now();

    if (!stream) {
        const auto u = final_update(chat, "server_error");
        if (!u) return;
        const std::string reason = api::chat_finish_reason(chat.message(), u->reason == finish_reason::length);
        w.send(200, "application/json",
               api::chat_completion_json(id, ctx.model_id, created, chat.message(), reason, usage_of(u->report),
                                         timings_of(u->report))
                   .dump(-1, ' ', false, json::error_handler_t::replace),
               chat.response_headers());
        return;
    }

    if (!w.begin_stream(200, "text/event-stream", chat.response_headers())) return;
    bool first = true;
    for (;;) {
        auto u = chat.next();
        if (!u) return;
        if (u->progress) {
            // llama-server's return_progress: a role chunk that carries where the prompt's processing stands.
            json chunk = api::chat_chunk_json(id, ctx.model_id, created, {}, true).at(0);
            chunk["prompt_progress"] = {{"total", u->progress->total},
                                        {"cache", u->progress->cache},
                                        {"processed", u->progress->processed},
                                        {"time_ms", u->progress->time_ms}};
            if (!write_sse(w, chunk)) {
                ctx.http.disconnects++;
                return;
            }
            first = false;
        }
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
            write_sse(w, api::chat_final_chunk_json(id, ctx.model_id, created, chat.message(), reason,
                                                    timings_of(u->report)));
            if (include_usage) {
                write_sse(w, api::chat_usage_chunk_json(id, ctx.model_id, created, usage_of(u->report),
                                                        timings_of(u->report)));
            }
        }
        w.write_chunk("data: [DONE]\n\n");
        w.end_stream();
        return;
    }
}

// A raw prompt, through the same raw-completion path (and policy call) as Ollama's raw /api/generate.
void handle_completion(const raw_generation_opener& open, frontend_context& ctx, const http::request& req,
                       http::response_writer& client, const request_clock& clock) {
    ctx.http.completions++;
    keepalive_writer w = with_keepalive(client, ctx);
    completion_request comp = api::parse_completion_request(parse_json_body(req));
    const bool stream = comp.stream, include_usage = comp.include_usage;
    const generation_source_ptr source =
        open(req, openai_raw_completion(std::move(comp)), clock, w, api::gen_completion_id());
    generation_source& completion = *source;
    const std::string& id = completion.id();
    const int64_t created = unix_now();

    if (!stream) {
        const auto u = final_update(completion, "server_error");
        if (!u) return;
        w.send(200, "application/json",
               api::completion_json(id, ctx.model_id, created, completion.message().content,
                                    finish_reason_name(u->reason), usage_of(u->report), timings_of(u->report))
                   .dump(-1, ' ', false, json::error_handler_t::replace),
               completion.response_headers());
        return;
    }

    if (!w.begin_stream(200, "text/event-stream", completion.response_headers())) return;
    for (;;) {
        auto u = completion.next();
        if (!u) return;
        std::string text;
        for (const auto& diff : u->diffs) text += diff.content_delta;
        if (!text.empty() || u->done) {
            std::optional<std::string> reason;
            std::optional<timings_info> timings;
            if (u->done && u->reason != finish_reason::error) {
                reason = finish_reason_name(u->reason);
                timings = timings_of(u->report);
            }
            if (!write_sse(w, api::completion_chunk_json(id, ctx.model_id, created, text, reason, timings))) {
                ctx.http.disconnects++;
                return;
            }
        }
        if (!u->done) continue;
        if (u->reason == finish_reason::error) {
            write_sse(w, json::parse(http::openai_error_body(500, "server_error", u->error)));
        } else if (include_usage) {
            write_sse(w, api::completion_usage_chunk_json(id, ctx.model_id, created, usage_of(u->report),
                                                          timings_of(u->report)));
        }
        w.write_chunk("data: [DONE]\n\n");
        w.end_stream();
        return;
    }
}

}  // namespace

raw_completion openai_raw_completion(completion_request comp) {
    raw_completion raw{.prompt = std::move(comp.prompt), .grammar_field = "grammar"};
    raw.params.api = "openai";
    raw.params.model = std::move(comp.model);
    raw.params.stream = comp.stream;
    raw.params.include_usage = comp.include_usage;
    raw.params.max_tokens = comp.max_tokens;
    raw.params.stop = std::move(comp.stop);
    raw.params.sampling = std::move(comp.sampling);
    raw.params.draft_max = comp.draft_max;
    return raw;
}

generation_handler openai_completions(raw_generation_opener open) {
    return [open = std::move(open)](frontend_context& ctx, const http::request& req, http::response_writer& w,
                                    const request_clock& clock) { handle_completion(open, ctx, req, w, clock); };
}

void register_openai_routes(http::http_server& server, frontend_context& ctx, generation_opener open,
                            generation_handler completion, response_store& store) {
    register_responses_routes(server, ctx, open, store);
    const auto chat = [open = std::move(open)](frontend_context& c, const http::request& req, http::response_writer& w,
                                               const request_clock& clock) { handle_chat(open, c, req, w, clock); };
    server.add_route("POST", "/v1/chat/completions", generation_route(ctx, chat));
    server.add_route("POST", "/chat/completions", generation_route(ctx, chat));
    server.add_route("POST", "/v1/completions", generation_route(ctx, completion));
}

}  // namespace keepwarm

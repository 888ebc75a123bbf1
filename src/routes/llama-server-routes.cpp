// See llama-server-routes.h. Each handler parses its body into the neutral request model, opens a raw completion on
// the backend and writes what comes back in llama-server's native shape; the source cancels the generation if the
// client goes away. The shapes follow the pinned llama.cpp's tools/server (server-task.cpp's to_json_non_oaicompat,
// server-context.cpp's handle_completions_impl).
#include "routes/llama-server-routes.h"

#include <nlohmann/json.hpp>

#include "api/llama-server-api.h"
#include "api/openai-api.h"
#include "chat/generation-report.h"
#include "routes/generation-route.h"
#include "routes/stream-keepalive.h"

namespace keepwarm {

namespace {
using json = nlohmann::ordered_json;

bool write_sse(http::response_writer& w, const json& data) {
    return w.write_chunk("data: " + data.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n");
}

json progress_json(const prompt_progress& p) {
    return api::prompt_progress_json(p.total, p.cache, p.processed, p.time_ms);
}

// llama-server's closing numbers of a finished generation; `content` and `tokens` as the caller gives them (a
// stream's last chunk has neither: they went out in the chunks before).
api::native_completion_result result_of(const frontend_context& ctx, const generation_source& source,
                                        const generation_source::update& u, std::string content,
                                        std::vector<llama_token> tokens) {
    const generation_report& st = u.report;
    api::native_completion_result r;
    r.content = std::move(content);
    r.tokens = std::move(tokens);
    r.id_slot = st.slot;
    r.model = ctx.model_id;
    r.tokens_predicted = st.generated_tokens;
    r.tokens_evaluated = st.prompt_tokens;
    r.prompt = source.prompt_text();
    r.stopping_word = st.stop_sequence;
    r.stop_type = api::native_stop_type(u.reason == finish_reason::length, st.stop_sequence);
    // What the slot's KV holds at the end: the prompt and every sampled token but the last (never decoded).
    r.tokens_cached = st.prompt_tokens + std::max(0, st.generated_tokens - 1);
    r.timings = timings_of(st);
    return r;
}

void serve_completion(const raw_generation_opener& open, frontend_context& ctx, const http::request& req,
                      http::response_writer& client, const request_clock& clock, raw_completion raw,
                      bool return_tokens) {
    ctx.http.completions++;
    keepalive_writer w(
        client, [] { return std::string(": keep-alive\n\n"); }, ctx.stream_keepalive);
    const bool stream = raw.params.stream;
    const generation_source_ptr source = open(req, std::move(raw), clock, w, api::gen_completion_id());
    generation_source& completion = *source;

    if (!stream) {
        auto u = final_update(completion, "server_error");
        if (!u) return;
        std::vector<llama_token> tokens = return_tokens ? std::move(u->generated) : std::vector<llama_token>{};
        const std::string& text = completion.message().content;
        const json body = api::native_completion_json(result_of(ctx, completion, *u, text, std::move(tokens)),
                                                      text.find('\n') != std::string::npos);
        w.send(200, "application/json", body.dump(-1, ' ', false, json::error_handler_t::replace),
               completion.response_headers());
        return;
    }

    if (!w.begin_stream(200, "text/event-stream", completion.response_headers())) return;
    int chunks = 0;
    for (;;) {
        auto u = completion.next();
        if (!u) return;
        std::string text;
        for (const auto& diff : u->diffs) text += diff.content_delta;
        bool written = true;
        if (u->progress) {
            written = write_sse(w, api::native_chunk_json("", 0, u->progress->total, progress_json(*u->progress)));
        }
        if (written && !text.empty()) {
            written = write_sse(w, api::native_chunk_json(text, ++chunks, completion.prompt_tokens()));
        }
        if (!written) {
            ctx.http.disconnects++;
            return;
        }
        if (!u->done) continue;
        if (u->reason == finish_reason::error) {
            // llama-server's stream error: the error object under "error", and the stream ends.
            write_sse(w, json{{"error", json::parse(http::openai_error_body(500, "server_error", u->error))["error"]}});
        } else {
            const std::string& all = completion.message().content;
            write_sse(w, api::native_completion_json(result_of(ctx, completion, *u, "", {}),
                                                     all.find('\n') != std::string::npos));
        }
        w.end_stream();  // llama-server's native stream has no closing [DONE]
        return;
    }
}

raw_completion raw_of(api::native_completion_request parsed) {
    raw_completion raw{.params = std::move(parsed.params),
                       .prompt = std::move(parsed.prompt),
                       .pieces = std::move(parsed.pieces),
                       .grammar_field = "json_schema"};
    raw.params.api = "llama-server";
    return raw;
}

void handle_completion(const raw_generation_opener& open, frontend_context& ctx, const http::request& req,
                       http::response_writer& w, const request_clock& clock) {
    api::native_completion_request parsed = api::parse_native_completion_request(parse_json_body(req));
    const bool return_tokens = parsed.return_tokens;
    serve_completion(open, ctx, req, w, clock, raw_of(std::move(parsed)), return_tokens);
}

void handle_infill(const raw_generation_opener& open, frontend_context& ctx, const http::request& req,
                   http::response_writer& w, const request_clock& clock) {
    api::infill_request parsed = api::parse_infill_request(parse_json_body(req));
    const bool return_tokens = parsed.completion.return_tokens;
    raw_completion raw = raw_of(std::move(parsed.completion));
    raw.infill = std::move(parsed.parts);
    serve_completion(open, ctx, req, w, clock, std::move(raw), return_tokens);
}

}  // namespace

void register_llama_server_routes(http::http_server& server, frontend_context& ctx, raw_generation_opener open,
                                  const chat_renderer* renderer) {
    const auto completion = [open](frontend_context& c, const http::request& req, http::response_writer& w,
                                   const request_clock& clock) { handle_completion(open, c, req, w, clock); };
    const auto infill = [open](frontend_context& c, const http::request& req, http::response_writer& w,
                               const request_clock& clock) { handle_infill(open, c, req, w, clock); };
    server.add_route("POST", "/completion", generation_route(ctx, completion));
    server.add_route("POST", "/completions", generation_route(ctx, completion));
    server.add_route("POST", "/infill", generation_route(ctx, infill));
    if (!renderer) return;
    server.add_route("POST", "/apply-template", [renderer](const http::request& req, http::response_writer& w) {
        const chat_request chat = api::parse_chat_request(parse_json_body(req));
        const json body{{"prompt", renderer->render(chat).prompt}};
        w.send(200, "application/json", body.dump(-1, ' ', false, json::error_handler_t::replace));
    });
}

}  // namespace keepwarm

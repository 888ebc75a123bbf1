// See ollama-routes.h. The generation routes run like the OpenAI ones (openai-routes.cpp): parse into a
// chat_request, hand it to the backend's generation_source, and write what comes back in Ollama's shape, whole or as
// newline-delimited JSON. /api/generate with raw=true skips the template and goes through the raw-completion path,
// like /v1/completions.
#include "routes/ollama-routes.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>

#include "api/ollama-api.h"
#include "chat/generation-report.h"
#include "routes/stream-keepalive.h"

namespace keepwarm {

namespace {

using json = nlohmann::ordered_json;
namespace ollama = api::ollama;

// The model is never unloaded; Ollama's own answer for a model kept forever is a date centuries ahead.
constexpr const char* never_expires = "9999-12-31T23:59:59Z";

std::string now() {
    return ollama::rfc3339(std::chrono::system_clock::now());
}

std::string dump(const json& body) {
    return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

ollama::metrics metrics_of(const generation_report& st, const request_clock& clock) {
    const auto total =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - clock.received);
    return ollama::metrics_of(usage_of(st), timings_of(st), total);
}

bool write_line(http::response_writer& w, const json& line) {
    return w.write_chunk(ollama::ndjson_line(line));
}

void end_with_error(http::response_writer& w, const std::string& error) {
    w.write_chunk(ollama::error_body(500, "server_error", error.empty() ? "generation failed" : error) + "\n");
    w.end_stream();
}

// Which Ollama answer a generation_source feeds: /api/chat's message, or /api/generate's response text.
enum class answer_shape { chat, generate };

// Ollama's NDJSON has no comment: its keep-alive is a line of the answer with empty content, which clients append.
keepalive_writer with_keepalive(http::response_writer& client, const frontend_context& ctx, const std::string& model,
                                answer_shape shape) {
    return keepalive_writer(
        client,
        [model, shape] {
            return ollama::ndjson_line(shape == answer_shape::chat
                                           ? ollama::chat_chunk_json(model, now(), "", "", {}, 0)
                                           : ollama::generate_chunk_json(model, now(), "", ""));
        },
        ctx.stream_keepalive);
}

// Relays a running generation_source to the client, whole or as NDJSON: text and thinking as they come, tool calls
// once whole (Ollama sends calls, not fragments), then a last line with done, done_reason and the numbers.
void relay_answer(frontend_context& ctx, generation_source& chat, const request_clock& clock, http::response_writer& w,
                  const std::string& model, bool stream, answer_shape shape) {
    if (!stream) {
        const auto u = final_update(chat, "server_error");
        if (!u) return;
        const std::string reason = ollama::done_reason(u->reason == finish_reason::length);
        const ollama::metrics m = metrics_of(u->report, clock);
        const common_chat_msg& msg = chat.message();
        const json body =
            shape == answer_shape::chat
                ? ollama::chat_response_json(model, now(), msg, reason, m)
                : ollama::generate_response_json(model, now(), msg.content, msg.reasoning_content, reason, m);
        w.send(200, "application/json", dump(body), chat.response_headers());
        return;
    }

    if (!w.begin_stream(200, "application/x-ndjson", chat.response_headers())) return;
    size_t calls_sent = 0;
    for (;;) {
        auto u = chat.next();
        if (!u) return;
        if (u->done && u->reason == finish_reason::error) return end_with_error(w, u->error);
        std::string content, thinking;
        for (const auto& diff : u->diffs) {
            content += diff.content_delta;
            thinking += diff.reasoning_content_delta;
        }
        // A call is whole once the next one has begun, or the answer is done.
        const std::vector<common_chat_tool_call>& calls = chat.message().tool_calls;
        const size_t whole = u->done ? calls.size() : (calls.empty() ? 0 : calls.size() - 1);
        const size_t from = std::min(calls_sent, whole);
        const auto new_calls = std::span(calls).subspan(from, whole - from);
        if (!content.empty() || !thinking.empty() || !new_calls.empty()) {
            const json line = shape == answer_shape::chat
                                  ? ollama::chat_chunk_json(model, now(), content, thinking, new_calls, from)
                                  : ollama::generate_chunk_json(model, now(), content, thinking);
            calls_sent = whole;
            if (!write_line(w, line)) {
                ctx.http.disconnects++;
                return;
            }
        }
        if (!u->done) continue;
        const std::string reason = ollama::done_reason(u->reason == finish_reason::length);
        const ollama::metrics m = metrics_of(u->report, clock);
        write_line(w, shape == answer_shape::chat ? ollama::chat_final_chunk_json(model, now(), reason, m)
                                                  : ollama::generate_final_chunk_json(model, now(), reason, m));
        w.end_stream();
        return;
    }
}

// Ollama refuses `think` for a model without a thinking mode; so does keepwarm where it knows the model's template
// (`thinking_mode` unset: through the proxy, the upstream decides), rather than drop it unsaid.
void check_thinking(std::optional<bool> thinking_mode, const chat_request& request) {
    if (request.enable_thinking.value_or(false) && thinking_mode == false) {
        throw request_error(400, "'think': the model's chat template has no thinking mode");
    }
}

void handle_chat(const generation_opener& open, std::optional<bool> thinking_mode, frontend_context& ctx,
                 const http::request& req, http::response_writer& client, const request_clock& clock) {
    ctx.http.ollama_chats++;
    chat_request request = ollama::parse_chat_request(parse_json_body(req));
    // Whatever model a request names is served by the loaded one, and the name is echoed back as asked (the policy
    // layer decides which names map to it).
    const std::string model = request.model;
    if (request.messages.empty()) {  // Ollama's "load the model" call: it is loaded
        client.send(200, "application/json", dump(ollama::chat_load_json(model, now())));
        return;
    }
    check_thinking(thinking_mode, request);
    const bool stream = request.stream;
    keepalive_writer w = with_keepalive(client, ctx, model, answer_shape::chat);
    const generation_source_ptr chat = open(req, std::move(request), clock, w, random_id("ollama-chat-"));
    relay_answer(ctx, *chat, clock, w, model, stream, answer_shape::chat);
}

void handle_generate(const generation_opener& open, const raw_generation_opener& open_raw,
                     std::optional<bool> thinking_mode, frontend_context& ctx, const http::request& req,
                     http::response_writer& client, const request_clock& clock) {
    ctx.http.ollama_generates++;
    ollama::generate_request request = ollama::parse_generate_request(parse_json_body(req));
    const std::string model = request.chat.model;  // echoed as asked, as in handle_chat
    if (request.prompt.empty()) {                  // Ollama's "load the model" call: it is loaded
        client.send(200, "application/json", dump(ollama::generate_load_json(model, now())));
        return;
    }
    const bool stream = request.chat.stream;
    keepalive_writer w = with_keepalive(client, ctx, model, answer_shape::generate);
    if (request.raw) {
        // The prompt text goes to the model as is: the raw-completion path, as /v1/completions takes.
        raw_completion raw{
            .params = std::move(request.chat), .prompt = std::move(request.prompt), .grammar_field = "format"};
        const generation_source_ptr source = open_raw(req, std::move(raw), clock, w, random_id("ollama-generate-"));
        relay_answer(ctx, *source, clock, w, model, stream, answer_shape::generate);
        return;
    }
    check_thinking(thinking_mode, request.chat);
    const generation_source_ptr chat = open(req, std::move(request.chat), clock, w, random_id("ollama-generate-"));
    relay_answer(ctx, *chat, clock, w, model, stream, answer_shape::generate);
}

// GET /api/tags: the one model `card` describes.
void add_tags_route(http::http_server& server, std::shared_ptr<const ollama::model_card> card) {
    server.add_route("GET", "/api/tags",
                     [card](const http::request&, http::response_writer& w) {
                         w.send(200, "application/json", dump(ollama::tags_json(*card)));
                     },
                     {.format_error = ollama::error_body});
}

[[noreturn]] void throw_not_in_proxy(const std::string& what) {
    throw request_error(501, what + " is not available through keepwarm proxy: it needs the local model",
                        "not_implemented_error");
}

}  // namespace

void register_ollama_routes(http::http_server& server, frontend_context& ctx, generation_opener open,
                            raw_generation_opener open_raw, std::optional<bool> thinking_mode) {
    const http::route_options route{.format_error = ollama::error_body};
    // Ollama's clients read a failed call's "error" as a string: a path under /api/ that no route takes is a 404 in
    // Ollama's shape, not OpenAI's object (which the `ollama` npm client prints as "[object Object]").
    server.set_error_format("/api/", ollama::error_body);
    // What clients probe before anything else stays open without an API key, like /health.
    const http::route_options probe{.requires_auth = false, .format_error = ollama::error_body};

    server.add_route(
        "POST", "/api/chat",
        generation_route(ctx, [open, thinking_mode](
                                  frontend_context& c, const http::request& req, http::response_writer& w,
                                  const request_clock& clock) { handle_chat(open, thinking_mode, c, req, w, clock); }),
        route);
    server.add_route(
        "POST", "/api/generate",
        generation_route(ctx,
                         [open, open_raw, thinking_mode](frontend_context& c, const http::request& req,
                                                         http::response_writer& w, const request_clock& clock) {
                             handle_generate(open, open_raw, thinking_mode, c, req, w, clock);
                         }),
        route);

    const auto version = [](const http::request& req, http::response_writer& w) {
        w.send(200, "application/json", req.method == "HEAD" ? "" : dump(ollama::version_json(KEEPWARM_VERSION)));
    };
    server.add_route("GET", "/api/version", version, probe);
    server.add_route("HEAD", "/api/version", version, probe);
    const auto running = [](const http::request& req, http::response_writer& w) {
        // A HEAD answer carries no body (the HTTP layer sends what it is given).
        w.send(200, "text/plain; charset=utf-8", req.method == "HEAD" ? "" : "Ollama is running");
    };
    server.add_route("GET", "/", running, probe);
    server.add_route("HEAD", "/", running, probe);
}

void register_ollama_model_routes(http::http_server& server, ollama::model_card model_card) {
    const http::route_options route{.format_error = ollama::error_body};
    auto card = std::make_shared<const ollama::model_card>(std::move(model_card));
    add_tags_route(server, card);
    server.add_route(
        "POST", "/api/show",
        [card](const http::request& req, http::response_writer& w) {
            ollama::parse_show_request(parse_json_body(req));  // any name: the loaded model answers
            w.send(200, "application/json", dump(ollama::show_json(*card)));
        },
        route);
    server.add_route(
        "GET", "/api/ps",
        [card](const http::request&, http::response_writer& w) {
            w.send(200, "application/json", dump(ollama::ps_json(*card, never_expires)));
        },
        route);
}

void register_ollama_proxy_model_routes(http::http_server& server, const std::string& model_id) {
    const http::route_options route{.format_error = ollama::error_body};
    // Only the name is known here: the upstreams hold the models.
    auto card = std::make_shared<ollama::model_card>();
    card->name = ollama::tagged_name(model_id);
    add_tags_route(server, card);
    server.add_route(
        "POST", "/api/show", [](const http::request&, http::response_writer&) { throw_not_in_proxy("/api/show"); },
        route);
    server.add_route(
        "GET", "/api/ps", [](const http::request&, http::response_writer&) { throw_not_in_proxy("/api/ps"); }, route);
}

}  // namespace keepwarm

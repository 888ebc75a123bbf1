// See ollama-routes.h. The generation routes run like the OpenAI ones (openai-routes.cpp): parse into a
// chat_request, hand it to chat_generation (render, tokenize, submit, parse the output), and write what comes back
// in Ollama's shape, whole or as newline-delimited JSON. /api/generate with raw=true skips the template and feeds the
// prompt text to the model as is, like /v1/completions.
#include "routes/ollama-routes.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>

#include "api/ollama-api.h"
#include "cache/block-key.h"
#include "chat/generation-report.h"
#include "ggml-backend.h"
#include "json-schema-to-grammar.h"
#include "local/chat-generation.h"
#include "model/model-inspect.h"
#include "routes/generation-relay.h"

namespace keepwarm {

namespace {

using json = nlohmann::ordered_json;
namespace ollama = api::ollama;

// The model is never unloaded; Ollama's own answer for a model kept forever is a date centuries ahead.
constexpr const char* never_expires = "9999-12-31T23:59:59Z";
// GGUF arrays longer than this (the vocabulary, merges, scores) are null in model_info, as Ollama shows them.
constexpr size_t max_model_info_array = 256;

std::string now() {
    return ollama::rfc3339(std::chrono::system_clock::now());
}

std::string dump(const json& body) {
    return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

// The response's numbers as Ollama writes them; its total_duration runs from the request's receipt to now.
ollama::metrics response_metrics(const generation_stats& st, const generation_request& gen) {
    const auto total =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - gen.received);
    return ollama::metrics_of(usage_of(st), timings_of(st), total);
}

// Maps an engine error that happened before anything was sent to an HTTP error.
[[noreturn]] void throw_generation_error(const std::string& error) {
    throw request_error(500, error.empty() ? "generation failed" : error, "server_error");
}

bool write_line(http::response_writer& w, const json& line) {
    return w.write_chunk(ollama::ndjson_line(line));
}

void end_with_error(http::response_writer& w, const std::string& error) {
    w.write_chunk(ollama::error_body(500, "server_error", error.empty() ? "generation failed" : error) + "\n");
    w.end_stream();
}

// Which Ollama answer a chat_generation feeds: /api/chat's message, or /api/generate's response text.
enum class answer_shape { chat, generate };

// Relays a running chat_generation to the client, whole or as NDJSON: text and thinking as they come, tool calls
// once whole (Ollama sends calls, not fragments), then a last line with done, done_reason and the numbers.
void relay_answer(server_context& ctx, generation_source& chat, const generation_request& gen, http::response_writer& w,
                  const std::string& model, bool stream, answer_shape shape) {
    if (!stream) {
        for (;;) {
            auto u = chat.next();
            if (!u) return;
            if (!u->done) continue;
            if (u->reason == finish_reason::error) throw_generation_error(u->error);
            const std::string reason = ollama::done_reason(u->reason == finish_reason::length);
            const ollama::metrics m = response_metrics(u->stats, gen);
            const common_chat_msg& msg = chat.message();
            const json body =
                shape == answer_shape::chat
                    ? ollama::chat_response_json(model, now(), msg, reason, m)
                    : ollama::generate_response_json(model, now(), msg.content, msg.reasoning_content, reason, m);
            w.send(200, "application/json", dump(body), chat.response_headers());
            return;
        }
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
        const ollama::metrics m = response_metrics(u->stats, gen);
        write_line(w, shape == answer_shape::chat ? ollama::chat_final_chunk_json(model, now(), reason, m)
                                                  : ollama::generate_final_chunk_json(model, now(), reason, m));
        w.end_stream();
        return;
    }
}

// Ollama refuses `think` for a model without a thinking mode; so does keepwarm, rather than drop it unsaid.
void check_thinking(const server_context& ctx, const chat_request& request) {
    if (request.enable_thinking.value_or(false) && ctx.renderer && !ctx.renderer->supports_thinking()) {
        throw request_error(400, "'think': the model's chat template has no thinking mode");
    }
}

[[noreturn]] void throw_not_in_proxy(const std::string& what) {
    throw request_error(501, what + " is not available through keepwarm proxy: it needs the local model",
                           "not_implemented_error");
}

void handle_chat(const generation_opener& open, server_context& ctx, const http::request& req, http::response_writer& w,
                 const std::shared_ptr<generation_request>& gen) {
    ctx.http.ollama_chats++;
    chat_request request = ollama::parse_chat_request(parse_json_body(req));
    // Whatever model a request names is served by the loaded one, and the name is echoed back as asked (the policy
    // layer decides which names map to it).
    const std::string model = request.model;
    if (request.messages.empty()) {  // Ollama's "load the model" call: it is loaded
        w.send(200, "application/json", dump(ollama::chat_load_json(model, now())));
        return;
    }
    check_thinking(ctx, request);
    const bool stream = request.stream;
    const generation_source_ptr chat = open(req, std::move(request), gen, w, random_id("ollama-chat-"));
    relay_answer(ctx, *chat, *gen, w, model, stream, answer_shape::chat);
}

// raw=true: the prompt text goes to the model as is (tokenize + generate, as /v1/completions does).
void generate_raw(server_context& ctx, const ollama::generate_request& request, http::response_writer& w,
                  const std::shared_ptr<generation_request>& gen) {
    const chat_request& params = request.chat;
    set_prompt(ctx, *gen, request.prompt);
    gen->sampling = to_sampling_params(params.sampling, common_params_sampling{});
    if (!params.json_schema.empty()) {
        try {
            gen->sampling.grammar = common_grammar(COMMON_GRAMMAR_TYPE_USER,
                                                   json_schema_to_grammar(common_json::parse(params.json_schema)));
        } catch (const std::exception& e) {
            throw request_error(400, std::string("'format' schema cannot be used: ") + e.what());
        }
    }
    prepare_sampling(ctx, *gen, "format");
    gen->max_tokens = params.max_tokens.value_or(-1);
    gen->stop = params.stop;
    ctx.llm->submit(gen);
    generation_relay events(*gen, w, ctx, random_id("ollama-generate-"));

    std::string text;
    if (!params.stream) {
        for (;;) {
            auto ev = events.next();
            if (!ev) return;
            text += ev->text;
            if (!ev->done) continue;
            if (ev->reason == finish_reason::error) throw_generation_error(ev->error);
            w.send(200, "application/json",
                   dump(ollama::generate_response_json(params.model, now(), text, "",
                                                       ollama::done_reason(ev->reason == finish_reason::length),
                                                       response_metrics(ev->stats, *gen))));
            return;
        }
    }

    if (!w.begin_stream(200, "application/x-ndjson")) return;
    for (;;) {
        auto ev = events.next();
        if (!ev) return;
        if (ev->done && ev->reason == finish_reason::error) return end_with_error(w, ev->error);
        if (!ev->text.empty() && !write_line(w, ollama::generate_chunk_json(params.model, now(), ev->text, ""))) {
            ctx.http.disconnects++;
            return;
        }
        if (!ev->done) continue;
        write_line(w, ollama::generate_final_chunk_json(params.model, now(),
                                                        ollama::done_reason(ev->reason == finish_reason::length),
                                                        response_metrics(ev->stats, *gen)));
        w.end_stream();
        return;
    }
}

void handle_generate(const generation_opener& open, server_context& ctx, const http::request& req,
                     http::response_writer& w, const std::shared_ptr<generation_request>& gen) {
    ctx.http.ollama_generates++;
    ollama::generate_request request = ollama::parse_generate_request(parse_json_body(req));
    const std::string model = request.chat.model;  // echoed as asked, as in handle_chat
    if (request.prompt.empty()) {                  // Ollama's "load the model" call: it is loaded
        w.send(200, "application/json", dump(ollama::generate_load_json(model, now())));
        return;
    }
    if (request.raw) {
        if (!ctx.llm) throw_not_in_proxy("/api/generate with raw=true");
        return generate_raw(ctx, request, w, gen);
    }
    check_thinking(ctx, request.chat);
    const bool stream = request.chat.stream;
    const generation_source_ptr chat = open(req, std::move(request.chat), gen, w, random_id("ollama-generate-"));
    relay_answer(ctx, *chat, *gen, w, model, stream, answer_shape::generate);
}

// Ollama's model_info: the GGUF's key/values with their types, without the chat template (that is /api/show's
// "template") and with the long tokenizer arrays as null.
json model_info(const std::string& path) {
    json info = read_gguf_metadata(path, max_model_info_array);
    for (auto it = info.begin(); it != info.end();) {
        it = it.key().starts_with("tokenizer.chat_template") ? info.erase(it) : std::next(it);
    }
    return info;
}

// Memory of the loaded model, as Ollama's /api/ps estimates its own: one recurrent state per sequence (slots, parked
// conversations, scratch); on a GPU, the offloaded layers' share.
void estimate_memory(const server_context& ctx, const model_report& report, ollama::model_card& card) {
    const engine_options& eo = ctx.llm->options();
    const serving_memory memory =
        estimate_serving_memory(report, {.weight_bytes = llama_model_size(ctx.llm->model()),
                                         .cache_type_k = eo.cache_type_k,
                                         .cache_type_v = eo.cache_type_v,
                                         .context_size = uint64_t(eo.context_size),
                                         .sequences = uint64_t(eo.slots + eo.cache_parked_sequences + 1),
                                         .gpu_layers = eo.gpu_layers,
                                         .has_gpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_GPU) ||
                                                    ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_IGPU)});
    card.memory_bytes = memory.total_bytes;
    card.vram_bytes = memory.gpu_bytes;
}

ollama::model_card make_model_card(const server_context& ctx) {
    const llama_model* model = ctx.llm->model();
    const model_report report = inspect_model(ctx.model_path);
    ollama::model_card card;
    card.name = ollama::tagged_name(ctx.model_id);
    card.architecture = report.architecture;
    card.parameter_size = ollama::parameter_size(llama_model_n_params(model));
    card.quantization_level = ollama::quantization_level(llama_model_ftype(model));
    card.file_bytes = report.file_size;
    // Not Ollama's sha256 of a manifest (there is none): keepwarm's cheap fingerprint of the file, which also keys
    // its disk cache.
    card.digest = model_fingerprint(ctx.model_path, "");
    card.modified_at = std::chrono::file_clock::to_sys(std::filesystem::last_write_time(ctx.model_path));
    card.path = ctx.model_path;
    card.chat_template = ctx.renderer->source();
    card.model_info = model_info(ctx.model_path);
    if (!card.model_info.contains("general.parameter_count")) {
        card.model_info["general.parameter_count"] = llama_model_n_params(model);
    }
    card.capabilities = {"completion"};
    const auto caps = ctx.renderer->caps();
    if (auto it = caps.find("supports_tools"); it != caps.end() && it->second) card.capabilities.push_back("tools");
    if (ctx.renderer->supports_thinking()) card.capabilities.push_back("thinking");
    card.context_length = ctx.llm->slot_context_size();
    estimate_memory(ctx, report, card);
    return card;
}

}  // namespace

void register_ollama_routes(http::http_server& server, server_context& ctx, generation_opener open) {
    const http::route_options route{.format_error = ollama::error_body};
    // What clients probe before anything else stays open without an API key, like /health.
    const http::route_options probe{.requires_auth = false, .format_error = ollama::error_body};
    const bool local = ctx.llm != nullptr;
    if (!open) open = local_generation(ctx);

    server.add_route(
        "POST", "/api/chat",
        generation_route(ctx,
                         [open](server_context& c, const http::request& req, http::response_writer& w,
                                const std::shared_ptr<generation_request>& gen) { handle_chat(open, c, req, w, gen); }),
        route);
    server.add_route(
        "POST", "/api/generate",
        generation_route(
            ctx, [open](server_context& c, const http::request& req, http::response_writer& w,
                        const std::shared_ptr<generation_request>& gen) { handle_generate(open, c, req, w, gen); }),
        route);

    if (!local) {
        // Only the name is known here: the upstreams hold the models.
        auto card = std::make_shared<ollama::model_card>();
        card->name = ollama::tagged_name(ctx.model_id);
        server.add_route(
            "GET", "/api/tags",
            [card](const http::request&, http::response_writer& w) {
                w.send(200, "application/json", dump(ollama::tags_json(*card)));
            },
            route);
        server.add_route(
            "POST", "/api/show", [](const http::request&, http::response_writer&) { throw_not_in_proxy("/api/show"); },
            route);
        server.add_route(
            "GET", "/api/ps", [](const http::request&, http::response_writer&) { throw_not_in_proxy("/api/ps"); },
            route);
    }

    if (local) {
        auto card = std::make_shared<const ollama::model_card>(make_model_card(ctx));
        server.add_route(
            "GET", "/api/tags",
            [card](const http::request&, http::response_writer& w) {
                w.send(200, "application/json", dump(ollama::tags_json(*card)));
            },
            route);
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

}  // namespace keepwarm

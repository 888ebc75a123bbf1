// See openai-routes.h. Each handler runs on its connection's thread: parse and validate the body, render the
// chat template, tokenize, hand a generation_request to the engine, then relay its events to the client
// (whole or as server-sent events), cancelling the generation if the client goes away. What the model read and
// wrote goes back to the prompt tokenizer, so the next turn's prompt reuses those exact token ids.
#include "server/openai-routes.h"

#include <nlohmann/json.hpp>

#include "api/chat-output-parser.h"
#include "api/openai-api.h"
#include "common.h"

#include <cmath>
#include <cstdio>

namespace keepwarm {

namespace {
using json = nlohmann::ordered_json;
using namespace std::chrono_literals;

json parse_body(const http::request& req) {
    if (req.body.empty()) throw http::http_error(400, "request body is empty; expected a JSON object");
    json body;
    try {
        body = json::parse(req.body);
    } catch (const json::parse_error& e) {
        throw http::http_error(400, std::string("request body is not valid JSON: ") + e.what());
    }
    if (!body.is_object()) throw http::http_error(400, "request body must be a JSON object");
    return body;
}

std::vector<llama_token> tokenize_prompt(const server_context& ctx, const std::string& prompt) {
    auto tokens = ctx.tokenizer->tokenize(prompt);
    if (tokens.empty()) throw http::http_error(400, "the prompt is empty");
    const int limit = ctx.llm->slot_context_size();
    if (static_cast<int>(tokens.size()) >= limit) {
        throw http::http_error(400,
                               "the prompt has " + std::to_string(tokens.size()) + " tokens but the context holds " +
                                   std::to_string(limit) + " tokens per request",
                               "exceed_context_size_error");
    }
    return tokens;
}

api::cache_detail cache_detail_of(const generation_stats& st) {
    return {
        .device = st.reused_device, .ram = st.reused_ram, .disk = st.reused_disk, .checkpoint_pos = st.checkpoint_pos};
}

api::usage_info usage_of(const generation_stats& st) {
    return {.prompt_tokens = st.prompt_tokens,
            .completion_tokens = st.generated_tokens,
            .cached_tokens = st.reused_tokens,
            .cache = cache_detail_of(st)};
}

api::timings_info timings_of(const generation_stats& st) {
    return {.prompt_n = st.computed_tokens,
            .cache_n = st.reused_tokens,
            .prompt_ms = st.prompt_ms,
            .predicted_n = st.generated_tokens,
            .predicted_ms = st.generation_ms,
            .cache = cache_detail_of(st),
            .setup_ms = st.setup_ms,
            .queued_ms = st.queued_ms,
            .prepare_ms = st.prepare_ms};
}

int64_t unix_now() {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

// Waits for the next event of a running generation. Returns nullopt once the client is gone, after telling the
// generation to stop. The socket is checked every 50 ms whether or not tokens are flowing: a non-streamed answer
// writes nothing until the end, so only this check notices a client that left.
// When the generation ends, its prompt and generated tokens are recorded in the prompt tokenizer. A handler that
// leaves early (client gone, failed write, exception) cancels the generation, and the destructor waits briefly for
// its final event so that what was generated still counts: the engine keeps that KV too.
class event_waiter {
public:
    event_waiter(generation_request& gen, http::response_writer& w, server_context& ctx, std::string id)
        : gen_(gen), w_(w), ctx_(ctx), id_(std::move(id)) {}
    event_waiter(const event_waiter&) = delete;
    event_waiter& operator=(const event_waiter&) = delete;

    ~event_waiter() {
        if (finished_) return;
        gen_.cancelled = true;
        // The engine answers a cancel at its next step; the limit only matters if it is stuck or stopping.
        const auto deadline = std::chrono::steady_clock::now() + drain_limit;
        while (std::chrono::steady_clock::now() < deadline) {
            if (auto ev = gen_.output.pop(check_interval); ev && ev->done) {
                finish(*ev);
                return;
            }
        }
    }

    std::optional<generation_event> next() {
        for (;;) {
            const auto now = std::chrono::steady_clock::now();
            if (now - last_check_ >= check_interval) {
                last_check_ = now;
                if (w_.client_gone()) {
                    gen_.cancelled = true;
                    ctx_.http.disconnects++;
                    std::fprintf(stderr, "keepwarm: %s client went away, generation cancelled\n", id_.c_str());
                    return std::nullopt;
                }
            }
            if (auto ev = gen_.output.pop(check_interval)) {
                if (ev->done) finish(*ev);
                return ev;
            }
        }
    }

private:
    void finish(const generation_event& ev) {
        finished_ = true;
        log_request(ev);
        // A failed step leaves the KV in an unknown state; anything else is what the model saw and wrote.
        if (ev.reason != finish_reason::error) ctx_.tokenizer->record(gen_.prompt, ev.generated);
    }

    // One line per generation, so an operator sees what each request reused without reading responses.
    void log_request(const generation_event& ev) const {
        const generation_stats& st = ev.stats;
        std::string where;  // which tiers the reused tokens came from
        const auto tier = [&](const char* name, int n) {
            if (n > 0) where += (where.empty() ? "" : " + ") + std::to_string(n) + " " + name;
        };
        tier("device", st.reused_device);
        tier("ram", st.reused_ram);
        tier("disk", st.reused_disk);
        if (st.checkpoint_pos >= 0) where += ", checkpoint at " + std::to_string(st.checkpoint_pos);
        if (st.matched_tokens > st.reused_tokens + 1) {
            where += (where.empty() ? "" : ", ") + std::to_string(st.matched_tokens) + " matched";
        }
        std::fprintf(stderr,
                     "keepwarm: %s slot %d: prompt %d tokens (reused %d%s%s%s, computed %d) in %.0f ms (setup %.1f ms, "
                     "prepare %.1f), "
                     "generated %d in %.0f ms, %s%s%s\n",
                     id_.c_str(), st.slot, st.prompt_tokens, st.reused_tokens, where.empty() ? "" : ": ", where.c_str(),
                     "", st.computed_tokens, st.prompt_ms, st.setup_ms, st.prepare_ms, st.generated_tokens,
                     st.generation_ms, finish_reason_name(ev.reason), ev.error.empty() ? "" : ": ", ev.error.c_str());
        if (!st.divergence.empty()) std::fprintf(stderr, "keepwarm: %s %s\n", id_.c_str(), st.divergence.c_str());
    }

    static constexpr auto check_interval = 50ms;
    static constexpr auto drain_limit = 2s;
    generation_request& gen_;
    http::response_writer& w_;
    server_context& ctx_;
    std::string id_;
    std::chrono::steady_clock::time_point last_check_ = std::chrono::steady_clock::now();
    bool finished_ = false;  // the final event was seen
};

bool write_sse(http::response_writer& w, const json& data) {
    return w.write_chunk("data: " + data.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n");
}

// Maps an engine error that happened before anything was sent to an HTTP error.
[[noreturn]] void throw_generation_error(const generation_event& ev) {
    throw http::http_error(500, ev.error.empty() ? "generation failed" : ev.error, "server_error");
}

// Checks the request's token ids against the vocab, and turns ignore_eos into bans on end-of-generation tokens.
void bind_to_vocab(const server_context& ctx, common_params_sampling& sampling) {
    const llama_vocab* vocab = ctx.llm->vocab();
    const int n_vocab = llama_vocab_n_tokens(vocab);
    for (const auto& bias : sampling.logit_bias) {
        if (bias.token >= n_vocab) {
            throw http::http_error(400, "'logit_bias' names token " + std::to_string(bias.token) +
                                            " but the vocabulary has " + std::to_string(n_vocab) + " tokens");
        }
    }
    if (!sampling.ignore_eos) return;
    for (const llama_token t : ctx.llm->eog_tokens()) sampling.logit_bias.push_back({t, -INFINITY});
}

void handle_chat(server_context& ctx, const http::request& req, http::response_writer& w,
                 const std::shared_ptr<generation_request>& gen) {
    ctx.http.chat_completions++;
    const json body = parse_body(req);
    const api::chat_request chat = api::parse_chat_request(body);
    const api::chat_renderer::rendered rendered = ctx.renderer->render(chat);

    gen->prompt = tokenize_prompt(ctx, rendered.prompt);
    gen->sampling = api::to_sampling_params(chat.sampling, common_params_sampling{});
    api::chat_renderer::apply_to_sampling(rendered, gen->sampling, ctx.llm->vocab());
    bind_to_vocab(ctx, gen->sampling);
    gen->render_special = gen->sampling.preserved_tokens;
    gen->max_tokens = chat.max_tokens.value_or(-1);
    gen->stop = rendered.stop;

    const std::string id = api::gen_chat_completion_id();
    const int64_t created = unix_now();
    ctx.llm->submit(gen);  // first: building the output parser costs milliseconds the engine need not wait for
    event_waiter events(*gen, w, ctx, id);  // from here on, leaving this handler cancels the generation
    api::chat_output_parser parser(ctx.renderer->parser_params(rendered, chat));

    if (!chat.stream) {
        for (;;) {
            auto ev = events.next();
            if (!ev) return;
            parser.push(ev->text);
            if (!ev->done) continue;
            if (ev->reason == finish_reason::error) throw_generation_error(*ev);
            const common_chat_msg msg = parser.finish();
            const std::string reason = api::chat_finish_reason(msg, ev->reason == finish_reason::length);
            w.send(200, "application/json",
                   api::chat_completion_json(id, ctx.model_id, created, msg, reason, usage_of(ev->stats),
                                             timings_of(ev->stats))
                       .dump(-1, ' ', false, json::error_handler_t::replace));
            return;
        }
    }

    if (!w.begin_stream(200, "text/event-stream")) {
        gen->cancelled = true;
        return;
    }
    bool first = true;
    for (;;) {
        auto ev = events.next();
        if (!ev) return;
        std::vector<common_chat_msg_diff> diffs = parser.push(ev->text);
        if (ev->done && ev->reason != finish_reason::error) {
            std::vector<common_chat_msg_diff> final_diffs;
            parser.finish(&final_diffs);
            diffs.insert(diffs.end(), final_diffs.begin(), final_diffs.end());
        }
        if (!diffs.empty() || first) {
            for (const json& chunk : api::chat_chunk_json(id, ctx.model_id, created, diffs, first)) {
                if (!write_sse(w, chunk)) {
                    gen->cancelled = true;
                    ctx.http.disconnects++;
                    return;
                }
            }
            first = false;
        }
        if (!ev->done) continue;
        if (ev->reason == finish_reason::error) {
            write_sse(w, json::parse(http::openai_error_body(500, "server_error", ev->error)));
        } else {
            const std::string reason = api::chat_finish_reason(parser.message(), ev->reason == finish_reason::length);
            write_sse(w, api::chat_final_chunk_json(id, ctx.model_id, created, parser.message(), reason,
                                                    timings_of(ev->stats)));
            if (chat.include_usage) {
                write_sse(w, api::chat_usage_chunk_json(id, ctx.model_id, created, usage_of(ev->stats),
                                                        timings_of(ev->stats)));
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
    const json body = parse_body(req);
    const api::completion_request comp = api::parse_completion_request(body);

    gen->prompt = tokenize_prompt(ctx, comp.prompt);
    gen->sampling = api::to_sampling_params(comp.sampling, common_params_sampling{});
    bind_to_vocab(ctx, gen->sampling);
    gen->max_tokens = comp.max_tokens.value_or(-1);
    gen->stop = comp.stop;
    const std::string id = api::gen_completion_id();
    const int64_t created = unix_now();
    ctx.llm->submit(gen);
    event_waiter events(*gen, w, ctx, id);

    std::string text;
    if (!comp.stream) {
        for (;;) {
            auto ev = events.next();
            if (!ev) return;
            text += ev->text;
            if (!ev->done) continue;
            if (ev->reason == finish_reason::error) throw_generation_error(*ev);
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
            std::optional<api::timings_info> timings;
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

// Every generation route goes through here: its generation_request is created, and its clock started, before the
// body is parsed, so the engine's setup_ms covers parsing, rendering and tokenizing. 4xx answers are counted for
// /metrics; the HTTP layer formats the error.
template <typename Handler>
http::handler generation_route(server_context& ctx, Handler h) {
    return [&ctx, h](const http::request& req, http::response_writer& w) {
        auto gen = std::make_shared<generation_request>();
        gen->received = std::chrono::steady_clock::now();
        try {
            h(ctx, req, w, gen);
        } catch (const http::http_error& e) {
            if (e.status >= 400 && e.status < 500) ctx.http.client_errors++;
            throw;
        }
    };
}

}  // namespace

void register_openai_routes(http::http_server& server, server_context& ctx) {
    server.add_route("POST", "/v1/chat/completions", generation_route(ctx, handle_chat));
    server.add_route("POST", "/chat/completions", generation_route(ctx, handle_chat));
    server.add_route("POST", "/v1/completions", generation_route(ctx, handle_completion));
    server.add_route("POST", "/completions", generation_route(ctx, handle_completion));
}

}  // namespace keepwarm

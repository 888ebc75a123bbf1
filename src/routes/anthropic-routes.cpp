// See anthropic-routes.h. Each handler runs on its connection's thread: the body becomes a chat_request
// (anthropic-api), the backend's generation_source serves it, and this file only shapes what comes back as
// Anthropic's message or event sequence.
#include "routes/anthropic-routes.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "api/anthropic-api.h"
#include "chat/generation-report.h"
#include "routes/stream-keepalive.h"

namespace keepwarm {

namespace {
using json = nlohmann::ordered_json;
namespace anthropic = api::anthropic;

// The client's stop sequence that ended the answer, or "": a stop the template adds (its end-of-turn text) is an
// end_turn for Anthropic, not a stop_sequence.
std::string client_stop_sequence(const generation_source& chat, const generation_report& st) {
    const auto& asked = chat.request().stop;
    if (st.stop_sequence.empty() || std::find(asked.begin(), asked.end(), st.stop_sequence) == asked.end()) return {};
    return st.stop_sequence;
}

void handle_messages(const generation_opener& open, frontend_context& ctx, const http::request& req,
                     http::response_writer& client, const request_clock& clock) {
    ctx.http.messages++;
    // Anthropic sends `event: ping` to keep idle connections (and the proxies between) open; so does keepwarm while
    // a prompt is computed or a tool call parsed.
    keepalive_writer w(
        client, [] { return anthropic::to_sse(anthropic::ping_event()); }, ctx.stream_keepalive);
    chat_request request = anthropic::parse_messages_request(parse_json_body(req));
    const std::string model = request.model;  // echoed as the client asked, whatever model serves it
    const bool stream = request.stream;
    const generation_source_ptr source = open(req, std::move(request), clock, w, anthropic::gen_message_id());
    generation_source& chat = *source;
    http::header_list headers = chat.response_headers();
    headers.emplace_back("request-id", chat.id());  // the SDK reports it as the response's _request_id

    if (!stream) {
        const auto u = final_update(chat, "api_error");
        if (!u) return;
        const std::string sequence = client_stop_sequence(chat, u->report);
        const std::string reason =
            anthropic::stop_reason(chat.message(), u->reason == finish_reason::length, !sequence.empty());
        w.send(200, "application/json",
               anthropic::message_json(chat.id(), model, chat.message(), reason, usage_of(u->report),
                                       timings_of(u->report), sequence)
                   .dump(-1, ' ', false, json::error_handler_t::replace),
               headers);
        return;
    }

    if (!w.begin_stream(200, "text/event-stream", headers)) return;
    anthropic::message_stream message(chat.id(), model);
    const auto send = [&](const std::vector<anthropic::stream_event>& events) {
        for (const auto& event : events) {
            if (!w.write_chunk(anthropic::to_sse(event))) {
                ctx.http.disconnects++;
                return false;
            }
        }
        return true;
    };
    if (!send({message.start(chat.prompt_tokens()), anthropic::ping_event()})) return;
    for (;;) {
        auto u = chat.next();
        if (!u) return;
        std::vector<anthropic::stream_event> events;
        if (u->done && u->reason == finish_reason::error) {
            events.push_back(anthropic::error_event("api_error", u->error.empty() ? "generation failed" : u->error));
        } else {
            events = message.push(u->diffs);
            if (u->done) {
                const std::string sequence = client_stop_sequence(chat, u->report);
                const std::string reason =
                    anthropic::stop_reason(chat.message(), u->reason == finish_reason::length, !sequence.empty());
                for (auto& event : message.finish(reason, usage_of(u->report), timings_of(u->report), sequence)) {
                    events.push_back(std::move(event));
                }
            }
        }
        if (!send(events)) return;
        if (u->done) {
            w.end_stream();
            return;
        }
    }
}

// Counts like a real request, without generating.
void handle_count_tokens(const token_counter& count, const http::request& req, http::response_writer& w) {
    const chat_request request =
        anthropic::parse_messages_request(parse_json_body(req), anthropic::endpoint::count_tokens);
    w.send(200, "application/json", anthropic::count_tokens_json(count(req, request)).dump());
}

}  // namespace

void register_anthropic_routes(http::http_server& server, frontend_context& ctx, generation_opener open,
                               token_counter count) {
    const http::route_options options{.requires_auth = true, .format_error = anthropic::error_body};
    const auto messages = [open = std::move(open)](frontend_context& c, const http::request& req,
                                                   http::response_writer& w, const request_clock& clock) {
        handle_messages(open, c, req, w, clock);
    };
    server.add_route("POST", "/v1/messages", generation_route(ctx, messages), options);
    // generation_route for its 4xx accounting; count_tokens never reaches the engine.
    const generation_handler count_tokens = [count = std::move(count)](frontend_context&, const http::request& req,
                                                                       http::response_writer& w, const request_clock&) {
        handle_count_tokens(count, req, w);
    };
    server.add_route("POST", "/v1/messages/count_tokens", generation_route(ctx, count_tokens), options);
}

}  // namespace keepwarm

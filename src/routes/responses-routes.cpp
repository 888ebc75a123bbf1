// See responses-routes.h. The handler runs on its connection's thread: parse the body into the neutral request model,
// open a generation_source on the backend, then write the answer as a response object or as the API's typed events.
#include "routes/responses-routes.h"

#include <nlohmann/json.hpp>

#include "api/responses-api.h"
#include "base/unix-time.h"
#include "chat/generation-report.h"
#include "routes/generation-route.h"
#include "routes/stream-keepalive.h"

namespace keepwarm {

namespace {

using json = nlohmann::ordered_json;
namespace responses = api::responses;

void handle_responses(const generation_opener& open, frontend_context& ctx, const http::request& req,
                      http::response_writer& client, const request_clock& clock) {
    ctx.http.responses++;
    responses::parsed_request parsed = responses::parse_request(parse_json_body(req));
    const std::string& model = ctx.model_id;  // the served name, as the Chat Completions route reports it
    const bool stream = parsed.chat.stream;
    // An SSE comment while a long prompt is computed: clients skip it, idle timers see bytes.
    keepalive_writer w(
        client, [] { return std::string(": keep-alive\n\n"); }, ctx.stream_keepalive);
    const generation_source_ptr source = open(req, std::move(parsed.chat), clock, w, responses::gen_response_id());
    generation_source& answer = *source;
    const int64_t created_at = unix_now();

    if (!stream) {
        const auto u = final_update(answer, "server_error");
        if (!u) return;
        const bool cut = u->reason == finish_reason::length;
        w.send(200, "application/json",
               responses::response_json(answer.id(), model, created_at, parsed.echo, cut ? "incomplete" : "completed",
                                        responses::output_json(answer.id(), answer.message(), cut),
                                        responses::usage_json(usage_of(u->stats)), timings_of(u->stats), "", cut)
                   .dump(-1, ' ', false, json::error_handler_t::replace),
               answer.response_headers());
        return;
    }

    if (!w.begin_stream(200, "text/event-stream", answer.response_headers())) return;
    responses::event_stream events(answer.id(), model, created_at, parsed.echo);
    const auto send = [&](const std::vector<responses::stream_event>& batch) {
        for (const auto& event : batch) {
            if (!w.write_chunk(events.to_sse(event))) {
                ctx.http.disconnects++;
                return false;
            }
        }
        return true;
    };
    if (!send(events.start())) return;
    for (;;) {
        auto u = answer.next();
        if (!u) return;
        if (u->done && u->reason == finish_reason::error) {
            send(events.fail(u->error));
            w.end_stream();
            return;
        }
        if (!send(events.push(u->diffs))) return;
        if (!u->done) continue;
        const auto status =
            u->reason == finish_reason::length ? responses::status::incomplete : responses::status::completed;
        send(events.finish(answer.message(), status, usage_of(u->stats), timings_of(u->stats)));
        w.end_stream();
        return;
    }
}

}  // namespace

void register_responses_routes(http::http_server& server, frontend_context& ctx, generation_opener open) {
    const auto handler = [open = std::move(open)](frontend_context& c, const http::request& req,
                                                  http::response_writer& w, const request_clock& clock) {
        handle_responses(open, c, req, w, clock);
    };
    server.add_route("POST", "/v1/responses", generation_route(ctx, handler));
    server.add_route("POST", "/responses", generation_route(ctx, handler));
}

}  // namespace keepwarm

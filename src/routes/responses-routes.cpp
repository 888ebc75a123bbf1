// See responses-routes.h. The handler runs on its connection's thread: parse the body into the neutral request model,
// open a generation_source on the backend, then write the answer as a response object or as the API's typed events.
#include "routes/responses-routes.h"

#include <nlohmann/json.hpp>

#include "api/responses-api.h"
#include "base/logger.h"
#include "base/request-error.h"
#include "base/unix-time.h"
#include "chat/generation-report.h"
#include "routes/generation-route.h"
#include "routes/stream-keepalive.h"

namespace keepwarm {

namespace {

using json = nlohmann::ordered_json;
namespace responses = api::responses;

// The body with a previous response's conversation before its input, when it names one of this tenant's.
json with_previous(json body, response_store& store, const std::string& tenant) {
    const json* previous =
        body.is_object() && body.contains("previous_response_id") ? &body["previous_response_id"] : nullptr;
    if (!previous || previous->is_null()) return body;
    if (!previous->is_string()) throw request_error(400, "'previous_response_id' must be a string");
    const std::string id = previous->get<std::string>();
    responses::check_requested_id(id, "previous_response_id");
    const std::optional<response_store::record> stored = store.get(id, tenant);
    if (!stored) throw responses::response_not_found(id, true);
    return responses::continue_input(std::move(body), stored->items);
}

// Kept when the request asked (the API's default): the conversation up to and including this answer.
void keep(response_store& store, const http::request& req, const responses::parsed_request& parsed, const json& body,
          const std::string& id, const json& response) {
    if (!parsed.echo.store) return;
    json items = responses::input_items(body);
    for (const json& item : response["output"]) items.push_back(item);
    store.put(id, req.tenant, {std::move(items), response});
}

void handle_responses(const generation_opener& open, response_store& store, frontend_context& ctx,
                      const http::request& req, http::response_writer& client, const request_clock& clock) {
    ctx.http.responses++;
    const json body = with_previous(parse_json_body(req), store, req.tenant);
    responses::parsed_request parsed = responses::parse_request(body);
    if (!parsed.echo.ignored_tools.empty()) {
        std::string names;
        for (const auto& t : parsed.echo.ignored_tools) names += (names.empty() ? "" : ", ") + t;
        log::debug("responses", "tools not offered to the model (they run on OpenAI's servers): {}", names);
    }
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
        const json response =
            responses::response_json(answer.id(), model, created_at, parsed.echo, cut ? "incomplete" : "completed",
                                     responses::output_json(answer.id(), answer.message(), cut),
                                     responses::usage_json(usage_of(u->report)), timings_of(u->report), "", cut);
        keep(store, req, parsed, body, answer.id(), response);
        w.send(200, "application/json", response.dump(-1, ' ', false, json::error_handler_t::replace),
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
        const std::vector<responses::stream_event> last =
            events.finish(answer.message(), status, usage_of(u->report), timings_of(u->report));
        keep(store, req, parsed, body, answer.id(), last.back().data["response"]);
        send(last);
        w.end_stream();
        return;
    }
}

}  // namespace

void register_responses_routes(http::http_server& server, frontend_context& ctx, generation_opener open,
                               response_store& store) {
    const auto handler = [open = std::move(open), &store](frontend_context& c, const http::request& req,
                                                          http::response_writer& w, const request_clock& clock) {
        handle_responses(open, store, c, req, w, clock);
    };
    server.add_route("POST", "/v1/responses", generation_route(ctx, handler));
    server.add_route("POST", "/responses", generation_route(ctx, handler));
    for (const std::string prefix : {"/v1/responses/", "/responses/"}) {
        server.add_route("GET", prefix + "*", [&store, prefix](const http::request& req, http::response_writer& w) {
            const std::string id = http::path_rest(req.path, prefix).value_or("");
            responses::check_requested_id(id, "id");
            const std::optional<response_store::record> stored = store.get(id, req.tenant);
            if (!stored) throw responses::response_not_found(id, false);
            w.send(200, "application/json", stored->response.dump(-1, ' ', false, json::error_handler_t::replace));
        });
        server.add_route("DELETE", prefix + "*", [&store, prefix](const http::request& req, http::response_writer& w) {
            const std::string id = http::path_rest(req.path, prefix).value_or("");
            responses::check_requested_id(id, "id");
            if (!store.erase(id, req.tenant)) throw responses::response_not_found(id, false);
            w.send(200, "application/json", json{{"id", id}, {"object", "response"}, {"deleted", true}}.dump());
        });
    }
}

}  // namespace keepwarm

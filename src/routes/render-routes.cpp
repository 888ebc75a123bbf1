// See render-routes.h. The wire format is vLLM's (vllm/entrypoints/serve/render/api_router.py: GenerateRequest of
// vllm/entrypoints/serve/disagg/protocol.py), of which llm-d's token producer reads `token_ids` and `features`
// (llm-d/llm-d-router, pkg/epp/framework/plugins/requestcontrol/dataproducer/tokenizer/vllm_http.go). keepwarm has
// no multimodal input, so `features` is null; sampling parameters are left out (keepwarm does not resolve them
// before generating).
#include "routes/render-routes.h"

#include <nlohmann/json.hpp>

#include "api/openai-api.h"
#include "routes/generation-route.h"
#include "routes/openai-routes.h"

namespace keepwarm {

namespace {
using json = nlohmann::ordered_json;

json generate_request_json(const std::string& id, const frontend_context& ctx, const std::vector<llama_token>& ids,
                           bool stream) {
    return json{{"request_id", id},    {"model", ctx.model_id}, {"token_ids", ids},
                {"features", nullptr}, {"stream", stream},      {"cache_salt", nullptr}};
}

void send_json(http::response_writer& w, const json& body) {
    w.send(200, "application/json", body.dump(-1, ' ', false, json::error_handler_t::replace));
}
}  // namespace

void register_render_routes(http::http_server& server, frontend_context& ctx, chat_prompt_renderer chat,
                            raw_prompt_renderer raw) {
    const auto render_chat = [chat = std::move(chat)](frontend_context& c, const http::request& req,
                                                      http::response_writer& w, const request_clock&) {
        chat_request request = api::parse_chat_request(parse_json_body(req));
        const bool stream = request.stream;
        const std::vector<llama_token> ids = chat(req, std::move(request));
        send_json(w, generate_request_json(api::gen_chat_completion_id(), c, ids, stream));
    };
    const auto render_completion = [raw = std::move(raw)](frontend_context& c, const http::request& req,
                                                          http::response_writer& w, const request_clock&) {
        completion_request request = api::parse_completion_request(parse_json_body(req));
        const bool stream = request.stream;
        const std::vector<llama_token> ids = raw(req, openai_raw_completion(std::move(request)));
        // One object per prompt, as vLLM answers a batch; keepwarm's completions take one prompt.
        send_json(w, json::array({generate_request_json(api::gen_completion_id(), c, ids, stream)}));
    };
    server.add_route("POST", "/v1/chat/completions/render", generation_route(ctx, render_chat));
    server.add_route("POST", "/v1/completions/render", generation_route(ctx, render_completion));
}

}  // namespace keepwarm

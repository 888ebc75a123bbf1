// See models-routes.h.
#include "routes/models-routes.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "api/openai-api.h"
#include "base/request-error.h"

namespace keepwarm {

namespace {
using json = nlohmann::ordered_json;

// A client-given name as an error message may quote it: at most 200 bytes.
std::string quotable(const std::string& name) {
    constexpr size_t limit = 200;
    return name.size() <= limit ? name : name.substr(0, limit) + "...";
}
}  // namespace

bool model_id_known(const frontend_context& ctx, const std::string& id) {
    if (id == ctx.model_id) return true;
    const auto& aliases = ctx.policy->config().model.aliases;
    return std::any_of(aliases.begin(), aliases.end(),
                       [&](const policy::model_alias& a) { return policy::glob_match(a.pattern, id); });
}

void register_models_routes(http::http_server& server, const frontend_context& ctx, json meta) {
    const auto created = std::chrono::duration_cast<std::chrono::seconds>(ctx.started.time_since_epoch()).count();
    auto shared_meta = std::make_shared<const json>(std::move(meta));

    const auto list = [&ctx, created, shared_meta](const http::request&, http::response_writer& w) {
        w.send(200, "application/json", api::models_list_json(ctx.model_id, created, "keepwarm", *shared_meta).dump());
    };
    server.add_route("GET", "/v1/models", list);
    server.add_route("GET", "/models", list);

    for (const std::string prefix : {"/v1/models/", "/models/"}) {
        server.add_route(
            "GET", prefix + "*",
            [&ctx, created, shared_meta, prefix](const http::request& req, http::response_writer& w) {
                const std::optional<std::string> id = http::path_rest(req.path, prefix);
                if (!id) throw request_error(400, "the model id in the path has a malformed %-escape");
                if (!model_id_known(ctx, *id)) {
                    throw request_error(
                        404,
                        "The model '" + quotable(*id) + "' does not exist; this server serves '" + ctx.model_id + "'",
                        "model_not_found");
                }
                // An alias is answered under the name asked for: it is served under that name.
                w.send(200, "application/json", api::model_json(*id, created, "keepwarm", *shared_meta).dump());
            });
    }
}

}  // namespace keepwarm

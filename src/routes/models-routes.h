// The model listing both frontends serve: GET /v1/models and /models (OpenAI's list with the served model), and
// GET /v1/models/{id} and /models/{id} (OpenAI's model object for the served name or a name the policy aliases to
// it; any other name is a 404 in OpenAI's error shape).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "backend/frontend-context.h"
#include "http/http-server.h"

namespace keepwarm {

// `meta`: what the frontend knows of its model (a local model's path and context sizes), added to each model object
// as "meta" when it is a non-empty object.
void register_models_routes(http::http_server& server, const frontend_context& ctx,
                            nlohmann::ordered_json meta = nlohmann::ordered_json::object());

// Whether GET /v1/models/{id} knows `id`: the served model's name, or a name one of the policy's aliases matches.
bool model_id_known(const frontend_context& ctx, const std::string& id);

}  // namespace keepwarm

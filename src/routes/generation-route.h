// What every generation route does around its handler, whatever API it speaks and whichever backend serves it:
// reading the JSON body, starting the request's clock, counting 4xx answers for /metrics.
// Threading: handlers run on their connection's thread.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>

#include "http/http-server.h"
#include "routes/frontend-context.h"
#include "routes/generation-source.h"

namespace keepwarm {

// The body as a JSON object, parsed by bounded_json (linear time, at most bounded_json::max_depth levels);
// request_error 400 when it is empty, not JSON, too deep, or not an object.
nlohmann::ordered_json parse_json_body(const http::request& req);

using generation_handler =
    std::function<void(frontend_context&, const http::request&, http::response_writer&, const request_clock&)>;

// Wraps a generation route: its clock starts before the body is parsed, so a backend's setup time covers parsing,
// rendering and tokenizing. 4xx answers are counted for /metrics; the HTTP layer formats the error in the route's
// API shape.
http::handler generation_route(frontend_context& ctx, generation_handler h);

}  // namespace keepwarm

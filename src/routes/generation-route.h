// What every generation route does around its handler, whatever API it speaks and whichever backend serves it:
// starting the request's clock, counting 4xx answers for /metrics. (Each reads its body with parse_json_body,
// backend/generation-source.h.)
// Threading: handlers run on their connection's thread.
#pragma once

#include <functional>

#include "backend/frontend-context.h"
#include "backend/generation-source.h"
#include "http/http-server.h"

namespace keepwarm {

// Wraps a generation route: its clock starts before the body is parsed, so a backend's setup time covers parsing,
// rendering and tokenizing. 4xx answers are counted for /metrics; the HTTP layer formats the error in the route's
// API shape.
http::handler generation_route(frontend_context& ctx, generation_handler h);

}  // namespace keepwarm

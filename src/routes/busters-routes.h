// GET /v1/cache/busters: the cache busters the detector found (newest first), with the span, its position, the
// tokens it cost and a suggested policy rule, and how often each (client, pattern) came up.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "http/http-server.h"
#include "policy/busters.h"
#include "routes/server-context.h"

namespace keepwarm {

// Makes the server's detector (none with detect mode off: the route then lists nothing) and serves its findings.
void register_busters_routes(http::http_server& server, server_context& ctx);

// The body of GET /v1/cache/busters for one tenant's clients; `detector` null: detection is off.
nlohmann::ordered_json busters_json(const policy::cache_buster_detector* detector, policy::detect_mode mode,
                                    const std::string& tenant);

}  // namespace keepwarm

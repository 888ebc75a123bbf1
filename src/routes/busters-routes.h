// GET /v1/cache/busters: the cache busters the detector found, newest first, with the span, its position, the tokens
// it cost and a suggested policy rule, and how often each (client, pattern) came up. The detector's side that a
// backend drives (build it, adopt a rule, confirm a finding) is backend/cache-busters.h.
// Threading: called by request threads; the detector and the policy's span rules are thread-safe.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "backend/frontend-context.h"
#include "http/http-server.h"
#include "policy/busters.h"

namespace keepwarm {

// Serves the detector's findings (none with detect mode off: the route then lists nothing).
void register_busters_routes(http::http_server& server, frontend_context& ctx);

// The body of GET /v1/cache/busters for one tenant's clients; `detector` null: detection is off.
nlohmann::ordered_json busters_json(const policy::cache_buster_detector* detector, policy::detect_mode mode,
                                    const std::string& tenant);

}  // namespace keepwarm

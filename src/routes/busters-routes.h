// The cache-buster detector's frontend side: GET /v1/cache/busters (the cache busters the detector found, newest
// first, with the span, its position, the tokens it cost and a suggested policy rule, and how often each (client,
// pattern) came up), the detector a command builds, and what a generation that ended tells it.
// Threading: called by request threads; the detector and the policy's span rules are thread-safe.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/generation.h"
#include "http/http-server.h"
#include "policy/busters.h"
#include "routes/frontend-context.h"

namespace keepwarm {

// The detector the policy's detect mode asks for, with the tenants' log switch; null when detection is off. Each
// command builds it into its frontend_context before registering routes.
std::unique_ptr<policy::cache_buster_detector> make_busters_detector(const frontend_context& ctx);

// Serves the detector's findings (none with detect mode off: the route then lists nothing).
void register_busters_routes(http::http_server& server, frontend_context& ctx);

// The body of GET /v1/cache/busters for one tenant's clients; `detector` null: detection is off.
nlohmann::ordered_json busters_json(const policy::cache_buster_detector* detector, policy::detect_mode mode,
                                    const std::string& tenant);

// A request the detector flagged (`report`, from inspect), before it is computed: in auto detect mode, when the span
// is a random id whose suggested rule rewrites it in its message, puts that rule in force (at most the policy's
// max_auto_rules; not again when a rule of its name is in force) and applies it to `messages` (the request's, as the
// policy left them), so that this request is computed and cached with the constant the following ones will have
// too: one miss, then hits. Returns the rule (the report's adopted_rule names it) when it rewrote `messages`: the
// caller renders them again.
std::optional<policy::span_rule> adopt_cache_buster_rule(frontend_context& ctx, policy::cache_buster_report& report,
                                                         std::vector<common_chat_msg>& messages);

// A generation that the detector flagged ended (not in error): keeps the report if the cache really stopped at the
// span. Needs ctx.busters (the detector that flagged it).
void confirm_cache_buster(frontend_context& ctx, policy::cache_buster_report report, const generation_stats& stats);

}  // namespace keepwarm

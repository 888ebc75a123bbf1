// The cache-buster detector as a backend drives it, whichever generates the answer (local/ or proxy/): the detector a
// command builds into its frontend_context, a flagged request's rule adopted before it is computed (detect = auto),
// and what a generation that ended tells the detector. The findings are served by routes/busters-routes.h.
// Threading: called by request threads; the detector and the policy's span rules are thread-safe.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "backend/frontend-context.h"
#include "chat/generation-report.h"
#include "policy/busters.h"

namespace keepwarm {

// The detector the policy's detect mode asks for, with the tenants' log switch; null when detection is off. Each
// command builds it into its frontend_context before registering routes.
std::unique_ptr<policy::cache_buster_detector> make_busters_detector(const frontend_context& ctx);

// A request the detector flagged (`report`, from inspect), before it is computed: in auto detect mode, when the span
// is a random id whose suggested rule rewrites it in its message, puts that rule in force (at most the policy's
// max_auto_rules; not again when a rule of its name is in force) and applies it to `messages` (the request's, as the
// policy left them), so that this request is computed and cached with the constant the following ones will have
// too: one miss, then hits. Returns the rule (the report's adopted_rule names it) when it rewrote `messages`: the
// caller renders them again.
std::optional<policy::span_rule> adopt_cache_buster_rule(frontend_context& ctx, policy::cache_buster_report& report,
                                                         std::vector<common_chat_msg>& messages);

// A generation that the detector flagged ended (not in error): keeps the finding if the cache really stopped at the
// span. Needs ctx.busters (the detector that flagged it).
void confirm_cache_buster(frontend_context& ctx, policy::cache_buster_report flagged, const generation_report& report);

}  // namespace keepwarm

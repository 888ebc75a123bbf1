// See cache-busters.h.
#include "backend/cache-busters.h"

#include "base/logger.h"

namespace keepwarm {

std::unique_ptr<policy::cache_buster_detector> make_busters_detector(const frontend_context& ctx) {
    if (ctx.policy->config().detect.mode == policy::detect_mode::off) return nullptr;
    policy::cache_buster_detector::options options;
    options.log_prompts = ctx.log_prompts;
    return std::make_unique<policy::cache_buster_detector>(options);
}

std::optional<policy::span_rule> adopt_cache_buster_rule(frontend_context& ctx, policy::cache_buster_report& report,
                                                         std::vector<common_chat_msg>& messages) {
    const policy::detect_policy& detect = ctx.policy->config().detect;
    if (detect.mode != policy::detect_mode::automatic) return std::nullopt;
    std::optional<policy::span_rule> rule = policy::auto_span_rule(report, messages);
    if (!rule) return std::nullopt;
    const auto in_force = ctx.policy->span_rules();
    size_t automatic = 0;
    for (const policy::span_rule& r : in_force->rules()) {
        // A rule of that name already in force did not match this span: nothing more to do with it.
        if (r.name() == rule->name()) return std::nullopt;
        automatic += r.origin() == policy::span_origin::automatic;
    }
    if (automatic >= detect.max_auto_rules) return std::nullopt;
    ctx.policy->add_span_rule(*rule);
    report.adopted_rule = rule->name();
    // This request too: it is computed, and cached, with the constant in place, so the next one (which the policy
    // now gives the constant as well) reuses past the span. Applied only to this request: its earlier turns' ids
    // were elsewhere in the history, or not there at all.
    policy::span_rule_set(std::vector<policy::span_rule>{*rule}).apply(messages);
    // The pattern holds the prompt's literal text around the span: logged only when the operator asked.
    log::info("policy",
              "detect auto: span rule {} (pattern '{}', replace with '{}', roles {}) in force from this request on",
              rule->name(), ctx.log_prompts ? rule->pattern() : "(not logged)",
              ctx.log_prompts ? rule->replacement() : "(not logged)", policy::role_names(rule->roles()).front());
    return rule;
}

void confirm_cache_buster(frontend_context& ctx, policy::cache_buster_report flagged, const generation_report& report) {
    ctx.busters->confirm(std::move(flagged), report);
}

}  // namespace keepwarm

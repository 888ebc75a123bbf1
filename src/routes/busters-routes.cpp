// See busters-routes.h.
#include "routes/busters-routes.h"

#include <cstdio>
#include <optional>

#include "base/logger.h"

namespace keepwarm {

namespace {
using json = nlohmann::ordered_json;

json or_null(int value) {
    return value >= 0 ? json(value) : json(nullptr);
}

json rule_json(const policy::suggested_rule& rule) {
    json out = {{"name", rule.name},
                {"pattern", rule.pattern.empty() ? json(nullptr) : json(rule.pattern)},
                {"action", rule.action.empty() ? json(nullptr) : json(rule.action)}};
    if (rule.action == "replace") out["replacement"] = rule.replacement;
    out["note"] = rule.note;
    out["toml"] = rule.toml();
    return out;
}

json report_json(const policy::cache_buster_report& r) {
    return {{"client", r.origin.client},
            {"request_id", r.origin.request_id},
            {"api", r.origin.api},
            {"time", r.time},
            {"kind", policy::span_kind_name(r.kind)},
            {"random_id", r.looks_like_random_id()},
            {"span",
             {{"char_offset", r.char_offset},
              {"token_offset", or_null(r.token_offset)},
              {"token_offset_estimated", r.token_offset_estimated},
              {"message_index", or_null(r.message_index)},
              {"role", r.role.empty() ? json(nullptr) : json(r.role)},
              {"previous", r.previous_text},
              {"current", r.current_text},
              {"context_before", r.context_before},
              {"context_after", r.context_after}}},
            {"agreed_chars_after", r.agreed_chars},
            {"prompt_tokens", r.prompt_tokens},
            {"reused_tokens", r.reused_tokens},
            {"cost_tokens", r.cost_tokens},
            {"rule", rule_json(r.rule)},
            {"adopted_rule", r.adopted_rule.empty() ? json(nullptr) : json(r.adopted_rule)}};
}
}  // namespace

json busters_json(const policy::cache_buster_detector* detector, policy::detect_mode mode, const std::string& tenant) {
    json reports = json::array();
    json counts = json::array();
    json settings = nullptr;
    if (detector) {
        for (const auto& r : detector->reports(tenant)) reports.push_back(report_json(r));
        for (const auto& c : detector->counts(tenant)) {
            counts.push_back({{"client", c.client},
                              {"pattern", c.pattern},
                              {"rule", c.rule_name},
                              {"kind", policy::span_kind_name(c.kind)},
                              {"count", c.count},
                              {"cost_tokens", c.cost_tokens},
                              {"last_seen", c.last_seen}});
        }
        const auto& o = detector->settings();
        settings = {{"max_span_chars", o.diff.max_span_chars},
                    {"min_agreed_chars", o.diff.min_agreed_chars},
                    {"min_agreed_share", o.diff.min_agreed_share},
                    {"prompts_per_client", o.prompts_per_client},
                    {"max_clients", o.max_clients}};
    }
    return {{"object", "cache_busters"},
            {"mode", policy::detect_mode_name(mode)},
            {"reports", std::move(reports)},
            {"counts", std::move(counts)},
            {"settings", std::move(settings)}};
}

void register_busters_routes(http::http_server& server, frontend_context& ctx) {
    const policy::detect_mode mode = ctx.policy->config().detect.mode;
    // A tenant sees its own clients' reports only (the text they quote is its own).
    server.add_route("GET", "/v1/cache/busters", [&ctx, mode](const http::request& req, http::response_writer& w) {
        w.send(200, "application/json",
               busters_json(ctx.busters.get(), mode, req.tenant).dump(-1, ' ', false, json::error_handler_t::replace));
    });
}

}  // namespace keepwarm

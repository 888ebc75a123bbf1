// See generation-source.h.
#include "backend/generation-source.h"

#include <cstdio>

#include "backend/client-identity.h"
#include "base/logger.h"
#include "base/request-error.h"
#include "json/bounded-json.h"

namespace keepwarm {

using json = nlohmann::ordered_json;

json parse_json_body(const http::request& req) {
    if (req.body.empty()) throw request_error(400, "request body is empty; expected a JSON object");
    json body;
    try {
        // Linear in the number of keys, and bounded in depth before anything recurses over the tree.
        body = bounded_json::parse(req.body);
    } catch (const bounded_json::depth_error& e) {
        throw request_error(400, std::string("request body ") + e.what());
    } catch (const bounded_json::limit_error& e) {
        throw request_error(400, std::string("request body is not valid JSON: ") + e.what());
    }
    if (!body.is_object()) throw request_error(400, "request body must be a JSON object");
    return body;
}

policy::policy_outcome apply_request_policy(const policy::request_policy& policy, const http::request& req,
                                            chat_request& chat, const std::string& id, http::header_list& headers,
                                            policy::policy_use use) {
    const std::string client = client_name(req);
    policy::policy_outcome outcome =
        policy.apply(chat, {.client = client, .headers = &req.headers, .tenant = req.tenant}, use);
    if (!outcome.fired.empty()) {
        const std::string rules = outcome.header_value();
        headers.emplace_back("x-keepwarm-policy", rules);
        log::info("policy", "{} policy ({} via {}): {}", id, client, chat.api, rules);
    }
    return outcome;
}

policy::policy_outcome apply_raw_completion_policy(const policy::request_policy& policy, const http::request& req,
                                                   chat_request& params, const std::string& id,
                                                   http::header_list& headers) {
    // Counting: a raw prompt is never answered as a ping (there is no chat reply to give it).
    return apply_request_policy(policy, req, params, id, headers, policy::policy_use::counting);
}

ping_answer::ping_answer(std::string reply) {
    reply_.role = "assistant";
    reply_.content = std::move(reply);
}

generation_source::update ping_answer::next() {
    generation_source::update u;
    u.done = true;
    if (!answered_) {
        common_chat_msg_diff diff;
        diff.content_delta = reply_.content;
        u.diffs.push_back(std::move(diff));
        answered_ = true;
    }
    return u;
}

bool client_watch::gone() {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_check_ < client_check_interval) return false;
    last_check_ = now;
    return w_.client_gone();
}

std::optional<generation_source::update> final_update(generation_source& source, const std::string& error_type) {
    for (;;) {
        std::optional<generation_source::update> u = source.next();
        if (!u || !u->done) {
            if (!u) return std::nullopt;
            continue;
        }
        if (u->reason == finish_reason::error) {
            throw request_error(500, u->error.empty() ? "generation failed" : u->error, error_type);
        }
        return u;
    }
}

}  // namespace keepwarm

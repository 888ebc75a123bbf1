// See generation-route.h.
#include "routes/generation-route.h"

#include <string>

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

http::handler generation_route(frontend_context& ctx, generation_handler h) {
    return [&ctx, h = std::move(h)](const http::request& req, http::response_writer& w) {
        const request_clock clock;
        try {
            h(ctx, req, w, clock);
        } catch (const request_error& e) {
            if (e.status >= 400 && e.status < 500) ctx.http.client_errors++;
            throw;
        }
    };
}

}  // namespace keepwarm

// See generation-route.h.
#include "routes/generation-route.h"

#include "base/request-error.h"

namespace keepwarm {

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

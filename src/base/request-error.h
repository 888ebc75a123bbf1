// Why a request cannot be served, said by whichever layer finds out: a dialect's parser, the chat core, the policy,
// a backend. The layers below the HTTP edge know nothing of HTTP; the edge (http::http_server) answers a
// request_error in the route's API shape. `status` takes HTTP's numbers because the three APIs and every upstream
// speak them: 400 a bad field, 404 no such thing, 500 a bug, 501 not supported here, 502/503/504 an upstream that
// failed, is unavailable or did not answer in time, or an upstream's own 4xx passed on as it is.
#pragma once

#include <stdexcept>
#include <string>

namespace keepwarm {

struct request_error : std::runtime_error {
    int status;
    std::string type;       // the API's error type, e.g. "invalid_request_error", "exceed_context_size_error"
    int retry_after_s = 0;  // > 0: the edge sends Retry-After (a 503 of a full queue: try again soon)

    request_error(int status, std::string message, std::string type = "invalid_request_error", int retry_after_s = 0)
        : std::runtime_error(std::move(message)), status(status), type(std::move(type)), retry_after_s(retry_after_s) {}
};

}  // namespace keepwarm

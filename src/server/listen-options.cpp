// See listen-options.h.
#include "server/listen-options.h"

#include <stdexcept>
#include <string>

#include "http/http-server.h"

namespace keepwarm {

CLI::Validator cors_origin_check() {
    return CLI::Validator(
        [](std::string& origin) {
            try {
                origin = http::parse_cors_origin(origin);
                return std::string();
            } catch (const std::invalid_argument& e) {
                return std::string(e.what());
            }
        },
        "ORIGIN");
}

}  // namespace keepwarm

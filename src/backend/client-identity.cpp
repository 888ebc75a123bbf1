// See client-identity.h.
#include "backend/client-identity.h"

namespace keepwarm {

std::string client_name(const http::request& req) {
    if (std::string named = req.header("x-keepwarm-client"); !named.empty()) return named;
    const std::string agent = req.header("user-agent");
    if (const size_t end = agent.find_first_of("/ "); end != 0 && !agent.empty()) return agent.substr(0, end);
    const size_t colon = req.remote.rfind(':');
    return colon == std::string::npos ? req.remote : req.remote.substr(0, colon);
}

}  // namespace keepwarm

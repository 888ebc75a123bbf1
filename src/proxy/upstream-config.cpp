// See upstream-config.h.
#include "proxy/upstream-config.h"

#include <stdexcept>

#include "http/api-keys.h"

namespace keepwarm::proxy {

upstream_config upstream_config::parse(const std::string& spec) {
    upstream_config config;
    size_t pos = spec.find(',');
    config.origin = http::endpoint::parse(spec.substr(0, pos));
    while (pos != std::string::npos) {
        const size_t next = spec.find(',', pos + 1);
        const std::string part = spec.substr(pos + 1, next == std::string::npos ? std::string::npos : next - pos - 1);
        pos = next;
        const size_t eq = part.find('=');
        const std::string key = part.substr(0, eq), value = eq == std::string::npos ? "" : part.substr(eq + 1);
        if (eq == std::string::npos || value.empty()) {
            throw std::invalid_argument("'" + part + "' in upstream '" + spec + "' is not KEY=VALUE");
        }
        if (key == "dialect") {
            config.dialect = parse_dialect(value);
        } else if (key == "model") {
            config.model = value;
        } else if (key == "key") {
            http::check_api_key(value, "the key of upstream " + config.origin.url());
            config.api_key = value;
        } else {
            throw std::invalid_argument("'" + key + "' in upstream '" + spec + "' is not one of dialect, model, key");
        }
    }
    return config;
}

}  // namespace keepwarm::proxy

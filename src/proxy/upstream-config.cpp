// See upstream-config.h.
#include "proxy/upstream-config.h"

#include <stdexcept>

#include "http/api-keys.h"

namespace keepwarm::proxy {

namespace {

// `spec` as an error may show it: each key=VALUE part's value replaced by "***".
std::string without_keys(const std::string& spec) {
    std::string shown;
    size_t start = 0;
    for (;;) {
        const size_t end = spec.find(',', start);
        const std::string part = spec.substr(start, end == std::string::npos ? std::string::npos : end - start);
        shown += start == 0 ? "" : ",";
        shown += part.rfind("key=", 0) == 0 && start > 0 ? "key=***" : part;
        if (end == std::string::npos) return shown;
        start = end + 1;
    }
}

}  // namespace

void check_events_endpoint(const std::string& endpoint) {
    const bool tcp = endpoint.rfind("tcp://", 0) == 0, ipc = endpoint.rfind("ipc://", 0) == 0;
    if ((!tcp && !ipc) || endpoint.size() <= 6) {
        throw std::invalid_argument("events '" + endpoint + "' is not tcp://HOST:PORT or ipc://PATH");
    }
    if (tcp && (endpoint.find('*') != std::string::npos || endpoint.rfind(':') <= 5)) {
        throw std::invalid_argument("events '" + endpoint +
                                    "' is no address to connect to: name the upstream's host and port");
    }
}

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
            throw std::invalid_argument("'" + part + "' in upstream '" + without_keys(spec) + "' is not KEY=VALUE");
        }
        if (key == "dialect") {
            config.dialect = parse_dialect(value);
        } else if (key == "model") {
            config.model = value;
        } else if (key == "key") {
            http::check_api_key(value, "the key of upstream " + config.origin.url());
            config.api_key = value;
        } else if (key == "events") {
            check_events_endpoint(value);
            config.events = value;
        } else {
            throw std::invalid_argument("'" + key + "' in upstream '" + without_keys(spec) +
                                        "' is not one of dialect, model, key, events");
        }
    }
    return config;
}

}  // namespace keepwarm::proxy

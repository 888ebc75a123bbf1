// See proxy-config.h.
#include "proxy/proxy-config.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <initializer_list>

#include "config/settings-file.h"
#include "config/toml-reader.h"
#include "http/api-keys.h"

namespace keepwarm::proxy {

namespace {

// Walks the parsed file; every error names the file, line and column.
class proxy_config_reader : config::toml_reader {
public:
    proxy_config_reader(std::string source, std::string base_dir)
        : toml_reader(std::move(source)), base_dir_(std::move(base_dir)) {}

    proxy_settings read(const toml::table& root) const {
        proxy_settings s;
        for (auto&& [key, node] : root) {
            const std::string_view k = key.str();
            if (k == "alias") {
                s.model_alias = string(node, "alias");
                if (s.model_alias.empty()) fail(node.source(), "'alias' must not be empty");
            } else if (k == "policy") {
                const std::filesystem::path policy = string(node, "policy");
                s.policy_file = policy.is_relative() && !base_dir_.empty()
                                    ? (std::filesystem::path(base_dir_) / policy).string()
                                    : policy.string();
            } else if (k == "listen") {
                read_listen(table(node, "listen"), s.http);
            } else if (k == "routing") {
                read_routing(table(node, "routing"), s.pool.routing);
            } else if (k == "health") {
                read_health(table(node, "health"), s.pool);
            } else if (k == "timeouts") {
                read_timeouts(table(node, "timeouts"), s.pool);
            } else if (k == "upstream") {
                for (const toml::node& entry : array_of_tables(node, "upstream")) {
                    s.upstreams.push_back(read_upstream(table(entry, "upstream")));
                }
            } else {
                unknown(key, "the file", {"alias", "policy", "listen", "routing", "health", "timeouts", "upstream"});
            }
        }
        return s;
    }

private:
    void read_listen(const toml::table& t, http::server_options& http) const {
        for (auto&& [key, node] : t) {
            if (key.str() == "host") {
                http.host = string(node, "listen.host");
            } else if (key.str() == "port") {
                http.port = static_cast<uint16_t>(integer(node, "listen.port", 0, 65535));
            } else if (key.str() == "api_key") {
                http.api_key = string(node, "listen.api_key");
                try {
                    http::check_api_key(http.api_key, "listen.api_key");
                } catch (const std::invalid_argument& e) {
                    fail(node.source(), e.what());
                }
            } else if (key.str() == "max_body") {
                http.max_body_bytes = static_cast<size_t>(integer(node, "listen.max_body", 1, int64_t{1} << 40));
            } else if (key.str() == "max_connections") {
                http.max_connections = static_cast<int>(integer(node, "listen.max_connections", 1, 65536));
            } else if (key.str() == "max_connections_per_address") {
                http.max_connections_per_address =
                    static_cast<int>(integer(node, "listen.max_connections_per_address", 0, 65536));
            } else if (key.str() == "header_timeout") {
                http.header_timeout = seconds(node, "listen.header_timeout", 3600);
            } else if (key.str() == "idle_timeout") {
                http.idle_timeout = seconds(node, "listen.idle_timeout", 86400);
            } else if (key.str() == "stream_keepalive") {  // 0: never
                http.stream_keepalive = number(node, "listen.stream_keepalive") == 0
                                            ? std::chrono::milliseconds(0)
                                            : seconds(node, "listen.stream_keepalive", 3600);
            } else if (key.str() == "cors_origins") {
                http.cors_origins.clear();
                for (const toml::node& entry : array(node, "listen.cors_origins")) {
                    try {
                        http.cors_origins.push_back(http::parse_cors_origin(string(entry, "listen.cors_origins")));
                    } catch (const std::invalid_argument& e) {
                        fail(entry.source(), std::string("listen.cors_origins: ") + e.what());
                    }
                }
            } else {
                unknown(key, "[listen]",
                        {"host", "port", "api_key", "max_body", "max_connections", "max_connections_per_address",
                         "header_timeout", "idle_timeout", "stream_keepalive", "cors_origins"});
            }
        }
    }

    void read_routing(const toml::table& t, router_options& r) const {
        for (auto&& [key, node] : t) {
            if (key.str() == "block_chars") {
                r.block_chars = static_cast<size_t>(integer(node, "routing.block_chars", 16, 1 << 20));
            } else if (key.str() == "min_match_blocks") {
                r.min_match_blocks = static_cast<size_t>(integer(node, "routing.min_match_blocks", 1, 1 << 20));
            } else if (key.str() == "rebalance_margin") {
                r.rebalance_margin = static_cast<int>(integer(node, "routing.rebalance_margin", 0, 1 << 20));
            } else if (key.str() == "max_blocks_per_upstream") {
                r.max_blocks_per_upstream =
                    static_cast<size_t>(integer(node, "routing.max_blocks_per_upstream", 1, int64_t{1} << 30));
            } else {
                unknown(key, "[routing]",
                        {"block_chars", "min_match_blocks", "rebalance_margin", "max_blocks_per_upstream"});
            }
        }
    }

    void read_health(const toml::table& t, pool_options& pool) const {
        for (auto&& [key, node] : t) {
            if (key.str() == "interval") {
                pool.health_interval = seconds(node, "health.interval", 3600);
            } else if (key.str() == "timeout") {
                pool.health_timeout = seconds(node, "health.timeout", 3600);
            } else if (key.str() == "failures") {
                pool.health_failures = static_cast<int>(integer(node, "health.failures", 1, 1000));
            } else {
                unknown(key, "[health]", {"interval", "timeout", "failures"});
            }
        }
    }

    // How long a request waits on its upstream (see pool_options): at most a day each.
    void read_timeouts(const toml::table& t, pool_options& pool) const {
        for (auto&& [key, node] : t) {
            if (key.str() == "first_byte") {
                pool.first_byte_timeout = seconds(node, "timeouts.first_byte", 86400);
            } else if (key.str() == "idle") {
                pool.idle_timeout = seconds(node, "timeouts.idle", 86400);
            } else if (key.str() == "answer") {
                pool.answer_timeout = seconds(node, "timeouts.answer", 86400);
            } else {
                unknown(key, "[timeouts]", {"first_byte", "idle", "answer"});
            }
        }
    }

    upstream_config read_upstream(const toml::table& t) const {
        upstream_config u;
        bool has_url = false;
        for (auto&& [key, node] : t) {
            try {
                if (key.str() == "url") {
                    u.origin = http::endpoint::parse(string(node, "upstream.url"));
                    has_url = true;
                } else if (key.str() == "dialect") {
                    u.dialect = parse_dialect(string(node, "upstream.dialect"));
                } else if (key.str() == "model") {
                    u.model = string(node, "upstream.model");
                } else if (key.str() == "api_key") {
                    u.api_key = string(node, "upstream.api_key");
                    http::check_api_key(u.api_key, "");
                } else if (key.str() == "events") {
                    u.events = string(node, "upstream.events");
                    check_events_endpoint(u.events);
                } else {
                    unknown(key, "[[upstream]]", {"url", "dialect", "model", "api_key", "events"});
                }
            } catch (const std::invalid_argument& e) {
                fail(node.source(), std::string("upstream.") + std::string(key.str()) + ": " + e.what());
            }
        }
        if (!has_url) fail(t.source(), "an [[upstream]] needs a 'url'");
        return u;
    }

    std::string base_dir_;
};

}  // namespace

proxy_settings parse_proxy_config(std::string_view text, const std::string& source_name, const std::string& base_dir) {
    return proxy_config_reader(source_name, base_dir).read(config::parse_toml(text, source_name));
}

proxy_settings load_proxy_config(const std::string& path) {
    const config::settings_file file = config::read_settings_file(path);
    return proxy_config_reader(file.path, file.base_dir.string()).read(file.root);
}

}  // namespace keepwarm::proxy

// See proxy-config.h.
#include "proxy/proxy-config.h"

#include <toml++/toml.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>

namespace keepwarm::proxy {

namespace {

// Walks the parsed file; every error names the file, line and column.
class proxy_config_reader {
public:
    proxy_config_reader(std::string source, std::string base_dir)
        : source_(std::move(source)), base_dir_(std::move(base_dir)) {}

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
            } else if (k == "upstream") {
                if (!node.is_array()) wrong_type(node, "upstream", "an array of tables ([[upstream]])");
                for (const toml::node& entry : *node.as_array()) {
                    s.upstreams.push_back(read_upstream(table(entry, "upstream")));
                }
            } else {
                unknown(key, "the file", {"alias", "policy", "listen", "routing", "health", "upstream"});
            }
        }
        return s;
    }

private:
    [[noreturn]] void fail(const toml::source_region& where, const std::string& message) const {
        const int line = static_cast<int>(where.begin.line), column = static_cast<int>(where.begin.column);
        throw proxy_config_error(source_ + ":" + std::to_string(line) + ":" + std::to_string(column) + ": " + message,
                                 line, column);
    }

    [[noreturn]] void unknown(const toml::key& key, const char* where,
                              std::initializer_list<std::string_view> known) const {
        std::string list;
        for (const auto& k : known) list += (list.empty() ? "" : ", ") + std::string(k);
        fail(key.source(), "unknown key '" + std::string(key.str()) + "' in " + where + " (known: " + list + ")");
    }

    [[noreturn]] void wrong_type(const toml::node& n, const std::string& what, const std::string& expected) const {
        fail(n.source(), "'" + what + "' must be " + expected);
    }

    const toml::table& table(const toml::node& n, const std::string& what) const {
        if (!n.is_table()) wrong_type(n, what, "a table");
        return *n.as_table();
    }

    std::string string(const toml::node& n, const std::string& what) const {
        if (!n.is_string()) wrong_type(n, what, "a string");
        return n.as_string()->get();
    }

    int64_t integer(const toml::node& n, const std::string& what, int64_t lo, int64_t hi) const {
        if (!n.is_integer()) wrong_type(n, what, "an integer");
        const int64_t v = n.as_integer()->get();
        if (v < lo || v > hi) {
            fail(n.source(), "'" + what + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi));
        }
        return v;
    }

    std::chrono::milliseconds seconds(const toml::node& n, const std::string& what) const {
        double v = 0;
        if (n.is_integer()) {
            v = static_cast<double>(n.as_integer()->get());
        } else if (n.is_floating_point()) {
            v = n.as_floating_point()->get();
        } else {
            wrong_type(n, what, "a number of seconds");
        }
        if (!std::isfinite(v) || v <= 0 || v > 3600) fail(n.source(), "'" + what + "' must be between 0 and 3600 s");
        return std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(v * 1000)));
    }

    void read_listen(const toml::table& t, http::server_options& http) const {
        for (auto&& [key, node] : t) {
            if (key.str() == "host") {
                http.host = string(node, "listen.host");
            } else if (key.str() == "port") {
                http.port = static_cast<uint16_t>(integer(node, "listen.port", 0, 65535));
            } else if (key.str() == "api_key") {
                http.api_key = string(node, "listen.api_key");
            } else {
                unknown(key, "[listen]", {"host", "port", "api_key"});
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
                pool.health_interval = seconds(node, "health.interval");
            } else if (key.str() == "timeout") {
                pool.health_timeout = seconds(node, "health.timeout");
            } else {
                unknown(key, "[health]", {"interval", "timeout"});
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
                } else {
                    unknown(key, "[[upstream]]", {"url", "dialect", "model", "api_key"});
                }
            } catch (const std::invalid_argument& e) {
                fail(node.source(), std::string("upstream.") + std::string(key.str()) + ": " + e.what());
            }
        }
        if (!has_url) fail(t.source(), "an [[upstream]] needs a 'url'");
        return u;
    }

    std::string source_;
    std::string base_dir_;
};

}  // namespace

proxy_settings parse_proxy_config(std::string_view text, const std::string& source_name, const std::string& base_dir) {
    toml::table root;
    try {
        root = toml::parse(text, source_name);
    } catch (const toml::parse_error& e) {
        const auto& where = e.source().begin;
        throw proxy_config_error(source_name + ":" + std::to_string(where.line) + ":" + std::to_string(where.column) +
                                     ": " + std::string(e.description()),
                                 static_cast<int>(where.line), static_cast<int>(where.column));
    }
    return proxy_config_reader(source_name, base_dir).read(root);
}

proxy_settings load_proxy_config(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read the proxy config file '" + path + "'");
    std::ostringstream text;
    text << in.rdbuf();
    return parse_proxy_config(text.str(), path, std::filesystem::path(path).parent_path().string());
}

}  // namespace keepwarm::proxy

// The proxy's settings file (src/proxy/proxy-config.*): a complete file, the defaults, and mistakes stopped with their
// line and column.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "proxy/proxy-config.h"

using namespace keepwarm;
using namespace keepwarm::proxy;

namespace {

void expect_error(const std::string& text, int line, const std::string& needle) {
    try {
        parse_proxy_config(text, "proxy.toml");
        ADD_FAILURE() << "expected an error for:\n" << text;
    } catch (const proxy_config_error& e) {
        const std::string message = e.what();
        EXPECT_EQ(e.line, line) << message;
        EXPECT_EQ(message.rfind("proxy.toml:" + std::to_string(line) + ":", 0), 0u) << message;
        EXPECT_NE(message.find(needle), std::string::npos) << "'" << message << "' lacks '" << needle << "'";
    }
}

}  // namespace

TEST(ProxyConfig, CompleteFile) {
    const proxy_settings s = parse_proxy_config(R"(
alias = "team-model"
policy = "policy.toml"

[listen]
host = "0.0.0.0"
port = 9090
api_key = "secret"

[routing]
block_chars = 128
min_match_blocks = 3
rebalance_margin = 2
max_blocks_per_upstream = 1000

[health]
interval = 0.5
timeout = 3

[[upstream]]
url = "http://10.0.0.2:8080"

[[upstream]]
url = "http://10.0.0.3:11434"
dialect = "ollama"
model = "qwen3:8b"

[[upstream]]
url = "http://10.0.0.4:8080/prefix"
dialect = "anthropic"
api_key = "k"
)",
                                                "/etc/keepwarm/proxy.toml", "/etc/keepwarm");
    EXPECT_EQ(s.model_alias, "team-model");
    EXPECT_EQ(s.policy_file, "/etc/keepwarm/policy.toml");  // relative to the file
    EXPECT_EQ(s.http.host, "0.0.0.0");
    EXPECT_EQ(s.http.port, 9090);
    EXPECT_EQ(s.http.api_key, "secret");
    EXPECT_EQ(s.pool.routing.block_chars, 128u);
    EXPECT_EQ(s.pool.routing.min_match_blocks, 3u);
    EXPECT_EQ(s.pool.routing.rebalance_margin, 2);
    EXPECT_EQ(s.pool.routing.max_blocks_per_upstream, 1000u);
    EXPECT_EQ(s.pool.health_interval.count(), 500);
    EXPECT_EQ(s.pool.health_timeout.count(), 3000);
    ASSERT_EQ(s.upstreams.size(), 3u);
    EXPECT_EQ(s.upstreams[0].origin.url(), "http://10.0.0.2:8080");
    EXPECT_EQ(s.upstreams[0].dialect, upstream_dialect::openai);
    EXPECT_EQ(s.upstreams[1].dialect, upstream_dialect::ollama);
    EXPECT_EQ(s.upstreams[1].model, "qwen3:8b");
    EXPECT_EQ(s.upstreams[2].origin.base_path, "/prefix");
    EXPECT_EQ(s.upstreams[2].dialect, upstream_dialect::anthropic);
    EXPECT_EQ(s.upstreams[2].api_key, "k");
}

TEST(ProxyConfig, EmptyFileKeepsTheDefaults) {
    const proxy_settings s = parse_proxy_config("", "proxy.toml");
    const proxy_settings defaults;
    EXPECT_EQ(s.http.host, defaults.http.host);
    EXPECT_EQ(s.http.port, defaults.http.port);
    EXPECT_EQ(s.model_alias, "keepwarm-proxy");
    EXPECT_TRUE(s.policy_file.empty());
    EXPECT_TRUE(s.upstreams.empty());
    EXPECT_EQ(s.pool.routing.block_chars, defaults.pool.routing.block_chars);
    EXPECT_EQ(s.pool.health_interval, defaults.pool.health_interval);
}

TEST(ProxyConfig, ListenLimitsAndCorsOrigins) {
    const proxy_settings s = parse_proxy_config(R"(
[listen]
max_body = 20000
max_connections = 512
max_connections_per_address = 0
header_timeout = 2.5
idle_timeout = 30
cors_origins = ["https://App.example/", "http://localhost:3000"]
)",
                                                "proxy.toml");
    EXPECT_EQ(s.http.max_body_bytes, 20000u);
    EXPECT_EQ(s.http.max_connections, 512);
    EXPECT_EQ(s.http.max_connections_per_address, 0);
    EXPECT_EQ(s.http.header_timeout.count(), 2500);
    EXPECT_EQ(s.http.idle_timeout.count(), 30000);
    EXPECT_EQ(s.http.cors_origins, (std::vector<std::string>{"https://app.example", "http://localhost:3000"}));

    const proxy_settings defaults = parse_proxy_config("", "proxy.toml");
    EXPECT_TRUE(defaults.http.cors_origins.empty());  // CORS is off unless origins are named
    EXPECT_EQ(defaults.http.max_connections_per_address, 64);

    expect_error("[listen]\nmax_body = 0\n", 2, "'listen.max_body' must be between 1 and");
    expect_error("[listen]\nmax_connections = 0\n", 2, "'listen.max_connections' must be between 1 and 65536");
    expect_error("[listen]\ncors_origins = \"*\"\n", 2, "'listen.cors_origins' must be an array");
    expect_error("[listen]\ncors_origins = [\"*\", \"app.example\"]\n", 2,
                 "listen.cors_origins: 'app.example' is not an origin");
}

TEST(ProxyConfig, MistakesNameTheirLine) {
    expect_error("[listen]\nport = 70000\n", 2, "'listen.port' must be between 0 and 65535");
    expect_error("[listen]\nport = \"80\"\n", 2, "'listen.port' must be an integer");
    expect_error("[listen]\nhots = \"x\"\n", 2, "unknown key 'hots' in [listen]");
    expect_error("[[upstream]]\ndialect = \"openai\"\n", 1, "an [[upstream]] needs a 'url'");
    expect_error("[[upstream]]\nurl = \"https://x:1\"\n", 2, "https is not supported");
    expect_error("[[upstream]]\nurl = \"http://x:1\"\ndialect = \"vllm\"\n", 3, "is not one of openai, anthropic");
    expect_error("[[upstream]]\nurl = \"http://x:1\"\nkey = \"k\"\n", 3, "unknown key 'key' in [[upstream]]");
    expect_error("upstream = \"http://x:1\"\n", 1, "'upstream' must be an array of tables");
    expect_error("[health]\ninterval = 0\n", 2, "'health.interval' must be between 0 and 3600 s");
    expect_error("[routing]\nblock_chars = 8\n", 2, "'routing.block_chars' must be between 16");
    expect_error("\n[upstreams]\n", 2, "unknown key 'upstreams' in the file");
    expect_error("[listen]\nhost = \n", 2, "");
}

TEST(ProxyConfig, LoadsFromDiskAndReportsAMissingFile) {
    const auto dir = std::filesystem::temp_directory_path() / "keepwarm-test-proxy-config";
    std::filesystem::create_directories(dir);
    {
        std::ofstream out(dir / "proxy.toml");
        out << "policy = \"p.toml\"\n[[upstream]]\nurl = \"http://127.0.0.1:1\"\n";
    }
    const proxy_settings s = load_proxy_config((dir / "proxy.toml").string());
    EXPECT_EQ(s.policy_file, (dir / "p.toml").string());
    ASSERT_EQ(s.upstreams.size(), 1u);
    // Read as serve's settings file is (config/settings-file.h): bounded at 1 MiB.
    {
        std::ofstream out(dir / "big.toml");
        out << std::string((1u << 20) + 1, '\n');
    }
    try {
        load_proxy_config((dir / "big.toml").string());
        ADD_FAILURE() << "a file over 1 MiB was read";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("is larger than 1 MiB"), std::string::npos) << e.what();
    }
    std::filesystem::remove_all(dir);
    EXPECT_THROW(load_proxy_config((dir / "proxy.toml").string()), std::runtime_error);
}

TEST(ProxyConfig, UpstreamTimeouts) {
    const proxy_settings defaults = parse_proxy_config("[[upstream]]\nurl = \"http://h:1\"\n", "proxy.toml");
    EXPECT_EQ(defaults.pool.first_byte_timeout, std::chrono::minutes(10));
    EXPECT_EQ(defaults.pool.idle_timeout, std::chrono::minutes(2));
    EXPECT_EQ(defaults.pool.answer_timeout, std::chrono::minutes(30));
    EXPECT_EQ(defaults.pool.health_failures, 3);
    const proxy_settings s = parse_proxy_config(R"(
[timeouts]
first_byte = 1800
idle = 30.5
answer = 3600

[health]
failures = 5

[[upstream]]
url = "http://h:1"
)",
                                                "proxy.toml");
    EXPECT_EQ(s.pool.first_byte_timeout, std::chrono::minutes(30));
    EXPECT_EQ(s.pool.idle_timeout, std::chrono::milliseconds(30500));
    EXPECT_EQ(s.pool.answer_timeout, std::chrono::hours(1));
    EXPECT_EQ(s.pool.health_failures, 5);
    expect_error("[timeouts]\nanswer = 0\n", 2, "timeouts.answer");
    expect_error("[health]\nfailures = 0\n", 2, "health.failures");
    expect_error("[timeouts]\nfirst_byte = -1\n", 2, "timeouts.first_byte");
    expect_error("[timeouts]\nfirstbyte = 5\n", 2, "first_byte");
}

TEST(ProxyConfig, AKeyWithOuterWhitespaceIsAMistakeOnItsLine) {
    expect_error("[listen]\napi_key = \" secret-1\"\n", 2, "listen.api_key: the API key starts with whitespace");
    expect_error("[[upstream]]\nurl = \"http://h:1\"\napi_key = \"secret-1\\n\"\n", 3,
                 "upstream.api_key: the API key ends with whitespace");
    EXPECT_THROW(upstream_config::parse("http://h:1,key=sk\x01x"), std::invalid_argument);
    EXPECT_EQ(upstream_config::parse("http://h:1,key=sk-1").api_key, "sk-1");
    // A mistake in another part of the spec shows the spec without its key.
    try {
        upstream_config::parse("http://h:1,key=sk-secret-1,modle=m");
        ADD_FAILURE() << "no error";
    } catch (const std::invalid_argument& e) {
        EXPECT_EQ(std::string(e.what()),
                  "'modle' in upstream 'http://h:1,key=***,modle=m' is not one of dialect, model, key, events");
    }
}

TEST(ProxyConfig, AnUpstreamsKvEventsEndpoint) {
    EXPECT_EQ(upstream_config::parse("http://h:1,events=tcp://h:5557").events, "tcp://h:5557");
    EXPECT_EQ(upstream_config::parse("http://h:1").events, "");
    // An address to bind names no host the proxy could connect to.
    EXPECT_THROW(upstream_config::parse("http://h:1,events=tcp://*:5557"), std::invalid_argument);
    EXPECT_THROW(upstream_config::parse("http://h:1,events=h:5557"), std::invalid_argument);
    EXPECT_THROW(upstream_config::parse("http://h:1,events=tcp://h"), std::invalid_argument);
    const proxy_settings s =
        parse_proxy_config("[[upstream]]\nurl = \"http://a:1\"\nevents = \"tcp://a:5557\"\n", "proxy.toml");
    ASSERT_EQ(s.upstreams.size(), 1u);
    EXPECT_EQ(s.upstreams[0].events, "tcp://a:5557");
    expect_error("[[upstream]]\nurl = \"http://a:1\"\nevents = \"tcp://*:5557\"\n", 3,
                 "upstream.events: events 'tcp://*:5557' is no address to connect to");
}

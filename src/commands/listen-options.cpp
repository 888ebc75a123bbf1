// See listen-options.h.
#include "commands/listen-options.h"

#include <pthread.h>

#include <csignal>
#include <stdexcept>

#include "base/logger.h"
#include "commands/number-checks.h"
#include "config/key-file-mode.h"
#include "http/api-keys.h"
#include "policy/policy-file.h"

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

namespace {
// A duration option in seconds, at least one millisecond.
CLI::Option* add_seconds_option(CLI::App& cmd, const std::string& name, std::chrono::milliseconds& target,
                                const std::string& help) {
    return cmd
        .add_option_function<double>(
            name,
            [&target](double seconds) { target = std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)); },
            help)
        ->check(positive_real("seconds"));
}
}  // namespace

listen_options add_listen_options(CLI::App& cmd, http::server_options& h) {
    listen_options o;
    o.host = cmd.add_option("--host", h.host, "Address to listen on")->capture_default_str();
    o.port = cmd.add_option("--port", h.port, "Port to listen on (0: any free port)")
                 ->check(whole_number(0, 65535, ""))
                 ->capture_default_str();
    o.api_key = cmd.add_option("--api-key", h.api_key,
                               "Require 'Authorization: Bearer KEY'; KEY1,KEY2,...: any of these keys, as llama-server "
                               "(env KEEPWARM_API_KEY or LLAMA_API_KEY)");
    o.max_body =
        cmd.add_option("--max-body", h.max_body_bytes, "Largest request body accepted, in bytes; a larger one gets 413")
            ->capture_default_str()
            ->check(whole_number_at_least(1, "bytes"));
    o.max_connections = cmd.add_option("--max-connections", h.max_connections,
                                       "Open connections in all; more get 503 (GET /health is still answered)")
                            ->capture_default_str()
                            ->check(whole_number(1, 65536, "connections"));
    o.max_connections_per_address =
        cmd.add_option("--max-connections-per-address", h.max_connections_per_address,
                       "Open connections from one client address (IPv6: one /64); 0: no per-address limit")
            ->capture_default_str()
            ->check(whole_number(0, 65536, "connections; 0: no limit"));
    o.header_timeout =
        add_seconds_option(cmd, "--header-timeout", h.header_timeout,
                           "Seconds a request head may take, counted from a new connection's opening (default 10)");
    o.idle_timeout = add_seconds_option(cmd, "--idle-timeout", h.idle_timeout,
                                        "Close connections that send no request for this many seconds (default 120)");
    o.stream_keepalive = add_stream_keepalive_option(cmd, h.stream_keepalive);
    o.cors_origin = cmd.add_option("--cors-origin", h.cors_origins,
                                   "Web origin whose pages may call the API from a browser, e.g. "
                                   "https://app.example.com (repeatable; * allows every origin; default: none)")
                        ->check(cors_origin_check());
    return o;
}

void listen_options::copy_given(const http::server_options& given, http::server_options& into) const {
    if (host->count() > 0) into.host = given.host;
    if (port->count() > 0) into.port = given.port;
    if (api_key->count() > 0) into.api_key = given.api_key;
    if (max_body->count() > 0) into.max_body_bytes = given.max_body_bytes;
    if (max_connections->count() > 0) into.max_connections = given.max_connections;
    if (max_connections_per_address->count() > 0) {
        into.max_connections_per_address = given.max_connections_per_address;
    }
    if (header_timeout->count() > 0) into.header_timeout = given.header_timeout;
    if (idle_timeout->count() > 0) into.idle_timeout = given.idle_timeout;
    if (stream_keepalive->count() > 0) into.stream_keepalive = given.stream_keepalive;
    if (cors_origin->count() > 0) into.cors_origins = given.cors_origins;
}

void add_tenancy_options(CLI::App& cmd, tenancy_options& tenancy, const std::string& kept_apart) {
    cmd.add_option(
           "--api-keys-file", tenancy.api_keys_file,
           "API keys, one 'TENANT KEY' per line: each tenant gets its own " + kept_apart + " (docs/security.md)")
        ->check(CLI::ExistingFile);
    cmd.add_option("--api-key-file", tenancy.shared_keys_file,
                   "llama-server's keys file: one key per line ('#' comments), all sharing one " + kept_apart)
        ->check(CLI::ExistingFile);
    cmd.add_flag("--shared-cache", tenancy.shared_cache,
                 "Let the keys of --api-keys-file share their " + kept_apart + ", as if they were one tenant");
    cmd.add_flag("--log-prompts", tenancy.log_prompts,
                 "Quote prompt text in the log (where a prompt left the cache, cache busters)");
    cmd.add_flag("--no-reuse-report", tenancy.no_reuse_report,
                 "Responses do not say how many prompt tokens were reused (timing still shows it)");
}

CLI::Option* add_stream_keepalive_option(CLI::App& cmd, std::chrono::milliseconds& interval) {
    return cmd
        .add_option_function<double>(
            "--stream-keepalive",
            [&interval](double seconds) { interval = std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)); },
            "A stream with nothing to send for this many seconds (a long prompt being computed) gets its API's "
            "keep-alive: an SSE comment, an Anthropic ping, an Ollama line with empty content (default 10; 0: never)")
        ->check(real_number(0, 3600, "seconds; 0: never"));
}

void add_log_options(CLI::App& cmd) {
    cmd.add_option_function<std::string>(
           "--log-level", [](const std::string& name) { log::set_level(*log::parse_level(name)); },
           "Least severe lines logged: error, warn, info (the default: also one line per HTTP request) or debug")
        ->check(CLI::IsMember({"error", "warn", "info", "debug"}));
    cmd.add_option_function<std::string>(
           "--log-format", [](const std::string& name) { log::set_format(*log::parse_format(name)); },
           "Log lines as text (the default) or json: one JSON object per line, with time, level, component and msg")
        ->check(CLI::IsMember({"text", "json"}));
}

std::vector<std::string> apply_tenancy(const tenancy_options& tenancy, http::server_options& http,
                                       frontend_context& ctx, policy::policy_config& policy,
                                       const std::string& command) {
    std::vector<std::string> tenants =
        http::configure_tenants(http.api_key, http.api_keys, tenancy.api_keys_file, tenancy.shared_cache,
                                tenancy.shared_keys_file, tenancy.listed_keys);
    for (const std::string& file : {tenancy.api_keys_file, tenancy.shared_keys_file}) {
        if (file.empty()) continue;
        if (const std::string warning = config::readable_by_others_warning(file, "API keys file"); !warning.empty()) {
            log::warn(command, "{}", warning);
        }
    }
    ctx.log_prompts = tenancy.log_prompts;
    ctx.reuse_report = !tenancy.no_reuse_report;
    if (!tenants.empty() && policy.detect.mode == policy::detect_mode::automatic) {
        policy.detect.mode = policy::detect_mode::report;
        log::warn(command, "detect mode auto is report with isolated tenants");
    }
    return tenants;
}

sigset_t block_stop_signals() {
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    std::signal(SIGPIPE, SIG_IGN);
    return signals;
}

void add_no_policy_flag(CLI::App& cmd, CLI::Option* policy_option, bool& no_policy) {
    cmd.add_flag("--no-policy", no_policy,
                 "Run without a policy, not even the built-in defaults (pings, Claude Code's billing nonce, automatic "
                 "rules for random ids): any model name is served and nothing in a request is changed")
        ->excludes(policy_option);
}

policy::policy_config select_policy(const std::string& file, bool no_policy, const std::string& served_model,
                                    const std::optional<written_policy>& written) {
    if (no_policy) {  // the command line's word, over a settings file's policy
        policy::policy_config none;
        none.detect.mode = policy::detect_mode::off;
        return none;
    }
    if (!file.empty()) return policy::load_policy_file(file, served_model);
    if (written) return policy::read_policy_table(written->table, written->source, served_model);
    return policy::builtin_policy(served_model);
}

std::string describe_policy(const policy::request_policy& p) {
    const policy::policy_config& c = p.config();
    if (c.source.empty()) return "none (--no-policy: any model name is served; nothing else is changed)";
    std::string spans;
    for (const auto& rule : p.span_rules()->rules()) spans += (spans.empty() ? "" : ", ") + rule.name();
    return c.source + " (model " + (c.model.mode == policy::model_mode::strict ? "strict" : "any") + ", " +
           std::to_string(c.model.aliases.size()) + " aliases; " + std::to_string(c.clients.size()) +
           " client rules; pings " + (c.ping.enabled ? "absorbed" : "served") +
           "; spans: " + (spans.empty() ? "none" : spans) + "; cache-buster detection " +
           policy::detect_mode_name(c.detect.mode) + ")";
}

}  // namespace keepwarm

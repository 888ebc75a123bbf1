// Command-line pieces that `serve` and `proxy` share for the side that listens to clients: the listening options
// themselves (address, key, body and connection limits, timeouts, stream keep-alive, CORS), tenants (API keys file,
// shared cache, what the log and responses may reveal), the log's level and format, and which policy runs (a file,
// none, or the built-in defaults); and the stop signals both wait for.
#pragma once

#include <toml++/toml.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <csignal>
#include <optional>
#include <string>
#include <vector>

#include "backend/frontend-context.h"
#include "http/api-keys.h"
#include "http/http-server.h"
#include "policy/policy.h"

namespace keepwarm {

// Checks a --cors-origin value (http::parse_cors_origin) and writes it back normalized, as browsers send it.
CLI::Validator cors_origin_check();

// The listening options of one command, as add_listen_options defined them.
struct listen_options {
    CLI::Option* host = nullptr;
    CLI::Option* port = nullptr;
    CLI::Option* api_key = nullptr;
    CLI::Option* max_body = nullptr;
    CLI::Option* max_connections = nullptr;
    CLI::Option* max_connections_per_address = nullptr;
    CLI::Option* header_timeout = nullptr;
    CLI::Option* idle_timeout = nullptr;
    CLI::Option* stream_keepalive = nullptr;
    CLI::Option* cors_origin = nullptr;

    // Copies what the command line gave (its values in `given`) over `into`: for a command whose settings file is
    // read apart from the command line (the proxy's), where the command line wins.
    void copy_given(const http::server_options& given, http::server_options& into) const;
};

// Adds --host, --port, --api-key, --max-body, --max-connections, --max-connections-per-address, --header-timeout,
// --idle-timeout, --stream-keepalive and --cors-origin, which set `http`: the same set, checks and help for every
// command that listens.
listen_options add_listen_options(CLI::App& cmd, http::server_options& http);

struct tenancy_options {
    std::vector<http::api_key_entry> listed_keys;  // a settings file's [tenants] table
    std::string api_keys_file;
    std::string shared_keys_file;  // llama-server's --api-key-file: a key per line, all of one tenant
    bool shared_cache = false;
    bool log_prompts = false;
    bool no_reuse_report = false;
};

// Adds --api-keys-file, --api-key-file (llama-server's), --shared-cache, --log-prompts and --no-reuse-report.
// `kept_apart`: what each tenant gets of its own, for the help text ("cache", "routing and reports").
void add_tenancy_options(CLI::App& cmd, tenancy_options& tenancy, const std::string& kept_apart);

// Adds --stream-keepalive SECONDS (0: never) into `interval`.
CLI::Option* add_stream_keepalive_option(CLI::App& cmd, std::chrono::milliseconds& interval);

// Adds --log-level (error, warn, info, debug) and --log-format (text, json). They set the process's log
// (base/logger.h) as the command line is parsed, so that everything the command logs after that follows them.
void add_log_options(CLI::App& cmd);

// A server's stop signals (SIGINT, SIGTERM), blocked in the calling thread and so in every thread it starts, for the
// main thread to sigwait() on; SIGPIPE is ignored (a client gone mid-write is an error code, not a signal). Call it
// first, before any thread starts.
sigset_t block_stop_signals();

// Adds --no-policy, which excludes `policy_option` (--policy FILE).
void add_no_policy_flag(CLI::App& cmd, CLI::Option* policy_option, bool& no_policy);
// A policy written into a settings file (serve --config's [policy] table), with that file's name for its errors.
struct written_policy {
    toml::table table;
    std::string source;
};

// The policy a command runs: none (`no_policy`: any model name is served and nothing is changed, whatever a settings
// file says), the file's (`file` not empty), the settings file's [policy] (`written`), or else the built-in defaults
// (policy::builtin_policy). A mistake in the file throws, naming its line.
policy::policy_config select_policy(const std::string& file, bool no_policy, const std::string& served_model,
                                    const std::optional<written_policy>& written = std::nullopt);
// One line for the start-up banner: what the policy does to requests.
std::string describe_policy(const policy::request_policy& p);

// Reads the keys file into `http`, sets the log and report switches of `ctx`, and with isolated tenants turns the
// policy's auto detection into reports (an adopted rule holds a fragment of the prompt it came from and would apply
// to every tenant). Returns the isolated tenants; empty: one shared cache. `command` names the command in messages.
std::vector<std::string> apply_tenancy(const tenancy_options& tenancy, http::server_options& http,
                                       frontend_context& ctx, policy::policy_config& policy,
                                       const std::string& command);

}  // namespace keepwarm

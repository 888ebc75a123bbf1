// Command-line pieces that `serve` and `proxy` share for the side that listens to clients: the --cors-origin check,
// tenants (API keys file, shared cache, what the log and responses may reveal), and the log's level and format.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "http/http-server.h"
#include "policy/policy.h"
#include "routes/frontend-context.h"

namespace keepwarm {

// Checks a --cors-origin value (http::parse_cors_origin) and writes it back normalized, as browsers send it.
CLI::Validator cors_origin_check();

struct tenancy_options {
    std::string api_keys_file;
    std::string shared_keys_file;  // llama-server's --api-key-file: a key per line, all of one tenant
    bool shared_cache = false;
    bool log_prompts = false;
    bool no_reuse_report = false;
};

// Adds --api-keys-file, --api-key-file (llama-server's), --shared-cache, --log-prompts and --no-reuse-report.
// `kept_apart`: what each tenant gets of its own, for the help text ("cache", "routing and reports").
void add_tenancy_options(CLI::App& cmd, tenancy_options& tenancy, const std::string& kept_apart);

// Adds --log-level (error, warn, info, debug) and --log-format (text, json). They set the process's log
// (base/logger.h) as the command line is parsed, so that everything the command logs after that follows them.
void add_log_options(CLI::App& cmd);

// Reads the keys file into `http`, sets the log and report switches of `ctx`, and with isolated tenants turns the
// policy's auto detection into reports (an adopted rule holds a fragment of the prompt it came from and would apply
// to every tenant). Returns the isolated tenants; empty: one shared cache. `command` names the command in messages.
std::vector<std::string> apply_tenancy(const tenancy_options& tenancy, http::server_options& http,
                                       frontend_context& ctx, policy::policy_config& policy,
                                       const std::string& command);

}  // namespace keepwarm

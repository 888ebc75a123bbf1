// See listen-options.h.
#include "commands/listen-options.h"

#include <stdexcept>

#include "base/logger.h"
#include "http/api-keys.h"

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

void add_tenancy_options(CLI::App& cmd, tenancy_options& tenancy, const std::string& kept_apart) {
    cmd.add_option(
           "--api-keys-file", tenancy.api_keys_file,
           "API keys, one 'TENANT KEY' per line: each tenant gets its own " + kept_apart + " (README: Security)")
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
    std::vector<std::string> tenants = http::configure_tenants(http.api_key, http.api_keys, tenancy.api_keys_file,
                                                               tenancy.shared_cache, tenancy.shared_keys_file);
    ctx.log_prompts = tenancy.log_prompts;
    ctx.reuse_report = !tenancy.no_reuse_report;
    if (!tenants.empty() && policy.detect.mode == policy::detect_mode::automatic) {
        policy.detect.mode = policy::detect_mode::report;
        log::warn(command, "detect mode auto is report with isolated tenants");
    }
    return tenants;
}

}  // namespace keepwarm

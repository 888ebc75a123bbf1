// Reads the policy file (TOML, described in docs/policy.md) into a policy_config. Every mistake stops with the
// file's line and column: TOML syntax, unknown keys, wrong types, values out of range, patterns RE2 cannot compile
// (backreferences, lookaround), an alias that does not map to the served model.
#pragma once

#include <toml++/toml.h>

#include <string>
#include <string_view>

#include "config/config-error.h"
#include "policy/policy.h"

namespace keepwarm::policy {

// what() is "FILE:LINE:COLUMN: message".
using policy_file_error = config::config_file_error;

// `served_model`: the name the server reports for its model; aliases must map to it (empty: not checked).
policy_config load_policy_file(const std::string& path, const std::string& served_model);
// The same from text; `source_name` names it in errors.
policy_config parse_policy(std::string_view text, const std::string& source_name, const std::string& served_model);
// The same from a table already parsed: a settings file's [policy] (its lines are the settings file's).
policy_config read_policy_table(const toml::table& root, const std::string& source_name,
                                const std::string& served_model);

// The policy without a policy file: the protections every agent client needs, on by default (docs/policy.md,
// "Without a policy file"). Health pings are answered without the engine (default_ping_matcher), Claude Code's
// per-request billing nonce is kept out of the prompt, and the cache-buster detector puts the rule for a random id it
// finds in force by itself. Nothing else changes what the model reads. Written as the file that gives it.
extern const std::string_view builtin_policy_text;
inline constexpr const char* builtin_policy_source = "built-in defaults";
// builtin_policy_text, read (source "built-in defaults").
policy_config builtin_policy(const std::string& served_model);

}  // namespace keepwarm::policy

// The settings of `keepwarm proxy`: where it listens, its upstreams, routing and health checks, the policy file. They
// come from a TOML file (`--config FILE`, described in docs/proxy.md), from the command line, or both: options given
// on the command line win over the file, and `--upstream` adds to the file's upstreams. Every mistake in the file
// stops start-up with its line and column.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "config/config-error.h"
#include "http/http-server.h"
#include "proxy/upstream-pool.h"

namespace keepwarm::proxy {

struct proxy_settings {
    http::server_options http;
    std::vector<upstream_config> upstreams;
    std::string policy_file;  // empty: the built-in defaults (none with --no-policy)
    std::string model_alias = "keepwarm-proxy";
    pool_options pool;
};

// what() is "FILE:LINE:COLUMN: message".
using proxy_config_error = config::config_file_error;

// Reads the file as every command's settings file is read (config/settings-file.h: at most 1 MiB); a relative
// `policy` path is taken from the file's folder.
proxy_settings load_proxy_config(const std::string& path);
// The same from text; `source_name` names it in errors, `base_dir` resolves a relative policy path.
proxy_settings parse_proxy_config(std::string_view text, const std::string& source_name,
                                  const std::string& base_dir = "");

}  // namespace keepwarm::proxy

// Command-line pieces that `serve` and `proxy` share for the side that listens to clients.
#pragma once

#include <CLI/CLI.hpp>

namespace keepwarm {

// Checks a --cors-origin value (http::parse_cors_origin) and writes it back normalized, as browsers send it.
CLI::Validator cors_origin_check();

}  // namespace keepwarm

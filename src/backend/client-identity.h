// Who sent a request, as per-client policy rules, cache-buster reports and the log name it.
#pragma once

#include <string>

#include "http/http-server.h"

namespace keepwarm {

// The `x-keepwarm-client` header when a client names itself; else the User-Agent's first product name
// ("claude-cli" from "claude-cli/2.1.197 (external, cli)", "ollama-js" from "ollama-js/0.6.4 (x64 linux Node.js)");
// else the peer's address without its port.
std::string client_name(const http::request& req);

}  // namespace keepwarm

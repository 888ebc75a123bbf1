// `keepwarm proxy`: the three client APIs (OpenAI, Anthropic, Ollama) and the policy layer in front of engines users
// already run, each request routed to the upstream most likely to hold its prefix (docs/proxy.md).
#pragma once

#include <CLI/CLI.hpp>

namespace keepwarm {

void add_proxy_command(CLI::App& app);

}  // namespace keepwarm

// `keepwarm doctor A.json B.json`: renders two captured request bodies (OpenAI, Anthropic or Ollama) as the model
// would read them and says where they part, what that costs the prefix cache, what kind of span it is, and which
// policy rule would remove it. Exit status: 0 when the prompts are identical or one extends the other, 1 when they
// diverge, 2 on bad input.
#pragma once

#include <CLI/CLI.hpp>

namespace keepwarm {

void add_doctor_command(CLI::App& app);

}  // namespace keepwarm

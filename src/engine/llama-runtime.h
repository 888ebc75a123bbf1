// Process-wide llama.cpp set-up: loads the ggml backends (the best CPU variant for this machine, and any GPU
// backend shipped next to the binary) and routes llama.cpp's log through keepwarm's verbosity.
#pragma once

#include <string>

namespace keepwarm {

// Idempotent and thread-safe. Looks for backends in <binary dir>/lib, then <binary dir>, then llama.cpp's
// default search. Call before loading a model.
void init_llama_runtime(bool verbose = false);

// Directory holding the running executable.
std::string executable_dir();

}  // namespace keepwarm

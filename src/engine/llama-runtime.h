// Process-wide llama.cpp set-up: loads the ggml backends (the best CPU variant for this machine, and any GPU
// backend shipped next to the binary) and routes llama.cpp's log through keepwarm's verbosity.
#pragma once

#include <string>

namespace keepwarm {

// Idempotent and thread-safe. Looks for backends in <binary dir>/lib, then <binary dir>, then llama.cpp's
// default search; KEEPWARM_CPU_BACKEND=<variant> (e.g. haswell, x64) loads only that CPU variant. Call before
// loading a model. Throws std::runtime_error if the requested variant cannot be loaded.
void init_llama_runtime(bool verbose = false);

// The instruction sets the loaded compute backends use, e.g. "AVX2 AVX512 AMX_INT8 ...".
std::string compute_features();

// Directory holding the running executable.
std::string executable_dir();

}  // namespace keepwarm

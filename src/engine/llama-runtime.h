// Process-wide llama.cpp set-up: loads the ggml backends (the best CPU variant for this machine, and any GPU
// backend shipped next to the binary) and routes llama.cpp's log through keepwarm's verbosity.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

namespace keepwarm {

// Idempotent and thread-safe. Looks for backends in <binary dir>/lib, then <binary dir>, then llama.cpp's
// default search; KEEPWARM_CPU_BACKEND=<variant> (e.g. haswell, x64) loads only that CPU variant. Call before
// loading a model. Throws std::runtime_error if the requested variant cannot be loaded.
void init_llama_runtime(bool verbose = false);

// The instruction sets the loaded compute backends use, e.g. "AVX2 AVX512 AMX_INT8 ...".
std::string compute_features();

// A GPU the loaded backends run on.
struct gpu_device {
    std::string name;         // the backend's name for it, e.g. "CUDA0"
    std::string description;  // e.g. "NVIDIA H200"
    size_t free_bytes = 0;
    size_t total_bytes = 0;
};
std::vector<gpu_device> gpu_devices();

// Why a GPU backend library in `dir` (libggml-cuda*.so) gives this process no device: the loader's error (the CUDA
// runtime missing, say) or the backend's own "not on this machine" (no device, no driver). "" when there is none.
std::string gpu_backend_problem(const std::filesystem::path& dir);

// The start-up banner's line: the GPU used and how many of the model's layers are on it, or the CPU's features
// and, where a GPU backend was found but not used, why. `gpu_layers` < 0: all.
std::string describe_compute(int gpu_layers, int model_layers);

// Mixture-of-experts models whose experts do not all fit in GPU memory: llama.cpp's tensor placement patterns
// (llama-server's --n-cpu-moe) that keep the expert weights of the first `layers` blocks in host memory, where the
// CPU computes them (-1: every block's, --cpu-moe; 0: none). Dense models have no such tensors: no effect.
std::vector<std::string> expert_tensor_patterns(int layers);

// Directory holding the running executable.
std::string executable_dir();

}  // namespace keepwarm

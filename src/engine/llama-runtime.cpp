// See llama-runtime.h.
#include "engine/llama-runtime.h"

#include <dlfcn.h>
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "base/logger.h"
#include "common.h"
#include "ggml-backend.h"
#include "llama.h"

namespace keepwarm {

namespace {
std::atomic<bool> g_verbose{false};

// llama.cpp warns once per tensor its loader leaves out: a model's MTP heads not loaded make a dozen lines per head
// in every server's start that does not draft with them (the engine says so in one line instead). Shown with
// --verbose.
bool is_unused_tensor_notice(ggml_log_level level, const char* text) {
    return level == GGML_LOG_LEVEL_WARN && text != nullptr &&
           std::string_view(text).starts_with("model has unused tensor ");
}

// Warnings and errors always (but unused tensors'); everything with --verbose. A continuation line (the dots of a
// progress bar, say) follows the fate of the line it continues. llama.cpp hands over pieces of lines: each thread's
// pieces are joined, and each whole line goes to the process's log (base/logger.h) as one line of component
// "llama.cpp", so that with
// --log-format json it is JSON like every other line.
void log_callback(ggml_log_level level, const char* text, void*) {
    static thread_local bool last_shown = false;
    static thread_local log::level line_level = log::level::info;
    static thread_local std::string pending;  // the start of a line not yet ended
    const bool show = level == GGML_LOG_LEVEL_CONT ? last_shown
                                                   : (level >= GGML_LOG_LEVEL_WARN && level != GGML_LOG_LEVEL_CONT &&
                                                      !is_unused_tensor_notice(level, text)) ||
                                                         g_verbose.load(std::memory_order_relaxed);
    last_shown = show;
    if (!show || text == nullptr) return;
    if (level != GGML_LOG_LEVEL_CONT && pending.empty()) {
        line_level = level == GGML_LOG_LEVEL_ERROR  ? log::level::error
                     : level == GGML_LOG_LEVEL_WARN ? log::level::warn
                                                    : log::level::info;  // what --verbose asked to see
    }
    pending += text;
    size_t end;
    while ((end = pending.find('\n')) != std::string::npos) {
        if (end > 0) log::write(line_level, "llama.cpp", std::string_view(pending).substr(0, end));
        pending.erase(0, end + 1);
    }
    if (pending.size() > 64 * 1024) {  // a line that never ends is written in pieces
        log::write(line_level, "llama.cpp", pending);
        pending.clear();
    }
}
}  // namespace

namespace {
// The folder libggml was loaded from (through the binary's RPATH): the CPU backends sit beside it, wherever the
// keepwarm binary itself was copied to.
std::filesystem::path ggml_library_dir() {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&ggml_backend_load_all_from_path), &info) == 0 || !info.dli_fname) return {};
    std::error_code ec;
    const auto path = std::filesystem::canonical(info.dli_fname, ec);
    return ec ? std::filesystem::path{} : path.parent_path();
}

// Why the GPU backend found next to the binary gives no device, when it does not (set once, by init).
std::string g_gpu_problem;

bool is_gpu_backend_file(const std::string& name) {
    return name.starts_with("libggml-cuda") && name.ends_with(".so");
}

bool has_gpu_backend_file(const std::filesystem::path& dir) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
        if (is_gpu_backend_file(entry.path().filename().string())) return true;
    }
    return false;
}

// The CUDA backend links the CUDA 13 runtime by soname. Where the toolkit is installed but not on the loader's path
// (/usr/local/cuda/lib64 is not, on most machines), load it from there first, so the backend's dependencies resolve
// to it. And give the driver's cache of compiled kernels room for all of ggml's: on a GPU the prebuilt backend has
// no machine code for (Hopper), the driver compiles them from PTX at first use, work that a restart should not
// do again (its default cache, 256 MiB, does not keep them all).
void prepare_cuda_runtime(const std::filesystem::path& dir) {
    if (!has_gpu_backend_file(dir)) return;
    setenv("CUDA_CACHE_MAXSIZE", "4294967296", /*overwrite=*/0);
    for (const char* soname : {"libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13"}) {
        if (dlopen(soname, RTLD_NOW | RTLD_GLOBAL)) continue;
        for (const char* folder : {"/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"}) {
            if (dlopen((std::string(folder) + "/" + soname).c_str(), RTLD_NOW | RTLD_GLOBAL)) break;
        }
    }
}

// After loading: no GPU device, but a GPU backend was there to load.
std::string find_gpu_problem(const std::vector<std::filesystem::path>& dirs) {
    if (ggml_backend_reg_t cuda = ggml_backend_reg_by_name("CUDA"); cuda && ggml_backend_reg_dev_count(cuda) == 0) {
        return "the CUDA backend sees no device (no NVIDIA driver, or CUDA_VISIBLE_DEVICES hides them)";
    }
    for (const auto& dir : dirs) {
        if (std::string problem = gpu_backend_problem(dir); !problem.empty()) return problem;
    }
    return "";
}

bool is_gpu(ggml_backend_dev_t dev) {
    const auto type = ggml_backend_dev_type(dev);
    return type == GGML_BACKEND_DEVICE_TYPE_GPU || type == GGML_BACKEND_DEVICE_TYPE_IGPU;
}
}  // namespace

std::string gpu_backend_problem(const std::filesystem::path& dir) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
        const std::string file = entry.path().filename().string();
        if (!is_gpu_backend_file(file)) continue;
        void* handle = dlopen(entry.path().c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!handle) {
            const char* error = dlerror();
            std::string why = file + " cannot be loaded: " + (error ? error : "unknown error");
            if (why.find("libcudart") != std::string::npos || why.find("libcublas") != std::string::npos) {
                why += " (install the CUDA 13 runtime, or add the folder that holds it to LD_LIBRARY_PATH)";
            } else if (why.find("libcuda.so") != std::string::npos) {
                why += " (no NVIDIA driver on this machine)";
            }
            return why;
        }
        using score_fn = int (*)();
        const auto score = reinterpret_cast<score_fn>(dlsym(handle, "ggml_backend_score"));
        const bool unsupported = score && score() == 0;
        dlclose(handle);
        if (unsupported) return file + ": its backend finds no usable GPU on this machine";
    }
    return "";
}

std::vector<gpu_device> gpu_devices() {
    std::vector<gpu_device> out;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (!is_gpu(dev)) continue;
        gpu_device d{ggml_backend_dev_name(dev), ggml_backend_dev_description(dev)};
        ggml_backend_dev_memory(dev, &d.free_bytes, &d.total_bytes);
        out.push_back(std::move(d));
    }
    return out;
}

std::string describe_compute(int gpu_layers, int model_layers) {
    const std::vector<gpu_device> gpus = gpu_devices();
    if (gpus.empty()) {
        std::string line = "CPU, " + compute_features();
        if (!g_gpu_problem.empty()) line += "; GPU backend not used: " + g_gpu_problem;
        return line;
    }
    const auto gib = [](size_t bytes) {
        char text[32];
        std::snprintf(text, sizeof text, "%.1f", static_cast<double>(bytes) / (1ull << 30));
        return std::string(text);
    };
    std::string line;
    for (const gpu_device& gpu : gpus) {
        line += (line.empty() ? "" : ", ") + gpu.name + " " + gpu.description + " (" + gib(gpu.free_bytes) + " of " +
                gib(gpu.total_bytes) + " GiB free)";
    }
    // As llama.cpp counts them: the blocks and the output layer.
    const int offloadable = model_layers + 1;
    const int offloaded = gpu_layers < 0 ? offloadable : std::min(gpu_layers, offloadable);
    return line + "; " + std::to_string(offloaded) + "/" + std::to_string(offloadable) + " layers on the GPU";
}

std::vector<std::string> expert_tensor_patterns(int layers) {
    const std::string experts = LLM_FFN_EXPS_REGEX;
    if (layers < 0) return {experts};
    std::vector<std::string> patterns;
    for (int i = 0; i < layers; ++i) patterns.push_back("blk\\." + std::to_string(i) + experts);
    return patterns;
}

std::string executable_dir() {
    std::error_code ec;
    auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    return ec ? std::string(".") : exe.parent_path().string();
}

void init_llama_runtime(bool verbose) {
    g_verbose = verbose;
    static std::once_flag once;
    std::call_once(once, [] {
        llama_log_set(log_callback, nullptr);
        namespace fs = std::filesystem;
        const fs::path dir = executable_dir();
        std::vector<fs::path> candidates{dir / "lib", dir, dir / ".." / "lib"};
        if (auto ggml_dir = ggml_library_dir(); !ggml_dir.empty()) candidates.push_back(ggml_dir);
        bool loaded = false;
        // KEEPWARM_CPU_BACKEND=haswell (say) loads that one CPU variant instead of the best for this machine: to
        // check the code path of an older CPU, or to step around a kernel that misbehaves on this one.
        if (const char* variant = std::getenv("KEEPWARM_CPU_BACKEND"); variant && *variant) {
            for (const fs::path& candidate : candidates) {
                const fs::path lib = candidate / ("libggml-cpu-" + std::string(variant) + ".so");
                std::error_code ec;
                if (fs::exists(lib, ec) && ggml_backend_load(lib.c_str())) {
                    loaded = true;
                    break;
                }
            }
            if (!loaded) {
                throw std::runtime_error("KEEPWARM_CPU_BACKEND=" + std::string(variant) + ": no loadable libggml-cpu-" +
                                         variant + ".so next to the binary");
            }
        }
        for (const fs::path& candidate : candidates) {
            if (loaded) break;
            std::error_code ec;
            if (fs::exists(candidate / "libggml-base.so", ec) || fs::exists(candidate / "libggml-cpu-x64.so", ec)) {
                prepare_cuda_runtime(candidate);
                ggml_backend_load_all_from_path(candidate.c_str());
                loaded = ggml_backend_dev_count() > 0;
                if (loaded) break;
            }
        }
        if (!loaded) ggml_backend_load_all();
        if (gpu_devices().empty()) g_gpu_problem = find_gpu_problem(candidates);
        llama_backend_init();
    });
}

std::string compute_features() {
    // llama_print_system_info() gives "CPU : SSE3 = 1 | AVX = 1 | ... |"; keep the names that are on.
    std::istringstream in(llama_print_system_info());
    std::string item, out;
    while (std::getline(in, item, '|')) {
        const auto eq = item.find(" = 1");
        if (eq == std::string::npos) continue;
        std::string name = item.substr(0, eq);
        if (const auto colon = name.find(": "); colon != std::string::npos) name = name.substr(colon + 2);
        name.erase(0, name.find_first_not_of(' '));
        out += (out.empty() ? "" : " ") + name;
    }
    return out;
}

}  // namespace keepwarm

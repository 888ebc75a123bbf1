// See llama-runtime.h.
#include "engine/llama-runtime.h"

#include <dlfcn.h>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "ggml-backend.h"
#include "llama.h"

namespace keepwarm {

namespace {
std::atomic<bool> g_verbose{false};

// Warnings and errors always; everything with --verbose. A continuation line (the dots of a progress bar, say)
// follows the fate of the line it continues.
void log_callback(ggml_log_level level, const char* text, void*) {
    static thread_local bool last_shown = false;
    const bool show = level == GGML_LOG_LEVEL_CONT ? last_shown
                                                   : (level >= GGML_LOG_LEVEL_WARN && level != GGML_LOG_LEVEL_CONT) ||
                                                         g_verbose.load(std::memory_order_relaxed);
    last_shown = show;
    if (show) std::fputs(text, stderr);
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
}  // namespace

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
                ggml_backend_load_all_from_path(candidate.c_str());
                loaded = ggml_backend_dev_count() > 0;
                if (loaded) break;
            }
        }
        if (!loaded) ggml_backend_load_all();
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

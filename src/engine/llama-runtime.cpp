// See llama-runtime.h.
#include "engine/llama-runtime.h"

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <mutex>

#include "ggml-backend.h"
#include "llama.h"

namespace keepwarm {

namespace {
std::atomic<bool> g_verbose{false};

void log_callback(ggml_log_level level, const char* text, void*) {
    if (level >= GGML_LOG_LEVEL_WARN || g_verbose.load(std::memory_order_relaxed)) {
        std::fputs(text, stderr);
    }
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
        bool loaded = false;
        for (const fs::path& candidate : {dir / "lib", dir, dir / ".." / "lib"}) {
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

}  // namespace keepwarm

// Demo model cache: generated on first use, keyed by a hash of its spec so a changed generator makes a new file.
#include "model/demo-model.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "base/logger.h"
#include "ggml-cpp.h"
#include "gguf.h"
#include "model/model-builder.h"

namespace keepwarm {

namespace fs = std::filesystem;

fs::path cache_dir() {
    if (const char* dir = std::getenv("KEEPWARM_CACHE_DIR"); dir && *dir) return dir;
    if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return fs::path(xdg) / "keepwarm";
    if (const char* home = std::getenv("HOME"); home && *home) return fs::path(home) / ".cache" / "keepwarm";
    throw std::runtime_error("no cache directory: set KEEPWARM_CACHE_DIR, XDG_CACHE_HOME or HOME");
}

namespace {

// Holds an exclusive flock for its lifetime; the kernel drops it if the process dies, so a crash never wedges others.
class file_lock {
public:
    explicit file_lock(const fs::path& path) {
        fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd_ < 0) throw std::runtime_error("cannot open lock file " + path.string() + ": " + std::strerror(errno));
        while (::flock(fd_, LOCK_EX) != 0) {
            if (errno != EINTR) {
                const int err = errno;
                ::close(fd_);
                throw std::runtime_error("cannot lock " + path.string() + ": " + std::strerror(err));
            }
        }
    }
    ~file_lock() { ::close(fd_); }
    file_lock(const file_lock&) = delete;
    file_lock& operator=(const file_lock&) = delete;

private:
    int fd_ = -1;
};

}  // namespace

std::string ensure_demo_model() {
    const model_spec spec = preset_spec("tiny");
    const fs::path dir = cache_dir() / "models";
    const fs::path path = dir / ("demo-qwen3-" + spec_hash(spec) + ".gguf");

    std::error_code ec;
    if (fs::is_regular_file(path, ec)) return path.string();  // files only appear there complete (rename)

    fs::create_directories(dir, ec);
    if (ec) throw std::runtime_error("cannot create " + dir.string() + ": " + ec.message());

    // The lock only saves duplicate work; correctness comes from build_model's write-then-rename.
    file_lock lock(fs::path(path.string() + ".lock"));
    if (fs::is_regular_file(path, ec)) return path.string();

    log::info("model", "no --model given; generating the demo model (random weights, output is noise) at {}",
              path.string());
    const build_result result = build_model(spec, path.string());
    log::info("model", "demo model ready ({} MiB in {} s)", log::fixed(double(result.file_size) / (1024.0 * 1024.0), 1),
              log::fixed(result.seconds, 1));
    return result.path;
}

bool model_has_random_weights(const std::string& gguf_path) {
    gguf_init_params params{/*no_alloc =*/true, /*ctx =*/nullptr};
    gguf_context_ptr ctx(gguf_init_from_file(gguf_path.c_str(), params));
    if (!ctx) return false;
    const int64_t id = gguf_find_key(ctx.get(), "keepwarm.random_weights");
    return id >= 0 && gguf_get_kv_type(ctx.get(), id) == GGUF_TYPE_BOOL && gguf_get_val_bool(ctx.get(), id);
}

}  // namespace keepwarm

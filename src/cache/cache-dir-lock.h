// One server per cache directory: an exclusive advisory lock (flock) on a file inside it, held for the process's
// life, so a second server on the same --cache-dir refuses to start instead of overwriting the first's files.
#pragma once

#include <filesystem>
#include <stdexcept>
#include <string>

#include "base/file-io.h"

namespace keepwarm {

// Another live process holds the directory's lock; what() names it (pid, start time, what it said it is).
struct cache_dir_busy : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Threading: construct and use from one thread; the lock itself belongs to the process until destruction.
class cache_dir_lock {
public:
    static constexpr const char* file_name = "keepwarm.lock";

    // Creates `dir` if it is missing and takes the lock of `dir`/keepwarm.lock, without waiting. The file then says
    // who holds it: this pid, the start time and `holder` (e.g. "keepwarm serve on http://127.0.0.1:8080"). The
    // kernel drops the lock when the process exits, however it exits, so a crashed server never blocks a restart;
    // the file's stale text is only read while a live process holds the lock. Throws cache_dir_busy when another
    // open of the file holds the lock (another process, or another cache_dir_lock in this one), std::runtime_error
    // when the directory or the file cannot be made or locked.
    explicit cache_dir_lock(const std::filesystem::path& dir, const std::string& holder);

    // Rewrites what the file says about the holder (e.g. once the port is known).
    void describe(const std::string& holder);

    const std::filesystem::path& path() const { return path_; }

private:
    std::filesystem::path path_;
    unique_fd fd_;
    std::string started_;  // UTC, ISO 8601
};

}  // namespace keepwarm

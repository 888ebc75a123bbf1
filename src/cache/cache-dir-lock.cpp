// See cache-dir-lock.h.
#include "cache/cache-dir-lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <system_error>

#include "base/unix-time.h"

namespace keepwarm {

namespace {

// What a refused server quotes from the file: one short line, whatever the file holds.
constexpr size_t max_holder_text = 512;

std::string utc_timestamp(int64_t seconds) {
    const std::time_t t = static_cast<std::time_t>(seconds);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

std::string read_holder(int fd) {
    std::string text(max_holder_text, '\0');
    ssize_t n;
    do {
        n = ::pread(fd, text.data(), text.size(), 0);
    } while (n < 0 && errno == EINTR);
    text.resize(n > 0 ? static_cast<size_t>(n) : 0);
    while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
    for (char& c : text) {
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';  // the text goes into a log line
    }
    return text;
}

}  // namespace

cache_dir_lock::cache_dir_lock(const std::filesystem::path& dir, const std::string& holder)
    : path_(dir / file_name), fd_(-1), started_(utc_timestamp(unix_now())) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw std::runtime_error("cannot create the cache directory " + dir.string() + ": " + ec.message());
    // O_CLOEXEC: a child process must not inherit the lock and hold it past this one's end.
    fd_.fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd_.fd < 0) throw std::runtime_error("cannot open the lock file " + path_.string() + ": " + errno_text(errno));
    int r;
    do {
        r = ::flock(fd_.fd, LOCK_EX | LOCK_NB);
    } while (r != 0 && errno == EINTR);
    if (r != 0) {
        const int err = errno;
        if (err != EWOULDBLOCK) throw std::runtime_error("cannot lock " + path_.string() + ": " + errno_text(err));
        const std::string by = read_holder(fd_.fd);
        throw cache_dir_busy("the cache directory " + dir.string() + " is in use by another server (" +
                             (by.empty() ? "it has not said which yet; " + path_.string() + " is locked" : by) +
                             "): two servers on one directory would overwrite each other's files. Stop that server, "
                             "or give this one a --cache-dir of its own");
    }
    describe(holder);
}

void cache_dir_lock::describe(const std::string& holder) {
    std::string text = "pid " + std::to_string(::getpid()) + ", started " + started_;
    if (!holder.empty()) text += ", " + holder;
    text += "\n";
    // Best effort: the lock is what keeps a second server out; the text only helps its operator. Written before the
    // file is cut to its length, so a reader never finds it empty.
    if (::pwrite(fd_.fd, text.data(), text.size(), 0) == static_cast<ssize_t>(text.size())) {
        [[maybe_unused]] int r = ::ftruncate(fd_.fd, static_cast<off_t>(text.size()));
    }
}

}  // namespace keepwarm

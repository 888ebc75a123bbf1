// See file-io.h.
#include "base/file-io.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

namespace keepwarm {

namespace {
constexpr size_t io_chunk = 4 << 20;
std::atomic<uint64_t> temp_sequence{0};  // temp names stay unique even with two writers on one directory
}  // namespace

unique_fd::~unique_fd() {
    if (fd >= 0) ::close(fd);
}

int unique_fd::close_checked() {
    const int r = ::close(fd);
    fd = -1;
    return r == 0 ? 0 : errno;
}

std::string errno_text(int err) {
    return std::strerror(err);
}

int write_all(int fd, const uint8_t* data, size_t size) {
    while (size > 0) {
        const ssize_t n = ::write(fd, data, std::min(size, io_chunk));
        if (n < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (n == 0) return EIO;
        data += n;
        size -= static_cast<size_t>(n);
    }
    return 0;
}

int read_exact(int fd, uint8_t* data, size_t size, uint64_t offset) {
    while (size > 0) {
        const ssize_t n = ::pread(fd, data, std::min(size, io_chunk), static_cast<off_t>(offset));
        if (n < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (n == 0) return -1;
        data += n;
        size -= static_cast<size_t>(n);
        offset += static_cast<uint64_t>(n);
    }
    return 0;
}

std::string read_error_text(int err) {
    return err < 0 ? std::string("unexpected end of file") : errno_text(err);
}

int fsync_directory(const std::filesystem::path& dir) {
    unique_fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (d.fd < 0) return errno;
    if (::fsync(d.fd) != 0 && errno != EINVAL) return errno;
    return 0;
}

std::optional<std::string> write_file_atomically(const std::filesystem::path& final_path,
                                                 std::initializer_list<std::span<const uint8_t>> parts, int* err) {
    const std::filesystem::path dir = final_path.has_parent_path() ? final_path.parent_path() : ".";
    const std::filesystem::path temp =
        final_path.string() + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(temp_sequence.fetch_add(1));
    const auto failed = [&](int e, std::string message) -> std::optional<std::string> {
        if (err) *err = e;
        return message;
    };
    unique_fd f(::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (f.fd < 0) {
        const int e = errno;
        return failed(e, "cannot create " + temp.string() + ": " + errno_text(e));
    }
    (void)::flock(f.fd, LOCK_EX | LOCK_NB);
    auto fail = [&](const std::string& what, int e) {
        ::unlink(temp.c_str());
        return failed(e, what + " " + temp.string() + ": " + errno_text(e));
    };
    for (const std::span<const uint8_t> part : parts) {
        if (int e = write_all(f.fd, part.data(), part.size())) return fail("cannot write", e);
    }
    if (::fsync(f.fd) != 0) return fail("cannot fsync", errno);
    if (::rename(temp.c_str(), final_path.c_str()) != 0) return fail("cannot rename", errno);
    if (int e = fsync_directory(dir)) {
        ::unlink(final_path.c_str());
        return failed(e, "cannot fsync directory " + dir.string() + ": " + errno_text(e));
    }
    if (int e = f.close_checked()) {
        ::unlink(final_path.c_str());
        return failed(e, "cannot close " + final_path.string() + ": " + errno_text(e));
    }
    return std::nullopt;
}

bool remove_abandoned_temp(const std::filesystem::path& temp) {
    unique_fd f(::open(temp.c_str(), O_RDONLY | O_CLOEXEC));
    if (f.fd < 0) return false;
    if (::flock(f.fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) return false;
    return ::unlink(temp.c_str()) == 0;
}

}  // namespace keepwarm

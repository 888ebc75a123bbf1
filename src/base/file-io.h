// POSIX file plumbing shared by the cache's on-disk files (the disk tier's entries, the prompt tokenizer's saved
// index): an owning descriptor, whole writes and reads that retry short transfers and EINTR, and the atomic
// replace-a-file sequence (temporary file, fsync, rename, fsync of the directory).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>

namespace keepwarm {

struct unique_fd {
    int fd = -1;
    explicit unique_fd(int f) : fd(f) {}
    unique_fd(const unique_fd&) = delete;
    unique_fd& operator=(const unique_fd&) = delete;
    ~unique_fd();
    // Closes now and reports the error close() gives (a deferred write error on some file systems).
    int close_checked();
};

std::string errno_text(int err);

// Writes all of `data`; retries EINTR and short writes. Returns 0 or an errno value.
int write_all(int fd, const uint8_t* data, size_t size);

// Reads exactly `size` bytes at `offset`. Returns 0, an errno value, or -1 if the file ended first.
int read_exact(int fd, uint8_t* data, size_t size, uint64_t offset);
// What read_exact's result means, for a message.
std::string read_error_text(int err);

// Makes the directory entry of a rename durable. File systems that cannot fsync a directory say EINVAL; there is
// nothing more to do on those, so that counts as success. Returns 0 or an errno value.
int fsync_directory(const std::filesystem::path& dir);

// Replaces `final_path` with `parts`, written one after another, so that a reader sees the old file or the whole
// new one, never a part: the bytes go to `final_path` + ".tmp.<pid>.<n>" (held under flock(LOCK_EX) until renamed,
// so another process can tell a live write from debris), which is fsynced, renamed over `final_path`, and the
// directory fsynced. On failure nothing is left behind and the reason is returned (its errno value in `err`, when
// given: ENOSPC or EDQUOT tell a full file system from one that refuses writes).
std::optional<std::string> write_file_atomically(const std::filesystem::path& final_path,
                                                 std::initializer_list<std::span<const uint8_t>> parts,
                                                 int* err = nullptr);

// Deletes `temp`, a temporary file of write_file_atomically, unless a live writer still holds it (a crashed or
// killed one released its lock when it died). Returns true if it was deleted.
bool remove_abandoned_temp(const std::filesystem::path& temp);

}  // namespace keepwarm

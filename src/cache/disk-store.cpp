// The disk tier of the prefix cache: entry file encoding and verification, the atomic background writer, and the
// index that ties keys to verified files. The format is documented in disk-store.h.
#include "cache/disk-store.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string_view>

#include "base/file-io.h"
#include "base/logger.h"

namespace keepwarm {

namespace fs = std::filesystem;

static_assert(std::endian::native == std::endian::little, "the entry format is little-endian and copied as is");

namespace {

constexpr char magic[8] = {'K', 'W', 'K', 'V', 'B', 'L', 'K', '1'};
constexpr uint32_t format_version = 1;
constexpr size_t fixed_prefix = 16;  // magic, version, header_size: the same in every version
constexpr size_t max_fingerprint = 1024;
// Everything in a header but the fingerprint bytes and the tokens.
constexpr uint64_t header_overhead = fixed_prefix + 4 + 2 * block_key_size + 4 * 4 + 3 * 8;
constexpr uint64_t max_header = 256ull << 20;  // 64M tokens: far beyond any context, so bigger means damage
constexpr std::string_view entry_suffix = ".kwkv";
constexpr std::string_view temp_marker = ".kwkv.tmp.";
constexpr size_t io_chunk = 4 << 20;  // checksum reads, in pieces of this size

// Fills a buffer of a size known up front (memcpy into place; vector::insert trips a GCC 12 -Wstringop-overflow
// false positive at -O3).
class byte_writer {
public:
    explicit byte_writer(size_t size) : out_(size) {}
    void bytes(const void* p, size_t n) {
        if (n == 0) return;
        assert(n <= out_.size() - at_);  // the size comes from header_overhead, as does the reader's
        std::memcpy(out_.data() + at_, p, n);
        at_ += n;
    }
    template <typename T>
    void scalar(T v) {
        bytes(&v, sizeof v);
    }
    void key(const block_key& k) {
        unsigned char b[block_key_size];
        block_key_to_bytes(k, b);
        bytes(b, sizeof b);
    }
    size_t position() const { return at_; }
    std::vector<uint8_t>& out() { return out_; }

private:
    std::vector<uint8_t> out_;
    size_t at_ = 0;
};

class byte_reader {
public:
    byte_reader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
    bool bytes(void* out, size_t n) {
        if (n > n_ - at_) return false;
        if (n == 0) return true;  // `out` may be an empty vector's null data()
        std::memcpy(out, p_ + at_, n);
        at_ += n;
        return true;
    }
    template <typename T>
    bool scalar(T& v) {
        return bytes(&v, sizeof v);
    }
    bool key(block_key& k) {
        unsigned char b[block_key_size];
        if (!bytes(b, sizeof b)) return false;
        k = block_key_from_bytes(b);
        return true;
    }
    size_t position() const { return at_; }

private:
    const uint8_t* p_;
    size_t n_;
    size_t at_ = 0;
};

std::vector<uint8_t> encode_header(const disk_entry_info& info, const std::string& fingerprint,
                                   uint64_t payload_checksum) {
    const uint64_t header_size = header_overhead + fingerprint.size() + 4 * info.tokens.size();
    byte_writer w(static_cast<size_t>(header_size));
    w.bytes(magic, sizeof magic);
    w.scalar(format_version);
    w.scalar(static_cast<uint32_t>(header_size));
    w.scalar(static_cast<uint32_t>(fingerprint.size()));
    w.bytes(fingerprint.data(), fingerprint.size());
    w.key(info.key);
    w.key(info.parent);
    w.scalar(info.start);
    w.scalar(info.end);
    w.scalar(info.kind);
    w.scalar(static_cast<uint32_t>(info.tokens.size()));
    w.bytes(info.tokens.data(), info.tokens.size() * sizeof(llama_token));
    w.scalar(info.payload_bytes);
    w.scalar(payload_checksum);
    w.scalar(static_cast<uint64_t>(XXH3_64bits(w.out().data(), w.position())));
    return std::move(w.out());
}

struct header_verdict {
    enum status_t { ok, corrupt, foreign } status = ok;
    std::string reason;
    uint64_t header_size = 0;
    std::string fingerprint;
    disk_entry_info info;
    uint64_t payload_checksum = 0;
};

header_verdict corrupt(std::string reason) {
    header_verdict v;
    v.status = header_verdict::corrupt;
    v.reason = std::move(reason);
    return v;
}

// Reads and checks the header of an open entry file: magic, sizes, header checksum, version, internal consistency.
// Does not judge the fingerprint, the name or the payload.
header_verdict read_header(int fd, uint64_t file_size) {
    if (file_size < fixed_prefix) return corrupt("too short for a header (" + std::to_string(file_size) + " bytes)");
    uint8_t prefix[fixed_prefix];
    if (int err = read_exact(fd, prefix, sizeof prefix, 0)) return corrupt("read failed: " + read_error_text(err));
    if (std::memcmp(prefix, magic, sizeof magic) != 0) return corrupt("bad magic (not a keepwarm cache entry)");
    uint32_t version = 0, header_size = 0;
    std::memcpy(&version, prefix + 8, 4);
    std::memcpy(&header_size, prefix + 12, 4);
    if (header_size < header_overhead || header_size > max_header)
        return corrupt("implausible header size " + std::to_string(header_size));
    if (header_size > file_size)
        return corrupt("truncated: header size " + std::to_string(header_size) + " > file size " +
                       std::to_string(file_size));

    std::vector<uint8_t> header(header_size);
    if (int err = read_exact(fd, header.data(), header.size(), 0))
        return corrupt("read failed: " + read_error_text(err));
    uint64_t stored_checksum = 0;
    std::memcpy(&stored_checksum, header.data() + header_size - 8, 8);
    if (XXH3_64bits(header.data(), header_size - 8) != stored_checksum) return corrupt("header checksum mismatch");

    header_verdict v;
    v.header_size = header_size;
    if (version != format_version) {
        v.status = header_verdict::foreign;
        v.reason =
            "format version " + std::to_string(version) + " (this build reads " + std::to_string(format_version) + ")";
        return v;
    }

    byte_reader r(header.data() + fixed_prefix, header_size - fixed_prefix - 8);
    uint32_t fingerprint_size = 0, token_count = 0;
    if (!r.scalar(fingerprint_size) || fingerprint_size > max_fingerprint) return corrupt("malformed header");
    v.fingerprint.resize(fingerprint_size);
    disk_entry_info& info = v.info;
    if (!r.bytes(v.fingerprint.data(), fingerprint_size) || !r.key(info.key) || !r.key(info.parent) ||
        !r.scalar(info.start) || !r.scalar(info.end) || !r.scalar(info.kind) || !r.scalar(token_count))
        return corrupt("malformed header");
    if (info.start < 0 || info.end < info.start ||
        static_cast<int64_t>(token_count) != static_cast<int64_t>(info.end) - info.start)
        return corrupt("token count " + std::to_string(token_count) + " does not match [" + std::to_string(info.start) +
                       ", " + std::to_string(info.end) + ")");
    // The count is checked against what the header still holds before anything is allocated for it: a header whose
    // checksum is right can still claim billions of tokens.
    const uint64_t header_left = header_size - fixed_prefix - 8 - r.position();
    if (uint64_t{token_count} * sizeof(llama_token) > header_left)
        return corrupt("token count " + std::to_string(token_count) + " is more than the header holds");
    info.tokens.resize(token_count);
    if (!r.bytes(info.tokens.data(), token_count * sizeof(llama_token)) || !r.scalar(info.payload_bytes) ||
        !r.scalar(v.payload_checksum) || r.position() != header_size - fixed_prefix - 8)
        return corrupt("malformed header");
    return v;
}

// The size check shared by open() and get(): the file must end exactly where the payload does.
std::optional<std::string> size_mismatch(uint64_t file_size, uint64_t header_size, uint64_t payload_bytes) {
    const uint64_t expected = header_size + payload_bytes;
    if (file_size < expected)
        return "truncated: " + std::to_string(file_size) + " bytes, header says " + std::to_string(expected);
    if (file_size > expected) return std::to_string(file_size - expected) + " unexpected bytes after the payload";
    return std::nullopt;
}

// Streams the payload through XXH3-64 without holding it in memory.
std::optional<std::string> verify_payload_streaming(int fd, uint64_t offset, uint64_t size, uint64_t expected) {
    // Heap state: the struct is opaque without XXH_STATIC_LINKING_ONLY.
    std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
    if (!state) return std::string("out of memory");
    XXH3_64bits_reset(state.get());
    std::vector<uint8_t> buf(static_cast<size_t>(std::min<uint64_t>(size, io_chunk)));
    while (size > 0) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(size, buf.size()));
        if (int err = read_exact(fd, buf.data(), n, offset)) return "read failed: " + read_error_text(err);
        XXH3_64bits_update(state.get(), buf.data(), n);
        offset += n;
        size -= n;
    }
    if (XXH3_64bits_digest(state.get()) != expected) return std::string("payload checksum mismatch");
    return std::nullopt;
}

bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Moves a damaged file to rejected/ (deletes it if that fails) so it is never loaded again.
void move_aside(const fs::path& file) {
    std::error_code ec;
    const fs::path rejected = file.parent_path() / "rejected";
    fs::create_directories(rejected, ec);
    if (!ec) fs::rename(file, rejected / file.filename(), ec);
    if (ec) fs::remove(file, ec);
}

}  // namespace

disk_store::disk_store(std::filesystem::path dir, uint64_t budget_bytes, std::string model_fingerprint,
                       file_writer write_file)
    : dir_(std::move(dir)),
      budget_(budget_bytes),
      fingerprint_(std::move(model_fingerprint)),
      write_file_(write_file ? std::move(write_file) : file_writer(write_file_atomically)) {
    if (fingerprint_.size() > max_fingerprint)
        throw std::invalid_argument("disk cache: model fingerprint longer than " + std::to_string(max_fingerprint));
}

disk_store::~disk_store() {
    {
        std::lock_guard lock(index_mu_);
        stopping_ = true;
    }
    work_cv_.notify_all();
    if (writer_.joinable()) writer_.join();
}

void disk_store::queue(disk_op op) {
    ops_.push_back(op);
    // Started with the first write or deletion: a store that is only read (a start-up that finds nothing to change)
    // never needs one.
    if (!writer_.joinable()) writer_ = std::thread(&disk_store::writer_loop, this);
    work_cv_.notify_one();
}

uint64_t disk_store::entry_file_bytes(const disk_entry_info& info, uint64_t payload_bytes,
                                      const std::string& model_fingerprint) {
    return header_overhead + model_fingerprint.size() + 4 * info.tokens.size() + payload_bytes;
}

fs::path disk_store::entry_path(const block_key& key) const {
    return dir_ / (key.hex() + std::string(entry_suffix));
}

void disk_store::log(const std::string& message) const {
    log::warn("disk cache", "{}", message);
}

disk_store::open_report disk_store::open(bool verify_payloads) {
    fs::create_directories(dir_);
    open_report report;
    std::error_code ec;

    // The previous run's rejects were reported in its log; keeping them forever would grow the disk unboundedly.
    fs::remove_all(dir_ / "rejected", ec);

    std::vector<std::pair<disk_entry_info, uint64_t>> valid;  // info, file bytes
    for (const auto& dirent : fs::directory_iterator(dir_, ec)) {
        std::error_code entry_ec;
        if (!dirent.is_regular_file(entry_ec) || dirent.is_symlink(entry_ec)) continue;
        const fs::path path = dirent.path();
        const std::string name = path.filename().string();

        if (name.find(temp_marker) != std::string::npos) {
            if (remove_abandoned_temp(path)) {
                ++report.temp_removed;
                counters_.temp_removed++;
            }
            continue;
        }
        if (!ends_with(name, entry_suffix)) continue;

        auto reject = [&](const std::string& reason) {
            report.rejected.push_back(name + ": " + reason);
            counters_.rejected_at_open++;
            move_aside(path);
        };
        unique_fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
        struct stat st {};
        if (f.fd < 0 || ::fstat(f.fd, &st) != 0) {
            reject("cannot open: " + errno_text(errno));
            continue;
        }
        const uint64_t file_size = static_cast<uint64_t>(st.st_size);
        header_verdict v = read_header(f.fd, file_size);
        if (v.status == header_verdict::corrupt) {
            reject(v.reason);
            continue;
        }
        if (v.status == header_verdict::foreign) {
            report.foreign.push_back(name + ": " + v.reason);
            counters_.foreign_at_open++;
            continue;
        }
        if (v.fingerprint != fingerprint_) {
            report.foreign.push_back(name + ": another model (fingerprint " + v.fingerprint + ")");
            counters_.foreign_at_open++;
            continue;
        }
        const std::string stem = name.substr(0, name.size() - entry_suffix.size());
        if (stem != v.info.key.hex()) {
            reject("file name does not match its key " + v.info.key.hex());
            continue;
        }
        if (auto why = size_mismatch(file_size, v.header_size, v.info.payload_bytes)) {
            reject(*why);
            continue;
        }
        if (verify_payloads) {
            if (auto why = verify_payload_streaming(f.fd, v.header_size, v.info.payload_bytes, v.payload_checksum)) {
                reject(*why);
                continue;
            }
        }
        v.info.written =
            std::chrono::system_clock::time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(
                std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec)));
        valid.emplace_back(std::move(v.info), file_size);
    }
    if (ec) throw fs::filesystem_error("disk cache: cannot list", dir_, ec);

    std::lock_guard lock(index_mu_);
    for (auto& [info, file_bytes] : valid) {
        if (index_.contains(info.key) || pending_.contains(info.key)) continue;
        const block_key key = info.key;
        index_.emplace(key, indexed_entry{std::move(info), file_bytes, next_generation_++});
        bytes_ += file_bytes;
        ++report.entries;
        report.bytes += file_bytes;
    }
    return report;
}

bool disk_store::put(disk_entry_info info, std::shared_ptr<const std::vector<uint8_t>> payload) {
    auto refuse = [&](const std::string& why) {
        counters_.refused++;
        log("not storing " + info.key.hex() + ": " + why);
        return false;
    };
    if (!payload) return refuse("no payload");
    if (info.start < 0 || info.end < info.start ||
        static_cast<int64_t>(info.tokens.size()) != static_cast<int64_t>(info.end) - info.start)
        return refuse("token count " + std::to_string(info.tokens.size()) + " does not match [" +
                      std::to_string(info.start) + ", " + std::to_string(info.end) + ")");
    if (info.tokens.size() > (max_header - header_overhead - max_fingerprint) / sizeof(llama_token))
        return refuse(std::to_string(info.tokens.size()) + " tokens in one block: beyond what open() would accept");
    info.payload_bytes = payload->size();
    info.written = std::chrono::system_clock::now();
    const uint64_t file_bytes = entry_file_bytes(info, info.payload_bytes, fingerprint_);
    if (file_bytes > budget_)
        return refuse(std::to_string(file_bytes) + " bytes exceed the whole budget of " + std::to_string(budget_));

    std::lock_guard lock(index_mu_);
    if (index_.contains(info.key)) return true;
    if (auto it = pending_.find(info.key); it != pending_.end()) {
        if (it->second.cancelled) {  // erased while being written: same key, same content, so keep that write
            it->second.cancelled = false;
            bytes_ += it->second.file_bytes;
        }
        return true;
    }
    const block_key key = info.key;
    pending_.emplace(key, pending_write{std::move(info), std::move(payload), file_bytes});
    bytes_ += file_bytes;
    queue(disk_op{op_kind::write, key});
    return true;
}

std::optional<std::vector<uint8_t>> disk_store::get(const block_key& key, std::string* error) {
    uint64_t generation = 0, file_bytes = 0;
    {
        std::unique_lock lock(index_mu_);
        if (auto it = pending_.find(key); it != pending_.end() && !it->second.cancelled) {
            auto payload = it->second.payload;
            lock.unlock();
            counters_.reads++;
            return *payload;
        }
        auto it = index_.find(key);
        if (it == index_.end()) {
            counters_.misses++;
            if (error) *error = "not present";
            return std::nullopt;
        }
        generation = it->second.generation;
        file_bytes = it->second.file_bytes;
    }

    const fs::path path = entry_path(key);
    std::optional<std::vector<uint8_t>> payload;
    auto verify = [&]() -> std::optional<std::string> {
        unique_fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
        struct stat st {};
        if (f.fd < 0 || ::fstat(f.fd, &st) != 0) return "cannot open: " + errno_text(errno);
        const uint64_t file_size = static_cast<uint64_t>(st.st_size);
        header_verdict v = read_header(f.fd, file_size);
        if (v.status != header_verdict::ok) return v.reason;
        if (v.fingerprint != fingerprint_) return std::string("fingerprint changed on disk");
        if (v.info.key != key) return "file holds key " + v.info.key.hex();
        if (auto why = size_mismatch(file_size, v.header_size, v.info.payload_bytes)) return why;
        if (file_size != file_bytes) return "size changed on disk since indexed";
        (void)::posix_fadvise(f.fd, 0, 0, POSIX_FADV_SEQUENTIAL);
        std::vector<uint8_t> data(static_cast<size_t>(v.info.payload_bytes));
        if (int err = read_exact(f.fd, data.data(), data.size(), v.header_size))
            return "read failed: " + read_error_text(err);
        if (XXH3_64bits(data.data(), data.size()) != v.payload_checksum)
            return std::string("payload checksum mismatch");
        payload = std::move(data);
        return std::nullopt;
    };
    const auto why = verify();
    if (!why) {
        counters_.reads++;
        counters_.bytes_read += payload->size();
        return payload;
    }

    std::unique_lock lock(index_mu_);
    auto it = index_.find(key);
    if (it == index_.end() || it->second.generation != generation) {
        // Erased (and maybe rewritten) while we read: not damage, just a miss.
        lock.unlock();
        counters_.misses++;
        if (error) *error = "entry changed while being read";
        return std::nullopt;
    }
    bytes_ -= it->second.file_bytes;
    index_.erase(it);
    queue(disk_op{op_kind::quarantine, key});
    lock.unlock();
    counters_.read_failures++;
    log(path.filename().string() + ": " + *why + "; dropped and moved to rejected/");
    if (error) *error = *why;
    return std::nullopt;
}

bool disk_store::contains(const block_key& key) const {
    std::lock_guard lock(index_mu_);
    if (index_.contains(key)) return true;
    auto it = pending_.find(key);
    return it != pending_.end() && !it->second.cancelled;
}

std::optional<disk_entry_info> disk_store::info(const block_key& key) const {
    std::lock_guard lock(index_mu_);
    if (auto it = index_.find(key); it != index_.end()) return it->second.info;
    if (auto it = pending_.find(key); it != pending_.end() && !it->second.cancelled) return it->second.info;
    return std::nullopt;
}

bool disk_store::erase(const block_key& key) {
    std::lock_guard lock(index_mu_);
    if (auto it = index_.find(key); it != index_.end()) {
        bytes_ -= it->second.file_bytes;
        index_.erase(it);
        // Deleting on the writer thread keeps the order with a later put() of the same key.
        queue(disk_op{op_kind::remove, key});
        counters_.evicted++;
        return true;
    }
    auto it = pending_.find(key);
    if (it == pending_.end() || it->second.cancelled) return false;
    bytes_ -= it->second.file_bytes;
    if (it->second.in_flight)
        it->second.cancelled = true;  // the writer deletes the file once it is written
    else
        pending_.erase(it);  // its queued write op finds nothing and is skipped
    counters_.evicted++;
    return true;
}

std::vector<disk_entry_info> disk_store::entries() const {
    std::lock_guard lock(index_mu_);
    std::vector<disk_entry_info> out;
    out.reserve(index_.size() + pending_.size());
    for (const auto& [key, e] : index_) out.push_back(e.info);
    for (const auto& [key, p] : pending_)
        if (!p.cancelled) out.push_back(p.info);
    return out;
}

namespace {
// How long a full disk keeps the budget down, and how often a failed write is logged: a minute is short enough for
// an operator who frees space to see the tier grow again, long enough not to retry (or log) every block.
constexpr auto disk_full_hold = std::chrono::minutes(1);
constexpr auto failure_log_interval = std::chrono::minutes(1);
}  // namespace

uint64_t disk_store::budget_in_force() const {
    std::lock_guard lock(index_mu_);
    if (disk_full_at_ && std::chrono::steady_clock::now() - *disk_full_at_ < disk_full_hold) {
        return std::min(budget_, held_when_full_);
    }
    return budget_;
}

std::optional<std::string> disk_store::write_failure_line(const block_key& key, const std::string& error,
                                                          bool disk_full) {
    const auto now = std::chrono::steady_clock::now();
    if (failure_logged_at_ && now - *failure_logged_at_ < failure_log_interval) {
        ++failures_not_logged_;
        return std::nullopt;
    }
    std::string line = "write of " + key.hex() + " failed: " + error;
    if (failures_not_logged_ > 0) line += " (" + std::to_string(failures_not_logged_) + " more failed before it)";
    if (disk_full) {
        line += "; the disk is full: the tier keeps to the " + std::to_string(held_when_full_) +
                " bytes it holds for a minute, evicting to make room";
    }
    line += "; further failures are logged once a minute";
    failure_logged_at_ = now;
    failures_not_logged_ = 0;
    return line;
}

uint64_t disk_store::bytes() const {
    std::lock_guard lock(index_mu_);
    return bytes_;
}

size_t disk_store::size() const {
    std::lock_guard lock(index_mu_);
    size_t n = index_.size();
    for (const auto& [key, p] : pending_)
        if (!p.cancelled) ++n;
    return n;
}

void disk_store::flush() {
    std::unique_lock lock(index_mu_);
    idle_cv_.wait(lock, [&] { return ops_.empty() && !writer_busy_; });
}

void disk_store::writer_loop() {
    // Writing behind is background work. At normal priority it took a core from the model's threads for a third of a
    // second while a cold prompt was computed beside four demoted 8K conversations (their 128 MiB written), and those
    // threads wait for each other at every barrier of the graph. SCHED_IDLE runs it only on a core nobody else wants;
    // until then the entries are in RAM, and flush() still waits for them.
    sched_param idle{};
    if (const int rc = pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle); rc != 0) {
        log(std::string("could not lower the writer's priority: ") + std::strerror(rc));
    }
    std::unique_lock lock(index_mu_);
    for (;;) {
        work_cv_.wait(lock, [&] { return stopping_ || !ops_.empty(); });
        if (ops_.empty()) break;  // stopping, and nothing left to do
        const disk_op op = std::move(ops_.front());
        ops_.pop_front();
        writer_busy_ = true;

        if (op.kind == op_kind::write) {
            auto it = pending_.find(op.key);
            if (it == pending_.end()) {
                // Erased before it started.
            } else if (stopping_) {
                bytes_ -= it->second.file_bytes;
                pending_.erase(it);
                counters_.abandoned++;
            } else {
                it->second.in_flight = true;
                const disk_entry_info info = it->second.info;
                const auto payload = it->second.payload;
                lock.unlock();

                const fs::path final_path = entry_path(op.key);
                const uint64_t checksum = XXH3_64bits(payload->data(), payload->size());
                int err = 0;
                const auto error =
                    write_file_(final_path, {encode_header(info, fingerprint_, checksum), *payload}, &err);

                lock.lock();
                // Still there: only this thread removes an entry that is in flight.
                auto done = pending_.find(op.key);
                const bool cancelled = done->second.cancelled;
                const uint64_t file_bytes = done->second.file_bytes;
                pending_.erase(done);
                if (error) {
                    if (!cancelled) bytes_ -= file_bytes;
                    counters_.write_failures++;
                    const bool disk_full = err == ENOSPC || err == EDQUOT;
                    if (disk_full) {
                        counters_.disk_full++;
                        disk_full_at_ = std::chrono::steady_clock::now();
                        held_when_full_ = 0;
                        for (const auto& [key, entry] : index_) held_when_full_ += entry.file_bytes;
                    }
                    if (const auto line = write_failure_line(op.key, *error, disk_full)) {
                        lock.unlock();
                        log(*line);
                        lock.lock();
                    }
                } else if (cancelled) {
                    lock.unlock();
                    ::unlink(final_path.c_str());
                    lock.lock();
                } else {
                    index_.emplace(op.key, indexed_entry{info, file_bytes, next_generation_++});
                    counters_.writes++;
                    counters_.bytes_written += file_bytes;
                }
            }
        } else {
            lock.unlock();
            const fs::path path = entry_path(op.key);
            if (op.kind == op_kind::remove)
                ::unlink(path.c_str());
            else
                move_aside(path);
            lock.lock();
        }

        writer_busy_ = false;
        if (ops_.empty()) idle_cv_.notify_all();
    }
    writer_busy_ = false;
    idle_cv_.notify_all();
}

}  // namespace keepwarm

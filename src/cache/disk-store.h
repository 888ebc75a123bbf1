// The disk tier of the prefix cache: a content-addressed directory of KV blocks, one file per block, written
// atomically by a background thread and verified by checksum at start-up and again at every read.
//
// Threading: every public method is safe from any thread. One mutex (index_mu_) guards the index, the write queue
// and the byte count; no file I/O happens while it is held. Writes, deletions and quarantines run on the store's
// own writer thread in the order they were asked for; get() reads on the caller's thread.
//
// Directory layout:
//   <dir>/<key hex>.kwkv               one entry (format below)
//   <dir>/<key hex>.kwkv.tmp.<pid>.<n> a write in progress; the writer holds flock(LOCK_EX) on it until renamed.
//                                      open() deletes those no live writer holds (left by a crash or a kill).
//   <dir>/rejected/                    entries that failed verification, moved aside so they are never loaded
//                                      again but can still be inspected. open() empties it first, so it holds
//                                      at most one run's worth.
//
// Entry file format, version 1 (integers little-endian; a key is its 16 canonical bytes, see block-key.h):
//   off  size
//   0    8    magic "KWKVBLK1"
//   8    4    u32 format version (1)
//   12   4    u32 header_size: bytes from offset 0 through the header checksum; the payload starts there
//   16   4    u32 fingerprint length n (at most 1024)
//   20   n    model fingerprint (as given to the constructor; model_fingerprint() makes 32 hex digits)
//        16   key
//        16   parent key
//        4    i32 start
//        4    i32 end
//        4    u32 kind (caller-defined: 0 = KV block, 1 = recurrent-state checkpoint)
//        4    u32 token count (== end - start)
//        4*c  i32 token ids of [start, end)
//        8    u64 payload size
//        8    u64 XXH3-64 of the payload
//        8    u64 XXH3-64 of header bytes [0, header_size - 8)    <- always the last 8 bytes of the header
//   header_size  payload
//   The file is exactly header_size + payload size bytes. Offsets 0..16 and the position of the header checksum are
//   fixed for every future version, so a file of another version can be recognised (and left alone) safely.
//
// Whose files are whose: an entry whose header verifies but whose fingerprint or format version is not ours belongs
// to another model (or another keepwarm version) sharing the directory. It is reported by open() as foreign, left on
// disk untouched, kept out of the index and not counted against our budget. Anything that fails verification is
// ours to clean up: it is moved to rejected/.
//
// Budget: bytes() counts whole files (header + payload) of indexed entries plus queued writes. The store refuses
// (put returns false) an entry that alone exceeds the budget; otherwise it accepts it even if the total then exceeds
// the budget: choosing what to evict is the caller's business (erase). Use entry_file_bytes() to make room first.
// A file system that fills up before the budget is reached (ENOSPC, EDQUOT) lowers budget_in_force() to what the
// store held then, for a minute at a time, so that the caller's evictions make room for new entries instead of the
// tier freezing on its oldest ones. Failed writes are logged once a minute at most, with how many failed since.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cache/block-key.h"
#include "llama.h"

namespace keepwarm {

struct disk_entry_info {
    block_key key, parent;
    int32_t start = 0, end = 0;
    uint32_t kind = 0;                // caller-defined: 0 = KV block, 1 = recurrent-state checkpoint
    std::vector<llama_token> tokens;  // the block's own tokens, [start, end)
    uint64_t payload_bytes = 0;       // set by put() from the payload
    // When the entry was written: its file's modification time for an entry open() indexed, put()'s time for one
    // put in this run (not in the file format: what a restart reads first, newest first).
    std::chrono::system_clock::time_point written{};
};

struct disk_store_counters {
    std::atomic<uint64_t> writes{0};            // entries written and indexed
    std::atomic<uint64_t> write_failures{0};    // I/O errors while writing (disk full, ...); the temp file is removed
    std::atomic<uint64_t> disk_full{0};         // of those, the file system was full (ENOSPC, EDQUOT)
    std::atomic<uint64_t> refused{0};           // put() refused: larger than the whole budget, or inconsistent info
    std::atomic<uint64_t> abandoned{0};         // queued writes dropped because the store was destroyed first
    std::atomic<uint64_t> reads{0};             // get() hits (from disk or from a queued write)
    std::atomic<uint64_t> misses{0};            // get() of a key not present
    std::atomic<uint64_t> read_failures{0};     // get() found the file damaged; the entry was dropped
    std::atomic<uint64_t> rejected_at_open{0};  // files that failed verification in open()
    std::atomic<uint64_t> foreign_at_open{0};   // files of another model / format version, left alone
    std::atomic<uint64_t> temp_removed{0};      // leftover temporary files deleted by open()
    std::atomic<uint64_t> evicted{0};           // entries erased by the caller
    std::atomic<uint64_t> bytes_written{0};     // file bytes
    std::atomic<uint64_t> bytes_read{0};        // payload bytes returned by get() from disk
};

class disk_store {
public:
    // Nothing touches the disk until open(). `model_fingerprint` is written into every entry and only entries that
    // carry the same one are loaded.
    // `write_file` writes one entry (tests pass one that fails as a full or read-only file system would).
    using file_writer = std::function<std::optional<std::string>(
        const std::filesystem::path&, std::initializer_list<std::span<const uint8_t>>, int* err)>;
    disk_store(std::filesystem::path dir, uint64_t budget_bytes, std::string model_fingerprint,
               file_writer write_file = {});
    // Finishes the write in progress, drops the queued ones that have not started (counted as abandoned; call
    // flush() first to keep them), performs queued deletions, and joins the writer thread.
    ~disk_store();

    disk_store(const disk_store&) = delete;
    disk_store& operator=(const disk_store&) = delete;

    struct open_report {
        size_t entries = 0;                 // indexed (ours and valid)
        uint64_t bytes = 0;                 // their file bytes
        std::vector<std::string> rejected;  // "file: reason", moved to rejected/
        std::vector<std::string> foreign;   // "file: reason", another model or format version, left in place
        size_t temp_removed = 0;
    };
    // Call once, before the other methods. Creates the directory if missing (throws std::filesystem::filesystem_error
    // if it cannot create or list it), empties rejected/, removes leftover temporary files, and verifies every *.kwkv:
    // magic, header checksum, version, fingerprint, file name == key, token count == end - start, file size == header +
    // payload and, when `verify_payloads`, the payload checksum (reads every byte: O(total size); get() re-verifies
    // anyway, so false only defers the detection of a damaged payload to its first read).
    open_report open(bool verify_payloads = true);

    // Queues the entry for writing and returns at once (no I/O). payload_bytes is taken from `payload`, which must
    // not change afterwards. Returns true if queued or already present (a no-op: the key names the content); false
    // if refused (bigger than the budget, tokens.size() != end - start, or end < start), with a line on stderr.
    bool put(disk_entry_info info, std::shared_ptr<const std::vector<uint8_t>> payload);

    // The payload, or nullopt if absent or damaged. A queued entry is served from memory. A file is re-verified
    // (header against the index, size, payload checksum); on a mismatch the entry is dropped from the index, its
    // file moved to rejected/, read_failures counted and `error` (if given) says why.
    std::optional<std::vector<uint8_t>> get(const block_key& key, std::string* error = nullptr);

    bool contains(const block_key& key) const;                        // indexed or queued
    std::optional<disk_entry_info> info(const block_key& key) const;  // indexed or queued
    // Drops the entry: its file is deleted by the writer thread (after anything queued before), or its queued write
    // is cancelled. Returns false if the key was not present. Counted as evicted.
    bool erase(const block_key& key);
    std::vector<disk_entry_info> entries() const;  // indexed and queued, in no particular order

    uint64_t bytes() const;  // file bytes of indexed and queued entries (foreign files not included)
    size_t size() const;     // indexed and queued entries
    uint64_t budget() const { return budget_; }
    // What the caller should keep bytes() to: budget(), or less for a minute after a write found the disk full.
    uint64_t budget_in_force() const;
    const std::string& fingerprint() const { return fingerprint_; }
    const std::filesystem::path& directory() const { return dir_; }
    const disk_store_counters& counters() const { return counters_; }

    // Blocks until every write, deletion and quarantine asked for so far is done (for tests and shutdown).
    void flush();

    // Size on disk of an entry (header + payload): what put() adds to bytes().
    static uint64_t entry_file_bytes(const disk_entry_info& info, uint64_t payload_bytes,
                                     const std::string& model_fingerprint);

private:
    struct indexed_entry {
        disk_entry_info info;
        uint64_t file_bytes = 0;
        uint64_t generation = 0;  // tells get() whether the entry it read is still the one indexed
    };
    struct pending_write {
        disk_entry_info info;
        std::shared_ptr<const std::vector<uint8_t>> payload;
        uint64_t file_bytes = 0;
        bool in_flight = false;  // the writer thread is writing it now
        bool cancelled = false;  // erased while in flight: delete the file once written
    };
    enum class op_kind { write, remove, quarantine };
    struct disk_op {
        op_kind kind;
        block_key key;
    };

    void writer_loop();
    void queue(disk_op op);  // for the writer thread, started on first use; index_mu_ held
    void log(const std::string& message) const;
    // A failed write's log line, or nothing while such lines are held back (one a minute); index_mu_ held.
    std::optional<std::string> write_failure_line(const block_key& key, const std::string& error, bool disk_full);
    std::filesystem::path entry_path(const block_key& key) const;

    const std::filesystem::path dir_;
    const uint64_t budget_;
    const std::string fingerprint_;
    const file_writer write_file_;
    disk_store_counters counters_;

    mutable std::mutex index_mu_;
    // Guarded by index_mu_:
    std::unordered_map<block_key, indexed_entry> index_;
    std::unordered_map<block_key, pending_write> pending_;
    std::deque<disk_op> ops_;
    uint64_t bytes_ = 0;
    uint64_t next_generation_ = 1;
    bool writer_busy_ = false;
    std::optional<std::chrono::steady_clock::time_point> disk_full_at_;  // the last write that found the disk full
    uint64_t held_when_full_ = 0;                                        // indexed bytes then
    std::optional<std::chrono::steady_clock::time_point> failure_logged_at_;
    uint64_t failures_not_logged_ = 0;
    bool stopping_ = false;
    std::condition_variable work_cv_;  // ops_ non-empty or stopping_
    std::condition_variable idle_cv_;  // ops_ empty and !writer_busy_

    std::thread writer_;  // last member: started by the first queue(), guarded by index_mu_ until then
};

}  // namespace keepwarm

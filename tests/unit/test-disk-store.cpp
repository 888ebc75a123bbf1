// disk_store: the disk tier of the prefix cache. Round trips, restarts, every kind of damage a file can take,
// concurrent use, and a writer killed in the middle of its work.
#include "cache/disk-store.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>
#include <sched.h>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "base/file-io.h"
#include "base/logger.h"
#include "test-temp-dir.h"

#include <xxhash.h>

using keepwarm::block_key;
using keepwarm::chain_block_key;
using keepwarm::disk_entry_info;
using keepwarm::disk_store;
using keepwarm::root_block_key;
using tokens = std::vector<llama_token>;
using payload_ptr = std::shared_ptr<const std::vector<uint8_t>>;
namespace fs = std::filesystem;

namespace {

const std::string fingerprint = "0123456789abcdef0123456789abcdef";
constexpr uint64_t big_budget = 1ull << 30;

// A fresh directory per test, removed at the end.
struct temp_dir : keepwarm::test_support::temp_dir {
    temp_dir() : keepwarm::test_support::temp_dir("disk-store") {}
};

payload_ptr make_payload(size_t size, uint32_t seed) {
    auto bytes = std::make_shared<std::vector<uint8_t>>(size);
    std::mt19937 rng(seed);
    for (auto& b : *bytes) b = static_cast<uint8_t>(rng());
    return bytes;
}

disk_entry_info make_block(const block_key& parent, int32_t start, tokens t, uint32_t kind = 0) {
    disk_entry_info info;
    info.key = chain_block_key(parent, t);
    info.parent = parent;
    info.start = start;
    info.end = start + static_cast<int32_t>(t.size());
    info.kind = kind;
    info.tokens = std::move(t);
    return info;
}

// Block `i` of an independent one-block chain, so tests can make many distinct entries.
disk_entry_info block_n(int i) {
    return make_block(root_block_key(fingerprint), 0, tokens{i, i + 1, i + 2});
}

fs::path file_of(const fs::path& dir, const block_key& key) {
    return dir / (key.hex() + ".kwkv");
}

void flip_byte(const fs::path& path, uint64_t offset) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(offset));
    char c = 0;
    f.get(c);
    f.seekp(static_cast<std::streamoff>(offset));
    f.put(static_cast<char>(c ^ 0x01));
    ASSERT_TRUE(f.good());
}

size_t count_files(const fs::path& dir, std::string_view containing) {
    size_t n = 0;
    for (const auto& e : fs::directory_iterator(dir))
        if (e.is_regular_file() && e.path().filename().string().find(containing) != std::string::npos) ++n;
    return n;
}

bool has_reason(const std::vector<std::string>& lines, const block_key& key, const std::string& reason) {
    for (const auto& line : lines)
        if (line.starts_with(key.hex()) && line.find(reason) != std::string::npos) return true;
    return false;
}

}  // namespace

TEST(disk_store, put_flush_get_round_trip) {
    temp_dir dir;
    disk_store store(dir.path, big_budget, fingerprint);
    const auto report = store.open();
    EXPECT_EQ(report.entries, 0u);
    EXPECT_TRUE(fs::is_directory(dir.path));

    const auto info = block_n(1);
    const auto payload = make_payload(100000, 1);
    EXPECT_TRUE(store.put(info, payload));
    EXPECT_TRUE(store.contains(info.key));
    // Queued or written, the payload is there at once.
    EXPECT_EQ(store.get(info.key), *payload);

    store.flush();
    EXPECT_TRUE(fs::exists(file_of(dir.path, info.key)));
    EXPECT_EQ(store.counters().writes, 1u);
    EXPECT_EQ(store.size(), 1u);
    EXPECT_EQ(store.bytes(), fs::file_size(file_of(dir.path, info.key)));
    EXPECT_EQ(store.bytes(), disk_store::entry_file_bytes(info, payload->size(), fingerprint));

    // The first get may have raced the writer and read the file already, so count this read alone.
    const uint64_t read_before = store.counters().bytes_read;
    std::string error;
    const auto back = store.get(info.key, &error);
    ASSERT_TRUE(back) << error;
    EXPECT_EQ(*back, *payload);
    EXPECT_EQ(store.counters().bytes_read - read_before, payload->size());
    EXPECT_FALSE(store.get(block_n(2).key));
    EXPECT_EQ(store.counters().misses, 1u);

    // Content-addressed: the same key again is a no-op.
    EXPECT_TRUE(store.put(info, payload));
    store.flush();
    EXPECT_EQ(store.counters().writes, 1u);
}

// Threads of this process whose scheduling policy is SCHED_IDLE (field 41 of /proc/self/task/<tid>/stat).
static int idle_threads() {
    int n = 0;
    for (const auto& task : fs::directory_iterator("/proc/self/task")) {
        std::ifstream in(task.path() / "stat");
        std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        std::istringstream fields(stat.substr(stat.rfind(')') + 2));  // from field 3, after "pid (comm) "
        std::string field;
        for (int i = 3; i <= 41; ++i) fields >> field;
        if (fields && field == std::to_string(SCHED_IDLE)) ++n;
    }
    return n;
}

// Writing behind is background work: the writer must not take a core from the model's threads (which wait for each
// other at every barrier), so it runs at SCHED_IDLE, and what it queued is still written.
TEST(disk_store, the_writer_runs_only_on_an_idle_core) {
    temp_dir dir;
    const int before = idle_threads();
    disk_store store(dir.path, big_budget, fingerprint);
    store.open();
    const auto info = block_n(7);
    ASSERT_TRUE(store.put(info, make_payload(1000, 7)));
    store.flush();
    EXPECT_TRUE(fs::exists(file_of(dir.path, info.key)));
    EXPECT_EQ(idle_threads(), before + 1);
}

TEST(disk_store, reopen_finds_entries_after_restart) {
    temp_dir dir;
    const block_key root = root_block_key(fingerprint);
    const auto a = make_block(root, 0, {1, 2, 3, 4});
    const auto b = make_block(a.key, 4, {5, 6, 7, 8});
    const auto c = make_block(b.key, 8, {9}, 1);
    uint64_t bytes_before = 0;
    {
        disk_store store(dir.path, big_budget, fingerprint);
        store.open();
        store.put(a, make_payload(1000, 1));
        store.put(b, make_payload(2000, 2));
        store.put(c, make_payload(0, 3));  // an empty payload is still an entry
        store.flush();
        bytes_before = store.bytes();
    }

    disk_store store(dir.path, big_budget, fingerprint);
    const auto report = store.open();
    EXPECT_EQ(report.entries, 3u);
    EXPECT_TRUE(report.rejected.empty());
    EXPECT_EQ(report.bytes, bytes_before);
    EXPECT_EQ(store.bytes(), bytes_before);

    const auto got_b = store.info(b.key);
    ASSERT_TRUE(got_b);
    EXPECT_EQ(got_b->parent, a.key);
    EXPECT_EQ(got_b->start, 4);
    EXPECT_EQ(got_b->end, 8);
    EXPECT_EQ(got_b->tokens, b.tokens);
    EXPECT_EQ(got_b->payload_bytes, 2000u);
    EXPECT_EQ(store.info(c.key)->kind, 1u);
    EXPECT_EQ(store.entries().size(), 3u);

    EXPECT_EQ(store.get(a.key), *make_payload(1000, 1));
    EXPECT_EQ(store.get(b.key), *make_payload(2000, 2));
    EXPECT_EQ(store.get(c.key), std::vector<uint8_t>{});
}

TEST(disk_store, erase_deletes_the_file_or_cancels_the_queued_write) {
    temp_dir dir;
    disk_store store(dir.path, big_budget, fingerprint);
    store.open();
    const auto a = block_n(1), b = block_n(2);
    store.put(a, make_payload(5000, 1));
    store.flush();
    ASSERT_TRUE(fs::exists(file_of(dir.path, a.key)));

    EXPECT_TRUE(store.erase(a.key));
    EXPECT_FALSE(store.contains(a.key));
    EXPECT_FALSE(store.erase(a.key));
    store.put(b, make_payload(5000, 2));
    EXPECT_TRUE(store.erase(b.key));  // queued or in flight: either way it must not stay
    store.flush();
    EXPECT_FALSE(fs::exists(file_of(dir.path, a.key)));
    EXPECT_FALSE(fs::exists(file_of(dir.path, b.key)));
    EXPECT_EQ(store.size(), 0u);
    EXPECT_EQ(store.bytes(), 0u);
    EXPECT_EQ(store.counters().evicted, 2u);

    // Erase then put again of the same key: the order holds, the entry survives.
    store.put(a, make_payload(5000, 1));
    store.flush();
    EXPECT_TRUE(store.erase(a.key));
    EXPECT_TRUE(store.put(a, make_payload(5000, 1)));
    store.flush();
    EXPECT_TRUE(fs::exists(file_of(dir.path, a.key)));
    EXPECT_EQ(store.get(a.key), *make_payload(5000, 1));
}

TEST(disk_store, refuses_an_entry_larger_than_the_budget_and_inconsistent_info) {
    temp_dir dir;
    disk_store store(dir.path, 4096, fingerprint);
    store.open();
    EXPECT_FALSE(store.put(block_n(1), make_payload(8192, 1)));
    EXPECT_TRUE(store.put(block_n(2), make_payload(1000, 2)));

    auto bad = block_n(3);
    bad.end = 7;  // 3 tokens cannot cover [0, 7)
    EXPECT_FALSE(store.put(bad, make_payload(10, 3)));
    EXPECT_FALSE(store.put(block_n(4), nullptr));

    store.flush();
    EXPECT_FALSE(store.contains(block_n(1).key));
    EXPECT_TRUE(store.contains(block_n(2).key));
    EXPECT_EQ(store.counters().refused, 3u);
    EXPECT_EQ(count_files(dir.path, ".kwkv"), 1u);
    EXPECT_LE(store.bytes(), store.budget());
}

TEST(disk_store, open_rejects_every_kind_of_damage_and_leaves_other_models_alone) {
    temp_dir dir;
    std::vector<disk_entry_info> blocks;
    for (int i = 0; i < 6; ++i) blocks.push_back(block_n(i * 10));
    const auto foreign = make_block(root_block_key("other"), 0, {1, 2});
    {
        disk_store store(dir.path, big_budget, fingerprint);
        store.open();
        for (size_t i = 0; i < blocks.size(); ++i) store.put(blocks[i], make_payload(4000, static_cast<uint32_t>(i)));
        disk_store other(dir.path, big_budget, "another-model-fingerprint");
        other.put(foreign, make_payload(4000, 99));
        store.flush();
        other.flush();
    }
    const auto& payload_flip = blocks[0];
    const auto& header_flip = blocks[1];
    const auto& truncated = blocks[2];
    const auto& garbage = blocks[3];
    const auto& renamed = blocks[4];
    const auto& intact = blocks[5];
    const auto renamed_to = block_n(1000).key;

    const auto size = fs::file_size(file_of(dir.path, payload_flip.key));
    flip_byte(file_of(dir.path, payload_flip.key), size - 10);
    flip_byte(file_of(dir.path, header_flip.key), 70);  // inside the keys
    fs::resize_file(file_of(dir.path, truncated.key), size - 1);
    std::ofstream(file_of(dir.path, garbage.key), std::ios::app | std::ios::binary) << "garbage";
    fs::rename(file_of(dir.path, renamed.key), file_of(dir.path, renamed_to));
    std::ofstream(dir.path / "deadbeef.kwkv") << "not an entry at all";

    disk_store store(dir.path, big_budget, fingerprint);
    const auto report = store.open();
    EXPECT_EQ(report.entries, 1u);
    EXPECT_EQ(report.rejected.size(), 6u);
    EXPECT_TRUE(has_reason(report.rejected, payload_flip.key, "payload checksum"));
    EXPECT_TRUE(has_reason(report.rejected, header_flip.key, "header checksum"));
    EXPECT_TRUE(has_reason(report.rejected, truncated.key, "truncated"));
    EXPECT_TRUE(has_reason(report.rejected, garbage.key, "after the payload"));
    EXPECT_TRUE(has_reason(report.rejected, renamed_to, "does not match its key"));
    for (const auto& line : report.rejected) SCOPED_TRACE(line);
    ASSERT_EQ(report.foreign.size(), 1u);
    EXPECT_TRUE(has_reason(report.foreign, foreign.key, "another model"));
    EXPECT_EQ(store.counters().rejected_at_open, 6u);

    for (const auto& key :
         {payload_flip.key, header_flip.key, truncated.key, garbage.key, renamed.key, renamed_to, foreign.key}) {
        EXPECT_FALSE(store.contains(key));
        EXPECT_FALSE(store.get(key));
    }
    EXPECT_TRUE(store.get(intact.key));
    EXPECT_EQ(store.bytes(), fs::file_size(file_of(dir.path, intact.key)));  // the foreign file is not ours to count

    // Damaged files are moved aside, the other model's file stays where it was.
    EXPECT_EQ(count_files(dir.path / "rejected", ".kwkv"), 6u);
    EXPECT_TRUE(fs::exists(file_of(dir.path, foreign.key)));
    EXPECT_EQ(count_files(dir.path, ".kwkv"), 2u);

    // And the other model still finds its entry.
    disk_store other(dir.path, big_budget, "another-model-fingerprint");
    const auto other_report = other.open();
    EXPECT_EQ(other_report.entries, 1u);
    EXPECT_EQ(other_report.foreign.size(), 1u);
    EXPECT_EQ(other.get(foreign.key), *make_payload(4000, 99));
}

// A header whose checksum is right but whose token count is far more than it holds (found by fuzz/disk-entry): it was
// allocated before it was checked, so one crafted file in the cache folder made start-up allocate gigabytes.
TEST(disk_store, open_rejects_a_token_count_beyond_the_header_before_allocating_it) {
    temp_dir dir;
    const auto block = block_n(7);
    {
        disk_store store(dir.path, big_budget, fingerprint);
        store.open();
        store.put(block, make_payload(100, 7));
        store.flush();
    }
    const fs::path file = file_of(dir.path, block.key);
    std::vector<char> bytes(fs::file_size(file));
    std::ifstream(file, std::ios::binary).read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    uint32_t header_size = 0;
    std::memcpy(&header_size, bytes.data() + 12, 4);
    // magic+version+header_size, fingerprint size, fingerprint, key, parent: then start, end, kind, token count.
    const size_t start_at = 16 + 4 + fingerprint.size() + 2 * 16;
    const int32_t start = 0, end = 0x40000000;
    const uint32_t token_count = 0x40000000;
    std::memcpy(bytes.data() + start_at, &start, 4);
    std::memcpy(bytes.data() + start_at + 4, &end, 4);
    std::memcpy(bytes.data() + start_at + 12, &token_count, 4);
    const uint64_t checksum = XXH3_64bits(bytes.data(), header_size - 8);
    std::memcpy(bytes.data() + header_size - 8, &checksum, 8);
    std::ofstream(file, std::ios::binary | std::ios::trunc)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));

    disk_store store(dir.path, big_budget, fingerprint);
    const auto report = store.open();
    EXPECT_EQ(report.entries, 0u);
    ASSERT_EQ(report.rejected.size(), 1u);
    EXPECT_TRUE(has_reason(report.rejected, block.key, "more than the header holds")) << report.rejected[0];
}

TEST(disk_store, get_detects_damage_after_open_and_drops_the_entry) {
    temp_dir dir;
    const auto a = block_n(1), b = block_n(2);
    {
        disk_store store(dir.path, big_budget, fingerprint);
        store.open();
        store.put(a, make_payload(50000, 1));
        store.put(b, make_payload(50000, 2));
        store.flush();
    }
    disk_store store(dir.path, big_budget, fingerprint);
    ASSERT_EQ(store.open(/*verify_payloads=*/false).entries, 2u);
    flip_byte(file_of(dir.path, a.key), fs::file_size(file_of(dir.path, a.key)) / 2);
    fs::resize_file(file_of(dir.path, b.key), 1000);

    std::string error;
    EXPECT_FALSE(store.get(a.key, &error));
    EXPECT_NE(error.find("payload checksum"), std::string::npos) << error;
    EXPECT_FALSE(store.get(b.key, &error));
    EXPECT_NE(error.find("truncated"), std::string::npos) << error;
    EXPECT_EQ(store.counters().read_failures, 2u);
    EXPECT_FALSE(store.contains(a.key));
    EXPECT_EQ(store.size(), 0u);
    EXPECT_EQ(store.bytes(), 0u);

    store.flush();
    EXPECT_FALSE(fs::exists(file_of(dir.path, a.key)));
    EXPECT_TRUE(fs::exists(dir.path / "rejected" / file_of(dir.path, a.key).filename()));
}

TEST(disk_store, open_removes_leftover_temp_files_but_not_a_live_writers) {
    temp_dir dir;
    fs::create_directories(dir.path);
    const fs::path dead = dir.path / (block_n(1).key.hex() + ".kwkv.tmp.999999.0");
    const fs::path live = dir.path / (block_n(2).key.hex() + ".kwkv.tmp.999999.1");
    std::ofstream(dead) << "half a write";
    std::ofstream(live) << "a write in progress";
    const int live_fd = ::open(live.c_str(), O_RDONLY);
    ASSERT_GE(live_fd, 0);
    ASSERT_EQ(::flock(live_fd, LOCK_EX), 0);

    disk_store store(dir.path, big_budget, fingerprint);
    const auto report = store.open();
    ::close(live_fd);
    EXPECT_EQ(report.temp_removed, 1u);
    EXPECT_FALSE(fs::exists(dead));
    EXPECT_TRUE(fs::exists(live));
    EXPECT_EQ(report.entries, 0u);
}

TEST(disk_store, concurrent_put_get_erase_from_many_threads) {
    temp_dir dir;
    disk_store store(dir.path, big_budget, fingerprint);
    store.open();
    constexpr int threads = 4, per_thread = 24;
    std::vector<std::thread> pool;
    std::atomic<int> wrong{0};
    for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
            std::mt19937 rng(static_cast<uint32_t>(t));
            for (int i = 0; i < per_thread; ++i) {
                const int id = t * 1000 + i;
                store.put(block_n(id),
                          make_payload(2000 + static_cast<size_t>(id % 7) * 100, static_cast<uint32_t>(id)));
                // Read back someone's entry: if present, it must be intact.
                const int other = static_cast<int>(rng() % threads) * 1000 + static_cast<int>(rng() % per_thread);
                if (auto got = store.get(block_n(other).key))
                    if (*got !=
                        *make_payload(2000 + static_cast<size_t>(other % 7) * 100, static_cast<uint32_t>(other)))
                        ++wrong;
                if (i % 5 == 0) store.erase(block_n(id).key);
                if (i % 7 == 0) {
                    (void)store.contains(block_n(other).key);
                    (void)store.bytes();
                    (void)store.entries();
                }
            }
        });
    }
    for (auto& th : pool) th.join();
    store.flush();
    EXPECT_EQ(wrong, 0);

    const size_t erased = threads * ((per_thread + 4) / 5);
    EXPECT_EQ(store.size(), static_cast<size_t>(threads * per_thread) - erased);
    EXPECT_EQ(count_files(dir.path, ".kwkv"), store.size());
    EXPECT_EQ(count_files(dir.path, ".tmp."), 0u);
    uint64_t bytes = 0;
    for (const auto& info : store.entries()) {
        bytes += fs::file_size(file_of(dir.path, info.key));
        EXPECT_TRUE(store.get(info.key));
    }
    EXPECT_EQ(store.bytes(), bytes);
    EXPECT_EQ(store.counters().read_failures, 0u);
}

TEST(disk_store, writer_killed_mid_way_leaves_only_verifiable_entries) {
    temp_dir dir;
    fs::create_directories(dir.path);
    constexpr size_t payload_size = 512 << 10;
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        // The child writes until killed (bounded in case the parent never kills it).
        disk_store store(dir.path, big_budget, fingerprint);
        store.open();
        for (int i = 0; i < 1000; ++i) {
            store.put(block_n(i), make_payload(payload_size, static_cast<uint32_t>(i)));
            if (i % 4 == 3) store.flush();
        }
        store.flush();
        ::_exit(0);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);  // a hang guard
    // Kill while a write is in progress (a temp file exists), once there is something to verify. One listing gives
    // both counts, so they agree.
    for (;;) {
        size_t entries = 0, temps = 0;
        for (const auto& e : fs::directory_iterator(dir.path)) {
            const std::string name = e.path().filename().string();
            if (name.find(".tmp.") != std::string::npos)
                ++temps;
            else if (name.ends_with(".kwkv"))
                ++entries;
        }
        if ((entries >= 12 && temps > 0) || std::chrono::steady_clock::now() > deadline) break;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    ::kill(child, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the child finished before it was killed";

    disk_store store(dir.path, big_budget, fingerprint);
    const auto report = store.open();
    EXPECT_TRUE(report.rejected.empty()) << report.rejected.front();
    EXPECT_GE(report.entries, 8u);
    EXPECT_EQ(count_files(dir.path, ".tmp."), 0u);
    RecordProperty("temp_files_removed", static_cast<int>(report.temp_removed));
    for (const auto& info : store.entries()) {
        const auto got = store.get(info.key);
        ASSERT_TRUE(got);
        EXPECT_EQ(*got, *make_payload(payload_size, static_cast<uint32_t>(info.tokens[0])));
    }
}

// Issue 39 (F9): a file system that fills up before the budget froze the tier on its oldest entries (nothing was
// evicted, every new write failed) and logged one warning per block. A full disk now lowers the budget in force to
// what the store holds, so the caller's evictions make room, and failures are logged once a minute with a count.
TEST(disk_store, a_full_disk_lowers_the_budget_in_force_and_is_logged_once_a_minute) {
    temp_dir dir;
    // A file system with room for two entries: the third write and every one after it find it full.
    int written = 0;
    const disk_store::file_writer two_entries_fit = [&](const fs::path& path,
                                                        std::initializer_list<std::span<const uint8_t>> parts,
                                                        int* err) -> std::optional<std::string> {
        if (written >= 2) {
            *err = ENOSPC;
            return "cannot write " + path.string() + ": No space left on device";
        }
        ++written;
        return keepwarm::write_file_atomically(path, parts, err);
    };
    std::string log_lines;
    keepwarm::log::set_sink([&](std::string_view line) { log_lines += line; });
    disk_store store(dir.path, big_budget, fingerprint, two_entries_fit);
    store.open();
    EXPECT_EQ(store.budget_in_force(), big_budget);
    for (int i = 0; i < 12; ++i) EXPECT_TRUE(store.put(block_n(i), make_payload(1000, static_cast<uint32_t>(i))));
    store.flush();
    keepwarm::log::set_sink({});

    EXPECT_EQ(store.counters().writes, 2u);
    EXPECT_EQ(store.counters().write_failures, 10u);
    EXPECT_EQ(store.counters().disk_full, 10u);
    EXPECT_EQ(store.size(), 2u);
    EXPECT_EQ(store.budget_in_force(), store.bytes()) << "the two entries written are all the disk holds";
    size_t lines = 0;
    for (size_t at = 0; (at = log_lines.find("failed", at)) != std::string::npos; ++at) ++lines;
    EXPECT_EQ(lines, 1u) << log_lines;
    EXPECT_NE(log_lines.find("the disk is full"), std::string::npos) << log_lines;
}

// Fuzz target: a file in the disk tier of the prefix cache (the entry format of cache/disk-store.h), read by
// disk_store::open at start-up and get() afterwards. Whatever the file holds, open() must judge it (indexed, rejected
// or foreign) and get() return its payload or nullopt: no crash, no exception, no huge allocation.
//
// Input: one control byte, then the file. Random bytes rarely carry valid checksums or a file name that matches the
// key inside, so the control byte lets the fuzzer past those checks to the fields behind them:
//   bit 0: rewrite the header checksum (the header's last 8 bytes) to match
//   bit 1: rewrite the payload checksum (the 8 bytes before it) to match the bytes after the header
//   bit 2: name the file after the key the header holds (else a fixed name, which open() rejects as a mismatch)
//   bit 3: open(verify_payloads = false), leaving the payload check to get()
#include <unistd.h>
#include <xxhash.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cache/block-key.h"
#include "cache/disk-store.h"
#include "fuzz-support.h"

using namespace keepwarm;
namespace fs = std::filesystem;

namespace {

fs::path store_dir;

uint32_t u32_at(const std::vector<uint8_t>& f, size_t at) {
    uint32_t v = 0;
    if (at + 4 <= f.size()) std::memcpy(&v, f.data() + at, 4);
    return v;
}

void put_u64(std::vector<uint8_t>& f, size_t at, uint64_t v) {
    std::memcpy(f.data() + at, &v, 8);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    const char* tmp = std::getenv("TMPDIR");
    const fs::path base = fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::path(tmp ? tmp : "/tmp");
    store_dir = base / ("keepwarm-fuzz-disk-entry." + std::to_string(::getpid()));
    fs::remove_all(store_dir);
    fs::create_directories(store_dir);
    std::atexit([] {
        std::error_code ec;
        fs::remove_all(store_dir, ec);
    });
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const uint8_t control = data[0];
    std::vector<uint8_t> file(data + 1, data + size);

    const uint64_t header_size = u32_at(file, 12);
    const bool sized = header_size >= 24 && header_size <= file.size();
    if ((control & 2) && sized)
        put_u64(file, header_size - 16, XXH3_64bits(file.data() + header_size, file.size() - header_size));
    if ((control & 1) && sized) put_u64(file, header_size - 8, XXH3_64bits(file.data(), header_size - 8));
    std::string name = std::string(32, '0');
    const size_t key_at = 20 + size_t{u32_at(file, 16)};
    if ((control & 4) && key_at + block_key_size <= file.size())
        name = block_key_from_bytes(file.data() + key_at).hex();

    for (const auto& entry : fs::directory_iterator(store_dir)) fs::remove_all(entry.path());
    std::ofstream(store_dir / (name + ".kwkv"), std::ios::binary)
        .write(reinterpret_cast<const char*>(file.data()), static_cast<std::streamsize>(file.size()));

    try {
        disk_store store(store_dir, uint64_t{1} << 30, fuzz::disk_fingerprint);
        const auto report = store.open(/*verify_payloads=*/(control & 8) == 0);
        for (const disk_entry_info& info : store.entries()) {
            std::string why;
            const auto payload = store.get(info.key, &why);
            if (payload && payload->size() != info.payload_bytes)
                fuzz::finding("disk_store::get returned a payload of another size than its header says");
            if (!payload && (control & 8) == 0)
                fuzz::finding("disk_store::get failed on an entry open() verified: " + why);
        }
        if (report.entries + report.rejected.size() + report.foreign.size() != 1)
            fuzz::finding("disk_store::open did not judge the one entry file exactly once");
    } catch (const std::exception& e) {
        fuzz::finding(std::string("disk_store threw on an entry file: ") + e.what());
    }
    return 0;
}

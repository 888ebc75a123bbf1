// Chain hashing of KV block keys and the model fingerprint that roots every chain.
#include "cache/block-key.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "ggml-cpp.h"
#include "gguf.h"

namespace keepwarm {

static_assert(std::endian::native == std::endian::little, "token bytes are hashed as stored: little-endian int32");
static_assert(sizeof(llama_token) == 4);

namespace {

block_key from_xxh(XXH128_hash_t h) {
    return block_key{h.high64, h.low64};
}

struct xxh3_state_deleter {
    void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
};
// The state struct is opaque unless XXH_STATIC_LINKING_ONLY ties us to one library layout; the heap keeps us portable.
std::unique_ptr<XXH3_state_t, xxh3_state_deleter> new_xxh3_state() {
    std::unique_ptr<XXH3_state_t, xxh3_state_deleter> state(XXH3_createState());
    if (!state) throw std::bad_alloc();
    return state;
}

int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

[[noreturn]] void throw_io(const std::string& what, const std::string& path, int err) {
    throw std::runtime_error("model fingerprint: cannot " + what + " " + path + ": " + std::strerror(err));
}

// Reads exactly `size` bytes at `offset` (fewer only at end of file); EINTR and short reads are retried.
size_t read_at(int fd, unsigned char* buf, size_t size, uint64_t offset, const std::string& path) {
    size_t done = 0;
    while (done < size) {
        const ssize_t n = ::pread(fd, buf + done, size - done, static_cast<off_t>(offset + done));
        if (n < 0) {
            if (errno == EINTR) continue;
            throw_io("read", path, errno);
        }
        if (n == 0) break;
        done += static_cast<size_t>(n);
    }
    return done;
}

// Whether the GGUF's metadata gives its architecture a sliding window (`<arch>.attention.sliding_window` above 0, or
// a per-layer list). A file llama.cpp would not parse is taken as not: it never gets as far as a cache.
bool has_sliding_window(const std::string& gguf_path) {
    gguf_init_params params{/*no_alloc =*/true, /*ctx =*/nullptr};
    const gguf_context_ptr meta(gguf_init_from_file(gguf_path.c_str(), params));
    if (!meta) return false;
    const int64_t arch_id = gguf_find_key(meta.get(), "general.architecture");
    if (arch_id < 0 || gguf_get_kv_type(meta.get(), arch_id) != GGUF_TYPE_STRING) return false;
    const std::string key = std::string(gguf_get_val_str(meta.get(), arch_id)) + ".attention.sliding_window";
    const int64_t id = gguf_find_key(meta.get(), key.c_str());
    if (id < 0) return false;
    switch (gguf_get_kv_type(meta.get(), id)) {
        case GGUF_TYPE_UINT32:
            return gguf_get_val_u32(meta.get(), id) > 0;
        case GGUF_TYPE_INT32:
            return gguf_get_val_i32(meta.get(), id) > 0;
        case GGUF_TYPE_UINT64:
            return gguf_get_val_u64(meta.get(), id) > 0;
        case GGUF_TYPE_INT64:
            return gguf_get_val_i64(meta.get(), id) > 0;
        default:
            return true;
    }
}

}  // namespace

std::string block_key::hex() const {
    static constexpr char digits[] = "0123456789abcdef";
    std::string out(32, '0');
    for (int i = 0; i < 16; ++i) {
        out[static_cast<size_t>(15 - i)] = digits[(high >> (4 * i)) & 0xf];
        out[static_cast<size_t>(31 - i)] = digits[(low >> (4 * i)) & 0xf];
    }
    return out;
}

std::optional<block_key> block_key::from_hex(std::string_view text) {
    if (text.size() != 32) return std::nullopt;
    block_key key;
    for (size_t i = 0; i < 32; ++i) {
        const int d = hex_digit(text[i]);
        if (d < 0) return std::nullopt;
        uint64_t& half = i < 16 ? key.high : key.low;
        half = (half << 4) | static_cast<uint64_t>(d);
    }
    return key;
}

void block_key_to_bytes(const block_key& key, unsigned char out[block_key_size]) {
    XXH128_canonical_t canonical;
    XXH128_canonicalFromHash(&canonical, XXH128_hash_t{key.low, key.high});
    std::memcpy(out, canonical.digest, block_key_size);
}

block_key block_key_from_bytes(const unsigned char in[block_key_size]) {
    XXH128_canonical_t canonical;
    std::memcpy(canonical.digest, in, block_key_size);
    return from_xxh(XXH128_hashFromCanonical(&canonical));
}

block_key root_block_key(std::string_view model_fingerprint) {
    // The tag keeps a root from ever equalling a chain key computed from the same bytes.
    static constexpr std::string_view tag = "keepwarm.root.v1";
    std::string input(tag);
    input += model_fingerprint;
    return from_xxh(XXH3_128bits(input.data(), input.size()));
}

block_key tenant_root_block_key(std::string_view model_fingerprint, std::string_view tenant) {
    if (tenant.empty()) return root_block_key(model_fingerprint);
    static constexpr std::string_view tag = "keepwarm.tenant.v1";
    const uint64_t fingerprint_size = model_fingerprint.size();  // length prefix: the split is unambiguous
    std::string input(tag);
    input.append(reinterpret_cast<const char*>(&fingerprint_size), sizeof fingerprint_size);
    input += model_fingerprint;
    input += tenant;
    return from_xxh(XXH3_128bits(input.data(), input.size()));
}

block_key chain_block_key(const block_key& parent, std::span<const llama_token> tokens) {
    // One contiguous input: cheaper than a streaming state for the few KB a block holds.
    std::vector<unsigned char> input(block_key_size + tokens.size_bytes());
    block_key_to_bytes(parent, input.data());
    if (!tokens.empty()) std::memcpy(input.data() + block_key_size, tokens.data(), tokens.size_bytes());
    return from_xxh(XXH3_128bits(input.data(), input.size()));
}

std::string model_fingerprint(const std::string& gguf_path, std::string_view kv_format) {
    static constexpr uint64_t head_bytes = 16ull << 20;
    static constexpr uint64_t sample_bytes = 64ull << 10;
    static constexpr uint64_t sample_count = 64;

    const int fd = ::open(gguf_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw_io("open", gguf_path, errno);
    struct fd_closer {
        int fd;
        ~fd_closer() { ::close(fd); }
    } closer{fd};

    struct stat st {};
    if (::fstat(fd, &st) != 0) throw_io("stat", gguf_path, errno);
    const uint64_t file_size = static_cast<uint64_t>(st.st_size);

    const auto state_owner = new_xxh3_state();
    XXH3_state_t* state = state_owner.get();
    XXH3_128bits_reset(state);
    XXH3_128bits_update(state, &file_size, sizeof file_size);

    std::vector<unsigned char> buf(1 << 20);
    const uint64_t head = std::min(file_size, head_bytes);
    bool gguf_magic = false;
    for (uint64_t at = 0; at < head;) {
        const size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), head - at));
        const size_t got = read_at(fd, buf.data(), want, at, gguf_path);
        if (got != want) throw_io("read (file shrank)", gguf_path, EIO);
        if (at == 0) gguf_magic = got >= 4 && std::memcmp(buf.data(), "GGUF", 4) == 0;
        XXH3_128bits_update(state, buf.data(), got);
        at += got;
    }
    // Samples cover the tensor data past the head, so a re-quantized or fine-tuned file with identical metadata
    // still gets a different fingerprint. Offsets are spread from the end of the head to the end of the file.
    if (file_size > head_bytes + sample_bytes) {
        const uint64_t span = file_size - head_bytes - sample_bytes;
        for (uint64_t i = 0; i < sample_count; ++i) {
            const uint64_t at = head_bytes + span * i / (sample_count - 1);
            const size_t got = read_at(fd, buf.data(), sample_bytes, at, gguf_path);
            if (got != sample_bytes) throw_io("read (file shrank)", gguf_path, EIO);
            XXH3_128bits_update(state, buf.data(), got);
        }
    } else if (file_size > head_bytes) {
        // Small tail: hash it whole.
        const size_t tail = static_cast<size_t>(file_size - head_bytes);
        const size_t got = read_at(fd, buf.data(), tail, head_bytes, gguf_path);
        if (got != tail) throw_io("read (file shrank)", gguf_path, EIO);
        XXH3_128bits_update(state, buf.data(), got);
    }
    const uint64_t format_size = kv_format.size();  // length prefix: no ambiguity with the bytes before it
    XXH3_128bits_update(state, &format_size, sizeof format_size);
    XXH3_128bits_update(state, kv_format.data(), kv_format.size());
    // Entries of a sliding-window model written before prompt_cache::swa_window_intact may hold KV positions that
    // llama.cpp had already overwritten when they were saved. Their model's fingerprint changes, so they are another
    // model's entries to this version and never read; every other model keeps its fingerprint and its entries.
    if (gguf_magic && has_sliding_window(gguf_path)) {
        static constexpr std::string_view swa_generation = "swa=window-intact";
        const uint64_t generation_size = swa_generation.size();
        XXH3_128bits_update(state, &generation_size, sizeof generation_size);
        XXH3_128bits_update(state, swa_generation.data(), swa_generation.size());
    }
    return from_xxh(XXH3_128bits_digest(state)).hex();
}

}  // namespace keepwarm

// Content keys of cached KV blocks: a chain hash that names one exact token prefix of one model + KV format,
// and the model fingerprint that roots the chain. The disk tier names its files after these keys.
// Threading: plain values and pure functions; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "llama.h"

namespace keepwarm {

// A 128-bit XXH3 value. Its byte form (block_key_bytes) is XXH3's canonical one: `high` big-endian, then `low`
// big-endian, which is also the order hex() spells it in.
struct block_key {
    uint64_t high = 0, low = 0;

    friend bool operator==(const block_key&, const block_key&) = default;
    friend bool operator<(const block_key& a, const block_key& b) {
        return a.high != b.high ? a.high < b.high : a.low < b.low;
    }

    std::string hex() const;  // 32 lowercase hex digits
    // Accepts exactly 32 hex digits (either case); anything else is nullopt.
    static std::optional<block_key> from_hex(std::string_view text);
};

inline constexpr size_t block_key_size = 16;
void block_key_to_bytes(const block_key& key, unsigned char out[block_key_size]);
block_key block_key_from_bytes(const unsigned char in[block_key_size]);

// The parent of every block that starts at position 0: XXH3-128 over "keepwarm.root.v1" || model_fingerprint.
block_key root_block_key(std::string_view model_fingerprint);

// The parent of every block that starts at position 0 in one tenant's cache: root_block_key() for the shared tenant
// (""), so entries written before tenants existed stay readable; otherwise XXH3-128 over "keepwarm.tenant.v1" ||
// u64 length of the fingerprint || model_fingerprint || tenant. Two tenants' chains never share a key, so the same
// tokens cached for two tenants are two entries, each filed under its own tenant.
block_key tenant_root_block_key(std::string_view model_fingerprint, std::string_view tenant);

// key(block) = XXH3-128(parent's 16 canonical bytes || the block's token ids as int32 little-endian). Because the
// parent is the key of the block ending where this one starts, the result names the whole prefix [0, end).
block_key chain_block_key(const block_key& parent, std::span<const llama_token> tokens);

// Identifies a model file + KV format cheaply enough to compute at every start-up (a few ms for a file in the page
// cache): 32 hex digits of XXH3-128 over the file size, its first 16 MiB (GGUF header, metadata and tensor infos;
// the whole file if smaller), 64 samples of 64 KiB at evenly spaced offsets across the rest, and `kv_format` (e.g.
// "k=f16 v=f16 llama=<version>"). Not a full content hash: two files that differ only between samples collide.
// A model with sliding-window attention (its GGUF's `<arch>.attention.sliding_window` above 0) also hashes the tag
// "swa=window-intact", so that its entries written before the window was kept whole are not read (see the .cpp).
// Throws std::runtime_error naming the path if the file cannot be read.
std::string model_fingerprint(const std::string& gguf_path, std::string_view kv_format);

}  // namespace keepwarm

template <>
struct std::hash<keepwarm::block_key> {
    // The key is already a uniform hash; folding its halves is enough.
    size_t operator()(const keepwarm::block_key& key) const noexcept { return static_cast<size_t>(key.high ^ key.low); }
};

// One KV-events message as an upstream publishes it (vLLM's wire format, which llm-d reads and keepwarm serve
// --kv-events writes; docs/kv-events.md): three ZeroMQ frames, the topic `kv@<pod>@<model>`, an 8-byte big-endian
// sequence number and a msgpack `[ts, [event...], dp_rank]`, each event `[tag, fields...]`. Decoded from the
// documented format, not from keepwarm's publisher, so the proxy reads vLLM's events too.
// Threading: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace keepwarm::proxy {

// Where an upstream holds a block; vLLM's names lower-cased ("gpu", "cpu"), keepwarm's third "disk".
enum class kv_medium : uint8_t { device, ram, disk };
inline constexpr size_t kv_medium_count = 3;
const char* kv_medium_name(kv_medium m);

struct kv_block_stored {
    std::vector<uint64_t> block_hashes;  // the upstream's own keys, one per block, in path order
    std::optional<uint64_t> parent;      // the block before the first; none: the run starts at position 0
    std::vector<int32_t> token_ids;      // block_size per block
    uint32_t block_size = 0;
    kv_medium medium = kv_medium::device;
};
struct kv_block_removed {
    std::vector<uint64_t> block_hashes;
    kv_medium medium = kv_medium::device;
};
struct kv_all_cleared {};
using kv_event = std::variant<kv_block_stored, kv_block_removed, kv_all_cleared>;

struct kv_event_message {
    std::string topic;
    uint64_t seq = 0;
    std::vector<kv_event> events;
};

// Limits on what one message may hold, checked before anything is kept: an upstream is trusted only as far as its
// events describe its own cache.
inline constexpr size_t max_kv_message_bytes = 64u << 20;
inline constexpr uint32_t max_kv_block_size = 1u << 16;

// Decodes the three frames. Returns nullopt and says why in `error` for anything that is not the format: another
// number of frames, a sequence frame that is not 8 bytes, msgpack that does not parse or does not have the shape, a
// BlockStored whose tokens are not block_size per hash, an unknown medium. Unknown event tags are an error too
// (vLLM adds them rarely; a decoder that skipped one could miss a removal). A topic that does not start with "kv@" is
// not an error here (the subscription filters topics).
std::optional<kv_event_message> decode_kv_event_message(std::span<const std::string_view> frames, std::string& error);

}  // namespace keepwarm::proxy

// The KV-event wire format that vLLM publishes and llm-d reads (docs/kv-events.md): the prefix cache's block changes
// grouped into BlockStored / BlockRemoved / AllBlocksCleared events, a batch of them as msgpack, the topic and the
// sequence-number frame. Pure functions.
// Threading: none; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cache/kv-block-events.h"

namespace keepwarm::events {

// The `medium` of an event: "GPU" (device cells), "CPU" (RAM blocks), "DISK" (the disk tier).
std::string_view medium_name(kv_medium medium);

// One event on the wire.
struct wire_event {
    enum class kind { block_stored, block_removed, all_blocks_cleared };
    kind what = kind::all_blocks_cleared;
    kv_medium medium = kv_medium::device;
    std::vector<uint64_t> hashes;     // stored, removed: in path order
    std::optional<uint64_t> parent;   // stored: the block before the first (none: it starts at position 0)
    std::vector<llama_token> tokens;  // stored: block_size per block, concatenated
    size_t blocks() const { return what == kind::all_blocks_cleared ? 1 : hashes.size(); }
};

// Groups changes into events: a run of stored blocks of one medium, each the child of the one before, is one
// BlockStored (at most `max_blocks` blocks: a longer run is cut, the next part naming the last block as its parent);
// consecutive removals on one medium are one BlockRemoved. Events keep the changes' order per medium, so a parent's
// BlockStored comes before its child's.
std::vector<wire_event> group_changes(std::span<const kv_block_change> changes, size_t max_blocks = 256);

// The msgpack payload of one message: [ts, [events...], dp_rank] with each event a tagged array
// (["BlockStored", hashes, parent, token_ids, block_size, lora_id, medium], ["BlockRemoved", hashes, medium],
// ["AllBlocksCleared"]); dp_rank is 0.
std::string encode_batch(double timestamp, std::span<const wire_event> events, int block_size);

// The second frame: the sequence number as 8 bytes, big-endian.
std::string sequence_frame(uint64_t sequence);

// The first frame: kv@<pod>@<model>.
std::string event_topic(std::string_view pod, std::string_view model);

}  // namespace keepwarm::events

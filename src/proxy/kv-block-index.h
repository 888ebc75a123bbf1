// Exact cache-aware routing: which token-prefix blocks each upstream holds, and on which medium, as the KV events
// it publishes say (kv-event-message.h). The upstream's own block hashes only tie a removal to its store and a block
// to its parent; the index keys each block by its own chained hash over the token ids (token_block_keys), as llm-d's
// indexer does, so the proxy can look a request's prompt tokens up without knowing how the upstream hashes.
// An upstream is in step from an AllBlocksCleared on (its start, a snapshot after a new subscription, an overflow's
// full listing); before that, after a gap in its sequence numbers, or after a message that breaks the format, it is
// out of step: its blocks are dropped, routing falls back to inference for it, and the subscriber reconnects so the
// upstream sends a snapshot.
// A pure class: no clock, no I/O. Threading: not thread-safe; the caller holds one mutex around every call.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "proxy/kv-event-message.h"

namespace keepwarm::proxy {

// The keys of `tokens`' whole blocks of `block_size`: key i chains over blocks 0..i (a partial last block is left
// out, as the events report whole blocks only).
std::vector<uint64_t> token_block_keys(std::span<const int32_t> tokens, uint32_t block_size);

class kv_block_index {
public:
    // `max_blocks_per_upstream` bounds what one upstream's events can make the proxy hold; past it, that upstream is
    // out of step until its next AllBlocksCleared.
    kv_block_index(size_t upstreams, size_t max_blocks_per_upstream);

    enum class outcome {
        applied,   // in step (or waiting for an AllBlocksCleared, which is no error)
        resync,    // out of step (a gap, a protocol break): reconnect for a snapshot
        overflow,  // more blocks than the bound: out of step until the upstream clears on its own
    };
    outcome apply(size_t upstream, const kv_event_message& message);
    // The subscription was (re)opened: what follows starts a new stream for the proxy (a snapshot first).
    void reconnected(size_t upstream);

    bool in_step(size_t upstream) const { return upstreams_.at(upstream).in_step; }
    uint32_t block_size(size_t upstream) const { return upstreams_.at(upstream).block_size; }
    // How many of `keys` (token_block_keys with block_size(upstream)), from the first, the upstream holds on some
    // medium; 0 when it is out of step.
    size_t held_blocks(size_t upstream, std::span<const uint64_t> keys) const;

    struct upstream_stats {
        bool in_step = false;
        std::array<size_t, kv_medium_count> blocks{};  // held now, per medium
        uint64_t messages = 0;
        uint64_t events = 0;
        uint64_t resyncs = 0;        // times it fell out of step (gap, protocol break, overflow, a new process)
        uint64_t orphan_blocks = 0;  // stored blocks whose parent it did not hold (not indexed)
    };
    upstream_stats stats(size_t upstream) const;

private:
    struct upstream_state {
        bool in_step = false;
        bool have_seq = false;
        uint64_t last_seq = 0;
        uint32_t block_size = 0;
        std::unordered_map<uint64_t, uint64_t> key_of;  // the upstream's block hash -> the index's key
        std::unordered_map<uint64_t, uint8_t> media;    // key -> bit per kv_medium held
        upstream_stats stats;
    };
    void clear(upstream_state& u);
    void out_of_step(upstream_state& u);
    // false: the event breaks the format (the caller resyncs).
    bool store(upstream_state& u, const kv_block_stored& s);
    void remove(upstream_state& u, const kv_block_removed& r);

    size_t max_blocks_;
    std::vector<upstream_state> upstreams_;
};

}  // namespace keepwarm::proxy

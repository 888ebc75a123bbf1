// What the prefix cache tells an observer about its blocks: which whole blocks of the shared tenant's paths it can
// reuse, on which medium, as changes since its previous report (docs/kv-events.md). The cache knows nothing of who
// listens or how it is sent; a publisher (events/) implements the observer.
// Threading: the cache calls the observer on its engine thread; an observer must return at once (no I/O).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "llama.h"

namespace keepwarm {

// Where a block's KV can be reused from: the device sequences' cells, RAM blocks, disk files.
enum class kv_medium : uint8_t { device = 0, ram = 1, disk = 2 };
inline constexpr int kv_medium_count = 3;
inline constexpr uint8_t kv_medium_bit(kv_medium m) {
    return static_cast<uint8_t>(1u << static_cast<unsigned>(m));
}

// One block that became reusable on a medium (stored) or stopped being reusable there (removed).
struct kv_block_change {
    bool stored = true;
    kv_medium medium = kv_medium::device;
    uint64_t hash = 0;
    std::optional<uint64_t> parent;   // stored: the block before it on its path (none: it starts at position 0)
    std::vector<llama_token> tokens;  // stored: the block's tokens
};

// The changes of one report, in path order for stored blocks (a parent before its child).
struct kv_block_report {
    // Every block reusable now, as stored changes: what was reported before no longer holds (at start, and after
    // the observer refused a report).
    bool full_listing = false;
    std::vector<kv_block_change> changes;
};

// A block as the cache lists it now (prompt_cache::listed_blocks, for GET /v1/cache/blocks).
struct kv_listed_block {
    uint64_t hash = 0;
    std::optional<uint64_t> parent;
    uint8_t media = 0;  // kv_medium_bit of each medium holding it
};

class kv_block_observer {
public:
    virtual ~kv_block_observer() = default;
    // Takes one report. False: it could not keep it (its queue is full; it dropped what it held): the cache then
    // sends a full listing at once, which an observer always takes.
    virtual bool take(kv_block_report report) = 0;
};

}  // namespace keepwarm

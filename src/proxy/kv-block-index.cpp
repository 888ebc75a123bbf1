// See kv-block-index.h.
#include "proxy/kv-block-index.h"

#include <xxhash.h>

namespace keepwarm::proxy {

namespace {
uint8_t bit(kv_medium m) {
    return static_cast<uint8_t>(1u << static_cast<unsigned>(m));
}

// The seed of every chain: a key no block's hash is likely to equal.
constexpr uint64_t root_key = 0x6b7677726d6b7631ull;

uint64_t chain(uint64_t parent, const int32_t* tokens, uint32_t block_size) {
    return XXH3_64bits_withSeed(tokens, sizeof(int32_t) * block_size, parent);
}
}  // namespace

std::vector<uint64_t> token_block_keys(std::span<const int32_t> tokens, uint32_t block_size) {
    std::vector<uint64_t> keys;
    if (block_size == 0) return keys;
    keys.reserve(tokens.size() / block_size);
    uint64_t key = root_key;
    for (size_t pos = 0; pos + block_size <= tokens.size(); pos += block_size) {
        key = chain(key, tokens.data() + pos, block_size);
        keys.push_back(key);
    }
    return keys;
}

kv_block_index::kv_block_index(size_t upstreams, size_t max_blocks_per_upstream)
    : max_blocks_(max_blocks_per_upstream), upstreams_(upstreams) {}

void kv_block_index::clear(upstream_state& u) {
    u.key_of.clear();
    u.media.clear();
    u.stats.blocks = {};
}

void kv_block_index::out_of_step(upstream_state& u) {
    if (u.in_step) u.stats.resyncs++;
    u.in_step = false;
    clear(u);
}

void kv_block_index::reconnected(size_t upstream) {
    upstream_state& u = upstreams_.at(upstream);
    out_of_step(u);
    u.have_seq = false;
}

bool kv_block_index::store(upstream_state& u, const kv_block_stored& s) {
    if (u.block_size != 0 && s.block_size != u.block_size) return false;  // one server, one block size
    u.block_size = s.block_size;
    uint64_t key = root_key;
    if (s.parent) {
        const auto it = u.key_of.find(*s.parent);
        if (it == u.key_of.end()) {
            // Its prefix is not held (keepwarm never reports such a block; vLLM may, racing an eviction): a block
            // that cannot be reached from the start is no use to routing.
            u.stats.orphan_blocks += s.block_hashes.size();
            return true;
        }
        key = it->second;
    }
    for (size_t i = 0; i < s.block_hashes.size(); i++) {
        key = chain(key, s.token_ids.data() + i * s.block_size, s.block_size);
        u.key_of[s.block_hashes[i]] = key;
        uint8_t& held = u.media[key];
        if (!(held & bit(s.medium))) u.stats.blocks[static_cast<size_t>(s.medium)]++;
        held |= bit(s.medium);
    }
    return true;
}

void kv_block_index::remove(upstream_state& u, const kv_block_removed& r) {
    for (const uint64_t hash : r.block_hashes) {
        const auto it = u.key_of.find(hash);
        if (it == u.key_of.end()) continue;  // never stored, or stored after a hole
        const auto held = u.media.find(it->second);
        if (held == u.media.end()) continue;
        if (held->second & bit(r.medium)) u.stats.blocks[static_cast<size_t>(r.medium)]--;
        held->second &= static_cast<uint8_t>(~bit(r.medium));
        if (held->second == 0) {
            u.media.erase(held);
            u.key_of.erase(it);
        }
    }
}

kv_block_index::outcome kv_block_index::apply(size_t upstream, const kv_event_message& m) {
    upstream_state& u = upstreams_.at(upstream);
    u.stats.messages++;
    bool lost = false;
    if (u.have_seq) {
        if (m.seq == 0) {
            out_of_step(u);  // a new process: its first message clears and lists its blocks
        } else if (m.seq <= u.last_seq) {
            return outcome::applied;  // already seen (a duplicate, or the old stream's tail)
        } else if (m.seq != u.last_seq + 1) {
            out_of_step(u);  // lost messages: what they removed is still in the index
            lost = true;
        }
    }
    u.have_seq = true;
    u.last_seq = m.seq;
    for (const kv_event& e : m.events) {
        u.stats.events++;
        if (std::holds_alternative<kv_all_cleared>(e)) {
            clear(u);
            u.in_step = true;
            u.block_size = 0;
            continue;
        }
        if (!u.in_step) continue;  // what came before the snapshot is unknown
        if (const auto* s = std::get_if<kv_block_stored>(&e)) {
            if (!store(u, *s)) {
                out_of_step(u);
                return outcome::resync;
            }
            if (u.media.size() > max_blocks_) {
                out_of_step(u);
                return outcome::overflow;
            }
        } else {
            remove(u, std::get<kv_block_removed>(e));
        }
    }
    // A gap that this message's own AllBlocksCleared closed needs no snapshot; before the first one, waiting is normal.
    return lost && !u.in_step ? outcome::resync : outcome::applied;
}

size_t kv_block_index::held_blocks(size_t upstream, std::span<const uint64_t> keys) const {
    const upstream_state& u = upstreams_.at(upstream);
    if (!u.in_step) return 0;
    size_t n = 0;
    while (n < keys.size() && u.media.contains(keys[n])) n++;
    return n;
}

kv_block_index::upstream_stats kv_block_index::stats(size_t upstream) const {
    upstream_stats s = upstreams_.at(upstream).stats;
    s.in_step = upstreams_.at(upstream).in_step;
    return s;
}

}  // namespace keepwarm::proxy

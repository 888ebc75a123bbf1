// The proxy's reading of KV events: messages built byte by byte from the documented wire format (vLLM's, as
// docs/kv-events.md states it; no msgpack library and nothing of keepwarm's publisher), decoded, and applied to the
// index that routing asks which upstream holds a prompt's token prefix.
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "proxy/kv-block-index.h"
#include "proxy/kv-event-message.h"

using namespace keepwarm::proxy;

namespace {

// msgpack, just what the format uses.
struct pack {
    std::string out;
    pack& array(size_t n) {
        if (n < 16) {
            out += static_cast<char>(0x90 | n);
        } else {
            out += '\xdc';
            out += static_cast<char>(n >> 8);
            out += static_cast<char>(n & 0xff);
        }
        return *this;
    }
    pack& str(std::string_view s) {
        out += static_cast<char>(0xa0 | s.size());  // fixstr: every string here is under 32 bytes
        out += s;
        return *this;
    }
    pack& uint(uint64_t v) {
        if (v < 128) {
            out += static_cast<char>(v);
            return *this;
        }
        out += '\xcf';
        for (int i = 7; i >= 0; i--) out += static_cast<char>((v >> (8 * i)) & 0xff);
        return *this;
    }
    pack& nil() {
        out += '\xc0';
        return *this;
    }
    pack& float64(double d) {
        out += '\xcb';
        uint64_t bits;
        std::memcpy(&bits, &d, 8);
        for (int i = 7; i >= 0; i--) out += static_cast<char>((bits >> (8 * i)) & 0xff);
        return *this;
    }
};

// One event, appended to a batch under construction.
struct stored {
    std::vector<uint64_t> hashes;
    std::optional<uint64_t> parent;
    std::vector<int> tokens;
    uint32_t block_size;
    const char* medium = "GPU";  // nullptr: the field left out (vLLM before media)
};
struct removed {
    std::vector<uint64_t> hashes;
    const char* medium = "GPU";
};
struct cleared {};
using event = std::variant<stored, removed, cleared>;

std::string payload(const std::vector<event>& events) {
    pack p;
    p.array(3).float64(1765000000.5).array(events.size());
    for (const event& e : events) {
        if (const auto* s = std::get_if<stored>(&e)) {
            p.array(s->medium ? 7 : 5).str("BlockStored").array(s->hashes.size());
            for (const uint64_t h : s->hashes) p.uint(h);
            s->parent ? p.uint(*s->parent) : p.nil();
            p.array(s->tokens.size());
            for (const int t : s->tokens) p.uint(static_cast<uint64_t>(t));
            p.uint(s->block_size);
            if (s->medium) p.nil().str(s->medium);
        } else if (const auto* r = std::get_if<removed>(&e)) {
            p.array(3).str("BlockRemoved").array(r->hashes.size());
            for (const uint64_t h : r->hashes) p.uint(h);
            p.str(r->medium);
        } else {
            p.array(1).str("AllBlocksCleared");
        }
    }
    p.uint(0);  // dp_rank
    return p.out;
}

std::string seq_frame(uint64_t seq) {
    std::string s;
    for (int i = 7; i >= 0; i--) s += static_cast<char>((seq >> (8 * i)) & 0xff);
    return s;
}

kv_event_message decode(uint64_t seq, const std::vector<event>& events) {
    const std::string topic = "kv@10.0.0.7:8080@qwen3", sq = seq_frame(seq), body = payload(events);
    const std::string_view frames[] = {topic, sq, body};
    std::string error;
    auto m = decode_kv_event_message(frames, error);
    EXPECT_TRUE(m) << error;
    return m ? *m : kv_event_message{};
}

std::vector<int> range(int from, int n) {
    std::vector<int> v;
    for (int i = 0; i < n; i++) v.push_back(from + i);
    return v;
}

// How many 4-token blocks of `tokens` upstream u holds.
size_t held(const kv_block_index& index, size_t u, const std::vector<int>& tokens) {
    const std::vector<int32_t> t(tokens.begin(), tokens.end());
    return index.held_blocks(u, token_block_keys(t, 4));
}

}  // namespace

TEST(KvEventMessage, DecodesTheThreeFrames) {
    const kv_event_message m = decode(
        0x0102030405060708ull, {cleared{}, stored{{11, 12}, std::nullopt, range(1, 8), 4}, removed{{12}, "CPU"}});
    EXPECT_EQ(m.topic, "kv@10.0.0.7:8080@qwen3");
    EXPECT_EQ(m.seq, 0x0102030405060708ull);
    ASSERT_EQ(m.events.size(), 3u);
    EXPECT_TRUE(std::holds_alternative<kv_all_cleared>(m.events[0]));
    const auto& s = std::get<kv_block_stored>(m.events[1]);
    EXPECT_EQ(s.block_hashes, (std::vector<uint64_t>{11, 12}));
    EXPECT_FALSE(s.parent);
    EXPECT_EQ(s.token_ids.size(), 8u);
    EXPECT_EQ(s.block_size, 4u);
    EXPECT_EQ(s.medium, kv_medium::device);
    const auto& r = std::get<kv_block_removed>(m.events[2]);
    EXPECT_EQ(r.medium, kv_medium::ram);
}

TEST(KvEventMessage, MediumLeftOutIsTheDevice) {
    const kv_event_message m = decode(1, {stored{{5}, 4, range(0, 4), 4, nullptr}});
    EXPECT_EQ(std::get<kv_block_stored>(m.events[0]).medium, kv_medium::device);
    EXPECT_EQ(std::get<kv_block_stored>(m.events[0]).parent, 4u);
}

TEST(KvEventMessage, RefusesWhatIsNotTheFormat) {
    std::string error;
    const std::string topic = "kv@p@m", sq = seq_frame(1), good = payload({cleared{}});
    const auto refused = [&](std::vector<std::string_view> frames) {
        error.clear();
        return !decode_kv_event_message(frames, error) && !error.empty();
    };
    EXPECT_TRUE(refused({topic, sq}));                                                     // two frames
    EXPECT_TRUE(refused({topic, std::string_view(sq).substr(1), good}));                   // a 7-byte sequence
    EXPECT_TRUE(refused({topic, sq, std::string_view(good).substr(0, good.size() - 3)}));  // truncated msgpack
    EXPECT_TRUE(refused({topic, sq, "\x92\xcb"}));                                         // not [ts, events, rank]
    const std::string short_tokens = payload({stored{{1, 2}, std::nullopt, range(0, 7), 4}});
    EXPECT_TRUE(refused({topic, sq, short_tokens}));  // 7 tokens for 2 blocks of 4
    EXPECT_NE(error.find("tokens"), std::string::npos) << error;
    const std::string odd_medium = payload({removed{{1}, "TAPE"}});
    EXPECT_TRUE(refused({topic, sq, odd_medium}));
    pack unknown;
    unknown.array(3).float64(0).array(1).array(1).str("BlockMoved").uint(0);
    EXPECT_TRUE(refused({topic, sq, unknown.out}));
}

TEST(KvBlockIndex, StoredBlocksAreHeldByTheirTokens) {
    kv_block_index index(2, 1000);
    EXPECT_EQ(index.apply(0, decode(0, {cleared{}, stored{{101, 102}, std::nullopt, range(0, 8), 4}})),
              kv_block_index::outcome::applied);
    // A run continuing from its parent, on the next message.
    EXPECT_EQ(index.apply(0, decode(1, {stored{{103}, 102, range(8, 4), 4}})), kv_block_index::outcome::applied);
    EXPECT_TRUE(index.in_step(0));
    EXPECT_EQ(index.block_size(0), 4u);
    EXPECT_EQ(held(index, 0, range(0, 14)), 3u);  // 3 whole blocks; the last 2 tokens are no block
    EXPECT_EQ(held(index, 0, range(0, 6)), 1u);
    std::vector<int> other = range(0, 12);
    other[5] = 999;  // differs inside the second block
    EXPECT_EQ(held(index, 0, other), 1u);
    EXPECT_EQ(held(index, 1, range(0, 12)), 0u);  // the other upstream published nothing
    EXPECT_EQ(index.stats(0).blocks[static_cast<size_t>(kv_medium::device)], 3u);
}

TEST(KvBlockIndex, RemovedPerMediumAndCleared) {
    kv_block_index index(1, 1000);
    index.apply(0, decode(0, {cleared{}, stored{{1, 2}, std::nullopt, range(0, 8), 4}}));
    // Demoted to RAM: stored there, then removed from the device; still held.
    index.apply(0, decode(1, {stored{{2}, 1, range(4, 4), 4, "CPU"}, removed{{2}, "GPU"}}));
    EXPECT_EQ(held(index, 0, range(0, 8)), 2u);
    EXPECT_EQ(index.stats(0).blocks[static_cast<size_t>(kv_medium::ram)], 1u);
    EXPECT_EQ(index.stats(0).blocks[static_cast<size_t>(kv_medium::device)], 1u);
    index.apply(0, decode(2, {removed{{2}, "CPU"}}));
    EXPECT_EQ(held(index, 0, range(0, 8)), 1u);
    // A block whose first block is gone no longer matches from the start.
    index.apply(0, decode(3, {stored{{2}, 1, range(4, 4), 4, "DISK"}, removed{{1}, "GPU"}}));
    EXPECT_EQ(held(index, 0, range(0, 8)), 0u);
    index.apply(0, decode(4, {stored{{1}, std::nullopt, range(0, 4), 4}, cleared{}}));
    EXPECT_EQ(held(index, 0, range(0, 8)), 0u);
    EXPECT_TRUE(index.in_step(0));
}

TEST(KvBlockIndex, NothingCountsBeforeTheFirstClear) {
    kv_block_index index(1, 1000);
    // A subscriber that joins mid-stream: stores before the snapshot are not trusted (their removals may be lost).
    EXPECT_EQ(index.apply(0, decode(40, {stored{{1}, std::nullopt, range(0, 4), 4}})),
              kv_block_index::outcome::applied);
    EXPECT_FALSE(index.in_step(0));
    EXPECT_EQ(held(index, 0, range(0, 4)), 0u);
    // The snapshot the publisher sends a new subscriber.
    index.apply(0, decode(41, {cleared{}, stored{{1, 2}, std::nullopt, range(0, 8), 4}}));
    EXPECT_TRUE(index.in_step(0));
    EXPECT_EQ(held(index, 0, range(0, 8)), 2u);
}

TEST(KvBlockIndex, AGapDropsTheUpstreamUntilItsSnapshot) {
    kv_block_index index(2, 1000);
    index.apply(0, decode(0, {cleared{}, stored{{1, 2}, std::nullopt, range(0, 8), 4}}));
    index.apply(1, decode(0, {cleared{}, stored{{1}, std::nullopt, range(0, 4), 4}}));
    // Message 1 is lost: it may have removed block 1. The index drops upstream 0 and asks for a snapshot.
    EXPECT_EQ(index.apply(0, decode(2, {stored{{3}, 2, range(8, 4), 4}})), kv_block_index::outcome::resync);
    EXPECT_FALSE(index.in_step(0));
    EXPECT_EQ(held(index, 0, range(0, 12)), 0u);
    EXPECT_EQ(index.stats(0).resyncs, 1u);
    EXPECT_EQ(held(index, 1, range(0, 4)), 1u);  // the other upstream is untouched
    index.reconnected(0);
    EXPECT_EQ(index.apply(0, decode(3, {cleared{}, stored{{1}, std::nullopt, range(0, 4), 4}})),
              kv_block_index::outcome::applied);
    EXPECT_TRUE(index.in_step(0));
    EXPECT_EQ(held(index, 0, range(0, 12)), 1u);
}

TEST(KvBlockIndex, AGapClosedByItsOwnClearNeedsNoSnapshot) {
    kv_block_index index(1, 1000);
    index.apply(0, decode(5, {cleared{}}));
    EXPECT_EQ(index.apply(0, decode(9, {cleared{}, stored{{1}, std::nullopt, range(0, 4), 4}})),
              kv_block_index::outcome::applied);
    EXPECT_EQ(held(index, 0, range(0, 4)), 1u);
}

TEST(KvBlockIndex, ARestartedUpstreamStartsOver) {
    kv_block_index index(1, 1000);
    index.apply(0, decode(0, {cleared{}, stored{{1, 2}, std::nullopt, range(0, 8), 4}}));
    index.apply(0, decode(1, {stored{{3}, 2, range(8, 4), 4}}));
    // Sequence 0 again: a new process, which lists what it holds (its disk tier) after clearing.
    index.apply(0, decode(0, {cleared{}, stored{{7}, std::nullopt, range(0, 4), 4, "DISK"}}));
    EXPECT_TRUE(index.in_step(0));
    EXPECT_EQ(held(index, 0, range(0, 12)), 1u);
    EXPECT_EQ(index.stats(0).blocks[static_cast<size_t>(kv_medium::disk)], 1u);
    EXPECT_EQ(index.stats(0).blocks[static_cast<size_t>(kv_medium::device)], 0u);
    // A message the proxy already applied (a sequence number not past the last) changes nothing.
    index.apply(0, decode(1, {stored{{8}, 7, range(4, 4), 4}}));
    index.apply(0, decode(1, {removed{{8}, "GPU"}}));
    EXPECT_EQ(held(index, 0, range(0, 8)), 2u);
}

TEST(KvBlockIndex, BoundedPerUpstream) {
    kv_block_index index(1, 2);
    EXPECT_EQ(index.apply(0, decode(0, {cleared{}, stored{{1, 2, 3}, std::nullopt, range(0, 12), 4}})),
              kv_block_index::outcome::overflow);
    EXPECT_FALSE(index.in_step(0));
    EXPECT_EQ(held(index, 0, range(0, 12)), 0u);
}

TEST(KvBlockIndex, OrphansAndBlockSizeChanges) {
    kv_block_index index(1, 1000);
    index.apply(0, decode(0, {cleared{}, stored{{5}, 4, range(4, 4), 4}}));  // parent 4 never stored
    EXPECT_EQ(index.stats(0).orphan_blocks, 1u);
    EXPECT_TRUE(index.in_step(0));
    index.apply(0, decode(1, {stored{{1}, std::nullopt, range(0, 4), 4}}));
    // Another block size from the same stream breaks the format: out of step, snapshot wanted.
    EXPECT_EQ(index.apply(0, decode(2, {stored{{9}, std::nullopt, range(0, 8), 8}})), kv_block_index::outcome::resync);
    EXPECT_FALSE(index.in_step(0));
}

TEST(TokenBlockKeys, ChainedOverWholeBlocks) {
    const std::vector<int32_t> a{1, 2, 3, 4, 5, 6, 7, 8, 9}, b{1, 2, 3, 4, 5, 6, 7, 0};
    const auto ka = token_block_keys(a, 4), kb = token_block_keys(b, 4);
    ASSERT_EQ(ka.size(), 2u);
    ASSERT_EQ(kb.size(), 2u);
    EXPECT_EQ(ka[0], kb[0]);
    EXPECT_NE(ka[1], kb[1]);
    // The same second block after another first one is another key.
    const std::vector<int32_t> c{0, 2, 3, 4, 5, 6, 7, 8};
    EXPECT_NE(token_block_keys(c, 4)[1], ka[1]);
}

// The KV-event wire format (docs/kv-events.md): changes grouped into vLLM's events, the msgpack layout llm-d decodes
// (read back here with msgpack-c's own unpacker), the sequence frame and the topic.
#include <gtest/gtest.h>

#include <msgpack.hpp>

#include "events/kv-event-encoder.h"

using namespace keepwarm;
using namespace keepwarm::events;

namespace {

kv_block_change stored(uint64_t hash, std::optional<uint64_t> parent, kv_medium m, std::vector<llama_token> tokens) {
    return {.stored = true, .medium = m, .hash = hash, .parent = parent, .tokens = std::move(tokens)};
}

kv_block_change removed(uint64_t hash, kv_medium m) {
    return {.stored = false, .medium = m, .hash = hash, .parent = {}, .tokens = {}};
}

}  // namespace

TEST(kv_event_encoder, a_path_on_two_media_is_one_event_per_medium_with_its_parent_chain) {
    // The cache lists a path block by block, each block's media together: GPU and CPU interleave.
    const std::vector<kv_block_change> changes = {
        stored(1, std::nullopt, kv_medium::device, {10, 11}),
        stored(1, std::nullopt, kv_medium::ram, {10, 11}),
        stored(2, 1, kv_medium::device, {12, 13}),
        stored(2, 1, kv_medium::ram, {12, 13}),
        stored(9, 1, kv_medium::device, {20, 21}),  // a branch: a new run under block 1
    };
    const auto events = group_changes(changes);
    ASSERT_EQ(events.size(), 3u);
    EXPECT_EQ(events[0].medium, kv_medium::device);
    EXPECT_EQ(events[0].hashes, (std::vector<uint64_t>{1, 2}));
    EXPECT_EQ(events[0].parent, std::nullopt);
    EXPECT_EQ(events[0].tokens, (std::vector<llama_token>{10, 11, 12, 13}));
    EXPECT_EQ(events[1].medium, kv_medium::ram);
    EXPECT_EQ(events[1].hashes, (std::vector<uint64_t>{1, 2}));
    EXPECT_EQ(events[2].hashes, (std::vector<uint64_t>{9}));
    EXPECT_EQ(events[2].parent, std::optional<uint64_t>(1));
}

TEST(kv_event_encoder, a_long_run_is_cut_and_the_next_part_names_its_parent) {
    std::vector<kv_block_change> changes;
    for (uint64_t h = 1; h <= 5; ++h) {
        changes.push_back(stored(h, h == 1 ? std::nullopt : std::optional(h - 1), kv_medium::disk, {int(h)}));
    }
    const auto events = group_changes(changes, 2);
    ASSERT_EQ(events.size(), 3u);
    EXPECT_EQ(events[1].hashes, (std::vector<uint64_t>{3, 4}));
    EXPECT_EQ(events[1].parent, std::optional<uint64_t>(2));
    EXPECT_EQ(events[2].parent, std::optional<uint64_t>(4));
}

TEST(kv_event_encoder, removals_group_by_medium_and_keep_their_place_after_stores) {
    const std::vector<kv_block_change> changes = {
        removed(1, kv_medium::device), removed(2, kv_medium::device), removed(3, kv_medium::ram),
        stored(4, std::nullopt, kv_medium::ram, {1}), removed(5, kv_medium::ram)};
    const auto events = group_changes(changes);
    ASSERT_EQ(events.size(), 4u);
    EXPECT_EQ(events[0].what, wire_event::kind::block_removed);
    EXPECT_EQ(events[0].hashes, (std::vector<uint64_t>{1, 2}));
    EXPECT_EQ(events[1].hashes, (std::vector<uint64_t>{3}));
    EXPECT_EQ(events[2].what, wire_event::kind::block_stored);
    EXPECT_EQ(events[3].hashes, (std::vector<uint64_t>{5}));
}

TEST(kv_event_encoder, a_batch_has_vllms_array_layout) {
    std::vector<wire_event> events(3);
    events[0].what = wire_event::kind::all_blocks_cleared;
    events[1] = {.what = wire_event::kind::block_stored,
                 .medium = kv_medium::ram,
                 .hashes = {0xfedcba9876543210ull, 7},
                 .parent = std::nullopt,
                 .tokens = {1, 2, 3, 4}};
    events[2] = {.what = wire_event::kind::block_removed, .medium = kv_medium::disk, .hashes = {7}};
    const std::string payload = encode_batch(1700000000.25, events, 2);

    const msgpack::object_handle handle = msgpack::unpack(payload.data(), payload.size());
    const msgpack::object& batch = handle.get();
    ASSERT_EQ(batch.type, msgpack::type::ARRAY);
    ASSERT_EQ(batch.via.array.size, 3u);  // [ts, events, dp_rank]
    EXPECT_EQ(batch.via.array.ptr[0].type, msgpack::type::FLOAT64);
    EXPECT_DOUBLE_EQ(batch.via.array.ptr[0].as<double>(), 1700000000.25);
    EXPECT_EQ(batch.via.array.ptr[2].as<int>(), 0);
    const msgpack::object& list = batch.via.array.ptr[1];
    ASSERT_EQ(list.via.array.size, 3u);

    const msgpack::object& cleared = list.via.array.ptr[0];
    ASSERT_EQ(cleared.via.array.size, 1u);
    EXPECT_EQ(cleared.via.array.ptr[0].as<std::string>(), "AllBlocksCleared");

    const msgpack::object& st = list.via.array.ptr[1];
    ASSERT_EQ(st.via.array.size, 7u);
    EXPECT_EQ(st.via.array.ptr[0].as<std::string>(), "BlockStored");
    EXPECT_EQ(st.via.array.ptr[1].as<std::vector<uint64_t>>(), (std::vector<uint64_t>{0xfedcba9876543210ull, 7}));
    EXPECT_TRUE(st.via.array.ptr[2].is_nil()) << "the first block's parent is nil";
    EXPECT_EQ(st.via.array.ptr[3].as<std::vector<uint32_t>>(), (std::vector<uint32_t>{1, 2, 3, 4}));
    EXPECT_EQ(st.via.array.ptr[4].as<int>(), 2);
    EXPECT_TRUE(st.via.array.ptr[5].is_nil()) << "lora_id";
    EXPECT_EQ(st.via.array.ptr[6].as<std::string>(), "CPU");

    const msgpack::object& rm = list.via.array.ptr[2];
    ASSERT_EQ(rm.via.array.size, 3u);
    EXPECT_EQ(rm.via.array.ptr[0].as<std::string>(), "BlockRemoved");
    EXPECT_EQ(rm.via.array.ptr[1].as<std::vector<uint64_t>>(), (std::vector<uint64_t>{7}));
    EXPECT_EQ(rm.via.array.ptr[2].as<std::string>(), "DISK");
}

TEST(kv_event_encoder, frames_are_the_topic_and_a_big_endian_sequence) {
    EXPECT_EQ(event_topic("10.0.0.7:8080", "qwen3"), "kv@10.0.0.7:8080@qwen3");
    EXPECT_EQ(sequence_frame(0x0102030405060708ull), std::string("\x01\x02\x03\x04\x05\x06\x07\x08", 8));
    EXPECT_EQ(sequence_frame(0), std::string(8, '\0'));
    EXPECT_EQ(medium_name(kv_medium::device), "GPU");
    EXPECT_EQ(medium_name(kv_medium::ram), "CPU");
    EXPECT_EQ(medium_name(kv_medium::disk), "DISK");
}

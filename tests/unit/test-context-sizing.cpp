// choose_default_context: the context `serve` sizes when the operator names none (issue 33: the former 8,192 tokens
// in 2 slots turned every agent's first request away).
#include <gtest/gtest.h>

#include "model/context-sizing.h"

namespace keepwarm {
namespace {

constexpr uint64_t GiB = 1ull << 30;

// An 8B-class dense model: 36 layers x 8 KV heads x 128 x (K + V) in f16 = 144 KiB per cell.
context_sizing_input eight_b(uint32_t trained, int slots, uint64_t memory) {
    return {.trained_tokens = trained,
            .slots = slots,
            .memory_for_cache = memory,
            .bytes_per_cell = 144 * 1024,
            .bytes_per_sequence = 0,
            .sequences = slots + 10};
}

TEST(context_sizing, a_slot_of_the_trained_context_when_memory_holds_it) {
    const context_choice c = choose_default_context(eight_b(40960, 2, 64 * GiB));
    EXPECT_EQ(c.slot_tokens, 40960);
    EXPECT_EQ(c.context_size, 81920);
    EXPECT_EQ(c.cache_bytes, 81920ull * 144 * 1024);
    EXPECT_NE(c.why.find("trained 40960"), std::string::npos) << c.why;
}

TEST(context_sizing, a_long_trained_context_is_capped_and_halved_to_fit_but_not_below_what_agents_need) {
    // 256K trained: capped at 128K; 2 x 128K x 144 KiB = 36 GiB does not fit in 3/4 of 40 GiB; 64K does (18 GiB).
    EXPECT_EQ(choose_default_context(eight_b(262144, 2, 40 * GiB)).slot_tokens, 65536);
    EXPECT_EQ(choose_default_context(eight_b(262144, 2, 200 * GiB)).slot_tokens, largest_default_slot_tokens);
    // 12 GiB: 2 x 32K = 9 GiB fits in 9 GiB (3/4 of 12).
    EXPECT_EQ(choose_default_context(eight_b(262144, 2, 12 * GiB)).slot_tokens, agent_slot_tokens);
}

TEST(context_sizing, short_memory_gives_what_fits_and_says_what_to_change) {
    // 4 GiB: 3 GiB for 2 slots = 10,922 cells each, rounded down to whole KiB of tokens.
    const context_choice c = choose_default_context(eight_b(40960, 2, 4 * GiB));
    EXPECT_EQ(c.slot_tokens, 10240);
    EXPECT_LE(c.cache_bytes, 3 * GiB);
    EXPECT_NE(c.why.find("memory is short"), std::string::npos) << c.why;
    EXPECT_NE(c.why.find("--parallel"), std::string::npos) << c.why;
    // Almost nothing free: the smallest default slot, not zero.
    EXPECT_EQ(choose_default_context(eight_b(40960, 2, 1)).slot_tokens, smallest_default_slot_tokens);
}

TEST(context_sizing, never_more_than_the_trained_context) {
    EXPECT_EQ(choose_default_context(eight_b(2048, 2, 64 * GiB)).slot_tokens, 2048);
    EXPECT_EQ(choose_default_context(eight_b(2048, 2, 1)).slot_tokens, 2048);
    EXPECT_EQ(choose_default_context(eight_b(2048, 2, 0)).slot_tokens, 2048);
}

TEST(context_sizing, recurrent_states_count_against_the_memory) {
    context_sizing_input in = eight_b(131072, 1, 20 * GiB);
    EXPECT_EQ(choose_default_context(in).slot_tokens, 65536);  // 9 GiB of 15
    in.bytes_per_sequence = 3 * GiB / 4;                       // 11 sequences: 8.25 GiB more
    EXPECT_EQ(choose_default_context(in).slot_tokens, agent_slot_tokens);
}

TEST(context_sizing, unknown_memory_gives_what_agents_need) {
    const context_choice c = choose_default_context(eight_b(131072, 2, 0));
    EXPECT_EQ(c.slot_tokens, agent_slot_tokens);
    EXPECT_NE(c.why.find("unknown"), std::string::npos) << c.why;
}

}  // namespace
}  // namespace keepwarm

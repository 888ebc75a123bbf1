// plan_block_restore: which RAM/disk blocks (and which tail) a restore reads, planned over a prefix tree whose nodes
// keep blocks by end position, as the prompt cache's do. Every case ends (the planner steps at most one block a turn)
// and never plans past `limit`.
#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <vector>

#include "cache/prefix-tree.h"
#include "cache/restore-plan.h"

using namespace keepwarm;

namespace {

using tokens = std::vector<llama_token>;
struct span_blocks {
    std::map<int32_t, int> blocks;  // end position -> anything
};
using tree = prefix_tree<span_blocks>;

tokens sequence(int n, llama_token first = 1) {
    tokens t(static_cast<size_t>(n));
    std::iota(t.begin(), t.end(), first);
    return t;
}

// `path` in the tree with blocks ending at `ends`, in increasing order (each stored on the node that ends there, as the
// prompt cache stores them; this Value has no split_upper, so later splits must fall below every stored end).
void store(tree& t, const tokens& path, const std::vector<int32_t>& ends) {
    for (const int32_t end : ends) {
        tree::node* tip = t.insert(path);
        t.node_ending_at(tip, static_cast<size_t>(end))->value.blocks[end] = 1;
    }
}

block_restore_plan plan(tree& t, const tokens& prompt, int from, int limit, int b) {
    return plan_block_restore<tree>(t.longest_prefix(prompt), from, limit, b);
}

}  // namespace

// The reported hang: a prompt of exactly k blocks whose blocks are stored (a longer prompt with the same start came
// before) is restored up to its last position but one; the last block is read once, and planning ends.
TEST(restore_plan, a_prompt_of_exactly_whole_blocks_plans_each_block_once) {
    for (const int k : {1, 2, 4}) {
        tree t;
        const tokens longer = sequence(k * 256 + 100);
        std::vector<int32_t> ends;
        for (int e = 256; e <= k * 256; e += 256) ends.push_back(e);
        store(t, longer, ends);
        const tokens prompt(longer.begin(), longer.begin() + k * 256);
        const int limit = k * 256 - 1;
        const block_restore_plan p = plan(t, prompt, 0, limit, 256);
        EXPECT_EQ(p.ends, ends) << k << " blocks";
        EXPECT_EQ(p.attention_end, limit) << k << " blocks";
    }
}

TEST(restore_plan, blocks_after_the_device_span_stop_at_the_first_gap) {
    tree t;
    const tokens path = sequence(1000);
    store(t, path, {64, 128, 256, 320});  // 192 is missing
    const block_restore_plan p = plan(t, path, 70, 999, 64);
    EXPECT_EQ(p.ends, (std::vector<int32_t>{128}));
    EXPECT_EQ(p.attention_end, 128);
}

TEST(restore_plan, a_tail_continues_the_last_whole_block_and_the_longest_that_fits_is_taken) {
    tree t;
    const tokens path = sequence(300);
    store(t, path, {64, 128, 150, 170, 190});
    EXPECT_EQ(plan(t, path, 0, 299, 64).ends, (std::vector<int32_t>{64, 128, 190}));
    // A tail past the limit is still the longest: it is restored up to the limit, not cut back to a shorter tail.
    const block_restore_plan p = plan(t, path, 0, 180, 64);
    EXPECT_EQ(p.ends, (std::vector<int32_t>{64, 128, 190}));
    EXPECT_EQ(p.attention_end, 180);
}

// Issue 33: the same prompt sent again after a restart (limit = its length - 1) restores the tail stored at its end,
// all but the last position, instead of stopping at the last whole block.
TEST(restore_plan, the_same_prompt_again_takes_the_tail_at_its_end_up_to_the_limit) {
    tree t;
    const tokens path = sequence(1516);
    std::vector<int32_t> ends;
    for (int32_t end = 256; end <= 1280; end += 256) ends.push_back(end);
    ends.push_back(1516);
    store(t, path, ends);
    const block_restore_plan p = plan(t, path, 0, 1515, 256);
    EXPECT_EQ(p.ends.back(), 1516);
    EXPECT_EQ(p.attention_end, 1515);
    // A tail that ends past what matched is another path's: never taken.
    tokens other = sequence(1400);
    other.push_back(-7);
    EXPECT_EQ(plan(t, other, 0, static_cast<int>(other.size()) - 1, 256).attention_end, 1280);
}

TEST(restore_plan, nothing_is_planned_past_what_matched) {
    tree t;
    store(t, sequence(512), {256, 512});
    tokens prompt = sequence(400);
    prompt.push_back(-5);  // departs from the stored path at 400: block 512 is not on the prompt's path
    const block_restore_plan p = plan(t, prompt, 0, static_cast<int>(prompt.size()) - 1, 256);
    EXPECT_EQ(p.ends, (std::vector<int32_t>{256}));
    EXPECT_EQ(p.attention_end, 256);
}

TEST(restore_plan, a_device_span_at_or_past_the_limit_plans_no_block) {
    tree t;
    const tokens path = sequence(512);
    store(t, path, {256, 512});
    const block_restore_plan p = plan(t, path, 511, 511, 256);
    EXPECT_TRUE(p.ends.empty());
    EXPECT_EQ(p.attention_end, 511);
}

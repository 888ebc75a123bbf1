// The stored part of a restore plan: which RAM/disk blocks (and which tail) bring a prompt's KV back past what the
// device already holds. Pure planning over the prefix tree, nothing read or written, so that its every loop can be
// proved bounded by a test and a fuzz target (fuzz/restore-plan.cpp) on a tree of their own.
// Threading: whoever owns the tree.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace keepwarm {

struct block_restore_plan {
    // Ends of the blocks to read, in order, strictly increasing: each covers [last whole block's end before it, end).
    // Only the last may be a tail (an end that is not a multiple of the block size).
    std::vector<int32_t> ends;
    // Positions whose KV the device span and the planned blocks provide together: never more than `limit`.
    int attention_end = 0;
};

// Plans what a restore reads after `from` positions that the device already gives (from <= limit): every whole
// block of `block_tokens` positions the matched path holds without a gap (a node's Value keeps them in `blocks`, a
// map keyed by end position), then the longest tail past the last of them, never planning beyond `limit` positions
// (the part of a block or tail past `limit` is simply not restored) nor beyond what matched. A tail may end past
// `limit`: the same prompt sent again (limit = its length - 1) finds the tail stored at its end and restores all but
// its last position, as a block past `limit` is taken for a prompt of exactly whole blocks.
// Bounds: the whole-block loop steps one block per turn from `from` to `limit`; the tail search walks the path's
// nodes once, upwards, each node's blocks once, downwards.
template <typename Tree>
block_restore_plan plan_block_restore(const typename Tree::match& m, int from, int limit, int block_tokens) {
    block_restore_plan plan;
    plan.attention_end = std::min(from, limit);
    const int matched = static_cast<int>(m.length);
    if (!m.deepest || block_tokens <= 0 || limit <= 0) return plan;
    const int b = block_tokens;
    // `end` only grows, and a block is planned only while it adds positions: a prompt whose last restorable
    // position falls inside a block that ends past `limit` (a prompt of exactly k blocks whose blocks are stored,
    // with `limit` = its length - 1) takes that block once, and one the device already gives up to `limit` none.
    for (int end = (plan.attention_end / b + 1) * b; plan.attention_end < limit && end <= matched; end += b) {
        const auto* n = Tree::ancestor_at(m.deepest, static_cast<size_t>(end));
        if (!n->value.blocks.count(end)) break;
        plan.ends.push_back(end);
        plan.attention_end = std::min(end, limit);
    }
    // A tail: an alternative ending inside the next block, past `attention_end`, the longest on the prompt's path.
    const int from_tail = plan.attention_end;
    if (from_tail >= limit) return plan;
    const int upto = std::min(matched, from_tail / b * b + b - 1);
    if (upto <= from_tail) return plan;
    for (const auto* n = Tree::ancestor_at(m.deepest, static_cast<size_t>(upto));
         !Tree::is_root(n) && static_cast<int>(n->depth) > from_tail; n = n->parent) {
        const auto& blocks = n->value.blocks;
        for (auto it = blocks.upper_bound(upto); it != blocks.begin();) {
            --it;
            if (it->first <= from_tail) break;
            if (it->first % b != 0) {
                plan.ends.push_back(it->first);
                plan.attention_end = std::min(it->first, limit);
                return plan;
            }
        }
    }
    return plan;
}

}  // namespace keepwarm

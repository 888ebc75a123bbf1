// Fuzz target: the restore planner (cache/restore-plan.h) over a prefix tree of stored blocks and tails, as the prompt
// cache keeps them. Whatever the tree holds and whatever the prompt, `from` and `limit`, planning ends (libFuzzer's
// -timeout catches a loop) and the plan keeps its contract: ends strictly increasing, each a block the prompt's path
// holds, whole blocks contiguous from the device span on, at most one tail and only last, nothing past `limit`
// positions or past what matched. A prompt of exactly k blocks whose blocks are stored (issue 39's hang) is one of
// the shapes the seeds and the fuzzer reach.
//
// Input: block size (1 byte, 1..64), limit and from (2 bytes each), then paths: each a length (2 bytes), a fork point
// (1 byte: where it leaves the previous path) and a count of stored ends (1 byte) with each end (2 bytes). The last
// path, cut or extended by the limit's high bit, is the prompt.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <vector>

#include "cache/prefix-tree.h"
#include "cache/restore-plan.h"

using namespace keepwarm;

namespace {

struct span_blocks {
    std::map<int32_t, int> blocks;  // end position -> anything
    // As the prompt cache's span_value: an entry belongs to the node whose span holds its last position.
    span_blocks split_upper(size_t upper_depth) {
        span_blocks upper;
        for (auto it = blocks.begin(); it != blocks.end() && it->first <= static_cast<int32_t>(upper_depth);) {
            upper.blocks.insert(*it);
            it = blocks.erase(it);
        }
        return upper;
    }
};
using tree = prefix_tree<span_blocks>;

struct reader {
    const uint8_t* data;
    size_t size, at = 0;
    bool more() const { return at < size; }
    unsigned u8() { return at < size ? data[at++] : 0; }
    unsigned u16() { return u8() | (u8() << 8); }
};

[[noreturn]] void broken(const char* what, int value) {
    std::fprintf(stderr, "restore plan: %s (%d)\n", what, value);
    std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    reader in{data, size};
    const int b = static_cast<int>(in.u8() % 64) + 1;
    const unsigned limit_bits = in.u16();
    const int limit = static_cast<int>(limit_bits % 4096);
    const int from = static_cast<int>(in.u16() % 4096);

    tree t;
    std::vector<llama_token> path;
    for (int paths = 0; in.more() && paths < 16; ++paths) {
        const size_t length = in.u16() % 4096;
        const size_t fork = path.empty() ? 0 : in.u8() * path.size() / 256;
        path.resize(fork);
        // Tokens after the fork point depend on the path's number, so paths part there.
        while (path.size() < length) path.push_back(static_cast<llama_token>(path.size() * 31 + paths * 7 + 1));
        path.resize(length);
        tree::node* tip = t.insert(path);
        const unsigned count = in.u8() % 32;
        for (unsigned i = 0; i < count && !path.empty(); ++i) {
            const size_t end = in.u16() % path.size() + 1;
            t.node_ending_at(tip, end)->value.blocks[static_cast<int32_t>(end)] = 1;
            tip = t.longest_prefix(path).deepest;  // splitting may have put a new node above the old tip
        }
    }
    std::vector<llama_token> prompt = path;
    if (limit_bits & 0x8000) prompt.push_back(-1);  // one token past every stored path

    const tree::match m = t.longest_prefix(prompt);
    const int start = std::min(from, limit);
    const block_restore_plan plan = plan_block_restore<tree>(m, start, limit, b);

    if (plan.attention_end > limit) broken("planned past the limit", plan.attention_end);
    if (plan.attention_end < start) broken("planned less than the device gives", plan.attention_end);
    if (plan.ends.size() > static_cast<size_t>((limit - start) / b + 2)) {
        broken("more steps than blocks to the limit", static_cast<int>(plan.ends.size()));
    }
    int expected_whole = (start / b + 1) * b;
    for (size_t i = 0; i < plan.ends.size(); ++i) {
        const int32_t end = plan.ends[i];
        if (i > 0 && end <= plan.ends[i - 1]) broken("ends not increasing", end);
        if (end > static_cast<int32_t>(m.length)) broken("past what matched", end);
        if (!tree::ancestor_at(m.deepest, static_cast<size_t>(end))->value.blocks.count(end)) {
            broken("a block the path does not hold", end);
        }
        if (end % b == 0) {
            if (end != expected_whole) broken("whole blocks not contiguous from the device span", end);
            expected_whole += b;
        } else if (i + 1 != plan.ends.size()) {
            broken("a tail that is not last", end);
        }
    }
    if (!plan.ends.empty() && plan.attention_end != std::min<int>(plan.ends.back(), limit)) {
        broken("attention end is not the last planned end", plan.attention_end);
    }
    return 0;
}

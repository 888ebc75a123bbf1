// The proxy's cache-aware router on its own: chained block hashes of the canonical prompt, longest-prefix choice,
// least-loaded fallback, rebalancing, failover and forgetting a restarted upstream's tree.
#include <gtest/gtest.h>

#include <set>

#include "proxy/upstream-router.h"

using namespace keepwarm;
using namespace keepwarm::proxy;

namespace {

constexpr size_t block = 16;

// A conversation's prompt after `turns` turns: a system prompt unique to `name`, then the turns.
chat_request conversation(const std::string& name, int turns) {
    chat_request chat;
    common_chat_msg system;
    system.role = "system";
    system.content = name + " is the name of this conversation. Answer briefly and precisely.";
    chat.messages.push_back(system);
    for (int i = 0; i < turns; i++) {
        common_chat_msg user, assistant;
        user.role = "user";
        user.content = "Question number " + std::to_string(i) + " of " + name + ", with some words around it.";
        assistant.role = "assistant";
        assistant.content = "Answer number " + std::to_string(i) + ", as long as a sentence can be.";
        chat.messages.push_back(user);
        chat.messages.push_back(assistant);
    }
    return chat;
}

std::vector<uint64_t> blocks_of(const chat_request& chat) {
    return chained_block_hashes(canonical_prompt_text(chat), block);
}

// Routes and starts a request, returning where it went (finish() is the caller's).
size_t send(upstream_router& router, const std::vector<uint64_t>& blocks) {
    const auto d = router.choose(blocks);
    EXPECT_TRUE(d.has_value());
    router.start(*d, blocks);
    return d->upstream;
}

router_options options() {
    return {.block_chars = block, .min_match_blocks = 2, .rebalance_margin = 2, .max_blocks_per_upstream = 1000};
}

}  // namespace

TEST(UpstreamRouter, ChainedHashesShareExactlyTheCommonPrefix) {
    const std::string a = std::string(40, 'x') + "tail one", b = std::string(40, 'x') + "other tail";
    const auto ha = chained_block_hashes(a, block), hb = chained_block_hashes(b, block);
    ASSERT_EQ(ha.size(), 3u);  // 48 bytes: 3 whole blocks; the partial one is left out
    EXPECT_EQ(ha[0], hb[0]);
    EXPECT_EQ(ha[1], hb[1]);
    EXPECT_NE(ha[2], hb[2]);  // block 2 holds where they differ
    // Chained: the same block text after a different prefix hashes differently.
    const auto hc = chained_block_hashes(std::string(16, 'y') + std::string(16, 'x'), block);
    EXPECT_NE(hc[1], ha[1]);
    EXPECT_TRUE(chained_block_hashes("short", block).empty());
}

TEST(UpstreamRouter, CanonicalTextGrowsByAppendingTurns) {
    const std::string one = canonical_prompt_text(conversation("a", 1)),
                      two = canonical_prompt_text(conversation("a", 2));
    EXPECT_TRUE(two.starts_with(one));
    EXPECT_FALSE(canonical_prompt_text(conversation("b", 2)).starts_with(one));
}

TEST(UpstreamRouter, AConversationStaysOnItsUpstreamAcrossTurns) {
    upstream_router router(3, options());
    const size_t first = send(router, blocks_of(conversation("a", 1)));
    router.finish(first);
    for (int turn = 2; turn <= 5; turn++) {
        const auto blocks = blocks_of(conversation("a", turn));
        const auto d = router.choose(blocks);
        ASSERT_TRUE(d);
        EXPECT_EQ(d->upstream, first) << "turn " << turn;
        EXPECT_GE(d->matched_blocks, 2u);
        router.start(*d, blocks);
        router.finish(d->upstream);
    }
    EXPECT_EQ(router.stats(first).requests, 5u);
    EXPECT_EQ(router.stats(first).prefix_hits, 4u);
}

TEST(UpstreamRouter, DifferentConversationsSpreadOverUpstreams) {
    upstream_router router(3, options());
    std::set<size_t> used;
    for (const char* name : {"a", "b", "c"}) {
        const size_t u = send(router, blocks_of(conversation(name, 1)));
        router.finish(u);
        used.insert(u);
    }
    EXPECT_EQ(used.size(), 3u);
}

TEST(UpstreamRouter, AShortMatchDoesNotPullARequest) {
    upstream_router router(2, {.block_chars = block, .min_match_blocks = 100, .rebalance_margin = 2});
    const auto blocks = blocks_of(conversation("a", 1));
    const size_t first = send(router, blocks);
    router.finish(first);
    // The same prompt again matches fully, but below the threshold: the upstream with fewer requests gets it.
    const auto d = router.choose(blocks);
    ASSERT_TRUE(d);
    EXPECT_NE(d->upstream, first);
    EXPECT_EQ(d->matched_blocks, 0u);
}

TEST(UpstreamRouter, LoadGoesToTheNextLongestMatchWithinTheMargin) {
    upstream_router router(3, options());
    const auto shared = blocks_of(conversation("a", 1));  // what two upstreams were sent
    const auto longer = blocks_of(conversation("a", 3));  // the conversation went on at its home
    ASSERT_GT(longer.size(), shared.size());
    const size_t home = send(router, longer);
    router.finish(home);
    // The second upstream is sent the shared start (the least loaded, then fewest requests: not home).
    const auto second = router.choose(blocks_of(conversation("b", 1)));
    ASSERT_TRUE(second);
    ASSERT_NE(second->upstream, home);
    router.start(*second, shared);
    router.finish(second->upstream);
    for (int i = 0; i < 3; i++) router.start(*router.choose(longer), longer);  // 3 in flight at home: over margin 2
    ASSERT_EQ(router.stats(home).in_flight, 3);
    const auto d = router.choose(longer);
    ASSERT_TRUE(d);
    EXPECT_TRUE(d->rebalanced);
    EXPECT_EQ(d->upstream, second->upstream) << "it holds the shared start; the third upstream holds nothing";
    EXPECT_EQ(d->matched_blocks, shared.size());
}

TEST(UpstreamRouter, LoadBeyondTheMarginWinsOverTheMatch) {
    upstream_router router(2, options());
    const auto blocks = blocks_of(conversation("a", 2));
    const size_t home = send(router, blocks);  // in flight: 1
    send(router, blocks);                      // in flight: 2, a match
    EXPECT_EQ(router.stats(home).in_flight, 2);
    send(router, blocks);  // in flight 3 vs 0: 3 - 0 > margin 2 after this one
    const auto d = router.choose(blocks);
    ASSERT_TRUE(d);
    EXPECT_NE(d->upstream, home);
    EXPECT_TRUE(d->rebalanced);
    router.start(*d, blocks);
    EXPECT_EQ(router.stats(d->upstream).rebalanced, 1u);
    // Once the load drains, the match wins again.
    for (int i = 0; i < 3; i++) router.finish(home);
    EXPECT_EQ(router.choose(blocks)->upstream, home);
}

TEST(UpstreamRouter, DownUpstreamsAreSkippedAndForgottenWhenTheyComeBack) {
    upstream_router router(2, options());
    const auto blocks = blocks_of(conversation("a", 2));
    const size_t home = send(router, blocks);
    router.finish(home);
    const size_t other = 1 - home;

    router.set_health(home, false);
    EXPECT_EQ(router.choose(blocks)->upstream, other);
    EXPECT_EQ(router.choose(blocks, {other}), std::nullopt);  // the one left was excluded (it failed)
    router.set_health(other, false);
    EXPECT_EQ(router.choose(blocks), std::nullopt);

    router.set_health(home, true);  // back after being down: a restart, its KV cache is gone
    EXPECT_EQ(router.stats(home).tree_blocks, 0u);
    EXPECT_EQ(router.stats(home).forgotten, 1u);
    EXPECT_EQ(router.match(home, blocks), 0u);
}

TEST(UpstreamRouter, AnotherInstanceMeansARestart) {
    upstream_router router(1, options());
    router.set_health(0, true, "started-1");
    const auto blocks = blocks_of(conversation("a", 2));
    router.finish(send(router, blocks));
    router.set_health(0, true, "started-1");
    EXPECT_GT(router.match(0, blocks), 0u);
    router.set_health(0, true, "started-2");  // restarted between two checks
    EXPECT_EQ(router.match(0, blocks), 0u);
}

TEST(UpstreamRouter, TheTreeIsBoundedAndKeepsWhatWasSentLast) {
    upstream_router router(1, {.block_chars = block, .min_match_blocks = 1, .max_blocks_per_upstream = 8});
    const auto a = blocks_of(conversation("a", 2)), b = blocks_of(conversation("b", 2));
    ASSERT_GT(a.size(), 8u);
    router.finish(send(router, a));
    EXPECT_EQ(router.stats(0).tree_blocks, 8u);
    // The first blocks were kept (they are what later turns share); the match is found through them.
    EXPECT_GE(router.match(0, std::span(a).first(4)), 4u);
    router.finish(send(router, b));
    EXPECT_EQ(router.match(0, a), 0u);  // a's blocks were least recently sent
    EXPECT_GT(router.match(0, b), 0u);
}

TEST(upstream_router, a_tenants_prompt_never_matches_another_tenants_blocks) {
    // Each tenant's chain starts from its own root: where bob's request goes never depends on what alice sent.
    const std::string text(4 * 256, 'p');
    const auto alice = chained_block_hashes(text, 256, "alice"), bob = chained_block_hashes(text, 256, "bob");
    const auto shared = chained_block_hashes(text, 256);
    ASSERT_EQ(alice.size(), 4u);
    for (size_t i = 0; i < alice.size(); ++i) {
        EXPECT_NE(alice[i], bob[i]);
        EXPECT_NE(alice[i], shared[i]);
    }
    upstream_router router(2, {.block_chars = 256, .min_match_blocks = 2});
    router.start({.upstream = 1}, alice);
    EXPECT_EQ(router.match(1, alice), 4u);
    EXPECT_EQ(router.match(1, bob), 0u);
}

// Requests with one prompt_cache_key go to one upstream even when their prompts share too little to match (a new
// conversation of a client that says it shares a prefix, say), within the load rule, per tenant, and a bounded
// number of keys are remembered.
TEST(upstream_router, requests_with_one_prompt_cache_key_go_to_one_upstream) {
    upstream_router router(3,
                           {.block_chars = block, .min_match_blocks = 2, .rebalance_margin = 2, .max_routing_keys = 2});
    const uint64_t key = routing_key("agent-session-1", "");
    const auto first_blocks = blocks_of(conversation("a", 1));
    const auto first = router.choose(first_blocks, {}, key);
    ASSERT_TRUE(first);
    EXPECT_FALSE(first->keyed) << "a key seen for the first time decides nothing";
    router.start(*first, first_blocks, key);
    router.finish(first->upstream);
    // Other conversations with nothing in common: without the key they spread, with it they follow it.
    for (const char* name : {"b", "c", "d"}) {
        const auto blocks = blocks_of(conversation(name, 1));
        EXPECT_NE(router.choose(blocks)->upstream, first->upstream) << "least loaded without the key";
        const auto d = router.choose(blocks, {}, key);
        ASSERT_TRUE(d);
        EXPECT_EQ(d->upstream, first->upstream) << name;
        EXPECT_TRUE(d->keyed);
        router.start(*d, blocks, key);
        router.finish(d->upstream);
    }
    EXPECT_EQ(router.stats(first->upstream).keyed, 3u);
    // Another tenant's identical key is another key.
    EXPECT_NE(routing_key("agent-session-1", "bob"), key);
    EXPECT_EQ(routing_key("", "bob"), 0u);
    EXPECT_FALSE(router.choose(blocks_of(conversation("e", 1)), {}, routing_key("agent-session-1", "bob"))->keyed);
    // Down or excluded: the key gives way.
    EXPECT_NE(router.choose(blocks_of(conversation("f", 1)), {first->upstream}, key)->upstream, first->upstream);
    // Load beyond the margin wins over the key.
    const auto busy = blocks_of(conversation("g", 1));
    for (int i = 0; i < 3; i++) router.start(*router.choose(busy, {}, key), busy, key);
    const auto over = router.choose(busy, {}, key);
    EXPECT_NE(over->upstream, first->upstream);
    EXPECT_TRUE(over->rebalanced);
    for (int i = 0; i < 3; i++) router.finish(first->upstream);
    // Two keys are remembered: a third pushes out the least recently used (this one, after two newer keys).
    for (const char* other : {"k2", "k3"}) {
        const auto blocks = blocks_of(conversation(other, 1));
        router.start(*router.choose(blocks, {}, routing_key(other, "")), blocks, routing_key(other, ""));
    }
    EXPECT_FALSE(router.choose(blocks_of(conversation("h", 1)), {}, key)->keyed);
}

// Routing by model name: the upstreams that do not serve the name are left out, unless none serves it.
TEST(UpstreamsNotServing, LeavesOutTheUpstreamsThatDoNotServeTheName) {
    const std::vector<std::vector<std::string>> served = {{"qwen", "llama"}, {"llama"}, {}, {"mistral"}};
    EXPECT_EQ(upstreams_not_serving(served, "qwen"), (std::vector<size_t>{1, 2, 3}));
    EXPECT_EQ(upstreams_not_serving(served, "llama"), (std::vector<size_t>{2, 3}));
    EXPECT_EQ(upstreams_not_serving(served, "mistral"), (std::vector<size_t>{0, 1, 2}));
}

TEST(UpstreamsNotServing, ANameNoUpstreamServesIsAClientsLabelAndExcludesNone) {
    const std::vector<std::vector<std::string>> served = {{"qwen"}, {"llama"}};
    EXPECT_TRUE(upstreams_not_serving(served, "claude-sonnet-4-5").empty());
    EXPECT_TRUE(upstreams_not_serving(served, "").empty());
    EXPECT_TRUE(upstreams_not_serving({{}, {}}, "qwen").empty());  // nothing listed yet
    EXPECT_TRUE(upstreams_not_serving({}, "qwen").empty());
}

TEST(UpstreamRouter, ExactRoutingGoesToTheMostHeldBlocksUnderTheLoadRule) {
    upstream_router router(3, {.rebalance_margin = 1});
    // Nobody holds a block: no exact decision (the pool then infers).
    EXPECT_FALSE(router.choose_held(std::vector<size_t>{0, 0, 0}));
    const std::vector<size_t> held{1, 3, 2};
    auto d = router.choose_held(held);
    ASSERT_TRUE(d);
    EXPECT_EQ(d->upstream, 1u);
    EXPECT_EQ(d->matched_blocks, 3u);
    EXPECT_TRUE(d->exact);
    EXPECT_FALSE(d->rebalanced);
    // Excluded or down upstreams are passed over.
    EXPECT_EQ(router.choose_held(held, {1})->upstream, 2u);
    router.set_health(2, false);
    EXPECT_EQ(router.choose_held(held, {1})->upstream, 0u);
    router.set_health(2, true);
    // Load wins past the margin, as in choose().
    router.start(*d, {});
    router.start(*d, {});
    d = router.choose_held(held);
    EXPECT_TRUE(d->rebalanced);
    EXPECT_EQ(d->upstream, 2u) << "the next most held blocks within the margin, not the least loaded (0)";
    EXPECT_EQ(d->matched_blocks, 2u);
    const upstream_router::upstream_stats s = router.stats(1);
    EXPECT_EQ(s.exact_hits, 2u);
    EXPECT_EQ(s.exact_blocks, 6u);
    EXPECT_EQ(s.prefix_hits, 0u);  // text-block hits count inference only
}

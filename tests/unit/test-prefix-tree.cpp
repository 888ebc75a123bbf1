// prefix_tree: the radix tree over token ids that the prefix cache indexes every cached span with.
#include <gtest/gtest.h>

#include <random>

#include "cache/prefix-tree.h"

using keepwarm::prefix_tree;
using tokens = std::vector<llama_token>;

TEST(prefix_tree, empty_tree_matches_nothing) {
    prefix_tree<int> tree;
    const auto m = tree.longest_prefix(tokens{1, 2, 3});
    EXPECT_EQ(m.length, 0u);
    EXPECT_EQ(m.deepest, nullptr);
    EXPECT_EQ(tree.node_count(), 0u);
}

TEST(prefix_tree, insert_then_match_whole_and_partial) {
    prefix_tree<int> tree;
    auto* n = tree.insert(tokens{1, 2, 3, 4});
    n->value = 7;
    EXPECT_EQ(n->depth, 4u);
    EXPECT_EQ(tree.node_count(), 1u);

    auto m = tree.longest_prefix(tokens{1, 2, 3, 4, 5, 6});
    EXPECT_EQ(m.length, 4u);
    EXPECT_TRUE(m.ends_at_node());
    EXPECT_EQ(m.deepest->value, 7);

    m = tree.longest_prefix(tokens{1, 2, 9});
    EXPECT_EQ(m.length, 2u);
    EXPECT_FALSE(m.ends_at_node());
    EXPECT_EQ(m.into_edge, 2u);
}

TEST(prefix_tree, diverging_insert_splits_the_edge_and_keeps_values) {
    prefix_tree<int> tree;
    tree.insert(tokens{1, 2, 3, 4})->value = 1;
    auto* other = tree.insert(tokens{1, 2, 7, 8, 9});
    other->value = 2;
    EXPECT_EQ(tree.node_count(), 3u);  // shared [1 2], then [3 4] and [7 8 9]
    EXPECT_EQ(other->depth, 5u);
    EXPECT_EQ(other->parent->depth, 2u);
    EXPECT_EQ(other->parent->edge, (tokens{1, 2}));
    EXPECT_EQ(tree.longest_prefix(tokens{1, 2, 3, 4}).deepest->value, 1);
    EXPECT_EQ(tree.longest_prefix(tokens{1, 2, 7, 8, 9, 10}).deepest->value, 2);
    EXPECT_EQ(tree.path(other), (tokens{1, 2, 7, 8, 9}));
}

TEST(prefix_tree, inserting_a_prefix_of_a_path_returns_a_node_ending_there) {
    prefix_tree<int> tree;
    tree.insert(tokens{5, 6, 7, 8});
    auto* mid = tree.insert(tokens{5, 6});
    EXPECT_EQ(mid->depth, 2u);
    EXPECT_EQ(mid->children.size(), 1u);
    EXPECT_EQ(tree.insert(tokens{5, 6}), mid) << "inserting again finds the same node";
    EXPECT_EQ(tree.insert(tokens{}), tree.root());
}

TEST(prefix_tree, erase_leaf_only) {
    prefix_tree<int> tree;
    auto* a = tree.insert(tokens{1, 2, 3});
    auto* b = tree.insert(tokens{1, 2, 4});
    auto* shared = a->parent;
    EXPECT_FALSE(tree.erase_leaf(shared)) << "has children";
    EXPECT_FALSE(tree.erase_leaf(tree.root()));
    EXPECT_TRUE(tree.erase_leaf(a));
    EXPECT_EQ(tree.longest_prefix(tokens{1, 2, 3}).length, 2u);
    EXPECT_EQ(tree.longest_prefix(tokens{1, 2, 4}).deepest, b);
    EXPECT_EQ(tree.node_count(), 2u);
}

// Against a brute-force reference: the longest prefix is the longest common prefix with any inserted sequence.
TEST(prefix_tree, matches_brute_force_on_random_sequences) {
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> token(0, 3), length(0, 12);
    prefix_tree<int> tree;
    std::vector<tokens> inserted;
    for (int i = 0; i < 300; ++i) {
        tokens t(length(rng));
        for (auto& x : t) x = token(rng);
        tree.insert(t);
        inserted.push_back(t);
    }
    size_t visited = 0;
    tree.for_each([&](auto& n) {
        ++visited;
        EXPECT_EQ(n.depth, n.parent->depth + n.edge.size());
        EXPECT_FALSE(n.edge.empty());
    });
    EXPECT_EQ(visited, tree.node_count());
    for (int q = 0; q < 500; ++q) {
        tokens query(length(rng) + 2);
        for (auto& x : query) x = token(rng);
        size_t best = 0;
        for (const auto& t : inserted) {
            size_t k = 0;
            while (k < t.size() && k < query.size() && t[k] == query[k]) ++k;
            best = std::max(best, k);
        }
        const auto m = tree.longest_prefix(query);
        ASSERT_EQ(m.length, best);
        if (m.deepest) {
            const tokens p = tree.path(m.deepest);
            const size_t matched_depth = m.deepest->depth - m.deepest->edge.size() + m.into_edge;
            EXPECT_EQ(matched_depth, best);
            EXPECT_TRUE(std::equal(query.begin(), query.begin() + static_cast<std::ptrdiff_t>(best), p.begin()));
        }
    }
}

TEST(prefix_tree, paths_under_two_roots_never_match_each_other) {
    // One root per tenant: the same tokens cached under tenant A are not found from tenant B's root.
    prefix_tree<int> tree;
    auto* a = tree.root();
    auto* b = tree.new_root();
    tree.insert_below(a, tokens{7, 4, 0, 3, 1, 7})->value = 1;
    EXPECT_EQ(tree.longest_prefix(b, tokens{7, 4, 0, 3, 1, 7}).length, 0u);
    EXPECT_EQ(tree.longest_prefix(a, tokens{7, 4, 0, 3, 1, 7}).length, 6u);
    auto* in_b = tree.insert_below(b, tokens{7, 4, 0, 9});
    EXPECT_EQ(prefix_tree<int>::root_of(in_b), b);
    EXPECT_EQ(tree.longest_prefix(b, tokens{7, 4, 0, 3}).length, 3u);  // B's own path only
    EXPECT_EQ(tree.longest_prefix(a, tokens{7, 4, 0, 9}).length, 3u);
    EXPECT_EQ(tree.path(in_b), (tokens{7, 4, 0, 9}));
    EXPECT_FALSE(tree.erase_leaf(b));
    EXPECT_TRUE(prefix_tree<int>::is_root(b));
    size_t visited = 0;
    tree.for_each([&](auto&) { ++visited; });
    EXPECT_EQ(visited, tree.node_count());
    EXPECT_EQ(visited, 2u);
}

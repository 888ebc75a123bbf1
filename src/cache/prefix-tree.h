// A radix tree over token ids: the index of every cached prefix, whatever tier holds its KV. Lookup walks the
// prompt once, so its cost grows with the prompt's length, not with how many conversations are cached.
// Each node ends a run of tokens (its edge) and carries a Value (e.g. where that span's KV lives). When an edge is
// split, a Value with a member `Value split_upper(size_t upper_depth)` hands the upper node what belongs to it.
// The tree may have several roots (new_root()): separate namespaces, e.g. one per tenant, whose paths never meet.
// Threading: not synchronized; the owner serializes access.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "llama.h"

namespace keepwarm {

template <typename Value>
class prefix_tree {
public:
    struct node {
        std::vector<llama_token> edge;  // tokens from the parent to this node
        size_t depth = 0;               // tokens from the root to the end of this node's edge
        node* parent = nullptr;
        std::map<llama_token, std::unique_ptr<node>> children;  // keyed by the first token of the child's edge
        Value value{};
    };

    struct match {
        size_t length = 0;        // tokens of the query found in the tree
        node* deepest = nullptr;  // the node whose edge holds the last matched token (nullptr: nothing matched)
        size_t into_edge = 0;     // how many tokens of deepest's edge matched (== edge size: the whole node)
        bool ends_at_node() const { return deepest && into_edge == deepest->edge.size(); }
    };

    prefix_tree() { roots_.push_back(std::make_unique<node>()); }

    // The first root (always there).
    node* root() { return roots_.front().get(); }
    const node* root() const { return roots_.front().get(); }
    // Adds an empty root: the start of paths that no other root's paths share.
    node* new_root() { return roots_.emplace_back(std::make_unique<node>()).get(); }
    static bool is_root(const node* n) { return n->parent == nullptr; }
    static node* root_of(node* n) {
        while (n->parent) n = n->parent;
        return n;
    }
    size_t node_count() const { return nodes_; }  // excluding the roots

    // The longest prefix of `tokens` present in the tree, below the first root.
    match longest_prefix(std::span<const llama_token> tokens) const { return longest_prefix(root(), tokens); }

    // The longest prefix of `tokens` present below `from_root`.
    match longest_prefix(const node* from_root, std::span<const llama_token> tokens) const {
        match m;
        node* at = const_cast<node*>(from_root);
        size_t i = 0;
        while (i < tokens.size()) {
            auto it = at->children.find(tokens[i]);
            if (it == at->children.end()) break;
            node* child = it->second.get();
            size_t k = 0;
            while (k < child->edge.size() && i < tokens.size() && child->edge[k] == tokens[i]) ++k, ++i;
            m.deepest = child;
            m.into_edge = k;
            if (k < child->edge.size()) break;
            at = child;
        }
        m.length = i;
        return m;
    }

    // Makes `tokens` a path of the tree and returns the node that ends exactly at its last token (splitting an
    // edge if the path ended inside one). Inserting an empty sequence returns the root.
    node* insert(std::span<const llama_token> tokens) { return insert_below(root(), tokens); }

    // Like insert(), for the path `from`'s path + `tokens`.
    node* insert_below(node* from, std::span<const llama_token> tokens) {
        node* at = from;
        const size_t base = from->depth;
        size_t i = 0;
        while (i < tokens.size()) {
            auto it = at->children.find(tokens[i]);
            if (it == at->children.end()) {
                auto leaf = std::make_unique<node>();
                leaf->edge.assign(tokens.begin() + static_cast<std::ptrdiff_t>(i), tokens.end());
                leaf->depth = base + tokens.size();
                leaf->parent = at;
                node* raw = leaf.get();
                at->children.emplace(tokens[i], std::move(leaf));
                ++nodes_;
                return raw;
            }
            node* child = it->second.get();
            size_t k = 0;
            while (k < child->edge.size() && i < tokens.size() && child->edge[k] == tokens[i]) ++k, ++i;
            if (k < child->edge.size()) {
                node* upper = split(child, k);
                if (i == tokens.size()) return upper;
                at = upper;  // diverged inside the edge: the rest becomes a new leaf under the split point
                continue;
            }
            at = child;
        }
        return at;
    }

    // Splits `n`'s edge after `keep` tokens: a new node takes the first `keep` tokens (and the place of `n` under its
    // parent), `n` keeps the rest below it. Returns the new node. The new node's value is default-constructed.
    node* split(node* n, size_t keep) {
        auto& slot = n->parent->children.at(n->edge.front());
        std::unique_ptr<node> lower = std::move(slot);
        auto upper = std::make_unique<node>();
        upper->edge.assign(lower->edge.begin(), lower->edge.begin() + static_cast<std::ptrdiff_t>(keep));
        upper->depth = lower->depth - lower->edge.size() + keep;
        upper->parent = lower->parent;
        lower->edge.erase(lower->edge.begin(), lower->edge.begin() + static_cast<std::ptrdiff_t>(keep));
        lower->parent = upper.get();
        if constexpr (requires(Value v) { v.split_upper(size_t{}); })
            upper->value = lower->value.split_upper(upper->depth);
        node* raw = upper.get();
        upper->children.emplace(lower->edge.front(), std::move(lower));
        slot = std::move(upper);
        ++nodes_;
        return raw;
    }

    // Grows a leaf's edge in place (a sequence that keeps decoding past the end of its own path).
    void extend_leaf(node* leaf, std::span<const llama_token> tokens) {
        leaf->edge.insert(leaf->edge.end(), tokens.begin(), tokens.end());
        leaf->depth += tokens.size();
    }

    // The node whose edge holds position `pos - 1` on the path from the root to `n` (the node that a prefix of
    // `pos` tokens of that path ends in), or the root for pos 0. Requires pos <= n->depth.
    static node* ancestor_at(node* n, size_t pos) {
        while (n->parent && n->depth - n->edge.size() >= pos) n = n->parent;
        return n;
    }

    // Makes a node end exactly after `pos` tokens of the path to `n`, splitting an edge if needed, and returns it.
    node* node_ending_at(node* n, size_t pos) {
        node* at = ancestor_at(n, pos);
        if (at->depth == pos) return at;
        return split(at, pos - (at->depth - at->edge.size()));
    }

    // Removes a leaf. Returns false (and does nothing) for a root or a node that has children.
    bool erase_leaf(node* n) {
        if (is_root(n) || !n->children.empty()) return false;
        n->parent->children.erase(n->edge.front());
        --nodes_;
        return true;
    }

    // The tokens from the root to the end of `n`'s edge.
    std::vector<llama_token> path(const node* n) const {
        std::vector<llama_token> out(n->depth);
        for (const node* at = n; at && !is_root(at); at = at->parent) {
            std::copy(at->edge.begin(), at->edge.end(),
                      out.begin() + static_cast<std::ptrdiff_t>(at->depth - at->edge.size()));
        }
        return out;
    }

    // Visits every node but the roots, parents before children.
    template <typename F>
    void for_each(F&& visit) {
        std::vector<node*> stack;
        for (auto& r : roots_) stack.push_back(r.get());
        while (!stack.empty()) {
            node* at = stack.back();
            stack.pop_back();
            if (!is_root(at)) visit(*at);
            for (auto& [token, child] : at->children) stack.push_back(child.get());
        }
    }

private:
    std::vector<std::unique_ptr<node>> roots_;  // never empty
    size_t nodes_ = 0;
};

}  // namespace keepwarm

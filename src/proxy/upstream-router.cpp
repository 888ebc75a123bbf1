// See upstream-router.h.
#include "proxy/upstream-router.h"

#include <xxhash.h>

#include <algorithm>

namespace keepwarm::proxy {

std::string canonical_prompt_text(const chat_request& chat) {
    // Control characters as delimiters: they do not occur in ordinary text, so fields cannot run into each other.
    std::string text;
    for (const auto& tool : chat.tools) {
        text += "\x01tool\x02" + tool.name + "\x02" + tool.description + "\x02" + tool.parameters;
    }
    for (const auto& msg : chat.messages) {
        text += "\x01" + msg.role + "\x02";
        text += msg.content;
        for (const auto& part : msg.content_parts) text += part.text;
        if (!msg.reasoning_content.empty()) text += "\x03" + msg.reasoning_content;
        for (const auto& call : msg.tool_calls) text += "\x04" + call.name + "\x02" + call.arguments;
        if (!msg.tool_call_id.empty()) text += "\x05" + msg.tool_call_id;
    }
    return text;
}

std::vector<uint64_t> chained_block_hashes(const std::string& text, size_t block_chars, std::string_view tenant) {
    std::vector<uint64_t> hashes;
    if (block_chars == 0) return hashes;
    uint64_t chain = tenant.empty() ? 0 : XXH3_64bits(tenant.data(), tenant.size());
    for (size_t pos = 0; pos + block_chars <= text.size(); pos += block_chars) {
        chain = XXH3_64bits_withSeed(text.data() + pos, block_chars, chain);
        hashes.push_back(chain);
    }
    return hashes;
}

uint64_t routing_key(std::string_view prompt_cache_key, std::string_view tenant) {
    if (prompt_cache_key.empty()) return 0;
    const uint64_t seed = tenant.empty() ? 0 : XXH3_64bits(tenant.data(), tenant.size());
    const uint64_t key = XXH3_64bits_withSeed(prompt_cache_key.data(), prompt_cache_key.size(), seed);
    return key == 0 ? 1 : key;
}

upstream_router::upstream_router(size_t upstreams, router_options options) : options_(options), upstreams_(upstreams) {}

size_t upstream_router::match(size_t upstream, std::span<const uint64_t> blocks) const {
    const upstream_state& u = upstreams_.at(upstream);
    // A chained hash stands for its whole prefix, so the last block found is the match, even if the tree has
    // forgotten earlier ones.
    for (size_t i = blocks.size(); i > 0; i--) {
        if (u.blocks.contains(blocks[i - 1])) return i;
    }
    return 0;
}

std::optional<size_t> upstream_router::keyed_upstream(uint64_t key) const {
    if (key == 0) return std::nullopt;
    const auto it = keys_.find(key);
    if (it == keys_.end()) return std::nullopt;
    return it->second->second;
}

std::vector<size_t> upstreams_not_serving(const std::vector<std::vector<std::string>>& served, std::string_view model) {
    std::vector<size_t> not_serving;
    if (model.empty()) return not_serving;
    for (size_t i = 0; i < served.size(); i++) {
        if (std::find(served[i].begin(), served[i].end(), model) == served[i].end()) not_serving.push_back(i);
    }
    if (not_serving.size() == served.size()) not_serving.clear();  // nobody serves the name: a client's label
    return not_serving;
}

std::optional<upstream_router::decision> upstream_router::choose(std::span<const uint64_t> blocks,
                                                                 const std::vector<size_t>& excluded,
                                                                 uint64_t key) const {
    std::vector<size_t> matched(upstreams_.size());
    for (size_t i = 0; i < upstreams_.size(); i++) {
        if (const size_t m = match(i, blocks); m >= options_.min_match_blocks) matched[i] = m;
    }
    const std::optional<size_t> least = least_loaded(excluded);
    if (!least) return std::nullopt;
    if (const auto keyed = keyed_upstream(key)) {
        const upstream_stats& s = upstreams_[*keyed].stats;
        if (s.healthy && std::find(excluded.begin(), excluded.end(), *keyed) == excluded.end()) {
            if (overloaded(*keyed, *least))
                return decision{.upstream = *least, .matched_blocks = match(*least, blocks), .rebalanced = true};
            return decision{.upstream = *keyed, .matched_blocks = match(*keyed, blocks), .keyed = true};
        }
    }
    if (auto d = choose_matched(matched, excluded, *least)) return d;
    return decision{.upstream = *least, .matched_blocks = match(*least, blocks)};
}

std::optional<upstream_router::decision> upstream_router::choose_held(std::span<const size_t> held,
                                                                      const std::vector<size_t>& excluded) const {
    const std::optional<size_t> least = least_loaded(excluded);
    if (!least) return std::nullopt;
    std::optional<decision> d = choose_matched(held, excluded, *least);
    if (d) d->exact = true;
    return d;
}

bool upstream_router::eligible(size_t i, const std::vector<size_t>& excluded) const {
    return upstreams_[i].stats.healthy && std::find(excluded.begin(), excluded.end(), i) == excluded.end();
}

std::optional<size_t> upstream_router::least_loaded(const std::vector<size_t>& excluded) const {
    // Fewest in flight, then fewest requests so far (spreads new conversations), then first.
    std::optional<size_t> least;
    for (size_t i = 0; i < upstreams_.size(); i++) {
        if (!eligible(i, excluded)) continue;
        const upstream_stats& s = upstreams_[i].stats;
        if (!least) {
            least = i;
            continue;
        }
        const upstream_stats& l = upstreams_[*least].stats;
        if (s.in_flight < l.in_flight || (s.in_flight == l.in_flight && s.requests < l.requests)) least = i;
    }
    return least;
}

bool upstream_router::overloaded(size_t upstream, size_t least) const {
    return upstreams_[upstream].stats.in_flight - upstreams_[least].stats.in_flight > options_.rebalance_margin;
}

std::optional<upstream_router::decision> upstream_router::choose_matched(std::span<const size_t> matched,
                                                                         const std::vector<size_t>& excluded,
                                                                         size_t least) const {
    // The longest match; when load rules it out, the longest match among the upstreams within the margin (the next
    // best holder recomputes less than the least loaded one, which may hold nothing), else the least loaded.
    std::optional<size_t> best, best_within;
    for (size_t i = 0; i < upstreams_.size() && i < matched.size(); i++) {
        if (!eligible(i, excluded) || matched[i] == 0) continue;
        if (!best || matched[i] > matched[*best]) best = i;
        if (!overloaded(i, least) && (!best_within || matched[i] > matched[*best_within])) best_within = i;
    }
    if (!best) return std::nullopt;
    if (best_within == best) return decision{.upstream = *best, .matched_blocks = matched[*best]};
    const size_t to = best_within.value_or(least);
    return decision{.upstream = to, .matched_blocks = to < matched.size() ? matched[to] : 0, .rebalanced = true};
}

void upstream_router::start(const decision& d, std::span<const uint64_t> blocks, uint64_t key) {
    upstream_state& u = upstreams_.at(d.upstream);
    u.stats.requests++;
    u.stats.in_flight++;
    if (d.keyed) u.stats.keyed++;
    if (key != 0) {
        if (auto it = keys_.find(key); it != keys_.end()) {
            it->second->second = d.upstream;
            key_recency_.splice(key_recency_.begin(), key_recency_, it->second);
        } else {
            key_recency_.emplace_front(key, d.upstream);
            keys_.emplace(key, key_recency_.begin());
        }
        while (keys_.size() > options_.max_routing_keys) {
            keys_.erase(key_recency_.back().first);
            key_recency_.pop_back();
        }
    }
    if (d.exact) {
        if (d.matched_blocks > 0) {
            u.stats.exact_hits++;
            u.stats.exact_blocks += d.matched_blocks;
        }
    } else if (d.matched_blocks >= options_.min_match_blocks) {
        u.stats.prefix_hits++;
        u.stats.matched_blocks += d.matched_blocks;
    }
    if (d.rebalanced) u.stats.rebalanced++;
    // Most recent at the front; the prompt's first blocks last, so they are the last of it to be forgotten.
    for (size_t i = blocks.size(); i > 0; i--) {
        const uint64_t h = blocks[i - 1];
        if (auto it = u.blocks.find(h); it != u.blocks.end()) {
            u.recency.splice(u.recency.begin(), u.recency, it->second);
        } else {
            u.recency.push_front(h);
            u.blocks.emplace(h, u.recency.begin());
        }
    }
    while (u.blocks.size() > options_.max_blocks_per_upstream) {
        u.blocks.erase(u.recency.back());
        u.recency.pop_back();
    }
    u.stats.tree_blocks = u.blocks.size();
}

void upstream_router::finish(size_t upstream) {
    upstream_state& u = upstreams_.at(upstream);
    if (u.stats.in_flight > 0) u.stats.in_flight--;
}

void upstream_router::set_health(size_t upstream, bool healthy, const std::string& instance) {
    upstream_state& u = upstreams_.at(upstream);
    const bool came_back = healthy && !u.stats.healthy;
    const bool other_instance = healthy && !instance.empty() && !u.instance.empty() && instance != u.instance;
    if (came_back || other_instance) forget(u);
    if (healthy && !instance.empty()) u.instance = instance;
    u.stats.healthy = healthy;
}

void upstream_router::forget(upstream_state& u) {
    if (u.blocks.empty()) return;
    u.blocks.clear();
    u.recency.clear();
    u.stats.tree_blocks = 0;
    u.stats.forgotten++;
}

upstream_router::upstream_stats upstream_router::stats(size_t upstream) const {
    return upstreams_.at(upstream).stats;
}

}  // namespace keepwarm::proxy

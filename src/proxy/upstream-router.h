// Cache-aware routing across upstream engines: which upstream most likely still holds a request's prompt prefix in
// its KV cache. Per upstream, an approximate prefix tree of what was sent there: the prompt in a canonical text form
// cut into fixed-size blocks, each block's hash chained over all blocks before it, so one hash stands for a whole
// prefix and the tree is a bounded set of hashes (least recently sent forgotten first). A request goes to the
// upstream with the longest match, if at least min_match_blocks long, else to the least loaded; when the matching
// upstream has more requests in flight than the least loaded one by more than rebalance_margin, load wins: the
// request goes to the longest match among the upstreams within that margin, or to the least loaded when none matches.
// A request with a routing key (the client's prompt_cache_key) goes where the key's last request went, under the
// same load rule, whatever its blocks match: the client says these requests share a prefix.
// A pure class: no clock, no I/O. Threading: not thread-safe; the caller holds one mutex around every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "chat/chat-request.h"

namespace keepwarm::proxy {

// The prompt as routing compares it: tools, then each message's role, content, reasoning and tool calls, with
// delimiters, so that two prompts share a text prefix exactly when they share their leading messages.
std::string canonical_prompt_text(const chat_request& chat);

// Hashes of text's whole blocks of `block_chars` bytes; hash i covers blocks 0..i (a partial last block is left out:
// it changes as the conversation grows). The chain starts from the tenant's root ("": 0), so two tenants' hashes
// never meet: where one tenant's request goes never depends on what another tenant sent.
std::vector<uint64_t> chained_block_hashes(const std::string& text, size_t block_chars, std::string_view tenant = {});

struct router_options {
    size_t block_chars = 256;                  // bytes of canonical text per block
    size_t min_match_blocks = 2;               // shorter matches do not pull a request to an upstream
    int rebalance_margin = 4;                  // in-flight requests by which the best match may exceed the least loaded
    size_t max_blocks_per_upstream = 1 << 16;  // prefix tree bound, in blocks
    size_t max_routing_keys = 1 << 16;         // keys remembered (least recently used forgotten first)
};

// A request's routing key: its tenant's and the client's prompt_cache_key together (0: none). Tenants' keys never
// meet, like their block hashes.
uint64_t routing_key(std::string_view prompt_cache_key, std::string_view tenant);

// Routing by model name: the upstreams a request for `model` must not go to. When at least one upstream serves the
// name (`served[i]`: the models upstream i serves, its spec's model= and what its health answer lists), those that do
// not serve it; when none does (a client's label such as "claude-...", which a single-model set-up answers whatever
// its name), or the name is empty, none: the request goes wherever routing sends it, as if every upstream served it.
std::vector<size_t> upstreams_not_serving(const std::vector<std::vector<std::string>>& served, std::string_view model);

class upstream_router {
public:
    upstream_router(size_t upstreams, router_options options);

    struct decision {
        size_t upstream = 0;
        size_t matched_blocks = 0;  // of the chosen upstream
        bool rebalanced = false;    // a longer match (or the key's upstream) elsewhere lost to load
        bool keyed = false;         // sent where its routing key's requests go
        bool exact = false;         // by the blocks its KV events say it holds (matched_blocks: of those)
    };
    // Where a request with these block hashes (and routing key, 0: none) should go, among healthy upstreams not in
    // `excluded`; nullopt when there is none.
    std::optional<decision> choose(std::span<const uint64_t> blocks, const std::vector<size_t>& excluded = {},
                                   uint64_t key = 0) const;

    // Exact routing, where upstreams publish KV events: held[i] is how many of the prompt's token blocks upstream i
    // holds (0: none, or it publishes none). The upstream holding the most, if any holds one, under the same load rule
    // as choose(); nullopt when none holds a block (the caller then infers with choose()).
    std::optional<decision> choose_held(std::span<const size_t> held, const std::vector<size_t>& excluded = {}) const;

    // The request was sent where `d` says: its blocks join that upstream's tree, its key (if any) points there, and
    // it is in flight until finish().
    void start(const decision& d, std::span<const uint64_t> blocks, uint64_t key = 0);
    void finish(size_t upstream);

    // What the health checks (or a failed call) say. An upstream that comes back after being down, or that reports
    // another instance (e.g. a new start time), has lost its cache: its tree is forgotten.
    void set_health(size_t upstream, bool healthy, const std::string& instance = "");

    struct upstream_stats {
        uint64_t requests = 0;
        uint64_t prefix_hits = 0;     // requests routed here by a match of at least min_match_blocks
        uint64_t matched_blocks = 0;  // summed over those requests
        uint64_t rebalanced = 0;      // requests sent here although a longer match was elsewhere
        uint64_t keyed = 0;           // requests routed here by their routing key
        uint64_t forgotten = 0;       // times its tree was dropped (restarts)
        uint64_t exact_hits = 0;      // requests routed here by the blocks its events say it holds
        uint64_t exact_blocks = 0;    // summed over those requests, in its event blocks
        int in_flight = 0;
        bool healthy = true;
        size_t tree_blocks = 0;
    };
    upstream_stats stats(size_t upstream) const;
    size_t size() const { return upstreams_.size(); }
    const router_options& options() const { return options_; }

    // Length of the prefix of `blocks` this upstream was sent, in blocks.
    size_t match(size_t upstream, std::span<const uint64_t> blocks) const;

private:
    struct upstream_state {
        // The tree: chained block hashes, most recently sent at the front.
        std::list<uint64_t> recency;
        std::unordered_map<uint64_t, std::list<uint64_t>::iterator> blocks;
        upstream_stats stats;
        std::string instance;
    };
    void forget(upstream_state& u);
    std::optional<size_t> keyed_upstream(uint64_t key) const;
    bool eligible(size_t upstream, const std::vector<size_t>& excluded) const;  // healthy and not excluded
    std::optional<size_t> least_loaded(const std::vector<size_t>& excluded) const;
    // More in flight than `least` by over the margin.
    bool overloaded(size_t upstream, size_t least) const;
    // By match lengths (matched[i], 0: none or too short): the longest under the load rule; nullopt when none.
    std::optional<decision> choose_matched(std::span<const size_t> matched, const std::vector<size_t>& excluded,
                                           size_t least) const;

    router_options options_;
    std::vector<upstream_state> upstreams_;
    // Routing keys -> the upstream their last request went to; most recently used at the front.
    std::list<std::pair<uint64_t, size_t>> key_recency_;
    std::unordered_map<uint64_t, std::list<std::pair<uint64_t, size_t>>::iterator> keys_;
};

}  // namespace keepwarm::proxy

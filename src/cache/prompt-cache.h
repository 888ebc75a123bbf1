// The prefix cache: one prefix tree over token ids indexes every span of KV that keepwarm holds, in three tiers:
//   device  live cells of the llama context. Each slot is a sequence; an idle conversation is parked in a spare
//           sequence (llama_memory_seq_cp shares cells, nothing is copied), so a system prompt used by many
//           conversations is held once.
//   RAM     serialized blocks of `block_tokens` positions (llama_state_seq_get_data of just that span, taken
//           through a scratch sequence), one per tree position, never one copy per conversation; and a path's tail
//           up to the end of its last prompt and up to its end, past the last whole block, kept when its cells
//           leave the device (a demotion, a shutdown), so that a restart or an eviction loses no token of what the
//           next turn shares. A tail is an alternative ending, not a step: nothing depends on it, any may be evicted.
//   disk    the same blocks as content-addressed files (disk_store), written behind the RAM tier; indexed at
//           start-up, so a restarted server picks up where it left off.
// Tenants: each tenant's paths hang below a root of its own, so a lookup, the cells a slot shares, a RAM or disk
// block and a checkpoint only ever serve the tenant that cached them. A block's key chains from its tenant's root
// key (tenant_root_block_key), so disk entries say whose they are after a restart.
// Models whose memory cannot roll back (hybrid recurrent/attention) also keep checkpoints: the recurrent state
// alone (LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY) at block ends and message boundaries, captured while the prompt is
// computed; a restore then costs at most the tokens since the last checkpoint. So do sliding-window models whose SWA
// layers keep only about a window per sequence (prompt_cache_options::windowed_swa): their checkpoint is that window
// of SWA KV, and their blocks hold the full-attention layers' KV only.
// Threading: engine thread only, except snapshot(), which any thread may call.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cache/block-key.h"
#include "cache/disk-store.h"
#include "cache/kv-block-events.h"
#include "cache/prefix-tree.h"
#include "llama.h"

namespace keepwarm {

struct prompt_cache_options {
    int slots = 1;             // sequences 0 .. slots-1 serve requests
    int parked_sequences = 8;  // spare sequences that keep idle conversations on the device
    int block_tokens = 256;    // RAM/disk block size, and the checkpoint interval of hybrid models
    uint64_t ram_budget = 4ull << 30;
    std::filesystem::path disk_dir;  // empty: no disk tier
    uint64_t disk_budget = 16ull << 30;
    std::string model_fingerprint;  // model file + KV format: disk entries of another model are never loaded
    // Sliding-window models: one more sequence shares every cached cell, so that llama.cpp never hands one to a new
    // token (see prompt_cache::guard_).
    bool guard_window_cells = false;
    // Sliding-window models whose context was made with swa_full off: the SWA layers hold about a window of KV per
    // sequence, and llama.cpp gives a cell outside its holder's window to the next token that needs one. A prefix is
    // then reused up to a point where the window before it is known: on the device (swa_window_intact) or in a
    // checkpoint. Never with guard_window_cells (a guard would keep every cell).
    bool windowed_swa = false;
    // Told which whole blocks of the shared tenant's paths can be reused, per medium, each time the cache publishes
    // its state (docs/kv-events.md). Not owned: it outlives the cache. Null: no block is listed.
    kv_block_observer* block_observer = nullptr;
};

// Where the reused prompt tokens of one request came from.
struct cache_restore {
    int reused = 0;  // prompt positions now in the slot's sequence (device + ram + disk)
    int device = 0, ram = 0, disk = 0;
    int checkpoint_pos = -1;  // hybrid models: the checkpoint the recurrent state came from
    int matched = 0;          // prompt tokens found in the tree, whatever tier (reused <= matched)
    // When the prompt departs from a cached path that goes on differently: the first differing position (else -1).
    int divergence_pos = -1;
    std::vector<llama_token> cached_continuation;  // the cached tokens from divergence_pos on (a few)
};

// What acquire() does for a prompt, planned from the cache's state as it is (prompt_cache::plan_acquire), nothing
// changed: which device cells the slot shares, which RAM/disk blocks it restores past them, and what the slot's own
// content must give way to first. acquire() plans, makes the plan executable (parking or dropping the slot's content,
// making room: each of which changes the tree, so it plans again), then carries the last plan out.
struct acquire_plan {
    int matched = 0;  // prompt tokens found in the tenant's tree, whatever tier
    int holder = -1;  // the device sequence whose cells give the prompt's first positions (-1: none)
    int device = 0;   // positions those cells give, at most `limit` (shared, or kept where the holder is the slot)
    // Ends of the RAM/disk blocks (or tail) restored past them, in order (plan_block_restore; for a hybrid model none
    // past the checkpoint that `target` comes from).
    std::vector<int32_t> blocks;
    int ram_blocks = 0;            // of those, the ones RAM holds (the rest are read from disk)
    int target = 0;                // positions the slot holds once the plan is carried out
    bool from_checkpoint = false;  // hybrid models: the recurrent state at `target` comes from a checkpoint
    int own_reused = 0;            // positions the prompt takes from the slot's own cells
    bool slot_leaves = false;      // the slot's content is not the prompt's holder: it is parked or dropped first
    bool slot_cut = false;         // the slot holds the prompt's start and more: the rest is parked or cut first
};

// A conversation the prefix cache holds (a path from a tenant's root to a leaf of its tree), as speculative decoding's
// history takes it (engine/draft-sources.h).
struct cached_conversation {
    block_key tenant_root;            // whose: the root key of its tenant's chains (tenant_root_block_key)
    std::vector<llama_token> tokens;  // its path, less the start that a newer conversation listed before it shares
    std::chrono::system_clock::time_point written{};  // when its newest entry was written (in this run: stored)
};

struct cache_tier_stats {
    uint64_t entries = 0, bytes = 0, budget = 0, tokens = 0;
    uint64_t hits = 0, evictions = 0;  // hits: requests that reused at least one token from this tier
};

// What is held because a client asked (cache hints: Anthropic's cache_control, OpenAI's prompt_cache_key).
struct cache_hint_stats {
    uint64_t requests = 0;       // requests whose prompt carried a hint
    uint64_t device_tokens = 0;  // marked tokens whose KV cells a device sequence holds
    uint64_t ram_entries = 0, ram_bytes = 0, disk_entries = 0, disk_bytes = 0;  // marked blocks and checkpoints
    uint64_t evicted = 0;  // marked entries and sequences evicted anyway (nothing unmarked was left to evict)
};

// A consistent copy of the cache's state, for /v1/cache and /metrics.
struct cache_snapshot {
    cache_tier_stats device, ram, disk;
    cache_hint_stats hinted;
    uint64_t checkpoints = 0, checkpoint_bytes = 0;
    uint64_t lookups = 0, hits = 0, misses = 0;  // misses: requests that reused nothing
    uint64_t tree_nodes = 0;
    uint64_t disk_rejected = 0, disk_read_failures = 0, restore_failures = 0;
    int block_tokens = 0;
    bool checkpoints_enabled = false;
    uint64_t block_report_us = 0;  // engine-thread CPU time spent listing blocks for the block observer
};

class prompt_cache {
public:
    // Sequences the llama context must be created with (n_seq_max).
    static int sequences_needed(const prompt_cache_options& options) {
        return options.slots + options.parked_sequences + 1 + (options.guard_window_cells ? 1 : 0);
    }

    // `ctx` must outlive the cache and have kv_unified and sequences_needed() sequences. Opens the disk tier and
    // indexes what it holds (problems are logged and counted, never fatal).
    prompt_cache(llama_context* ctx, prompt_cache_options options);
    ~prompt_cache();
    prompt_cache(const prompt_cache&) = delete;
    prompt_cache& operator=(const prompt_cache&) = delete;

    // Whether a prompt's state must be kept as checkpoints while it is computed (hybrid models; sliding-window models
    // with a windowed SWA cache), and where (message starts, block ends, the prompt's end: engine::next_cut).
    bool needs_checkpoints() const { return checkpoints_; }
    // Whether the KV of a sequence can be cut back to a shorter length and go on from there (not hybrid or recurrent:
    // a recurrent state cannot drop its last tokens). A speculative draft's rejected tokens are cut this way.
    bool can_truncate() const { return can_truncate_; }
    // The draft tokens a generating slot's last step may drop (drop_draft): any number where the KV can be cut; on a
    // hybrid model, the recurrent-state snapshots llama.cpp keeps per sequence (llama_context_params::n_rs_seq), else
    // none. Every other cut of a hybrid sequence goes through a checkpoint, as before.
    int droppable_draft_tokens() const;
    // Drops the rejected rows of a verifying step from sequence `slot`: its positions from `length` on, which its
    // last decode added and which the cache was never told of (append). On a hybrid model the recurrent state rolls
    // back to a snapshot, applied by the sequence's next decode; until then a copy of the sequence (park, a holder's
    // cells shared) takes the rolled-back state from it first (settle_rollback). False if llama.cpp refused.
    bool drop_draft(int slot, int length);
    int block_tokens() const { return options_.block_tokens; }

    // Makes sequence `slot` hold the longest cached prefix of `prompt` it can, at most `limit` positions, from
    // whichever tier holds it; the slot's previous content stays cached (parked or demoted). The slot is in use
    // until release_slot(). Only what `tenant` cached is matched ("": the shared tenant).
    cache_restore acquire(int slot, std::span<const llama_token> prompt, int limit, std::string_view tenant = {});
    // The plan acquire() would start from for the same arguments, read from the cache's state without changing it
    // (counters included). acquire() may plan again after parking the slot's content or making room.
    acquire_plan plan_acquire(int slot, std::span<const llama_token> prompt, int limit,
                              std::string_view tenant = {}) const;
    // Tokens just decoded into `slot` at the end of its sequence (prompt or generated).
    void append(int slot, std::span<const llama_token> tokens);
    // Call right before llama_decode (which places new tokens in cells): on sliding-window models, brings the guard
    // up to date after cells were freed (see guard_). Nothing to do for other models.
    void before_decode() { refresh_guard(); }
    // The slot's request ended; its KV stays cached. With `discard`, its KV is in an unknown state: drop it.
    void release_slot(int slot, bool discard);
    // A client asked to keep the first `tokens` positions of what `slot` holds (a cache hint): until `ttl` from now,
    // eviction takes everything unmarked first (device sequences, RAM and disk entries). Hints live in memory only:
    // a restart forgets them.
    void hint(int slot, int tokens, std::chrono::seconds ttl);
    // Checkpointed models (needs_checkpoints()): keep the state of `slot` at its current length that its blocks do
    // not hold (the recurrent state, or the last window of SWA KV). False: a windowed SWA cache could not put the
    // window back into cells (see the .cpp); the slot's KV is gone, and its request must fail.
    bool checkpoint(int slot);
    // Tokens held by `slot`'s sequence.
    int slot_length(int slot) const;
    // Cuts what `slot` holds back to its first `length` positions (nothing if it holds fewer). Models that need no
    // checkpoints only (needs_checkpoints() false). For exact reuse (engine_options::exact_reuse): KV that a cold run
    // would have computed in other batches is not kept.
    void trim(int slot, int length);
    // The KV of positions [p0, p1) of `slot`'s sequence, serialized as a RAM or disk block holds it. For tests that
    // compare restored KV with computed KV byte for byte.
    std::vector<uint8_t> kv_bytes(int slot, int p0, int p1) { return serialize_span(seq(slot).seq, p0, p1); }
    // The KV is full: demote the least recently used idle sequence to RAM and free its cells. False if none.
    bool make_room() { return make_room(nullptr); }
    // A long prompt is about to be computed. The KV is unified: attention runs over every cell up to the highest one
    // in use, and ggml's CPU kernels pay for the cells masked off too (a cold 12K prompt took 10.5 s with two idle
    // 12K conversations on the device against 6.9 s without). So every idle sequence (parked, or a slot between
    // requests) goes to RAM, as a demotion does, as far as the RAM budget takes it without evicting; its next turn
    // restores it from there. What an idle sequence shares with a sequence in use stays. Works for about `budget`
    // (a block at least), so that generating slots are not held up: false when there is more to do (call again),
    // true when done. Idle slots emptied are added to `emptied_slots`.
    bool make_way(std::chrono::steady_clock::duration budget, std::vector<int>& emptied_slots);
    // Graceful shutdown: write what only the device holds to RAM and disk.
    void persist_all();

    cache_snapshot snapshot() const;
    // The conversations the cache holds, whatever tier (at start-up: those the disk tier held), newest first by when
    // their last entry was written; a path the device alone holds counts as new. A conversation that shares its
    // start with a newer one of its tenant is listed without that start, which the newer one gave. Stops once
    // `token_budget` tokens are listed (the last one cut to its end). Reads the tree: token ids only, no KV; O(tree
    // nodes + listed tokens).
    std::vector<cached_conversation> conversations(size_t token_budget) const;
    // What disk entries are filed under (prompt_cache_options::model_fingerprint): with a tenant's name, the root key
    // of its chains.
    const std::string& model_fingerprint() const { return options_.model_fingerprint; }
    // The block report that acquire() and trim() left for later (see publish_deferring_blocks), if one is due. The
    // engine calls it after each step: a request's setup does not wait for a walk over every cached block, and its
    // blocks are reported a step later. release_slot() reports at once, so whoever sees an answer end sees its
    // blocks listed.
    void report_pending_blocks() {
        if (blocks_pending_) report_blocks();
    }
    // The blocks the last report to the block observer described (none without one). Any thread.
    std::vector<kv_listed_block> listed_blocks() const;

private:
    struct stored_state {
        std::shared_ptr<const std::vector<uint8_t>> ram;  // null: not in RAM
        bool on_disk = false;
        block_key key;
        uint64_t bytes = 0;
        std::chrono::steady_clock::time_point last_used;
        std::chrono::system_clock::time_point written;  // when stored (an entry from disk: its file's time)
    };
    struct span_value {
        int holders = 0;                              // device sequences whose path covers this whole node
        std::map<int32_t, stored_state> blocks;       // KV of [block_start(end), end), keyed by end position
        std::map<int32_t, stored_state> checkpoints;  // partial state after `pos` tokens, keyed by pos
        // A client's hint covers the positions of this span below hinted_end, until hinted_until.
        std::chrono::steady_clock::time_point hinted_until{};
        int32_t hinted_end = 0;
        span_value split_upper(size_t upper_depth);
    };
    using tree = prefix_tree<span_value>;
    using node = tree::node;

    struct device_sequence {
        llama_seq_id seq = 0;
        node* tip = nullptr;  // the path this sequence holds ends here (root: empty)
        int prompt_end = 0;   // the length of the last prompt it was given: where the next turn's prompt leaves it
        bool in_use = false;  // a slot serving a request
        // drop_draft rolled its recurrent state back to a snapshot that no decode has applied yet (append clears it).
        bool rollback_pending = false;
        std::chrono::steady_clock::time_point last_used;
    };

    enum class tier { ram, disk };

    device_sequence& seq(llama_seq_id id) { return sequences_[static_cast<size_t>(id)]; }
    node* tenant_root(std::string_view tenant);  // made on first use
    node* root_for_key(const block_key& key);    // the root whose chain starts at `key` (made on first use)
    const block_key& chain_root(node* n) const;  // the root key of the tenant whose tree holds `n`
    void hold(device_sequence& s, node* tip);    // s now holds the path to tip (holders counted)
    void drop(device_sequence& s);               // s holds nothing
    void truncate(device_sequence& s, int length);
    // A pending rollback (drop_draft) written into the sequence's own state, before its cells are shared: a copy
    // (llama_memory_seq_cp) takes the state of the cell, not the snapshot its source's next decode would read.
    // False (counted as a restore failure) if llama.cpp could not read the state back.
    bool settle_rollback(device_sequence& s);
    void prune(node* n);
    struct device_match {
        const device_sequence* holder = nullptr;  // holds the deepest matched span on the device
        int length = 0;                           // prompt tokens it holds
    };
    device_match find_holder(const tree::match& m, const device_sequence& s) const;
    // Where a prompt departs from a cached path that goes on differently (acquire's cache_restore fields).
    struct divergence_point {
        int divergence_pos = -1;
        std::vector<llama_token> cached_continuation;
    };
    divergence_point find_divergence(const node* root, std::span<const llama_token> prompt) const;
    // acquire()'s plan for slot `s` from the tree below `root` as it is now.
    // `device_cap` bounds what is taken from device cells (a holder whose sliding-window KV has holes: 0).
    // `window_at_device`: a windowed SWA cache still holds the window before the device span's end (acquire checks it
    // with swa_window_intact); if not, the plan goes on from a checkpoint.
    acquire_plan plan_for(const device_sequence& s, const node* root, std::span<const llama_token> prompt, int limit,
                          int device_cap = std::numeric_limits<int>::max(), bool window_at_device = true) const;
    // Sliding-window models: whether sequence `seq` still has, in its SWA layers, every position a prompt going on
    // at `length` attends to, [length - n_swa + 1, length). llama.cpp gives a cell that one sequence alone holds to
    // a new token once its position is outside that sequence's own window (llama_kv_cache::find_slot), full-size
    // SWA cache or not; the full-attention layers keep theirs. True for other models.
    bool swa_window_intact(llama_seq_id seq, int length);
    size_t scratch_swa_bytes();
    // One step towards a plan that can be carried out as it stands: the slot's content leaves or is cut (kept parked
    // when worth it), then room is made for the prompt. True when the step changed what the plan was read from: plan
    // again.
    bool make_plan_executable(device_sequence& s, const acquire_plan& plan, int prompt_size, int round, bool& kept_own);
    // Carries out `plan`: shares the holder's cells, restores the planned blocks and (hybrid) checkpoint into `s`
    // and extends its path over them; on a failed read, drops `s` and forgets the unreadable entry.
    cache_restore execute(device_sequence& s, const node* root, std::span<const llama_token> prompt,
                          const acquire_plan& plan);
    // The stored block (or checkpoint) ending at `pos` on the prompt's path as the tree is now (nullptr: gone).
    stored_state* planned_entry(const node* root, std::span<const llama_token> prompt, bool is_checkpoint, int32_t pos);
    // An entry that could not be read: off the disk tier, and out of the tree unless RAM holds it.
    void forget_unreadable(const node* root, std::span<const llama_token> prompt, bool is_checkpoint, int32_t pos);
    void count_restore(const cache_restore& r);  // hit and miss counters
    int device_tokens();                         // tokens whose KV cells some device sequence holds
    device_sequence* free_parking();
    device_sequence* eviction_victim(const device_sequence* keep);
    // Whether a live hint covers position `first` of n's span or a later one of it.
    static bool hinted(const node& n, int32_t first, std::chrono::steady_clock::time_point now);
    // Whether evicting `s` would lose hinted positions no other device sequence holds.
    bool holds_hint(const device_sequence& s, std::chrono::steady_clock::time_point now) const;
    bool make_room(const device_sequence* keep);
    bool worth_keeping(const device_sequence& s) const;
    // Stops after the block during which `deadline` passed (false: call again to go on; true: demoted).
    bool demote(device_sequence& s,
                std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max());
    // Stores the whole blocks past `from` of what `s` holds, then its tail, and (hybrid) the recurrent state at its
    // end, each unless a tier has it; `write_ram_to_disk` also writes held blocks that only RAM has to the disk tier.
    // Stops after the block during which `deadline` passed (false: call again to go on; true: all saved).
    bool save_path(device_sequence& s, int from, bool write_ram_to_disk,
                   std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max());
    static int shared_depth(const device_sequence& s);
    // The first position a block or tail ending at `end` covers: the last whole block's end before it.
    int32_t block_start(int32_t end) const { return (end - 1) / options_.block_tokens * options_.block_tokens; }
    bool park(device_sequence& slot, const device_sequence* keep);  // false: demoted to RAM instead

    std::vector<uint8_t> serialize_span(llama_seq_id from, int p0, int p1);
    std::vector<uint8_t> serialize_checkpoint(llama_seq_id from, int32_t pos);
    bool valid_checkpoint(const std::vector<uint8_t>& state, int32_t pos) const;
    bool load_block(const stored_state& state, std::vector<uint8_t>& out, bool& from_disk);
    bool restore_block(llama_seq_id slot, const std::vector<uint8_t>& payload, int p0, int p1);
    bool restore_checkpoint(llama_seq_id slot, const std::vector<uint8_t>& payload);
    // Windowed SWA: copies the window of `seq`'s SWA KV into cells that `seq` alone holds, dropping its share of every
    // other SWA cell. llama.cpp gives a cell outside its holder's window to a new token only when one sequence holds
    // it: a sequence that took a long prefix from another (llama_memory_seq_cp shares every cell of the range) would
    // otherwise keep all of that prefix's leftover SWA cells from being given out while both live, and the SWA layers
    // hold about a window per sequence, so the next decode could find no cell. False: the window could not be
    // placed (the sequence has lost its SWA KV).
    bool reseat_window(llama_seq_id seq);

    stored_state* find_block(node* path_tip, int end);
    void store_block(node* n, int32_t end, std::vector<uint8_t> payload, std::span<const llama_token> path);
    void store_checkpoint(node* n, int32_t pos, std::vector<uint8_t> payload, std::span<const llama_token> path);
    // A new stored state of `kind` (a block or a checkpoint) for the first `end` tokens of `path`, which end in `n`'s
    // span: held in RAM (its bytes counted) and written to the disk tier when there is one.
    stored_state keep_in_tiers(node* n, uint32_t kind, int32_t end, std::vector<uint8_t> payload,
                               std::span<const llama_token> path);
    void write_to_disk(stored_state& state, node* n, uint32_t kind, int32_t end, std::span<const llama_token> path);
    void enforce_ram_budget();
    void enforce_disk_budget();
    template <typename InTier, typename Over, typename Drop>
    void evict_until(InTier in_tier, uint64_t budget, Over over, Drop drop);
    void index_disk();
    // Makes the counters and the block report current.
    void publish();
    // As publish(), but the block report waits for report_pending_blocks(): for the changes a request's setup makes.
    void publish_deferring_blocks();
    void publish_counters();
    // Tells the block observer what changed since its last report (everything when listed_valid_ is false).
    void report_blocks();

    llama_context* ctx_;
    prompt_cache_options options_;
    bool can_truncate_ = true;
    int rollback_tokens_ = 0;   // llama_n_rs_seq: the recurrent-state snapshots per sequence (hybrid models)
    bool checkpoints_ = false;  // needs_checkpoints(): hybrid, or windowed_swa
    llama_seq_id scratch_ = 0;
    // Sliding-window models (prompt_cache_options::guard_window_cells; else -1): a sequence that shares every cell a
    // device sequence holds. llama.cpp's find_slot gives a cell that exactly one sequence holds to a new token once
    // the cell is outside that sequence's window, full-size SWA cache or not: two slots overwrote each other's
    // conversations' early SWA cells, whose prompts then recomputed past the hole (swa_window_intact). A cell held by
    // two sequences is never taken. New cells join the guard when decoded (append) or restored (restore_block);
    // cells freed by a device sequence still have the guard, which is rebuilt before the next placement
    // (refresh_guard: before_decode, restore_block).
    llama_seq_id guard_ = -1;
    bool guard_stale_ = false;  // cells were freed since the guard was last rebuilt
    void guard(llama_seq_id seq, int p0, int p1);
    void refresh_guard();
    // Checkpointed models: the partial state (recurrent part, or windowed SWA part) of an empty sequence.
    std::vector<uint8_t> empty_partial_state_;
    // Sliding-window models (0: none, or hybrid): the window, and the serialized size of the SWA part of the scratch
    // sequence holding one cell and each further cell (measured on first use; 0: not yet).
    int n_swa_ = 0;
    size_t swa_one_cell_bytes_ = 0, swa_cell_bytes_ = 0;
    tree tree_;
    std::map<block_key, node*> roots_by_key_;     // each tenant's root, by its root block key
    std::map<const node*, block_key> root_keys_;  // ... and back
    std::vector<device_sequence> sequences_;
    std::unique_ptr<disk_store> disk_;
    uint64_t ram_bytes_ = 0;

    cache_snapshot counters_;  // engine thread's running totals; copied into published_ by publish()
    mutable std::mutex published_mu_;
    cache_snapshot published_;  // guarded by published_mu_
    // The blocks last reported to the block observer, by hash. Written by the engine thread, under published_mu_.
    std::unordered_map<uint64_t, kv_listed_block> listed_;
    bool listed_valid_ = false;    // false: the next report is a full listing
    bool blocks_pending_ = false;  // publish_deferring_blocks() left a report for report_pending_blocks()
};

}  // namespace keepwarm

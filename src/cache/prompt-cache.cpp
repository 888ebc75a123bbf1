// See prompt-cache.h. Restoring a prompt: match it against the tree; take the deepest device span by sharing
// cells (llama_memory_seq_cp), extend it with RAM/disk blocks through the scratch sequence, and on checkpointed
// models finish at a point whose partial state is known (a checkpoint; the end of the sequence copied; with a
// windowed SWA cache, any device position whose window is still there).
#include "cache/prompt-cache.h"

#include <algorithm>
#include <cstring>
#include <ctime>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include "base/logger.h"
#include "cache/restore-plan.h"

namespace keepwarm {

namespace {
using clock = std::chrono::steady_clock;

// Each tenant's share of a tier when several hold entries there: an equal part of the budget. A tenant over it is
// evicted first, and its hints protect nothing, so one tenant's flood of prompts (marked or not) evicts its own
// entries, not another's (issue 39: a victim that marked its prompts fell from 99% to 0% reuse). A lone tenant has
// the whole tier.
uint64_t tenant_share(uint64_t budget, size_t tenants) {
    return tenants > 1 ? budget / tenants : std::numeric_limits<uint64_t>::max();
}

// Every llama_state_seq_* buffer opens with this header (llama-context.cpp: io_magic, then the source seq id),
// followed by the memory's own state_write output.
constexpr uint32_t state_magic = 0xaf143cd8;
constexpr size_t state_header = sizeof(uint32_t) + sizeof(llama_seq_id);

constexpr uint32_t kind_block = 0;       // disk entry: KV of [end - block_tokens, end)
constexpr uint32_t kind_checkpoint = 1;  // disk entry: partial state (recurrent, or SWA window) after `end` tokens
constexpr uint32_t kind_tail = 2;        // disk entry: KV of a path's tail past its last whole block

// The key of a stored state of `kind`: a block's chains from its tenant's root key through the tokens up to its end; a
// checkpoint's one step further, through a sentinel that is not a token id, so it never equals the block ending there.
block_key stored_state_key(const block_key& root, std::span<const llama_token> tokens, uint32_t kind) {
    const block_key block = chain_block_key(root, tokens);
    if (kind != kind_checkpoint) return block;  // a block or a tail: a tail never ends where a block does
    const llama_token sentinel = -1;
    return chain_block_key(block, std::span<const llama_token>(&sentinel, 1));
}

// Prefill cost saved by restoring `tokens` tokens that end at position `depth`, in units of one token at depth 0:
// attention work grows with depth, the rest does not.
double compute_saved(int tokens, int depth) {
    return tokens * (1.0 + depth / 8192.0);
}

// CPU time of the calling thread, in microseconds: what a piece of engine work costs, whatever else runs on the
// machine.
uint64_t thread_cpu_us() {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<uint64_t>(t.tv_sec) * 1000000 + static_cast<uint64_t>(t.tv_nsec) / 1000;
}

// Recency weight: an entry untouched for five minutes counts half as much as one used just now.
double recency(clock::time_point last_used, clock::time_point now) {
    const double age_s = std::chrono::duration<double>(now - last_used).count();
    return 1.0 / (1.0 + age_s / 300.0);
}
}  // namespace

prompt_cache::span_value prompt_cache::span_value::split_upper(size_t upper_depth) {
    span_value upper;
    upper.holders = holders;  // every sequence through the lower part passes the upper part too
    upper.hinted_until = hinted_until;
    upper.hinted_end = hinted_end;
    const auto depth = static_cast<int32_t>(upper_depth);
    upper.blocks.insert(blocks.begin(), blocks.upper_bound(depth));
    blocks.erase(blocks.begin(), blocks.upper_bound(depth));
    upper.checkpoints.insert(checkpoints.begin(), checkpoints.upper_bound(depth));
    checkpoints.erase(checkpoints.begin(), checkpoints.upper_bound(depth));
    return upper;
}

prompt_cache::prompt_cache(llama_context* ctx, prompt_cache_options options) : ctx_(ctx), options_(std::move(options)) {
    if (options_.block_tokens < 16) throw std::invalid_argument("the cache block size must be at least 16 tokens");
    const llama_model* model = llama_get_model(ctx_);
    can_truncate_ = !llama_model_is_recurrent(model) && !llama_model_is_hybrid(model);
    if (can_truncate_) n_swa_ = std::max(0, llama_model_n_swa(model));
    if (options_.windowed_swa && (n_swa_ == 0 || options_.guard_window_cells)) {
        throw std::invalid_argument("a windowed SWA cache is for sliding-window models, without the guard sequence");
    }
    checkpoints_ = !can_truncate_ || options_.windowed_swa;
    if (!can_truncate_) rollback_tokens_ = static_cast<int>(llama_n_rs_seq(ctx_));
    const int n = sequences_needed(options_);
    scratch_ = n - 1;
    if (options_.guard_window_cells) guard_ = n - 2;
    const int device_sequences = options_.slots + options_.parked_sequences;
    for (int i = 0; i < device_sequences; ++i) {
        device_sequence s;
        s.seq = i;
        s.tip = tree_.root();
        sequences_.push_back(s);
    }
    if (checkpoints_) {
        // The partial part of an empty sequence: appended to a block's attention KV so that a block can be loaded
        // without carrying a stale recurrent state or SWA window (the checkpoint restored afterwards supplies it).
        llama_memory_seq_rm(llama_get_memory(ctx_), scratch_, -1, -1);
        empty_partial_state_.resize(llama_state_seq_get_size_ext(ctx_, scratch_, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY));
        llama_state_seq_get_data_ext(ctx_, empty_partial_state_.data(), empty_partial_state_.size(), scratch_,
                                     LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
        empty_partial_state_.erase(empty_partial_state_.begin(), empty_partial_state_.begin() + state_header);
    }
    root_keys_[tree_.root()] = root_block_key(options_.model_fingerprint);
    roots_by_key_[root_block_key(options_.model_fingerprint)] = tree_.root();
    counters_.block_tokens = options_.block_tokens;
    counters_.checkpoints_enabled = checkpoints_;
    counters_.ram.budget = options_.ram_budget;
    if (!options_.disk_dir.empty() && options_.disk_budget > 0) {
        disk_ = std::make_unique<disk_store>(options_.disk_dir, options_.disk_budget, options_.model_fingerprint);
        index_disk();
    }
    publish();
}

prompt_cache::~prompt_cache() {
    if (disk_) disk_->flush();
}

void prompt_cache::index_disk() {
    const auto report = disk_->open();
    for (const auto& why : report.rejected) log::warn("disk cache", "ignored {}", why);
    counters_.disk_rejected = report.rejected.size();
    size_t blocks = 0, checkpoints = 0;
    for (auto& info : disk_->entries()) {
        const bool shape_ok = info.start == 0 && info.end == static_cast<int32_t>(info.tokens.size()) && info.end > 0;
        const bool kind_ok = info.kind == kind_block        ? info.end % options_.block_tokens == 0
                             : info.kind == kind_tail       ? info.end % options_.block_tokens != 0
                             : info.kind == kind_checkpoint ? checkpoints_
                                                            : false;
        if (!shape_ok || !kind_ok) {
            log::warn("disk cache", "ignored {}.kwkv: written with another layout", info.key.hex());
            disk_->erase(info.key);
            counters_.disk_rejected++;
            continue;
        }
        // The key chains from the root key of the tenant that cached it: that names the tenant, and a file whose
        // key does not follow from its parent and tokens cannot say whose it is.
        if (stored_state_key(info.parent, info.tokens, info.kind) != info.key) {
            log::warn("disk cache", "ignored {}.kwkv: its key does not follow from its tokens", info.key.hex());
            disk_->erase(info.key);
            counters_.disk_rejected++;
            continue;
        }
        node* n = tree_.insert_below(root_for_key(info.parent), info.tokens);
        stored_state state;
        state.on_disk = true;
        state.key = info.key;
        state.bytes = info.payload_bytes;
        state.last_used = clock::now() - std::chrono::minutes(10);  // older than anything used in this run
        state.written = info.written;
        (info.kind == kind_checkpoint ? n->value.checkpoints : n->value.blocks)[info.end] = state;
        (info.kind == kind_checkpoint ? checkpoints : blocks)++;
    }
    if (blocks + checkpoints > 0 || !report.rejected.empty()) {
        log::info("disk cache", "{} blocks and {} checkpoints ({} MiB) in {}, {} rejected", blocks, checkpoints,
                  log::fixed(disk_->bytes() / 1048576.0, 1), options_.disk_dir.string(), report.rejected.size());
    }
}

// ---- tenants, device sequences and the tree ----

prompt_cache::node* prompt_cache::tenant_root(std::string_view tenant) {
    return root_for_key(tenant_root_block_key(options_.model_fingerprint, tenant));
}

prompt_cache::node* prompt_cache::root_for_key(const block_key& key) {
    if (auto it = roots_by_key_.find(key); it != roots_by_key_.end()) return it->second;
    node* root = tree_.new_root();
    roots_by_key_.emplace(key, root);
    root_keys_.emplace(root, key);
    return root;
}

const block_key& prompt_cache::chain_root(node* n) const {
    return root_keys_.at(tree::root_of(n));
}

void prompt_cache::hold(device_sequence& s, node* tip) {
    s.tip = tip;
    for (node* n = tip; !tree::is_root(n); n = n->parent) n->value.holders++;
}

void prompt_cache::drop(device_sequence& s) {
    llama_memory_seq_rm(llama_get_memory(ctx_), s.seq, -1, -1);
    guard_stale_ = true;
    node* tip = s.tip;
    for (node* n = tip; !tree::is_root(n); n = n->parent) n->value.holders--;
    s.tip = tree::root_of(tip);  // empty, still in its tenant's tree
    prune(tip);
}

void prompt_cache::prune(node* n) {
    while (!tree::is_root(n) && n->value.holders == 0 && n->value.blocks.empty() && n->value.checkpoints.empty() &&
           n->children.empty()) {
        node* parent = n->parent;
        tree_.erase_leaf(n);
        n = parent;
    }
}

void prompt_cache::truncate(device_sequence& s, int length) {
    if (length >= static_cast<int>(s.tip->depth)) return;
    if (length == 0) {
        drop(s);
        return;
    }
    llama_memory_seq_rm(llama_get_memory(ctx_), s.seq, length, -1);
    guard_stale_ = true;
    node* old_tip = s.tip;
    node* new_tip = tree_.node_ending_at(old_tip, static_cast<size_t>(length));
    for (node* n = old_tip; n != new_tip; n = n->parent) n->value.holders--;
    s.tip = new_tip;
    prune(old_tip);
}

int prompt_cache::droppable_draft_tokens() const {
    return can_truncate_ ? std::numeric_limits<int>::max() : rollback_tokens_;
}

bool prompt_cache::drop_draft(int slot, int length) {
    device_sequence& s = seq(slot);
    llama_memory_t mem = llama_get_memory(ctx_);
    if (llama_memory_seq_pos_max(mem, s.seq) < length) return true;  // the whole draft was accepted
    // The recurrent part refuses a second rollback before a decode, or one deeper than its snapshots, and then
    // leaves the sequence as it was.
    if (!llama_memory_seq_rm(mem, s.seq, length, -1)) return false;
    if (!can_truncate_) s.rollback_pending = true;
    guard_stale_ = true;
    return true;
}

bool prompt_cache::settle_rollback(device_sequence& s) {
    if (!s.rollback_pending) return true;
    s.rollback_pending = false;
    // Written out, the state is the snapshot's (llama.cpp reads the pending one); read back, it is the cell's.
    std::vector<uint8_t> state(llama_state_seq_get_size_ext(ctx_, s.seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY));
    state.resize(
        llama_state_seq_get_data_ext(ctx_, state.data(), state.size(), s.seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY));
    if (!state.empty() && restore_checkpoint(s.seq, state)) return true;
    log::warn("cache", "sequence {}: its rolled-back recurrent state could not be settled", s.seq);
    counters_.restore_failures++;
    return false;
}

void prompt_cache::trim(int slot, int length) {
    if (checkpoints_) return;
    truncate(seq(slot), std::max(length, 0));
    publish_deferring_blocks();
}

int prompt_cache::slot_length(int slot) const {
    return static_cast<int>(sequences_[static_cast<size_t>(slot)].tip->depth);
}

void prompt_cache::append(int slot, std::span<const llama_token> tokens) {
    if (tokens.empty()) return;
    device_sequence& s = seq(slot);
    s.rollback_pending = false;  // the decode that added them applied it
    node* tip = s.tip;
    const auto end = static_cast<int>(tip->depth + tokens.size());
    guard(s.seq, end - static_cast<int>(tokens.size()), end);
    if (!tree::is_root(tip) && tip->children.empty() && tip->value.holders == 1) {
        tree_.extend_leaf(tip, tokens);  // the common case: a conversation growing its own path
        return;
    }
    node* new_tip = tree_.insert_below(tip, tokens);
    for (node* n = new_tip; n != tip; n = n->parent) n->value.holders++;
    s.tip = new_tip;
}

prompt_cache::device_sequence* prompt_cache::free_parking() {
    for (size_t i = static_cast<size_t>(options_.slots); i < sequences_.size(); ++i) {
        if (tree::is_root(sequences_[i].tip)) return &sequences_[i];
    }
    return nullptr;
}

// The idle sequence whose loss costs least: one that holds no prefix a client marked before one that does, then the
// least recently used. Slots in use are never chosen.
prompt_cache::device_sequence* prompt_cache::eviction_victim(const device_sequence* keep) {
    const auto now = clock::now();
    // Device cells by tenant (a shared prefix counted once per sequence: a share of what the tenant keeps busy).
    std::unordered_map<const node*, uint64_t> tenant_tokens;
    uint64_t total = 0;
    for (const auto& s : sequences_) {
        if (tree::is_root(s.tip)) continue;
        tenant_tokens[tree::root_of(s.tip)] += s.tip->depth;
        total += s.tip->depth;
    }
    const uint64_t share = tenant_share(total, tenant_tokens.size());
    // A tenant over its share first (its hints protect nothing then), then an unmarked sequence, then the oldest.
    const auto rank = [&](const device_sequence& s) {
        const bool over_share = tenant_tokens[tree::root_of(s.tip)] > share;
        return std::pair{over_share ? 0 : 1, !over_share && holds_hint(s, now) ? 1 : 0};
    };
    device_sequence* victim = nullptr;
    std::pair<int, int> victim_rank;
    for (auto& s : sequences_) {
        if (s.in_use || tree::is_root(s.tip) || &s == keep) continue;
        const auto r = rank(s);
        if (!victim || r < victim_rank || (r == victim_rank && s.last_used < victim->last_used)) {
            victim = &s;
            victim_rank = r;
        }
    }
    return victim;
}

bool prompt_cache::hinted(const node& n, int32_t first, clock::time_point now) {
    return n.value.hinted_until > now && first < n.value.hinted_end;
}

bool prompt_cache::holds_hint(const device_sequence& s, clock::time_point now) const {
    for (const node* n = s.tip; !tree::is_root(n) && n->value.holders <= 1; n = n->parent) {
        if (hinted(*n, static_cast<int32_t>(n->depth - n->edge.size()), now)) return true;
    }
    return false;
}

void prompt_cache::hint(int slot, int tokens, std::chrono::seconds ttl) {
    const int b = options_.block_tokens;
    // In whole blocks: the block holding the prefix's last positions is kept with it.
    const auto end =
        static_cast<int32_t>(std::min<int64_t>((int64_t{tokens} + b - 1) / b * b, std::numeric_limits<int32_t>::max()));
    const auto now = clock::now();
    for (node* n = seq(slot).tip; !tree::is_root(n); n = n->parent) {
        span_value& v = n->value;
        if (static_cast<int32_t>(n->depth - n->edge.size()) >= end) continue;
        v.hinted_end = v.hinted_until > now ? std::max(v.hinted_end, end) : end;  // an expired hint counts no more
        v.hinted_until = std::max(v.hinted_until, now + ttl);
    }
    counters_.hinted.requests++;
}

// Keeps what sequence `s` holds alone (not shared with another device sequence) in RAM blocks, before its cells
// are freed. Blocks already in RAM or on disk are not written again.
bool prompt_cache::demote(device_sequence& s, clock::time_point deadline) {
    if (tree::is_root(s.tip)) return true;
    if (!save_path(s, shared_depth(s), /*write_ram_to_disk=*/false, deadline)) return false;
    counters_.device.evictions++;
    if (holds_hint(s, clock::now())) counters_.hinted.evicted++;
    return true;
}

// The positions of what `s` holds that another device sequence holds too.
int prompt_cache::shared_depth(const device_sequence& s) {
    for (const node* n = s.tip; !tree::is_root(n); n = n->parent) {
        if (n->value.holders > 1) return static_cast<int>(n->depth);
    }
    return 0;
}

bool prompt_cache::save_path(device_sequence& s, int from, bool write_ram_to_disk, clock::time_point deadline) {
    node* tip = s.tip;
    const int b = options_.block_tokens;
    const int length = static_cast<int>(tip->depth);
    std::vector<llama_token> path;
    const auto save = [&](int end) {  // the block or the tail that ends at `end`
        node* n = tree_.ancestor_at(tip, static_cast<size_t>(end));
        if (auto it = n->value.blocks.find(end); it != n->value.blocks.end()) {
            if (write_ram_to_disk && disk_ && it->second.ram && !it->second.on_disk) {
                if (path.empty()) path = tree_.path(tip);
                write_to_disk(it->second, n, end % b == 0 ? kind_block : kind_tail, end, path);
            }
            return;
        }
        // A block is restored to go on from its end: no use if the sliding-window KV before its end has holes. (A
        // windowed SWA cache's blocks hold no SWA KV: a checkpoint gives the window.)
        if (!checkpoints_ && !swa_window_intact(s.seq, end)) return;
        if (path.empty()) path = tree_.path(tip);
        store_block(n, end, serialize_span(s.seq, block_start(end), end), path);
    };
    for (int end = (from / b + 1) * b; end <= length; end += b) {
        save(end);
        if (clock::now() > deadline) return false;  // the blocks saved so far are kept: the next call goes on
    }
    // The tokens past the last whole block, up to the end of the last prompt (where the next turn's prompt, which
    // renders the answer its own way, leaves this path) and up to the end: without them a restart or a demotion
    // would cost up to a block of recomputation, and a conversation shorter than a block everything.
    for (const int end : {s.prompt_end, length}) {
        if (end > from && end <= length && end % b != 0) save(end);
    }
    // Checkpointed models: and up to each checkpoint in the last prompt's last block (its message starts). The next
    // turn of a template that renders the previous answer its own way (Qwen3.5 drops the "<think>" that ended the
    // prompt) leaves this path at the last one: without a tail ending there, that checkpoint is no use once the cells
    // have left the device, and the turn went back to the last whole block (up to a block, or --checkpoint-every,
    // recomputed).
    if (checkpoints_) {
        const int last_block = s.prompt_end / b * b;
        std::vector<int> ends;
        for (const node* n = tip; !tree::is_root(n) && static_cast<int>(n->depth) > last_block; n = n->parent) {
            for (const auto& [pos, state] : n->value.checkpoints) {
                if (pos > from && pos > last_block && pos < s.prompt_end) ends.push_back(pos);
            }
        }
        for (const int end : ends) save(end);
    }
    if (checkpoints_ && !tip->value.checkpoints.count(length)) {
        if (path.empty()) path = tree_.path(tip);
        store_checkpoint(tip, length, serialize_checkpoint(s.seq, length), path);
    }
    return true;
}

// Whether what `s` alone holds (beyond what other device sequences share) is long enough to keep when the slot
// moves on. A few tokens (typically the end of a turn that the next request renders differently) are cheaper to
// recompute than to keep a parked sequence for: each one costs a sequence and adds to every cell walk.
bool prompt_cache::worth_keeping(const device_sequence& s) const {
    if (tree::is_root(s.tip) || s.tip->value.holders > 1) return false;
    return static_cast<int>(s.tip->depth) - shared_depth(s) >= std::min(64, options_.block_tokens);
}

// The slot is about to serve another prompt: keep its current content on the device in a parked sequence
// (sharing cells, no copy), evicting the least recently used idle sequence if none is free, unless that one holds a
// prefix a client marked and the slot's content does not: then the slot's content goes to RAM.
bool prompt_cache::park(device_sequence& slot, const device_sequence* keep) {
    device_sequence* p = free_parking();
    if (!p) {
        const auto now = clock::now();
        device_sequence* victim = eviction_victim(keep);
        const bool marked_for_unmarked = victim && holds_hint(*victim, now) && !holds_hint(slot, now);
        if (victim && victim != &slot && victim->seq >= options_.slots && !marked_for_unmarked) {
            demote(*victim);
            drop(*victim);
            p = victim;
        }
    }
    if (!p) {
        demote(slot);  // nowhere to park it on the device: RAM then
        return false;
    }
    if (!settle_rollback(slot)) {
        demote(slot);  // written out from the snapshot, which its state is
        return false;
    }
    llama_memory_seq_cp(llama_get_memory(ctx_), slot.seq, p->seq, -1, -1);
    hold(*p, slot.tip);
    p->last_used = slot.last_used;
    p->prompt_end = slot.prompt_end;
    return true;
}

bool prompt_cache::make_room(const device_sequence* keep) {
    device_sequence* victim = eviction_victim(keep);
    if (!victim) return false;
    demote(*victim);
    drop(*victim);
    publish();
    return true;
}

bool prompt_cache::make_way(clock::duration budget, std::vector<int>& emptied_slots) {
    const clock::time_point deadline = clock::now() + budget;
    bool moved = false;
    bool done = true;
    for (auto& s : sequences_) {
        if (s.in_use || s.seq == scratch_ || tree::is_root(s.tip)) continue;
        // The whole sequence's state: more than its unshared part needs, never less.
        if (ram_bytes_ + llama_state_seq_get_size(ctx_, s.seq) > options_.ram_budget) continue;
        if (!demote(s, deadline)) {
            done = false;
            break;
        }
        drop(s);
        moved = true;
        if (s.seq < options_.slots) emptied_slots.push_back(s.seq);
        if (clock::now() > deadline) {
            done = false;
            break;
        }
    }
    if (moved) publish();
    return done;
}

void prompt_cache::persist_all() {
    for (auto& s : sequences_) {
        if (!tree::is_root(s.tip)) save_path(s, 0, /*write_ram_to_disk=*/true);
    }
    enforce_disk_budget();
    if (disk_) disk_->flush();
    publish();
}

// ---- serialization ----

std::vector<uint8_t> prompt_cache::serialize_span(llama_seq_id from, int p0, int p1) {
    llama_memory_t mem = llama_get_memory(ctx_);
    llama_memory_seq_rm(mem, scratch_, -1, -1);
    llama_memory_seq_cp(mem, from, scratch_, p0, p1);
    std::vector<uint8_t> out(llama_state_seq_get_size(ctx_, scratch_));
    out.resize(llama_state_seq_get_data(ctx_, out.data(), out.size(), scratch_));
    if (checkpoints_) {
        // Keep the attention KV only (written first); the partial part is the source sequence's latest recurrent
        // state, which is not the state at p1, or what a windowed SWA cache still holds of the span.
        const size_t partial =
            llama_state_seq_get_size_ext(ctx_, scratch_, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY) - state_header;
        out.resize(out.size() >= partial + state_header ? out.size() - partial : 0);
    }
    llama_memory_seq_rm(mem, scratch_, -1, -1);
    return out;
}

// Empty if the state is not the one after exactly `pos` tokens (then nothing is stored).
std::vector<uint8_t> prompt_cache::serialize_checkpoint(llama_seq_id from, int32_t pos) {
    std::vector<uint8_t> out(llama_state_seq_get_size_ext(ctx_, from, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY));
    out.resize(llama_state_seq_get_data_ext(ctx_, out.data(), out.size(), from, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY));
    if (!valid_checkpoint(out, pos)) {
        log::warn("cache", "state of sequence {} at {} failed validation; no checkpoint kept", from, pos);

        counters_.restore_failures++;
        out.clear();
    }
    return out;
}

bool prompt_cache::load_block(const stored_state& state, std::vector<uint8_t>& out, bool& from_disk) {
    from_disk = false;
    if (state.ram) {
        out = *state.ram;
        return true;
    }
    if (!state.on_disk || !disk_) return false;
    std::string error;
    auto payload = disk_->get(state.key, &error);
    if (!payload) {
        log::warn("disk cache", "{}.kwkv not loaded: {}", state.key.hex(), error);
        counters_.disk_read_failures++;
        return false;
    }
    out = std::move(*payload);
    from_disk = true;
    return true;
}

bool prompt_cache::restore_block(llama_seq_id slot, const std::vector<uint8_t>& payload, int p0, int p1) {
    llama_memory_t mem = llama_get_memory(ctx_);
    const std::vector<uint8_t>* bytes = &payload;
    std::vector<uint8_t> with_empty_recurrent;
    if (checkpoints_) {
        with_empty_recurrent.reserve(payload.size() + empty_partial_state_.size());
        with_empty_recurrent.assign(payload.begin(), payload.end());
        with_empty_recurrent.insert(with_empty_recurrent.end(), empty_partial_state_.begin(),
                                    empty_partial_state_.end());
        bytes = &with_empty_recurrent;
    }
    // No eviction here: the restore plan points into the tree. acquire() made room before it started.
    refresh_guard();  // the block's cells are placed now
    const bool ok = llama_state_seq_set_data(ctx_, bytes->data(), bytes->size(), scratch_) != 0;
    if (ok) llama_memory_seq_cp(mem, scratch_, slot, p0, p1);
    llama_memory_seq_rm(mem, scratch_, -1, -1);
    if (ok) guard(slot, p0, p1);
    return ok;
}

void prompt_cache::guard(llama_seq_id seq, int p0, int p1) {
    if (guard_ >= 0) llama_memory_seq_cp(llama_get_memory(ctx_), seq, guard_, p0, p1);
}

void prompt_cache::refresh_guard() {
    if (guard_ < 0 || !guard_stale_) return;
    llama_memory_t mem = llama_get_memory(ctx_);
    llama_memory_seq_rm(mem, guard_, -1, -1);
    for (const device_sequence& s : sequences_) {
        if (!tree::is_root(s.tip)) llama_memory_seq_cp(mem, s.seq, guard_, -1, -1);
    }
    guard_stale_ = false;
}

bool prompt_cache::reseat_window(llama_seq_id seq) {
    std::vector<uint8_t> window(llama_state_seq_get_size_ext(ctx_, seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY));
    window.resize(
        llama_state_seq_get_data_ext(ctx_, window.data(), window.size(), seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY));
    return !window.empty() && restore_checkpoint(seq, window);
}

bool prompt_cache::restore_checkpoint(llama_seq_id slot, const std::vector<uint8_t>& payload) {
    return llama_state_seq_set_data_ext(ctx_, payload.data(), payload.size(), slot,
                                        LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY) != 0;
}

// ---- RAM and disk entries ----

prompt_cache::stored_state prompt_cache::keep_in_tiers(node* n, uint32_t kind, int32_t end,
                                                       std::vector<uint8_t> payload,
                                                       std::span<const llama_token> path) {
    stored_state state;
    state.key = stored_state_key(chain_root(n), path.first(static_cast<size_t>(end)), kind);
    state.bytes = payload.size();
    state.last_used = clock::now();
    state.written = std::chrono::system_clock::now();
    state.ram = std::make_shared<const std::vector<uint8_t>>(std::move(payload));
    if (disk_) write_to_disk(state, n, kind, end, path);
    ram_bytes_ += state.bytes;
    return state;
}

void prompt_cache::write_to_disk(stored_state& state, node* n, uint32_t kind, int32_t end,
                                 std::span<const llama_token> path) {
    disk_->put({.key = state.key,
                .parent = chain_root(n),
                .start = 0,
                .end = end,
                .kind = kind,
                .tokens = {path.begin(), path.begin() + end},
                .payload_bytes = state.bytes},
               state.ram);
    state.on_disk = true;
}

void prompt_cache::store_block(node* n, int32_t end, std::vector<uint8_t> payload, std::span<const llama_token> path) {
    if (payload.empty()) return;
    const uint32_t kind = end % options_.block_tokens == 0 ? kind_block : kind_tail;
    n->value.blocks[end] = keep_in_tiers(n, kind, end, std::move(payload), path);
    enforce_ram_budget();
    enforce_disk_budget();
}

void prompt_cache::store_checkpoint(node* n, int32_t pos, std::vector<uint8_t> payload,
                                    std::span<const llama_token> path) {
    if (payload.empty()) return;
    n->value.checkpoints[pos] = keep_in_tiers(n, kind_checkpoint, pos, std::move(payload), path);
    counters_.checkpoints++;
    enforce_ram_budget();
    enforce_disk_budget();
}

bool prompt_cache::checkpoint(int slot) {
    device_sequence& s = seq(slot);
    if (!checkpoints_ || tree::is_root(s.tip)) return true;
    const auto pos = static_cast<int32_t>(s.tip->depth);
    if (s.tip->value.checkpoints.count(pos)) return true;  // a valid one is never displaced
    std::vector<uint8_t> state = serialize_checkpoint(s.seq, pos);
    if (state.empty()) return true;
    // Windowed SWA, the window held by this sequence alone: put it back into the lowest free cells, dropping the
    // cells the sequence left behind its window. llama.cpp places a batch from the cache's head onwards, and takes a
    // cell left behind only once it has passed every free one, so a long prompt spread over the whole SWA cache
    // (a window per sequence the context has: 12 windows by default), and attention walks every cell up to the
    // highest one in use: a cold 8K prompt on tiny-swa computed no faster than with a full-size cache. Freeing them
    // lowers the head to the first cell freed (llama_kv_cache::seq_rm), so the prompt goes on in about a window and a
    // batch of cells, as llama-server's cache of one window and a batch per slot does.
    if (options_.windowed_swa && shared_depth(s) + n_swa_ <= pos && !restore_checkpoint(s.seq, state)) {
        log::warn("cache", "sequence {} lost its sliding-window KV at {}: dropped", s.seq, pos);
        counters_.restore_failures++;
        drop(s);
        return false;
    }
    store_checkpoint(s.tip, pos, std::move(state), tree_.path(s.tip));
    return true;
}

// After the header, a recurrent-state snapshot (llama_memory_recurrent::state_write) starts with its cell count and,
// per cell, the last position it has seen. One cell at pos - 1 is the state after exactly `pos` tokens.
// A windowed SWA cache's (llama_kv_cache::state_write of the SWA layers) starts with its stream count (1: the cache
// is unified) and the sequence's cell count: the cells of its last window (llama.cpp writes no cell masked for the
// sequence's last position), at least one and at most a window.
bool prompt_cache::valid_checkpoint(const std::vector<uint8_t>& state, int32_t pos) const {
    if (state.size() < state_header + sizeof(uint32_t) + sizeof(int32_t) ||
        state.size() <= state_header + empty_partial_state_.size()) {
        return false;
    }
    uint32_t magic = 0, first = 0;
    int32_t second = 0;
    std::memcpy(&magic, state.data(), sizeof magic);
    std::memcpy(&first, state.data() + state_header, sizeof first);
    std::memcpy(&second, state.data() + state_header + sizeof first, sizeof second);
    if (magic != state_magic) return false;
    if (options_.windowed_swa) return first == 1 && second >= 1 && second <= std::min(pos, n_swa_);
    return first == 1 && second == pos - 1;
}

// An entry that can be dropped from a tier without stranding others: a checkpoint (each stands alone), or a block
// with no deeper block of the same tier below it (restoring needs a contiguous run of blocks).
namespace {
struct eviction_candidate {
    double score;
    void* n;
    int32_t end;
    bool checkpoint;
    bool hinted;      // a client's hint covers it
    bool kept;        // ... and protects it: its tenant holds no more than its share of the tier
    bool over_share;  // its tenant holds more than its share of the tier
};

}  // namespace

void prompt_cache::enforce_ram_budget() {
    const auto in_ram = [](const stored_state& st) { return st.ram != nullptr; };
    const auto over = [&] { return ram_bytes_ > options_.ram_budget; };
    evict_until(in_ram, options_.ram_budget, over, [&](stored_state& st) {
        ram_bytes_ -= st.bytes;
        st.ram.reset();
        counters_.ram.evictions++;
        return st.on_disk;  // still held on disk
    });
}

void prompt_cache::enforce_disk_budget() {
    if (!disk_) return;
    const auto on_disk = [](const stored_state& st) { return st.on_disk; };
    // The store's budget in force: less than ours for a while when the file system filled up first.
    const auto budget = [&] { return std::min(options_.disk_budget, disk_->budget_in_force()); };
    const auto over = [&] { return disk_->bytes() > budget(); };
    evict_until(on_disk, budget(), over, [&](stored_state& st) {
        disk_->erase(st.key);
        st.on_disk = false;
        counters_.disk.evictions++;
        return st.ram != nullptr;  // still held in RAM
    });
}

// Drops entries of one tier (`in_tier`, of `budget` bytes) while `over()`: first those of a tenant over its share,
// then those no hint protects, lowest score first; `drop` removes the tier's copy and says whether another tier
// still holds the entry (otherwise it leaves the tree).
template <typename InTier, typename Over, typename Drop>
void prompt_cache::evict_until(InTier in_tier, uint64_t budget, Over over, Drop drop) {
    const auto now = clock::now();
    while (over()) {
        std::vector<node*> order;
        std::unordered_map<const node*, uint64_t> tenant_bytes;  // this tier's bytes, by tenant root
        tree_.for_each([&](node& n) {
            order.push_back(&n);
            uint64_t held = 0;
            for (auto& [end, st] : n.value.blocks) held += in_tier(st) ? st.bytes : 0;
            for (auto& [pos, st] : n.value.checkpoints) held += in_tier(st) ? st.bytes : 0;
            if (held > 0) tenant_bytes[tree::root_of(&n)] += held;
        });
        const uint64_t share = tenant_share(budget, tenant_bytes.size());
        const auto candidate = [&](node* n, int32_t end, const stored_state& st, bool checkpoint, int32_t first) {
            const bool over_share = tenant_bytes[tree::root_of(n)] > share;
            const bool marked = hinted(*n, first, now);
            return eviction_candidate{
                compute_saved(options_.block_tokens, end) / static_cast<double>(st.bytes) * recency(st.last_used, now),
                n,
                end,
                checkpoint,
                marked,
                marked && !over_share,
                over_share};
        };
        std::unordered_map<node*, bool> deeper_block;  // a block of this tier exists below this node's edge
        std::vector<eviction_candidate> candidates;
        for (auto it = order.rbegin(); it != order.rend(); ++it) {
            node* n = *it;
            bool below = false;
            for (auto& [token, child] : n->children) below = below || deeper_block[child.get()];
            for (auto b = n->value.blocks.rbegin(); b != n->value.blocks.rend(); ++b) {
                if (!in_tier(b->second)) continue;
                const bool tail = b->first % options_.block_tokens != 0;  // an alternative ending: nothing needs it
                if (tail || !below)
                    candidates.push_back(candidate(n, b->first, b->second, false, block_start(b->first)));
                if (!tail) below = true;
            }
            deeper_block[n] = below;
            for (auto& [pos, c] : n->value.checkpoints) {
                if (!in_tier(c)) continue;
                candidates.push_back(candidate(n, pos, c, true, pos - 1));
            }
        }
        if (candidates.empty()) break;
        // A tenant's entries over its share go first; then what no hint protects; then the lowest score.
        std::sort(candidates.begin(), candidates.end(), [](const auto& a, const auto& b) {
            if (a.over_share != b.over_share) return a.over_share;
            return a.kept != b.kept ? b.kept : a.score < b.score;
        });
        for (const auto& c : candidates) {
            if (!over()) break;
            node* n = static_cast<node*>(c.n);
            auto& map = c.checkpoint ? n->value.checkpoints : n->value.blocks;
            auto entry = map.find(c.end);
            if (c.hinted) counters_.hinted.evicted++;
            if (!drop(entry->second)) map.erase(entry);
            // Pruning could free nodes later candidates point to; they are re-collected on the next round.
            if (n->value.blocks.empty() && n->value.checkpoints.empty() && n->value.holders == 0 &&
                n->children.empty()) {
                prune(n);
                break;
            }
        }
    }
}

// ---- restoring a prompt ----

int prompt_cache::device_tokens() {
    int used = 0;
    tree_.for_each([&](node& n) {
        if (n.value.holders > 0) used += static_cast<int>(n.edge.size());
    });
    return used;
}

prompt_cache::device_match prompt_cache::find_holder(const tree::match& m, const device_sequence& s) const {
    device_match best;
    for (node* n = m.deepest; n && !tree::is_root(n); n = n->parent) {
        if (n->value.holders == 0) continue;
        best.length = static_cast<int>(n == m.deepest ? m.length : n->depth);
        for (const auto& cand : sequences_) {
            bool through = false;
            for (node* a = cand.tip; !tree::is_root(a) && a->depth >= n->depth; a = a->parent) {
                if (a == n) {
                    through = true;
                    break;
                }
            }
            if (!through) continue;
            // Prefer the slot itself (nothing to copy), then the most recently used holder.
            if (!best.holder || &cand == &s || (best.holder != &s && cand.last_used > best.holder->last_used)) {
                best.holder = &cand;
            }
        }
        break;
    }
    return best;
}

prompt_cache::divergence_point prompt_cache::find_divergence(const node* root,
                                                             std::span<const llama_token> prompt) const {
    divergence_point d;
    const tree::match first = tree_.longest_prefix(root, prompt);
    if (first.length >= prompt.size()) return d;
    const node* n = first.deepest ? first.deepest : root;
    if (first.deepest && first.into_edge < first.deepest->edge.size()) {
        auto from = first.deepest->edge.begin() + static_cast<std::ptrdiff_t>(first.into_edge);
        d.cached_continuation.assign(from, from + std::min<std::ptrdiff_t>(8, first.deepest->edge.end() - from));
    } else if (!n->children.empty()) {
        const auto& edge = n->children.begin()->second->edge;
        d.cached_continuation.assign(
            edge.begin(), edge.begin() + std::min<std::ptrdiff_t>(8, static_cast<std::ptrdiff_t>(edge.size())));
    }
    if (!d.cached_continuation.empty()) d.divergence_pos = static_cast<int>(first.length);
    return d;
}

acquire_plan prompt_cache::plan_for(const device_sequence& s, const node* root, std::span<const llama_token> prompt,
                                    int limit, int device_cap, bool window_at_device) const {
    acquire_plan plan;
    const tree::match m = tree_.longest_prefix(root, prompt);
    const device_match dm = find_holder(m, s);
    plan.matched = static_cast<int>(m.length);
    plan.holder = dm.holder ? dm.holder->seq : -1;
    plan.slot_leaves = dm.holder != &s && !tree::is_root(s.tip);
    // Device span, then contiguous RAM/disk blocks, then (checkpointed models) a point whose partial state is known.
    plan.device = std::min({dm.length, limit, device_cap});
    block_restore_plan blocks = plan_block_restore<tree>(m, plan.device, limit, options_.block_tokens);
    plan.blocks = std::move(blocks.ends);
    const int attention_end = blocks.attention_end;
    plan.target = attention_end;
    if (checkpoints_) {
        // A recurrent state is right only at the end of the holder's own sequence or at a checkpoint; a windowed SWA
        // cache's window, wherever the holder still has it (window_at_device) or at a checkpoint.
        plan.target = 0;
        if (options_.windowed_swa) {
            if (window_at_device) plan.target = plan.device;
        } else if (dm.holder && static_cast<int>(dm.holder->tip->depth) == dm.length && dm.length <= limit) {
            plan.target = dm.length;
        }
        for (const node* n = m.deepest ? tree::ancestor_at(m.deepest, static_cast<size_t>(attention_end)) : root;
             !tree::is_root(n); n = n->parent) {
            const auto& cps = n->value.checkpoints;
            auto it = cps.upper_bound(attention_end);
            if (it == cps.begin()) continue;
            --it;
            if (it->first > plan.target) {
                plan.target = it->first;
                plan.from_checkpoint = true;
            }
            break;
        }
        while (!plan.blocks.empty() && block_start(plan.blocks.back()) >= plan.target) plan.blocks.pop_back();
    }
    // What this prompt takes from the slot's own cells. Past it the slot's content goes on differently, even where
    // the prompt goes further through RAM blocks of another path (its own earlier turn, demoted while this slot
    // served another agent): position `target` lies on the prompt's path, not on the slot's.
    plan.own_reused = std::min(plan.device, plan.target);
    plan.slot_cut = dm.holder == &s && plan.own_reused < static_cast<int>(s.tip->depth);
    for (const int32_t end : plan.blocks) {
        const auto& stored = tree::ancestor_at(m.deepest, static_cast<size_t>(end))->value.blocks;
        if (auto it = stored.find(end); it != stored.end() && it->second.ram) plan.ram_blocks++;
    }
    return plan;
}

acquire_plan prompt_cache::plan_acquire(int slot, std::span<const llama_token> prompt, int limit,
                                        std::string_view tenant) const {
    const auto root = roots_by_key_.find(tenant_root_block_key(options_.model_fingerprint, tenant));
    if (root == roots_by_key_.end()) return {};  // nothing cached for this tenant yet
    return plan_for(sequences_[static_cast<size_t>(slot)], root->second, prompt, limit);
}

bool prompt_cache::make_plan_executable(device_sequence& s, const acquire_plan& plan, int prompt_size, int round,
                                        bool& kept_own) {
    const device_sequence* holder = plan.holder >= 0 ? &seq(plan.holder) : nullptr;
    if (plan.slot_leaves) {
        if (worth_keeping(s)) park(s, holder);  // nobody else holds enough of what this slot has: keep it
        drop(s);
        return true;
    }
    if (plan.slot_cut) {
        // Keep the rest of the slot's content, parked, unless it is a few tokens that a dense model simply drops (a
        // hybrid model needs the copy: its slot cannot be cut).
        const int b = options_.block_tokens;
        const bool long_tail = static_cast<int>(s.tip->depth) - plan.own_reused >= std::min(64, b);
        if (s.tip->value.holders == 1 && (long_tail || !can_truncate_) && !kept_own) {
            kept_own = true;
            if (park(s, nullptr)) return true;  // else it went to RAM blocks
        }
        if (!can_truncate_) {  // hybrid: restart from the parked copy (this slot's state cannot be cut)
            drop(s);
            return true;
        }
    }
    // The slot's own content past what this prompt reuses goes now (parked above when worth keeping): the room check
    // then counts its cells as free, and an eviction sees a parked copy of it as that copy's alone (else the copy
    // would be dropped as shared with the slot, and lost when the slot is cut).
    if (holder == &s && can_truncate_) truncate(s, plan.own_reused);
    // Room for what is restored and computed; evicting re-plans, as it may demote what the plan uses.
    const int needed = prompt_size - plan.own_reused + options_.block_tokens;
    const int n_ctx = static_cast<int>(llama_n_ctx(ctx_));
    return round < 64 && n_ctx - device_tokens() < needed && make_room(holder);
}

size_t prompt_cache::scratch_swa_bytes() {
    return llama_state_seq_get_size_ext(ctx_, scratch_, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
}

// Counts the range's SWA cells from the serialized size of a copy of it in the scratch sequence (one cell: a fixed
// size, each further cell: the same number of bytes), so that no KV is copied out of the context.
bool prompt_cache::swa_window_intact(llama_seq_id seq, int length) {
    if (n_swa_ <= 0 || length <= 0) return true;
    llama_memory_t mem = llama_get_memory(ctx_);
    const auto copy = [&](llama_pos p0, llama_pos p1) { llama_memory_seq_cp(mem, seq, scratch_, p0, p1); };
    if (swa_cell_bytes_ == 0) {
        // The sequence's last position is always in its SWA cache; find another one close enough not to be masked.
        const llama_pos last = llama_memory_seq_pos_max(mem, seq);
        if (last < 0) return true;
        llama_memory_seq_rm(mem, scratch_, -1, -1);
        const size_t empty = scratch_swa_bytes();
        copy(last, last + 1);
        const size_t one = scratch_swa_bytes();
        size_t two = 0;
        for (llama_pos p = last - 1; p >= 0 && p > last - 8 && p > last - n_swa_ + 1; --p) {
            llama_memory_seq_rm(mem, scratch_, -1, -1);
            copy(p, p + 1);
            if (scratch_swa_bytes() == empty) continue;
            copy(last, last + 1);
            two = scratch_swa_bytes();
            break;
        }
        llama_memory_seq_rm(mem, scratch_, -1, -1);
        if (one <= empty || two <= one) return true;  // nothing to measure on yet
        swa_one_cell_bytes_ = one;
        swa_cell_bytes_ = two - one;
    }
    const int first = std::max(0, length - n_swa_ + 1);
    llama_memory_seq_rm(mem, scratch_, -1, -1);
    copy(first, length);
    const size_t bytes = scratch_swa_bytes();
    llama_memory_seq_rm(mem, scratch_, -1, -1);
    return bytes == swa_one_cell_bytes_ + static_cast<size_t>(length - first - 1) * swa_cell_bytes_;
}

prompt_cache::stored_state* prompt_cache::planned_entry(const node* root, std::span<const llama_token> prompt,
                                                        bool is_checkpoint, int32_t pos) {
    const tree::match now = tree_.longest_prefix(root, prompt);
    if (!now.deepest || static_cast<size_t>(pos) > now.length) return nullptr;
    node* n = tree::ancestor_at(now.deepest, static_cast<size_t>(pos));
    auto& map = is_checkpoint ? n->value.checkpoints : n->value.blocks;
    auto it = map.find(pos);
    return it == map.end() ? nullptr : &it->second;
}

void prompt_cache::forget_unreadable(const node* root, std::span<const llama_token> prompt, bool is_checkpoint,
                                     int32_t pos) {
    stored_state* state = planned_entry(root, prompt, is_checkpoint, pos);
    if (!state) return;
    state->on_disk = false;
    if (state->ram) return;
    const tree::match now = tree_.longest_prefix(root, prompt);
    node* n = tree::ancestor_at(now.deepest, static_cast<size_t>(pos));
    (is_checkpoint ? n->value.checkpoints : n->value.blocks).erase(pos);
}

cache_restore prompt_cache::execute(device_sequence& s, const node* root, std::span<const llama_token> prompt,
                                    const acquire_plan& plan) {
    llama_memory_t mem = llama_get_memory(ctx_);
    const int target = plan.target;
    s.prompt_end = static_cast<int>(prompt.size());
    cache_restore r;
    r.matched = plan.matched;
    bool ok = true;
    // 1. Device: share the holder's cells.
    const int from_device = std::min(plan.device, target);
    if (plan.holder == s.seq) {
        if (can_truncate_) truncate(s, from_device);
    } else if (plan.holder >= 0 && from_device > 0) {
        device_sequence& holder = seq(plan.holder);
        ok = settle_rollback(holder);
        if (ok) {
            llama_memory_seq_cp(mem, holder.seq, s.seq, 0, from_device);
            hold(s, tree_.node_ending_at(holder.tip, static_cast<size_t>(from_device)));
            holder.last_used = clock::now();
        }
    }
    r.device = from_device;
    // Step 1 may have split nodes (entries move to the upper part) or pruned the slot's old path: planned entries
    // are found again by position on the prompt's path (planned_entry).
    // 2. RAM and disk blocks.
    int restored = from_device;
    std::vector<uint8_t> payload;
    for (const int32_t end : plan.blocks) {
        if (!ok || restored >= target) break;
        stored_state* state = planned_entry(root, prompt, false, end);
        bool from_disk = false;
        if (!state || !load_block(*state, payload, from_disk)) {
            forget_unreadable(root, prompt, false, end);
            ok = false;
            break;
        }
        const int p1 = std::min(end, target);
        if (!restore_block(s.seq, payload, restored, p1)) {
            ok = false;
            break;
        }
        state->last_used = clock::now();
        if (from_disk && !state->ram && options_.ram_budget > 0) {
            state->ram = std::make_shared<const std::vector<uint8_t>>(payload);  // promote to RAM
            ram_bytes_ += state->bytes;
        }
        (from_disk ? r.disk : r.ram) += p1 - restored;
        restored = p1;
    }
    // 3. Checkpointed models: the partial state at `target`.
    if (ok && plan.from_checkpoint) {
        stored_state* state = planned_entry(root, prompt, true, target);
        bool from_disk = false;
        if (!state || !load_block(*state, payload, from_disk) || !restore_checkpoint(s.seq, payload)) {
            forget_unreadable(root, prompt, true, target);
            ok = false;
        } else {
            state->last_used = clock::now();
            r.checkpoint_pos = target;
            llama_memory_seq_rm(mem, s.seq, target, -1);  // attention beyond the checkpoint (the holder's tail)
        }
    }
    // 4. Windowed SWA: a slot that shares cells with another sequence holds in its SWA layers the window it needs,
    // in cells of its own (reseat_window).
    if (ok && options_.windowed_swa && !plan.from_checkpoint && target > 0 && shared_depth(s) > 0) {
        ok = reseat_window(s.seq);
    }
    if (!ok) {
        // Nothing half-restored is kept: this prompt starts from scratch. The failed entry is out of the tree.
        counters_.restore_failures++;
        drop(s);
        r = {};
        r.matched = static_cast<int>(tree_.longest_prefix(root, prompt).length);
    } else {
        r.reused = checkpoints_ ? target : restored;
        if (r.reused > static_cast<int>(s.tip->depth)) {  // extend the slot's path over what was restored
            const tree::match m = tree_.longest_prefix(root, prompt);
            node* tip = tree_.node_ending_at(m.deepest, static_cast<size_t>(r.reused));
            for (node* n = s.tip; !tree::is_root(n); n = n->parent) n->value.holders--;
            hold(s, tip);
        }
        r.device = std::min(r.device, r.reused);
    }
    // Blocks read back from disk were promoted to RAM above; the budget holds them too, now that the plan, which
    // points into the tree, is carried out (the slot holds its path, so nothing it restored is pruned).
    enforce_ram_budget();
    return r;
}

void prompt_cache::count_restore(const cache_restore& r) {
    (r.reused > 0 ? counters_.hits : counters_.misses)++;
    if (r.device > 0) counters_.device.hits++;
    if (r.ram > 0) counters_.ram.hits++;
    if (r.disk > 0) counters_.disk.hits++;
}

cache_restore prompt_cache::acquire(int slot, std::span<const llama_token> prompt, int limit, std::string_view tenant) {
    node* const root = tenant_root(tenant);
    device_sequence& s = seq(slot);
    s.in_use = true;
    counters_.lookups++;
    // Where the prompt leaves a cached path that goes on differently, before this slot's own tail is dropped.
    divergence_point divergence = find_divergence(root, prompt);
    // Plan, then execute. Parking or evicting changes the tree, so each of those steps re-plans. The rounds are
    // bounded: the slot's content is dropped at most once (an empty slot is nobody's preferred holder, and nothing
    // below gives it content again), kept at most once (`kept_own`), and room is made at most 64 times.
    acquire_plan plan;
    bool kept_own = false;
    int device_cap = std::numeric_limits<int>::max();
    bool window_at_device = true;
    for (int round = 0;; ++round) {
        plan = plan_for(s, root, prompt, limit, device_cap, window_at_device);
        if (options_.windowed_swa) {
            // Windowed SWA: the full-attention layers' cells are all there; the window before the device span's end
            // may not be (llama.cpp gives cells outside their holder's window to new tokens). Then a checkpoint.
            if (window_at_device && !plan.from_checkpoint && plan.target > 0 && plan.target == plan.device &&
                !swa_window_intact(plan.holder, plan.device)) {
                window_at_device = false;
                continue;
            }
        } else if (plan.device > 0 && plan.holder >= 0 && !swa_window_intact(plan.holder, plan.device)) {
            // Lost positions lie before the window of the holder's last token, so no shorter span of it is whole.
            log::warn("cache", "sequence {} lost sliding-window KV before position {}: not reused from the device",
                      plan.holder, plan.device);
            device_cap = 0;
            continue;
        }
        if (!make_plan_executable(s, plan, static_cast<int>(prompt.size()), round, kept_own)) break;
    }
    cache_restore r = execute(s, root, prompt, plan);
    if (tree::is_root(s.tip)) s.tip = root;  // an empty slot: what it computes next goes into this tenant's tree
    r.divergence_pos = divergence.divergence_pos;
    r.cached_continuation = std::move(divergence.cached_continuation);
    count_restore(r);
    s.last_used = clock::now();
    publish_deferring_blocks();
    return r;
}

void prompt_cache::release_slot(int slot, bool discard) {
    device_sequence& s = seq(slot);
    s.in_use = false;
    s.last_used = clock::now();
    if (discard) drop(s);
    publish();
}

// ---- statistics ----

void prompt_cache::publish() {
    report_blocks();
    publish_counters();
}

void prompt_cache::publish_deferring_blocks() {
    if (options_.block_observer) blocks_pending_ = true;
    publish_counters();
}

void prompt_cache::publish_counters() {
    cache_snapshot snap = counters_;
    snap.tree_nodes = tree_.node_count();
    const auto now = clock::now();
    tree_.for_each([&](node& n) {
        if (n.value.holders > 0) snap.device.tokens += n.edge.size();
        const auto start = static_cast<int32_t>(n.depth - n.edge.size());
        if (hinted(n, start, now)) {
            if (n.value.holders > 0)
                snap.hinted.device_tokens += std::min<uint64_t>(n.edge.size(), uint64_t(n.value.hinted_end - start));
            const auto count = [&](const stored_state& st, int32_t first) {
                if (!hinted(n, first, now)) return;
                if (st.ram) {
                    snap.hinted.ram_entries++;
                    snap.hinted.ram_bytes += st.bytes;
                }
                if (st.on_disk) {
                    snap.hinted.disk_entries++;
                    snap.hinted.disk_bytes += st.bytes;
                }
            };
            for (auto& [end, st] : n.value.blocks) count(st, block_start(end));
            for (auto& [pos, st] : n.value.checkpoints) count(st, pos - 1);
        }
        for (auto& [end, st] : n.value.blocks) {
            if (st.ram) {
                snap.ram.entries++;
                snap.ram.tokens += static_cast<uint64_t>(end - block_start(end));
            }
        }
        for (auto& [pos, st] : n.value.checkpoints) {
            if (st.ram) {
                snap.checkpoints++;
                snap.checkpoint_bytes += st.bytes;
            }
        }
    });
    snap.checkpoints = snap.checkpoints;
    for (auto& s : sequences_) {
        if (!tree::is_root(s.tip)) snap.device.entries++;
    }
    snap.ram.bytes = ram_bytes_;
    snap.ram.budget = options_.ram_budget;
    if (disk_) {
        snap.disk.entries = disk_->size();
        snap.disk.bytes = disk_->bytes();
        snap.disk.budget = options_.disk_budget;
        snap.disk_read_failures = counters_.disk_read_failures;
    }
    std::lock_guard lock(published_mu_);
    published_ = snap;
}

// Walks the shared tenant's tree block by block, chaining each block's hash from its parent's (chain_block_key from
// the model's root key, low 64 bits: docs/kv-events.md), and compares what each medium holds with the last report.
// A block is listed on a medium while that tier holds it and every earlier block of its path is held somewhere (a
// block past a hole cannot be restored); a path's tail past its last whole block is never listed.
void prompt_cache::report_blocks() {
    kv_block_observer* const observer = options_.block_observer;
    if (!observer) return;
    const uint64_t started = thread_cpu_us();
    blocks_pending_ = false;
    const int b = options_.block_tokens;
    const bool full = !listed_valid_;
    std::unordered_map<uint64_t, kv_listed_block> now;
    kv_block_report report;
    report.full_listing = full;
    struct frame {
        node* at;
        block_key chain;                   // the key of the block ending where `pending` starts
        std::optional<uint64_t> parent;    // its hash (none: position 0)
        std::vector<llama_token> pending;  // the tokens since then that ancestors hold (fewer than a block)
    };
    node* const root = tree_.root();
    std::vector<frame> stack;
    for (auto& [token, child] : root->children) stack.push_back({child.get(), root_keys_.at(root), std::nullopt, {}});
    std::vector<llama_token> joined;  // a block that starts in an ancestor: its tokens in one piece
    while (!stack.empty()) {
        frame f = std::move(stack.back());
        stack.pop_back();
        node* const n = f.at;
        const std::span<const llama_token> edge(n->edge);
        const auto start = static_cast<int32_t>(n->depth - n->edge.size());
        const auto depth = static_cast<int32_t>(n->depth);
        int32_t from = start;  // where this node's tokens not yet in a block begin
        bool intact = true;
        // Each block ending in this node: hashed from the span of its tokens (no copy unless it starts above).
        for (int32_t end = (start / b + 1) * b; end <= depth; end += b) {
            uint8_t media = n->value.holders > 0 ? kv_medium_bit(kv_medium::device) : 0;
            if (const auto it = n->value.blocks.find(end); it != n->value.blocks.end()) {
                if (it->second.ram) media |= kv_medium_bit(kv_medium::ram);
                if (it->second.on_disk) media |= kv_medium_bit(kv_medium::disk);
            }
            if (media == 0) {
                intact = false;
                break;
            }
            std::span<const llama_token> block =
                edge.subspan(static_cast<size_t>(from - start), static_cast<size_t>(end - from));
            if (!f.pending.empty()) {
                joined = f.pending;
                joined.insert(joined.end(), block.begin(), block.end());
                block = joined;
                f.pending.clear();
            }
            f.chain = chain_block_key(f.chain, block);
            const uint64_t hash = f.chain.low;
            now[hash] = kv_listed_block{.hash = hash, .parent = f.parent, .media = media};
            uint8_t before = 0;
            if (!full) {
                if (const auto it = listed_.find(hash); it != listed_.end()) before = it->second.media;
            }
            for (int m = 0; m < kv_medium_count; ++m) {
                const auto medium = static_cast<kv_medium>(m);
                if ((media & ~before & kv_medium_bit(medium)) == 0) continue;
                report.changes.push_back({.stored = true,
                                          .medium = medium,
                                          .hash = hash,
                                          .parent = f.parent,
                                          .tokens = std::vector<llama_token>(block.begin(), block.end())});
            }
            f.parent = hash;
            from = end;
        }
        if (!intact) continue;
        f.pending.insert(f.pending.end(), edge.begin() + (from - start), edge.end());
        for (auto& [token, child] : n->children) stack.push_back({child.get(), f.chain, f.parent, f.pending});
    }
    // Removals after the stores: a block moving between media (a demotion) is never absent from a subscriber's index.
    if (!full) {
        for (const auto& [hash, was] : listed_) {
            const auto it = now.find(hash);
            const uint8_t kept = it == now.end() ? 0 : it->second.media;
            for (int m = 0; m < kv_medium_count; ++m) {
                const auto medium = static_cast<kv_medium>(m);
                if ((was.media & ~kept & kv_medium_bit(medium)) == 0) continue;
                report.changes.push_back({.stored = false, .medium = medium, .hash = hash, .parent = {}, .tokens = {}});
            }
        }
    }
    {
        std::lock_guard lock(published_mu_);
        listed_ = std::move(now);
    }
    listed_valid_ = true;
    const bool refused = (report.full_listing || !report.changes.empty()) && !observer->take(std::move(report));
    counters_.block_report_us += thread_cpu_us() - started;
    if (refused) {
        listed_valid_ = false;  // the observer dropped what it held: it gets everything again, now
        report_blocks();
    }
}

std::vector<kv_listed_block> prompt_cache::listed_blocks() const {
    std::lock_guard lock(published_mu_);
    std::vector<kv_listed_block> out;
    out.reserve(listed_.size());
    for (const auto& [hash, block] : listed_) out.push_back(block);
    return out;
}

std::vector<cached_conversation> prompt_cache::conversations(size_t token_budget) const {
    // Each leaf ends a conversation; it is as new as the newest entry at its end (a path only the device holds: now).
    struct leaf {
        const node* n;
        block_key tenant_root;
        std::chrono::system_clock::time_point written;
    };
    std::vector<leaf> leaves;
    const auto now = std::chrono::system_clock::now();
    for (const auto& [root_key, root] : roots_by_key_) {
        std::vector<const node*> stack{root};
        while (!stack.empty()) {
            const node* at = stack.back();
            stack.pop_back();
            for (const auto& [token, child] : at->children) stack.push_back(child.get());
            if (!at->children.empty() || tree::is_root(at)) continue;
            std::chrono::system_clock::time_point written{};
            bool stored = false;
            for (const auto* entries : {&at->value.blocks, &at->value.checkpoints}) {
                for (const auto& [end, state] : *entries) {
                    written = std::max(written, state.written);
                    stored = true;
                }
            }
            leaves.push_back({at, root_key, stored ? written : now});
        }
    }
    // Newest first; the deeper one first where two were written together, so that it gives their shared start.
    std::sort(leaves.begin(), leaves.end(), [](const leaf& a, const leaf& b) {
        return a.written != b.written ? a.written > b.written : a.n->depth > b.n->depth;
    });

    // A node's edge is listed once, with the newest conversation through it.
    std::unordered_set<const node*> listed;
    std::vector<cached_conversation> out;
    size_t left = token_budget;
    std::vector<const node*> chain;
    for (const leaf& l : leaves) {
        if (left == 0) break;
        chain.clear();
        for (const node* at = l.n; !tree::is_root(at) && !listed.contains(at); at = at->parent) chain.push_back(at);
        if (chain.empty()) continue;
        cached_conversation c{.tenant_root = l.tenant_root, .tokens = {}, .written = l.written};
        for (auto at = chain.rbegin(); at != chain.rend(); ++at) {
            c.tokens.insert(c.tokens.end(), (*at)->edge.begin(), (*at)->edge.end());
            listed.insert(*at);
        }
        if (c.tokens.size() > left)
            c.tokens.erase(c.tokens.begin(), c.tokens.end() - static_cast<std::ptrdiff_t>(left));
        left -= c.tokens.size();
        out.push_back(std::move(c));
    }
    return out;
}

cache_snapshot prompt_cache::snapshot() const {
    std::lock_guard lock(published_mu_);
    return published_;
}

}  // namespace keepwarm

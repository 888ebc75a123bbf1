// The prefix cache's block reports (cache/kv-block-events.h, docs/kv-events.md), through the engine: a block is
// reported stored on the medium that holds it (device, RAM, disk) and removed when it leaves it; only the shared
// tenant's blocks are reported; a restarted server lists its disk blocks first; an observer that refuses a report
// gets a full listing; a request's setup never waits for a report. An index rebuilt from the reports alone always
// equals the cache's own listing.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "common.h"
#include "engine/engine.h"
#include "generated-models.h"
#include "greedy-runs.h"
#include "test-prose.h"
#include "test-temp-dir.h"

using namespace keepwarm;
namespace fs = std::filesystem;

namespace {

using tokens = std::vector<llama_token>;
using test_prose::words;

// Rebuilds, from the reports alone, which blocks each medium holds and the token prefix each block ends.
class recording_observer : public kv_block_observer {
public:
    bool take(kv_block_report report) override {
        std::this_thread::sleep_for(take_delay_.load());
        std::lock_guard lock(mu_);
        if (refuse_next_ && !report.full_listing) {
            refuse_next_ = false;
            refused_++;
            return false;
        }
        full_listings_ += report.full_listing ? 1 : 0;
        if (report.full_listing) held_.clear();
        for (const kv_block_change& c : report.changes) {
            if (c.stored) {
                EXPECT_TRUE(held_.insert({c.hash, c.medium}).second) << "stored twice on one medium";
                EXPECT_EQ(c.tokens.size(), 64u);
                if (c.parent) {
                    EXPECT_TRUE(prefix_.count(*c.parent)) << "a parent is reported before its child";
                }
                tokens prefix = c.parent && prefix_.count(*c.parent) ? prefix_[*c.parent] : tokens{};
                prefix.insert(prefix.end(), c.tokens.begin(), c.tokens.end());
                prefix_[c.hash] = prefix;
            } else {
                EXPECT_EQ(held_.erase({c.hash, c.medium}), 1u) << "removed without being stored";
            }
        }
        return true;
    }

    void refuse_next() {
        std::lock_guard lock(mu_);
        refuse_next_ = true;
    }
    // Each report from now on holds the engine thread this long, as the walk over a very large cache would.
    void delay_takes(std::chrono::milliseconds delay) { take_delay_ = delay; }
    int refused() {
        std::lock_guard lock(mu_);
        return refused_;
    }
    int full_listings() {
        std::lock_guard lock(mu_);
        return full_listings_;
    }

    // How many of the first whole blocks of `prompt` the medium holds, from the start.
    size_t blocks_held(const tokens& prompt, kv_medium m) {
        std::lock_guard lock(mu_);
        size_t n = 0;
        for (; (n + 1) * 64 <= prompt.size(); ++n) {
            const tokens want(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>((n + 1) * 64));
            bool found = false;
            for (const auto& [hash, medium] : held_) found = found || (medium == m && prefix_[hash] == want);
            if (!found) break;
        }
        return n;
    }

    // Whether any held block's prefix starts like `prompt`'s first block.
    bool holds_any_of(const tokens& prompt) {
        std::lock_guard lock(mu_);
        const tokens first(prompt.begin(), prompt.begin() + 64);
        for (const auto& [hash, medium] : held_) {
            const tokens& p = prefix_[hash];
            if (p.size() >= 64 && std::equal(first.begin(), first.end(), p.begin())) return true;
        }
        return false;
    }

    std::set<std::pair<uint64_t, kv_medium>> held() {
        std::lock_guard lock(mu_);
        return held_;
    }

private:
    std::atomic<std::chrono::milliseconds> take_delay_{std::chrono::milliseconds(0)};
    std::mutex mu_;
    std::set<std::pair<uint64_t, kv_medium>> held_;  // guarded by mu_
    std::map<uint64_t, tokens> prefix_;              // guarded by mu_
    bool refuse_next_ = false;                       // guarded by mu_
    int refused_ = 0, full_listings_ = 0;            // guarded by mu_
};

std::set<std::pair<uint64_t, kv_medium>> listed(const engine& e) {
    std::set<std::pair<uint64_t, kv_medium>> out;
    for (const kv_listed_block& b : e.cache_blocks()) {
        for (int m = 0; m < kv_medium_count; ++m) {
            if (b.media & kv_medium_bit(static_cast<kv_medium>(m))) out.insert({b.hash, static_cast<kv_medium>(m)});
        }
    }
    return out;
}

engine_options options_with(recording_observer& observer) {
    engine_options o;
    o.model_path = test_models::generated_model("unit-kv-block-events", "tiny");
    o.context_size = 4096;
    o.slots = 1;
    o.threads = 1;
    o.cache_block_tokens = 64;
    o.cache_parked_sequences = 4;
    o.cache_block_observer = &observer;
    return o;
}

tokens tokenize(engine& e, const std::string& text) {
    return common_tokenize(e.vocab(), text, true, true);
}

}  // namespace

TEST(kv_block_events, blocks_move_from_the_device_to_ram_and_private_tenants_stay_unreported) {
    recording_observer observer;
    engine e(options_with(observer));
    e.start();
    EXPECT_EQ(observer.full_listings(), 1) << "the first report lists everything (nothing yet)";
    const tokens a = tokenize(e, words(2200, 401));
    const tokens b = tokenize(e, words(1800, 403));
    ASSERT_GT(a.size() + b.size(), 4096u) << "the two must not fit together";

    greedy_runs::generate(e, a, 4);
    EXPECT_EQ(observer.blocks_held(a, kv_medium::device), a.size() / 64);
    EXPECT_EQ(observer.blocks_held(a, kv_medium::ram), 0u);
    EXPECT_EQ(observer.held(), listed(e));

    greedy_runs::generate(e, b, 4);  // no room for both: A's cells go, its blocks to RAM
    EXPECT_EQ(observer.blocks_held(b, kv_medium::device), b.size() / 64);
    EXPECT_EQ(observer.blocks_held(a, kv_medium::device), 0u) << "removed from the device";
    EXPECT_EQ(observer.blocks_held(a, kv_medium::ram), a.size() / 64) << "stored in RAM";
    EXPECT_EQ(observer.held(), listed(e));

    const tokens secret = tokenize(e, words(300, 405));
    greedy_runs::generate(e, secret, 4, "alice");
    EXPECT_FALSE(observer.holds_any_of(secret)) << "a private tenant's blocks are not published";
    EXPECT_EQ(observer.held(), listed(e));
}

TEST(kv_block_events, a_restarted_server_lists_its_disk_blocks_first) {
    const test_support::temp_dir dir("kv-block-events-disk");
    tokens a;
    {
        recording_observer observer;
        engine_options o = options_with(observer);
        o.cache_dir = dir.path.string();
        o.cache_parked_sequences = 0;
        engine e(o);
        e.start();
        a = tokenize(e, words(400, 411));
        const tokens other = tokenize(e, words(400, 412));
        greedy_runs::generate(e, a, 4);
        greedy_runs::generate(e, other, 4);  // no parking: A goes to RAM blocks, written to disk behind them
        EXPECT_EQ(observer.blocks_held(a, kv_medium::ram), a.size() / 64);
        EXPECT_EQ(observer.blocks_held(a, kv_medium::disk), a.size() / 64);
        EXPECT_EQ(observer.held(), listed(e));
    }
    {
        recording_observer observer;
        engine_options o = options_with(observer);
        o.cache_dir = dir.path.string();
        engine e(o);
        EXPECT_EQ(observer.full_listings(), 1);
        EXPECT_EQ(observer.blocks_held(a, kv_medium::disk), a.size() / 64) << "indexed at start-up, listed at once";
        EXPECT_EQ(observer.blocks_held(a, kv_medium::ram), 0u);
        EXPECT_EQ(observer.held(), listed(e));
        e.start();
        greedy_runs::generate(e, a, 4);  // restored from disk: on the device (and promoted to RAM) again
        EXPECT_EQ(observer.blocks_held(a, kv_medium::device), a.size() / 64);
        EXPECT_EQ(observer.held(), listed(e));
    }
}

TEST(kv_block_events, a_refused_report_is_followed_by_a_full_listing) {
    recording_observer observer;
    engine e(options_with(observer));
    e.start();
    const tokens a = tokenize(e, words(500, 421));
    greedy_runs::generate(e, a, 4);
    observer.refuse_next();
    const tokens b = tokenize(e, words(500, 422));
    greedy_runs::generate(e, b, 4);
    EXPECT_EQ(observer.refused(), 1);
    EXPECT_GE(observer.full_listings(), 2);
    EXPECT_EQ(observer.blocks_held(a, kv_medium::device), a.size() / 64);
    EXPECT_EQ(observer.blocks_held(b, kv_medium::device), b.size() / 64);
    EXPECT_EQ(observer.held(), listed(e));
}

TEST(kv_block_events, a_warm_turns_setup_does_not_wait_for_its_block_report) {
    recording_observer observer;
    engine_options o = options_with(observer);
    o.cache_parked_sequences = 0;
    engine e(o);
    e.start();
    const tokens a = tokenize(e, words(400, 431));
    greedy_runs::generate(e, a, 4);
    greedy_runs::generate(e, tokenize(e, words(400, 432)), 4);  // no parking: A's blocks go to RAM
    ASSERT_EQ(observer.blocks_held(a, kv_medium::device), 0u);

    // A's restore from RAM changes what the device holds: the report of it comes after the warm turn's first step,
    // so the turn's setup (request received to its first model call) does not include it.
    observer.delay_takes(std::chrono::milliseconds(400));
    const greedy_runs::result warm = greedy_runs::generate(e, a, 4);
    EXPECT_GT(warm.stats.reused_ram, 0);
    EXPECT_LT(warm.stats.setup_ms, 400) << "the restore's block report ran inside the request's setup";
    EXPECT_EQ(observer.blocks_held(a, kv_medium::device), a.size() / 64) << "reported by the time the answer ends";
    EXPECT_EQ(observer.held(), listed(e));
}

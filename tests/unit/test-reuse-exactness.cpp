// Does a reused prefix change the answer? A warm turn takes its prompt's prefix KV from the cache and computes only
// the rest; these tests show why its logits can differ from a fresh server's in their last bits (the order in which
// the rows were computed, not KV that changed on its way through RAM or disk), and that exact reuse
// (engine_options::exact_reuse, serve --exact-reuse) gives a fresh server's answer bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "common.h"
#include "engine/engine.h"
#include "generated-models.h"
#include "greedy-runs.h"
#include "test-prose.h"
#include "test-temp-dir.h"

using namespace keepwarm;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

using tokens = std::vector<llama_token>;

using test_prose::words;

std::string chatml(const std::string& system, const std::vector<std::string>& users) {
    std::string out = "<|im_start|>system\n" + system + "<|im_end|>\n";
    for (const std::string& user : users) out += "<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n";
    return out;
}

using greedy_runs::generate;
using greedy_runs::result;

// The largest difference between two runs' logits, over the positions both kept (0: bit for bit the same, as
// far as a float comparison sees).
float logit_difference(const result& a, const result& b) {
    float worst = 0;
    for (size_t i = 0; i < std::min(a.logits.size(), b.logits.size()); ++i) {
        for (size_t k = 0; k < std::min(a.logits[i].size(), b.logits[i].size()); ++k) {
            worst = std::max(worst, std::fabs(a.logits[i][k] - b.logits[i][k]));
        }
    }
    return worst;
}

// The first generated position whose logits are not the same bit for bit (the number kept: none).
size_t first_difference(const result& a, const result& b) {
    const size_t n = std::min(a.logits.size(), b.logits.size());
    for (size_t i = 0; i < n; ++i) {
        if (a.logits[i].size() != b.logits[i].size() ||
            std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * sizeof(float)) != 0) {
            return i;
        }
    }
    return n;
}

// Same tokens and the same logits, byte for byte.
bool identical(const result& a, const result& b) {
    return a.generated == b.generated && a.logits.size() == b.logits.size() &&
           first_difference(a, b) == a.logits.size();
}

std::string dense_model() {
    return test_models::generated_model("unit-reuse-exactness", "tiny");
}

// One slot and no parking: the slot's previous conversation goes to RAM when another takes it. Physical batches of
// `ubatch` tokens, so that prompts of a few hundred tokens span several, and 64-token blocks, so that a restore can
// end inside one.
engine_options options(int batch = 256, int ubatch = 128) {
    engine_options o;
    o.model_path = dense_model();
    o.context_size = 8192;
    o.slots = 1;
    o.threads = 1;
    o.batch_size = batch;
    o.ubatch_size = ubatch;
    o.cache_block_tokens = 64;
    o.cache_parked_sequences = 0;
    o.idle_to_ram_tokens = 0;  // nothing moves while kv_bytes reads the context
    return o;
}

tokens tokenize(engine& e, const std::string& text) {
    return common_tokenize(e.vocab(), text, true, true);
}

// What a fresh server with the same flags and an empty cache answers.
result cold(const engine_options& o, const tokens& prompt, int n) {
    engine_options fresh = o;
    fresh.cache_dir.clear();
    engine e(fresh);
    e.start();
    result r = generate(e, prompt, n);
    EXPECT_EQ(r.stats.reused_tokens, 0);
    return r;
}

tokens head(const tokens& t, size_t n) {
    return tokens(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(n));
}

}  // namespace

// (a) State: the KV a RAM or disk block brings back is, byte for byte, the KV it was stored with, and the KV the
// same positions get when computed again in the same batches. Nothing is lost or changed on the way.
TEST(reuse_exactness, restored_blocks_hold_the_kv_they_were_stored_with) {
    const test_support::temp_dir dir("exact-state");
    engine_options o = options(2048, 512);
    o.cache_dir = dir.path.string();
    tokens prompt, other;
    int restorable = 0;
    std::vector<uint8_t> computed;
    {
        engine e(o);
        e.start();
        prompt = tokenize(e, chatml(words(300, 1), {words(30, 2)}));
        other = tokenize(e, words(200, 3));  // shares no token with the prompt: all of it comes back from RAM
        // Whole blocks and the tail stored at the prompt's end: all of it but the last position.
        restorable = static_cast<int>(prompt.size()) - 1;
        generate(e, prompt, 1);  // one sampled token, not decoded: the slot holds the prompt
        computed = e.kv_bytes(0, 0, restorable);
        ASSERT_FALSE(computed.empty());
        generate(e, other, 1);  // the only slot takes it, the prompt goes to RAM
        const result from_ram = generate(e, prompt, 1);
        EXPECT_EQ(from_ram.stats.reused_ram, restorable);
        EXPECT_TRUE(e.kv_bytes(0, 0, restorable) == computed) << "RAM blocks changed the KV";
    }  // stopping persists the device tier to disk
    {
        engine e(o);
        e.start();
        const result from_disk = generate(e, prompt, 1);
        EXPECT_EQ(from_disk.stats.reused_disk, restorable);
        EXPECT_TRUE(e.kv_bytes(0, 0, restorable) == computed) << "disk blocks changed the KV";
    }
    {
        engine_options fresh = o;
        fresh.cache_dir.clear();
        engine e(fresh);
        e.start();
        generate(e, prompt, 1);
        EXPECT_TRUE(e.kv_bytes(0, 0, restorable) == computed) << "the same batches computed other KV";
    }
}

// (b) Order: a cold run fed in the cached run's split (first [0, R), then [R, N)) answers exactly as the cached run
// from disk does, and both differ from the cold run that computes the prompt in one batch.
TEST(reuse_exactness, a_cold_run_split_where_the_cache_ends_answers_as_the_cached_run) {
    const test_support::temp_dir dir("exact-order");
    engine_options o = options(2048, 512);
    o.cache_dir = dir.path.string();
    tokens prompt;
    size_t restorable = 0;
    {
        engine e(o);
        e.start();
        prompt = tokenize(e, chatml(words(300, 11), {words(30, 12)}));
        restorable = prompt.size() - 1;  // whole blocks and the tail at the prompt's end
        generate(e, prompt, 1);
    }
    const int n = 16;
    const result one_batch = cold(o, prompt, n);
    result from_disk, split;
    {
        engine e(o);
        e.start();
        from_disk = generate(e, prompt, n);
        EXPECT_EQ(from_disk.stats.reused_disk, static_cast<int>(restorable));
    }
    {
        engine_options fresh = o;
        fresh.cache_dir.clear();
        engine e(fresh);
        e.start();
        generate(e, head(prompt, restorable), 1);
        split = generate(e, prompt, n);
        EXPECT_EQ(split.stats.reused_device, static_cast<int>(restorable));
    }
    std::cout << "[ logits ] prompt " << prompt.size() << " tokens, " << restorable << " cached: disk vs split cold "
              << logit_difference(from_disk, split) << ", disk vs one-batch cold "
              << logit_difference(from_disk, one_batch) << "\n";
    EXPECT_TRUE(identical(from_disk, split)) << "the cached run differs from a cold run split the same way";
    EXPECT_GT(logit_difference(from_disk, one_batch), 0.0f) << "no order effect on this model and prompt";
}

namespace {

struct probe_outcome {
    int answers = 0;
    int differing = 0;  // answers whose tokens or logits are not bit for bit a fresh server's
    int warm_computed = 0;
    int warm_prompt = 0;
};

// Probe-like turns: a conversation growing (its answers in the next prompt), another tenant taking the only slot
// (the first goes to RAM), a prompt that leaves a cached path inside a block, then a restart (disk). Each answer is
// compared with a fresh server's.
probe_outcome run_probe(bool exact, int parked = 0) {
    const test_support::temp_dir dir(exact ? "exact-probe-on" : "exact-probe-off");
    engine_options o = options();
    o.cache_dir = dir.path.string();
    o.exact_reuse = exact;
    o.cache_parked_sequences = parked;
    const int n = 12;
    probe_outcome out;
    const auto check = [&](engine& e, const tokens& prompt, const std::string& tenant, const char* what) {
        const result warm = generate(e, prompt, n, tenant);
        const result fresh = cold(o, prompt, n);
        ++out.answers;
        if (warm.stats.reused_tokens > 0) {
            out.warm_computed += warm.stats.computed_tokens;
            out.warm_prompt += warm.stats.prompt_tokens;
        }
        const bool same = identical(warm, fresh);
        if (!same) ++out.differing;
        std::cout << "[ probe  ] exact " << exact << " parked " << parked << " " << what << ": " << prompt.size()
                  << " tokens, reused " << warm.stats.reused_tokens << " (device " << warm.stats.reused_device
                  << ", ram " << warm.stats.reused_ram << ", disk " << warm.stats.reused_disk << "), logits differ by "
                  << logit_difference(warm, fresh) << (same ? "" : " DIFFERENT from position ")
                  << (same ? "" : std::to_string(first_difference(warm, fresh))) << "\n";
        return warm;
    };
    const std::string system = words(260, 21);
    tokens turn2, branch;
    {
        engine e(o);
        e.start();
        const tokens turn1 = tokenize(e, chatml(system, {words(40, 22)}));
        const result first = check(e, turn1, "a", "turn 1 (cold)");
        turn2 = turn1;
        turn2.insert(turn2.end(), first.generated.begin(), first.generated.end());
        const tokens more =
            tokenize(e, "<|im_end|>\n<|im_start|>user\n" + words(30, 23) + "<|im_end|>\n<|im_start|>assistant\n");
        turn2.insert(turn2.end(), more.begin(), more.end());
        check(e, turn2, "a", "turn 2 (device)");
        check(e, tokenize(e, chatml(words(250, 24), {words(30, 25)})), "b", "other tenant");
        check(e, turn2, "a", "turn 2 again (ram)");
        branch = tokenize(e, chatml(system, {words(45, 26)}));  // leaves the cached path inside a block
        check(e, tokenize(e, chatml(words(250, 27), {words(30, 28)})), "b", "other tenant");
        check(e, branch, "a", "branch (ram, partial block)");
    }
    {
        engine e(o);
        e.start();
        check(e, turn2, "a", "turn 2 after a restart (disk)");
        tokens turn3 = turn2;
        const tokens more = tokenize(e, "and then?<|im_end|>\n<|im_start|>assistant\n");
        turn3.insert(turn3.end(), more.begin(), more.end());
        check(e, turn3, "a", "turn 3 after a restart (disk)");
    }
    return out;
}

}  // namespace

// Without exact reuse, some warm answers are not a fresh server's bit for bit; with it, every one is, at the cost
// of recomputing the prompt back to a physical batch's start (and the last answer) on every warm turn.
TEST(reuse_exactness, exact_reuse_answers_as_a_fresh_server_after_ram_disk_and_partial_reuse) {
    const probe_outcome off = run_probe(false);
    const probe_outcome on = run_probe(true);
    std::cout << "[ cost   ] warm turns computed " << off.warm_computed << " of " << off.warm_prompt
              << " prompt tokens without exact reuse, " << on.warm_computed << " of " << on.warm_prompt << " with it\n";
    EXPECT_GT(off.differing, 0) << "no warm answer differs from a fresh server's on this model";
    EXPECT_EQ(on.differing, 0) << "exact reuse gave an answer a fresh server does not";
    EXPECT_EQ(on.answers, off.answers);
    // Idle conversations parked on the device beside the slot (their cells masked in its attention) change nothing.
    EXPECT_EQ(run_probe(true, 2).differing, 0) << "exact reuse with parked conversations";
}

TEST(reuse_exactness, exact_reuse_refuses_a_batch_that_is_not_whole_physical_batches) {
    engine_options o = options(200, 128);
    o.exact_reuse = true;
    EXPECT_THROW(engine e(o), std::invalid_argument);
}

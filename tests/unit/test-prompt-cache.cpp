// The prefix cache through the engine: every path a prompt's KV can come back by (another sequence's cells, RAM
// blocks, disk after a restart, hybrid checkpoints, a partial match) gives the same greedy tokens as computing the
// prompt cold, and the accounting says which tier it came from.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "common.h"
#include "engine/engine.h"
#include "engine/llama-runtime.h"
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
    for (size_t i = 0; i < users.size(); ++i) {
        out += "<|im_start|>user\n" + users[i] + "<|im_end|>\n";
        out += "<|im_start|>assistant\n";
        if (i + 1 < users.size()) out += "Noted: " + words(12, 900 + static_cast<unsigned>(i)) + "<|im_end|>\n";
    }
    return out;
}

using greedy_runs::expect_same_output;
using greedy_runs::result;

// A greedy request for `n` tokens, never ended early by an end-of-generation token. With `hinted` > 0, the client
// asked to keep that many prompt tokens cached for `hint_ttl`.
std::shared_ptr<generation_request> submit(engine& e, const tokens& prompt, int n = 32, const std::string& tenant = {},
                                           int hinted = 0, std::chrono::seconds hint_ttl = 300s) {
    auto r = greedy_runs::greedy_request(e, prompt, n, tenant);
    r->hinted_tokens = hinted;
    r->hint_ttl = hint_ttl;
    e.submit(r);
    return r;
}

result wait_for(generation_request& r) {
    return greedy_runs::wait_for(r, 60s);
}

result generate(engine& e, const tokens& prompt, int n = 32, const std::string& tenant = {}, int hinted = 0,
                std::chrono::seconds hint_ttl = 300s) {
    return wait_for(*submit(e, prompt, n, tenant, hinted, hint_ttl));
}

engine_options base_options(const std::string& model) {
    engine_options o;
    o.model_path = model;
    o.context_size = 8192;
    o.slots = 1;
    o.threads = 1;
    o.cache_block_tokens = 64;
    o.cache_parked_sequences = 4;
    return o;
}

// The prompt computed from nothing, in a fresh engine.
result cold(const std::string& model, const tokens& prompt, int n = 32) {
    engine e(base_options(model));
    e.start();
    result r = generate(e, prompt, n);
    EXPECT_EQ(r.stats.reused_tokens, 0);
    return r;
}

tokens tokenize(engine& e, const std::string& text) {
    return common_tokenize(e.vocab(), text, true, true);
}

// How many tokens the two prompts share from their start.
size_t shared_prefix(const tokens& a, const tokens& b) {
    return static_cast<size_t>(std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin());
}

std::string dense_model() {
    return test_models::generated_model("unit-prompt-cache", "tiny");
}
std::string hybrid_model() {
    return test_models::generated_model("unit-prompt-cache", "tiny-hybrid");
}
std::string moe_model() {
    return test_models::generated_model("unit-prompt-cache", "tiny-moe");
}

// One conversation evicted by others and asked for again: device parking, then RAM, on one model.
void check_device_and_ram_paths(const std::string& model) {
    const std::string system = words(300, 1);
    const std::string a = chatml(system, {words(40, 2)});
    const std::string b = chatml(words(300, 3), {words(40, 4)});

    engine_options o = base_options(model);
    o.cache_parked_sequences = 1;
    engine e(o);
    e.start();
    const tokens pa = tokenize(e, a), pb = tokenize(e, b), pc = tokenize(e, chatml(words(300, 5), {words(9, 6)}));
    const result expected = cold(model, pa);

    generate(e, pa);
    generate(e, pb);  // the only slot takes B: A is parked (device)
    result again = generate(e, pa);
    EXPECT_EQ(again.stats.reused_device, static_cast<int>(pa.size()) - 1) << "parked sequence shares its cells";
    expect_same_output(again, expected);

    generate(e, pb);  // B parked again; the one parked sequence is taken by A...
    generate(e, pc);  // ...which C's arrival pushes out to RAM
    result from_ram = generate(e, pa);
    // The slot holds C, which shares only the opening "<|im_start|>system\n" with A; the rest comes from RAM.
    EXPECT_LE(from_ram.stats.reused_device, 4);
    EXPECT_GE(from_ram.stats.reused_ram, static_cast<int>(pa.size()) / 64 * 64 - 64);
    EXPECT_EQ(from_ram.stats.reused_tokens, from_ram.stats.reused_ram + from_ram.stats.reused_device);
    expect_same_output(from_ram, expected);
    EXPECT_GT(e.cache_stats().ram.bytes, 0u);
}

// The hybrid tests run on each hybrid layout: qwen35 (a dense feed-forward, as Qwen3.5-4B) and qwen35moe (routed and
// shared experts, as Qwen3.5-35B-A3B and Qwen3-Next). In their bodies, hybrid_model() is the one under test.
class hybrid_prompt_cache : public testing::TestWithParam<std::string> {
protected:
    std::string hybrid_model() const { return test_models::generated_model("unit-prompt-cache", GetParam()); }
};

}  // namespace

INSTANTIATE_TEST_SUITE_P(layouts, hybrid_prompt_cache, testing::Values("tiny-hybrid", "tiny-hybrid-moe"),
                         [](const testing::TestParamInfo<std::string>& info) {
                             std::string name = info.param;
                             std::replace(name.begin(), name.end(), '-', '_');
                             return name;
                         });

TEST(prompt_cache, dense_device_and_ram_restores_equal_a_cold_run) {
    check_device_and_ram_paths(dense_model());
}

TEST(prompt_cache, tolerance_separates_prompts) {
    // The equality checks above would catch a restore that put any other KV in place: one differing message
    // moves the first logits far beyond their tolerance.
    const std::string model = dense_model();
    engine e(base_options(model));
    e.start();
    const result a = cold(model, tokenize(e, chatml(words(300, 91), {words(30, 92)})));
    const result b = cold(model, tokenize(e, chatml(words(300, 94), {words(30, 93)})));
    float worst = 0;
    for (size_t i = 0; i < a.logits[0].size(); ++i) worst = std::max(worst, std::fabs(a.logits[0][i] - b.logits[0][i]));
    const auto [lo, hi] = std::minmax_element(a.logits[0].begin(), a.logits[0].end());
    EXPECT_GT(worst, 2 * 0.03f * (*hi - *lo));
}

TEST(prompt_cache, moe_device_and_ram_restores_equal_a_cold_run) {
    check_device_and_ram_paths(moe_model());
}

TEST(prompt_cache, a_partial_match_recomputes_from_the_divergence_only) {
    const std::string model = dense_model();
    engine e(base_options(model));
    e.start();
    const std::string system = words(400, 11);
    const tokens p1 = tokenize(e, chatml(system, {words(30, 12)}));
    const tokens p2 = tokenize(e, chatml(system, {words(30, 13)}));
    const size_t shared = shared_prefix(p1, p2);
    generate(e, p1);
    const result r = generate(e, p2);
    EXPECT_EQ(r.stats.reused_tokens, static_cast<int>(shared));
    EXPECT_EQ(r.stats.computed_tokens, static_cast<int>(p2.size() - shared));
    expect_same_output(r, cold(model, p2));
}

TEST(prompt_cache, generated_tokens_join_the_tree) {
    engine e(base_options(dense_model()));
    e.start();
    const tokens prompt = tokenize(e, chatml(words(200, 21), {words(20, 22)}));
    const result first = generate(e, prompt, 24);
    tokens next = prompt;
    next.insert(next.end(), first.generated.begin(), first.generated.end());
    const tokens more = tokenize(e, "<|im_end|>\n<|im_start|>user\nand then?<|im_end|>\n<|im_start|>assistant\n");
    next.insert(next.end(), more.begin(), more.end());
    const result second = generate(e, next);
    // All but the last sampled token were decoded into the KV, so all but that one are reused.
    EXPECT_EQ(second.stats.reused_tokens, static_cast<int>(prompt.size() + first.generated.size()) - 1);
}

TEST(prompt_cache, a_restarted_server_restores_from_disk_and_ignores_damaged_entries) {
    const std::string model = dense_model();
    const test_support::temp_dir dir("disk");
    engine_options o = base_options(model);
    o.cache_dir = dir.path.string();
    tokens prompt;
    {
        engine e(o);
        e.start();
        prompt = tokenize(e, chatml(words(400, 31), {words(30, 32)}));
        generate(e, prompt);
    }  // stopping persists the device tier
    const result expected = cold(model, prompt);
    {
        engine e(o);
        e.start();
        const result r = generate(e, prompt);
        EXPECT_GE(r.stats.reused_disk, static_cast<int>(prompt.size()) / 64 * 64 - 64);
        EXPECT_EQ(r.stats.reused_disk, r.stats.reused_tokens);
        expect_same_output(r, expected);
    }
    // Damage every entry in a different way; a new server reports them and computes the prompt itself.
    int damaged = 0;
    for (const auto& f : fs::directory_iterator(dir.path)) {
        if (f.path().extension() != ".kwkv") continue;
        const auto size = fs::file_size(f.path());
        if (damaged % 2 == 0) {
            std::fstream io(f.path(), std::ios::in | std::ios::out | std::ios::binary);
            io.seekp(static_cast<std::streamoff>(size - 10));
            io.put('\x5a');
        } else {
            fs::resize_file(f.path(), size / 2);
        }
        ++damaged;
    }
    ASSERT_GT(damaged, 0);
    {
        engine e(o);
        e.start();
        EXPECT_GE(e.cache_stats().disk_rejected, 1u);
        const result r = generate(e, prompt);
        expect_same_output(r, expected);
    }
}

TEST_P(hybrid_prompt_cache, hybrid_divergence_in_the_last_message_restarts_from_a_checkpoint) {
    const std::string model = hybrid_model();
    engine e(base_options(model));
    e.start();
    const std::string system = words(500, 41);
    const std::vector<std::string> history{words(30, 42), words(30, 43)};
    auto users1 = history, users2 = history;
    users1.push_back(words(40, 44));
    users2.push_back(words(40, 45));
    const tokens p1 = tokenize(e, chatml(system, users1));
    const tokens p2 = tokenize(e, chatml(system, users2));
    const size_t shared = shared_prefix(p1, p2);

    generate(e, p1);
    const result r = generate(e, p2);
    EXPECT_GE(r.stats.checkpoint_pos, 0);
    EXPECT_LE(r.stats.reused_tokens, static_cast<int>(shared));
    // The checkpoint at the start of the last user message is at most a few tokens before the divergence.
    EXPECT_LE(static_cast<int>(shared) - r.stats.reused_tokens, 8);
    expect_same_output(r, cold(model, p2));

    // The same prompt again: its own end state (or the last message start) serves it.
    const result same = generate(e, p2);
    EXPECT_GE(same.stats.reused_tokens, static_cast<int>(p2.size()) - 8);
    expect_same_output(same, r);
}

// A prompt that ends where a cached prompt's next message starts: the client continued an answer the template
// renders as nothing, or sent the conversation again without its generation prompt. The last prompt token is always
// computed, so a checkpoint at the message start itself is one token too far; the one taken a token before it serves
// the whole prompt. (Taken at the message start, the gauntlet's continued answers went back to the start of the
// previous message: 50 tokens recomputed for 1.)
TEST_P(hybrid_prompt_cache, a_prompt_ending_where_a_cached_message_starts_computes_only_its_last_token) {
    const std::string model = hybrid_model();
    engine e(base_options(model));
    e.start();
    const std::string system = words(300, 46);
    const std::string without_answer = chatml(system, {words(40, 47)});  // ends with "<|im_start|>assistant\n"
    const std::string ended = without_answer.substr(0, without_answer.rfind("<|im_start|>"));
    const tokens cached = tokenize(e, without_answer);
    const tokens prompt = tokenize(e, ended);
    ASSERT_EQ(shared_prefix(cached, prompt), prompt.size());

    generate(e, cached);
    const result r = generate(e, prompt);
    EXPECT_EQ(r.stats.reused_tokens, static_cast<int>(prompt.size()) - 1);
    EXPECT_EQ(r.stats.checkpoint_pos, r.stats.reused_tokens);
    expect_same_output(r, cold(model, prompt));
}

namespace {
void check_hybrid_ram_and_disk(const std::string& model, int checkpoint_interval) {
    const test_support::temp_dir dir("hybrid-disk");
    engine_options o = base_options(model);
    o.checkpoint_interval = checkpoint_interval;
    o.cache_parked_sequences = 0;
    o.cache_dir = dir.path.string();
    const std::string a_text = chatml(words(300, 51), {words(30, 52)});
    tokens pa;
    {
        engine e(o);
        e.start();
        pa = tokenize(e, a_text);
        const tokens pb = tokenize(e, chatml(words(300, 53), {words(30, 54)}));
        generate(e, pa);
        generate(e, pb);  // no parking: A goes to RAM blocks + a checkpoint at its end
        const result r = generate(e, pa);
        EXPECT_GT(r.stats.reused_ram, 0);
        EXPECT_GE(r.stats.checkpoint_pos, 0);
        expect_same_output(r, cold(model, pa));
    }
    engine e(o);
    e.start();
    const result r = generate(e, pa);
    EXPECT_GT(r.stats.reused_disk, 0);
    EXPECT_GE(r.stats.checkpoint_pos, 0);
    expect_same_output(r, cold(model, pa));
}
}  // namespace

TEST_P(hybrid_prompt_cache, hybrid_ram_and_disk_restores_equal_a_cold_run) {
    check_hybrid_ram_and_disk(hybrid_model(), 0);
}

// With checkpoints farther apart than the prompt (a GPU's default), the same prompt asked again after a demotion
// or a restart still restores: the last whole block before the prompt's end always has a checkpoint (the tail past
// it ends at the prompt's last token, which is always computed, so it cannot serve the same prompt).
TEST_P(hybrid_prompt_cache, hybrid_restores_with_checkpoints_sparser_than_the_prompt) {
    check_hybrid_ram_and_disk(hybrid_model(), 2048);
}

TEST(prompt_cache, ram_stays_within_its_budget_under_new_prefixes) {
    engine_options o = base_options(dense_model());
    o.cache_parked_sequences = 0;
    o.cache_ram_bytes = 3u << 20;
    engine e(o);
    e.start();
    for (unsigned i = 0; i < 6; ++i) {
        generate(e, tokenize(e, chatml(words(300, 60 + i), {words(10, 70 + i)})), 4);
        EXPECT_LE(e.cache_stats().ram.bytes, o.cache_ram_bytes);
    }
    EXPECT_GT(e.cache_stats().ram.evictions, 0u);
}

// A conversation whose client marked its prompt (a cache hint) stays parked on the device while unmarked ones come
// and go; with a hint that has expired (ttl 0) the least recently used rule moves it to RAM as before.
TEST(prompt_cache, a_marked_conversation_stays_on_the_device_while_unmarked_ones_are_evicted) {
    for (const auto& [ttl, parked] : {std::pair{0s, 2}, std::pair{300s, 2}, std::pair{300s, 1}}) {
        SCOPED_TRACE("ttl " + std::to_string(ttl.count()) + " s, parked " + std::to_string(parked));
        engine_options o = base_options(dense_model());
        o.cache_parked_sequences = parked;
        engine e(o);
        e.start();
        const tokens marked = tokenize(e, chatml(words(300, 201), {words(20, 202)}));
        generate(e, marked, 4, {}, static_cast<int>(marked.size()), ttl);
        for (unsigned i = 0; i < 3; ++i) generate(e, tokenize(e, chatml(words(300, 210 + i), {words(20, 220 + i)})), 4);
        const result again = generate(e, marked, 4);
        if (ttl == 0s) {
            EXPECT_LE(again.stats.reused_device, 4) << "the oldest parked conversation left the device";
            EXPECT_GT(again.stats.reused_ram, 0);
            EXPECT_EQ(e.cache_stats().hinted.evicted, 0u);
        } else {
            EXPECT_EQ(again.stats.reused_device, static_cast<int>(marked.size()) - 1);
            EXPECT_EQ(e.cache_stats().hinted.requests, 1u);
            EXPECT_GT(e.cache_stats().hinted.device_tokens, 0u);
        }
    }
}

// Under a RAM budget that holds about two prompts, new unmarked prefixes evict each other, not the marked one; only
// its first `hinted` tokens are marked, so the blocks past them go like any other.
TEST(prompt_cache, marked_ram_blocks_outlast_unmarked_ones_under_the_budget) {
    for (const auto ttl : {0s, 300s}) {
        engine_options o = base_options(dense_model());
        o.cache_parked_sequences = 0;
        o.cache_ram_bytes = 3u << 20;
        engine e(o);
        e.start();
        const std::string system = words(300, 301);
        const tokens marked = tokenize(e, chatml(system, {words(10, 302)}));
        const tokens system_only = tokenize(e, chatml(system, {}));
        const int hinted = static_cast<int>(system_only.size());
        generate(e, marked, 4, {}, hinted, ttl);
        for (unsigned i = 0; i < 6; ++i) {
            generate(e, tokenize(e, chatml(words(300, 310 + i), {words(10, 320 + i)})), 4);
            EXPECT_LE(e.cache_stats().ram.bytes, o.cache_ram_bytes);
        }
        const auto stats = e.cache_stats();
        const result again = generate(e, marked, 4);
        if (ttl == 0s) {
            EXPECT_LT(again.stats.reused_tokens, 64) << "an expired hint protects nothing";
        } else {
            EXPECT_GE(again.stats.reused_tokens, hinted / 64 * 64) << "the marked blocks are all still in RAM";
            EXPECT_GT(stats.hinted.ram_entries, 0u);
            EXPECT_GT(stats.hinted.ram_bytes, 0u);
            EXPECT_GT(stats.ram.evictions, 0u);
        }
    }
}

// A prompt that needs the cells of the slot's previous conversation: that conversation is parked, then moved to RAM
// to make room, and comes back from there (found by an agent client: it was dropped instead, as shared with the slot
// that was about to be cut).
TEST(prompt_cache, a_parked_conversation_evicted_for_room_goes_to_ram) {
    engine_options o = base_options(dense_model());
    o.context_size = 4096;
    engine e(o);
    e.start();
    const tokens a = tokenize(e, chatml(words(2200, 401), {words(20, 402)}));
    const tokens b = tokenize(e, chatml(words(1800, 403), {words(20, 404)}));
    ASSERT_GT(a.size() + b.size(), 4096u) << "the two must not fit together";
    generate(e, a, 4);
    generate(e, b, 4);
    EXPECT_GT(e.cache_stats().ram.entries, 0u);
    const result again = generate(e, a, 4);
    EXPECT_GE(again.stats.reused_tokens, static_cast<int>(a.size()) - 64) << "A came back from RAM";
    EXPECT_GT(again.stats.reused_ram, 0);
}

// Issue 18: the KV is unified, so a prompt's attention runs over every cell in use up to the highest, the idle
// conversations' cells included (masked, but paid for: a cold 12K prompt took 10.5 s beside two idle 12K
// conversations, 6.9 s without). A long prompt first moves them to RAM; they come back from there. A short one
// (a turn's new message) leaves them where they are, and so does --idle-to-ram-at 0.
TEST(prompt_cache, a_long_prompt_moves_idle_conversations_to_ram_out_of_its_way) {
    for (const int threshold : {512, 0}) {
        SCOPED_TRACE("idle_to_ram_tokens " + std::to_string(threshold));
        engine_options o = base_options(dense_model());
        o.idle_to_ram_tokens = threshold;
        engine e(o);
        e.start();
        const tokens a = tokenize(e, chatml(words(250, 501), {words(20, 502)}));
        const tokens b = tokenize(e, chatml(words(250, 503), {words(20, 504)}));
        const tokens c = tokenize(e, chatml(words(900, 505), {words(20, 506)}));
        ASSERT_LT(b.size(), 512u);
        ASSERT_GT(c.size(), 600u);
        generate(e, a, 4);
        generate(e, b, 4);  // short: A stays parked on the device
        EXPECT_EQ(e.cache_stats().ram.entries, 0u);
        EXPECT_GE(e.cache_stats().device.tokens, a.size() + b.size());
        generate(e, c, 4);
        const cache_snapshot after = e.cache_stats();
        const result again = generate(e, a, 4);
        // The same prompt again: from RAM, whole blocks (the tail that ends at its last token is computed with it).
        EXPECT_GE(again.stats.reused_tokens, static_cast<int>(a.size()) - o.cache_block_tokens);
        if (threshold > 0) {
            EXPECT_GT(after.ram.entries, 0u);
            EXPECT_LE(after.device.tokens, c.size() + 4) << "only C's cells are left on the device";
            EXPECT_GT(again.stats.reused_ram, 0) << "A came back from RAM";
        } else {
            EXPECT_EQ(after.ram.entries, 0u);
            EXPECT_GE(after.device.tokens, a.size() + b.size() + c.size());
            EXPECT_EQ(again.stats.reused_device, again.stats.reused_tokens);
        }
    }
}

// The same for a long answer (an agent writing a file): each decode's attention spans the idle conversations' cells
// too (on 2 threads, a decode at 8K took 11.2 ms beside an idle 8K conversation, 7.6 ms without). Once an answer has
// generated --idle-to-ram-at tokens, they go to RAM; an answer one token shorter leaves them on the device.
TEST(prompt_cache, a_long_answer_moves_idle_conversations_to_ram_out_of_its_way) {
    engine_options o = base_options(dense_model());
    o.idle_to_ram_tokens = 200;
    engine e(o);
    e.start();
    const tokens a = tokenize(e, chatml(words(250, 521), {words(20, 522)}));
    const tokens b = tokenize(e, chatml(words(60, 523), {words(20, 524)}));
    const tokens c = tokenize(e, chatml(words(60, 525), {words(20, 526)}));
    ASSERT_LT(b.size() + c.size(), 200u) << "the prompts alone must not move anything";
    generate(e, a, 4);
    generate(e, b, 199);
    EXPECT_EQ(e.cache_stats().ram.entries, 0u) << "199 generated: A stays parked on the device";
    EXPECT_GE(e.cache_stats().device.tokens, a.size() + b.size() + 150);
    generate(e, c, 240);
    const cache_snapshot after = e.cache_stats();
    EXPECT_GT(after.ram.entries, 0u);
    EXPECT_LE(after.device.tokens, c.size() + 240) << "only C's cells are left on the device";
    const result again = generate(e, a, 4);
    EXPECT_GE(again.stats.reused_tokens, static_cast<int>(a.size()) - o.cache_block_tokens);
    EXPECT_GT(again.stats.reused_ram, 0) << "A came back from RAM";
}

// Three agents on two slots (the gauntlet): agent B's turn ran in a slot beside A's, A's conversation went to RAM
// meanwhile, and A's next turn came to B's slot. The slot shares only the system prompt with A's turn, which goes on
// from RAM further than B's content reaches: B's own part must still be kept, not cut with the slot (it was: the
// check compared a position on A's path with the length of B's, and B's next turn recomputed its 2.7K tokens).
TEST(prompt_cache, a_slot_taken_by_a_turn_restored_from_ram_keeps_its_own_conversation) {
    engine_options o = base_options(dense_model());
    o.idle_to_ram_tokens = 100;
    engine e(o);
    e.start();
    const std::string system = words(200, 531);
    const tokens a = tokenize(e, chatml(system, {words(300, 532)}));
    const tokens b = tokenize(e, chatml(system, {words(120, 533)}));
    const size_t shared = shared_prefix(a, b);
    ASSERT_GE(b.size() - shared, 100u) << "B's own part must move A's conversation to RAM";
    ASSERT_GT(a.size() - shared, b.size() - shared + 4 + o.cache_block_tokens) << "A must reach past B's content";
    generate(e, a, 4);
    generate(e, b, 4);  // A is parked, then moved to RAM while B computes
    EXPECT_GT(e.cache_stats().ram.entries, 0u);
    const result a_again = generate(e, a, 4);
    EXPECT_GT(a_again.stats.reused_ram, 0) << "A came back from RAM";
    EXPECT_GE(a_again.stats.reused_tokens, static_cast<int>(a.size()) - o.cache_block_tokens);
    const result b_again = generate(e, b, 4);
    EXPECT_GE(b_again.stats.reused_tokens, static_cast<int>(b.size()) - o.cache_block_tokens)
        << "B's own part was lost when A's turn took its slot";
}

namespace {
// The case above is one order of turns among many: agents sharing a system prompt take turns on two slots, one or
// two at once, in a random order, their conversations moving between slots, parked cells and RAM. Whatever the
// order, a turn reuses what the turns finished before it left of its prompt (its longest shared prefix with one of
// their prompts and answers), short of at most one block (RAM keeps whole blocks) and never its last token.
void check_random_orders_of_turns(const std::string& model, unsigned seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    engine_options o = base_options(model);
    o.slots = 2;
    o.idle_to_ram_tokens = 100;
    o.cache_parked_sequences = 2;
    engine e(o);
    e.start();
    std::mt19937 rng(seed);
    const std::string system = words(200, seed);
    constexpr unsigned agents = 4;
    std::vector<std::vector<std::string>> users(agents);
    std::vector<tokens> finished;  // prompt + answer of every finished turn
    std::string order;
    for (int round = 0; round < 16; ++round) {
        std::vector<unsigned> who{static_cast<unsigned>(rng() % agents)};
        if (rng() % 2 == 0) who.push_back((who[0] + 1 + static_cast<unsigned>(rng() % (agents - 1))) % agents);
        std::vector<tokens> prompts;
        std::vector<std::shared_ptr<generation_request>> requests;
        for (const unsigned a : who) {
            users[a].push_back(words(20 + static_cast<int>(rng() % 100), static_cast<unsigned>(rng())));
            prompts.push_back(tokenize(e, chatml(system, users[a])));
            requests.push_back(submit(e, prompts.back(), 4));
            order += std::string(1, static_cast<char>('A' + a)) + std::to_string(users[a].size()) + " ";
        }
        order += "| ";
        std::vector<size_t> reachable;
        for (const tokens& p : prompts) {
            size_t best = 0;
            for (const tokens& f : finished) best = std::max(best, shared_prefix(p, f));
            reachable.push_back(std::min(best, p.size() - 1));
        }
        for (size_t i = 0; i < prompts.size(); ++i) {
            const result r = wait_for(*requests[i]);
            EXPECT_GE(r.stats.reused_tokens + o.cache_block_tokens, static_cast<int>(reachable[i]))
                << "turns so far (agent, turn; | ends the ones submitted together): " << order;
            tokens done = prompts[i];
            done.insert(done.end(), r.generated.begin(), r.generated.end());
            finished.push_back(std::move(done));
        }
    }
}
}  // namespace

TEST(prompt_cache, any_order_of_turns_reuses_what_earlier_turns_left) {
    for (const unsigned seed : {1u, 2u, 3u}) check_random_orders_of_turns(dense_model(), seed);
}

TEST_P(hybrid_prompt_cache, any_order_of_turns_on_a_hybrid_model_reuses_what_earlier_turns_left) {
    for (const unsigned seed : {1u, 2u}) check_random_orders_of_turns(hybrid_model(), seed);
}

TEST(prompt_cache, disk_stays_within_its_budget_under_new_prefixes) {
    const test_support::temp_dir dir("disk-budget");
    engine_options o = base_options(dense_model());
    o.cache_parked_sequences = 0;
    o.cache_dir = dir.path.string();
    o.cache_disk_bytes = 4u << 20;
    {
        engine e(o);
        e.start();
        for (unsigned i = 0; i < 8; ++i) {
            generate(e, tokenize(e, chatml(words(300, 160 + i), {words(10, 170 + i)})), 4);
            EXPECT_LE(e.cache_stats().disk.bytes, o.cache_disk_bytes);
        }
        EXPECT_GT(e.cache_stats().disk.evictions, 0u);
    }
    uintmax_t on_disk = 0;
    for (const auto& f : fs::recursive_directory_iterator(dir.path)) {
        if (f.is_regular_file() && f.path().extension() == ".kwkv") on_disk += f.file_size();
    }
    EXPECT_LE(on_disk, o.cache_disk_bytes);
}

TEST(prompt_cache, two_requests_with_the_same_new_prefix_compute_it_once) {
    engine_options o = base_options(dense_model());
    o.slots = 2;
    o.batch_size = 64;  // several steps, so the second request arrives while the first computes
    engine e(o);
    e.start();
    const std::string system = words(600, 81);
    const tokens p1 = tokenize(e, chatml(system, {words(10, 82)}));
    const tokens p2 = tokenize(e, chatml(system, {words(10, 83)}));
    auto r1 = submit(e, p1, 4);
    auto r2 = submit(e, p2, 4);
    const int computed = wait_for(*r1).stats.computed_tokens + wait_for(*r2).stats.computed_tokens;
    const size_t shared = shared_prefix(p1, p2);
    EXPECT_LE(computed, static_cast<int>(p1.size() + p2.size() - shared) + 16);
}

TEST(prompt_cache, a_tenant_never_reuses_another_tenants_prefix) {
    // Tenant B sends exactly A's prompt: nothing of it is reused (not from A's slot, a parked sequence or RAM), and
    // no divergence quotes A's tokens; the same tenant sending it again reuses it all.
    const std::string model = dense_model();
    engine_options o = base_options(model);
    o.slots = 2;
    engine e(o);
    e.start();
    const tokens secret = tokenize(e, chatml("The PIN is 740317. " + words(300, 51), {words(20, 52)}));
    const tokens guess = tokenize(e, chatml("The PIN is 740318. " + words(300, 51), {words(20, 52)}));
    generate(e, secret, 4, "alice");
    const result b = generate(e, secret, 4, "bob");
    EXPECT_EQ(b.stats.reused_tokens, 0);
    EXPECT_EQ(b.stats.matched_tokens, 0);
    EXPECT_TRUE(b.stats.divergence.empty()) << b.stats.divergence;
    // A third tenant guessing one digit off reuses nothing either: no prefix of alice's or bob's copy counts.
    const result near = generate(e, guess, 4, "carol");
    EXPECT_EQ(near.stats.reused_tokens, 0);
    const result again = generate(e, secret, 4, "alice");
    EXPECT_EQ(again.stats.reused_tokens, static_cast<int>(secret.size()) - 1);
    const result bob_again = generate(e, secret, 4, "bob");
    EXPECT_EQ(bob_again.stats.reused_tokens, static_cast<int>(secret.size()) - 1);
}

TEST(prompt_cache, a_tenants_blocks_come_back_from_ram_and_disk_to_that_tenant_only) {
    const std::string model = dense_model();
    const test_support::temp_dir dir("tenants-disk");
    engine_options o = base_options(model);
    o.cache_dir = dir.path.string();
    o.cache_parked_sequences = 0;
    tokens prompt, other;
    {
        engine e(o);
        e.start();
        prompt = tokenize(e, chatml(words(400, 61), {words(30, 62)}));
        other = tokenize(e, chatml(words(400, 63), {words(30, 64)}));
        generate(e, prompt, 4, "alice");
        generate(e, other, 4, "alice");  // no parking: alice's first prompt goes to RAM blocks
        EXPECT_EQ(generate(e, prompt, 4, "bob").stats.reused_tokens, 0);
        EXPECT_GT(generate(e, prompt, 4, "alice").stats.reused_ram, 0);
    }  // stopping persists the device tier
    {
        engine e(o);
        e.start();
        EXPECT_EQ(e.cache_stats().disk_rejected, 0u);
        const result b = generate(e, other, 4, "bob");
        EXPECT_EQ(b.stats.reused_tokens, 0) << "alice's disk entries are filed under alice";
        const result shared = generate(e, other, 4, "");
        EXPECT_EQ(shared.stats.reused_tokens, 0);
        const result a = generate(e, other, 4, "alice");
        EXPECT_GE(a.stats.reused_disk, static_cast<int>(other.size()) / 64 * 64 - 64);
    }
}

// The first `n` tokens of `a` and `b` agree, and `b` goes on past `a`: `b` is `a`'s next turn.
void expect_next_turn(const tokens& a, const tokens& b) {
    ASSERT_GT(b.size(), a.size());
    ASSERT_TRUE(std::equal(a.begin(), a.end(), b.begin())) << "the next turn must extend the prompt token for token";
}

// A restart keeps the tokens past the last whole block up to the end of the last prompt: the next turn, which
// shares that prompt and renders the answer its own way, gets all of it back from disk, not cut to a block boundary
// (the held-out restart scenario lost up to a block per conversation before tails were kept).
TEST(prompt_cache, a_restart_loses_no_token_of_the_last_prompt) {
    const std::string model = dense_model();
    const test_support::temp_dir dir("disk-tail");
    engine_options o = base_options(model);
    o.cache_dir = dir.path.string();
    const std::string system = words(150, 61);
    tokens first, next;
    {
        engine e(o);
        e.start();
        first = tokenize(e, chatml(system, {words(20, 62)}));
        next = tokenize(e, chatml(system, {words(20, 62), words(15, 63)}));
        generate(e, first);
    }
    expect_next_turn(first, next);
    ASSERT_NE(first.size() % 64, 0u) << "the prompt must end inside a block for this test to mean anything";
    const result expected = cold(model, next);
    engine e(o);
    e.start();
    const result r = generate(e, next);
    EXPECT_EQ(r.stats.reused_tokens, static_cast<int>(first.size()));
    EXPECT_EQ(r.stats.reused_disk, r.stats.reused_tokens);
    expect_same_output(r, expected);
}

// Issue 33: the same prompt sent again after a restart recomputes its last token only (the one whose logits the
// answer needs), as on a server that kept it on the device: the tail written at shutdown is restored up to it.
TEST(prompt_cache, a_restart_recomputes_one_token_of_the_same_prompt) {
    const std::string model = dense_model();
    const test_support::temp_dir dir("disk-same-prompt");
    engine_options o = base_options(model);
    o.cache_dir = dir.path.string();
    tokens prompt;
    {
        engine e(o);
        e.start();
        prompt = tokenize(e, chatml(words(150, 64), {words(20, 65)}));
        generate(e, prompt);
    }
    ASSERT_NE(prompt.size() % 64, 0u) << "the prompt must end inside a block for this test to mean anything";
    const result expected = cold(model, prompt);
    engine e(o);
    e.start();
    const result r = generate(e, prompt);
    EXPECT_EQ(r.stats.reused_tokens, static_cast<int>(prompt.size()) - 1);
    EXPECT_EQ(r.stats.reused_disk, r.stats.reused_tokens);
    expect_same_output(r, expected);
}

// A conversation shorter than a block whose cells another one needs is kept in RAM whole: its next turn computes
// only what is new.
TEST(prompt_cache, a_conversation_shorter_than_a_block_survives_its_demotion) {
    const std::string model = dense_model();
    engine_options o = base_options(model);
    o.cache_parked_sequences = 0;  // no parking: the slot's content goes to RAM when another prompt takes it
    o.cache_block_tokens = 256;
    engine e(o);
    e.start();
    // Longer than the few tokens a slot drops rather than keeps (64), shorter than a block.
    const tokens first = tokenize(e, chatml(words(80, 71), {words(20, 72)}));
    const tokens next = tokenize(e, chatml(words(80, 71), {words(20, 72), words(10, 73)}));
    const tokens other = tokenize(e, chatml(words(40, 74), {words(10, 75)}));
    expect_next_turn(first, next);
    ASSERT_GT(first.size(), 64u);
    ASSERT_LT(next.size(), 256u);
    generate(e, first, 8);
    generate(e, other, 8);  // the only slot takes the other prompt: the first conversation is demoted
    const result r = generate(e, next, 8);
    EXPECT_EQ(r.stats.reused_tokens, static_cast<int>(first.size()));
    EXPECT_EQ(r.stats.reused_ram + r.stats.reused_device, r.stats.reused_tokens);
    EXPECT_GT(r.stats.reused_ram, 0);
    expect_same_output(r, cold(model, next, 8));
}

// A hybrid model keeps the recurrent state at the prompt's end too: its tail comes back after a restart with no
// recomputation either.
TEST_P(hybrid_prompt_cache, a_hybrid_restart_loses_no_token_of_the_last_prompt) {
    const std::string model = hybrid_model();
    const test_support::temp_dir dir("hybrid-disk-tail");
    engine_options o = base_options(model);
    o.cache_dir = dir.path.string();
    const std::string system = words(150, 81);
    tokens first, next;
    {
        engine e(o);
        e.start();
        first = tokenize(e, chatml(system, {words(20, 82)}));
        next = tokenize(e, chatml(system, {words(20, 82), words(15, 83)}));
        generate(e, first, 8);
    }
    expect_next_turn(first, next);
    engine e(o);
    e.start();
    const result r = generate(e, next, 8);
    EXPECT_EQ(r.stats.checkpoint_pos, static_cast<int>(first.size()));
    EXPECT_EQ(r.stats.reused_tokens, static_cast<int>(first.size()));
    expect_same_output(r, cold(model, next, 8));
}

// The Qwen3.5 template ends a generation prompt with "<think>\n" and renders that answer without it in the next turn,
// which so leaves the previous prompt just after "<|im_start|>assistant\n". On the device the checkpoint at that
// message start serves it; after a demotion to RAM and after a restart it must too, not the last whole block:
// prompt_cache::save_path keeps a tail ending at each message-start checkpoint past the last whole block (without
// one the checkpoint was no use once the cells left the device: 256 reused here, not 288 and 333).
TEST_P(hybrid_prompt_cache, the_next_turn_after_a_demotion_or_a_restart_restarts_from_the_last_message_start) {
    const std::string model = hybrid_model();
    const test_support::temp_dir dir("hybrid-message-start");
    engine_options o = base_options(model);
    o.cache_parked_sequences = 0;  // the slot's content goes to RAM when another prompt takes it
    o.cache_block_tokens = 256;    // all three turns end inside the second block, well past its start
    o.cache_dir = dir.path.string();
    const std::string system = words(230, 101);
    const std::vector<std::string> users{words(20, 102), words(15, 103), words(15, 104)};
    const auto turn = [&](engine& e, size_t n) {
        return tokenize(e, chatml(system, std::vector<std::string>(users.begin(), users.begin() + n)) + "<think>\n");
    };
    // Reused: all of the previous prompt up to its last message start, a few tokens before where the turn leaves it.
    const auto expect_message_start = [&](const result& r, const tokens& previous, const tokens& next) {
        const int shared = static_cast<int>(shared_prefix(previous, next));
        ASSERT_GT(shared % o.cache_block_tokens, 16)
            << shared << ": the message start must lie well past a block's start";
        EXPECT_GE(r.stats.reused_tokens, shared - 8);
        EXPECT_EQ(r.stats.checkpoint_pos, r.stats.reused_tokens);
        expect_same_output(r, cold(model, next, 8));
    };
    tokens second;
    {
        engine e(o);
        e.start();
        const tokens first = turn(e, 1);
        second = turn(e, 2);
        generate(e, first, 8);
        generate(e, tokenize(e, chatml(words(60, 105), {words(10, 106)})), 4);  // takes the only slot
        const result r = generate(e, second, 8);
        EXPECT_GT(r.stats.reused_ram, 0);
        expect_message_start(r, first, second);
    }
    {
        engine e(o);  // restarted on the same cache folder
        e.start();
        const tokens third = turn(e, 3);
        const result r = generate(e, third, 8);
        EXPECT_GT(r.stats.reused_disk, 0);
        expect_message_start(r, second, third);
    }
}

// Issue 19: a checkpoint at every block cut a GPU's prefill into small batches. The checkpoint interval is a setting
// of its own: fewer checkpoints, the same answers, and a divergence inside the interval restarts from the last
// checkpoint before it, at most one interval back.
TEST_P(hybrid_prompt_cache, hybrid_checkpoints_follow_their_interval_and_restore_from_the_last_one) {
    const std::string model = hybrid_model();
    const std::string system = words(600, 51);  // one long message: only the interval cuts it
    const std::string changed = system.substr(0, system.size() * 9 / 10) + words(60, 52);
    uint64_t checkpoints[2] = {0, 0};
    const int intervals[2] = {64, 256};
    for (int i = 0; i < 2; ++i) {
        engine_options o = base_options(model);
        o.checkpoint_interval = intervals[i];
        engine e(o);
        e.start();
        EXPECT_EQ(e.options().checkpoint_interval, intervals[i]);
        const tokens p1 = tokenize(e, chatml(system, {words(20, 53)}));
        const tokens p2 = tokenize(e, chatml(changed, {words(20, 53)}));
        const size_t shared = shared_prefix(p1, p2);
        ASSERT_GT(shared, 400u);

        generate(e, p1);
        checkpoints[i] = e.cache_stats().checkpoints;
        const result r = generate(e, p2);
        EXPECT_GE(r.stats.checkpoint_pos, 0);
        EXPECT_LE(r.stats.reused_tokens, static_cast<int>(shared));
        EXPECT_LT(static_cast<int>(shared) - r.stats.reused_tokens, intervals[i]) << "interval " << intervals[i];
        expect_same_output(r, cold(model, p2));
    }
    EXPECT_LT(checkpoints[1], checkpoints[0]);
}

// Each checkpoint ends a prompt chunk: a CPU computes a hybrid prompt in whole physical batches (256-token chunks,
// the block size, were half of one), a GPU in whole logical ones; rounded up to whole blocks either way.
TEST(prompt_cache, the_checkpoint_interval_defaults_to_whole_batches_in_whole_blocks) {
    const bool gpu = !gpu_devices().empty();
    struct sizes {
        int block, batch, ubatch, cpu_interval;
    };
    for (const sizes c : {sizes{256, 2048, 512, 512}, sizes{256, 2048, 384, 512}, sizes{256, 2048, 128, 256},
                          sizes{128, 256, 512, 256}}) {
        engine_options o = base_options(hybrid_model());
        o.cache_block_tokens = c.block;
        o.batch_size = c.batch;
        o.ubatch_size = c.ubatch;
        engine e(o);
        const int gpu_interval = (c.batch + c.block - 1) / c.block * c.block;
        EXPECT_EQ(e.options().checkpoint_interval, gpu ? gpu_interval : c.cpu_interval)
            << "block " << c.block << ", batch " << c.batch << ", ubatch " << c.ubatch;
    }
}

namespace {
// Issue 39 (F1): a prompt of exactly k whole blocks whose blocks a longer prompt with the same start left in RAM or
// on disk hung the engine thread (the restore planner took the last block again and again, growing memory until
// bad_alloc). Each such prompt is restored from that tier up to its last position but one (a hybrid model: up to
// its last checkpoint) and answered as a cold run.
void check_prompts_of_exactly_whole_blocks(const std::string& model, bool from_disk) {
    constexpr int block = 256;
    const test_support::temp_dir dir(from_disk ? "whole-blocks-disk" : "whole-blocks-ram");
    engine_options o = base_options(model);
    o.cache_block_tokens = block;
    o.cache_parked_sequences = 0;  // the slot's content goes to RAM when another prompt takes it
    if (from_disk) o.cache_dir = dir.path.string();
    // A dense model reuses up to the last prompt token; a hybrid one up to its last checkpoint before it.
    int interval = 0;
    bool hybrid = false;
    const auto expected_reuse = [&](int k) { return hybrid ? (k * block - 1) / interval * interval : k * block - 1; };
    for (const int k : {1, 2, 4}) {
        fs::remove_all(dir.path);
        tokens prompt;
        {
            engine e(o);
            e.start();
            const tokens longer = tokenize(e, words(1400, 91));
            ASSERT_GT(longer.size(), size_t{4 * block + 64});
            prompt.assign(longer.begin(), longer.begin() + k * block);
            generate(e, longer, 4);
            interval = e.options().checkpoint_interval;
            hybrid = llama_model_is_hybrid(e.model());
            if (!from_disk) {
                generate(e, tokenize(e, words(40, 92)), 4);  // takes the only slot: the longer prompt goes to RAM
                const result r = generate(e, prompt, 8);
                EXPECT_EQ(r.stats.reused_tokens, expected_reuse(k)) << k << " blocks";
                EXPECT_EQ(r.stats.reused_ram + r.stats.reused_device, r.stats.reused_tokens) << k << " blocks";
                EXPECT_LE(r.stats.reused_device, 1) << "the other prompt shares at most the first token";
                expect_same_output(r, cold(model, prompt, 8));
                continue;
            }
        }
        engine e(o);  // restarted on the same cache folder
        e.start();
        const result r = generate(e, prompt, 8);
        EXPECT_EQ(r.stats.reused_tokens, expected_reuse(k)) << k << " blocks";
        EXPECT_EQ(r.stats.reused_disk, r.stats.reused_tokens) << k << " blocks";
        expect_same_output(r, cold(model, prompt, 8));
    }
}
}  // namespace

TEST(prompt_cache, a_prompt_of_exactly_whole_blocks_restores_from_ram) {
    check_prompts_of_exactly_whole_blocks(dense_model(), false);
}
TEST(prompt_cache, a_prompt_of_exactly_whole_blocks_restores_from_disk) {
    check_prompts_of_exactly_whole_blocks(dense_model(), true);
}
TEST_P(hybrid_prompt_cache, a_hybrid_prompt_of_exactly_whole_blocks_restores_from_ram) {
    check_prompts_of_exactly_whole_blocks(hybrid_model(), false);
}
TEST_P(hybrid_prompt_cache, a_hybrid_prompt_of_exactly_whole_blocks_restores_from_disk) {
    check_prompts_of_exactly_whole_blocks(hybrid_model(), true);
}

// Issue 39 (F6): blocks read back from disk are promoted to RAM, and the RAM budget holds them too, after a restart
// as before it.
TEST(prompt_cache, blocks_read_back_from_disk_stay_within_the_ram_budget) {
    const test_support::temp_dir dir("disk-promote-budget");
    engine_options o = base_options(dense_model());
    o.cache_parked_sequences = 0;
    o.cache_dir = dir.path.string();
    std::vector<tokens> prompts;
    {
        engine e(o);
        e.start();
        for (unsigned i = 0; i < 4; ++i) {
            prompts.push_back(tokenize(e, chatml(words(300, 180 + i), {words(10, 190 + i)})));
            generate(e, prompts.back(), 4);
        }
    }
    o.cache_ram_bytes = 1u << 20;  // a few of the tiny model's 64-token blocks: less than one prompt
    engine e(o);
    e.start();
    for (const tokens& p : prompts) {
        const result r = generate(e, p, 4);
        EXPECT_GT(r.stats.reused_disk, 0);
        EXPECT_LE(e.cache_stats().ram.bytes, o.cache_ram_bytes);
    }
    EXPECT_GT(e.cache_stats().ram.evictions, 0u);
}

// Issue 39 (F4): one tenant's cache hints (ttl 1 h on everything it sends) and its flood of new prefixes no longer
// evict another tenant's prompt: a tenant over its share of a tier is evicted first and its hints protect nothing
// there. Checked for a victim that marked its prompt and for one that did not.
TEST(prompt_cache, one_tenants_marked_flood_does_not_evict_another_tenants_prompt) {
    for (const bool victim_marks : {true, false}) {
        SCOPED_TRACE(victim_marks ? "the victim marks its prompt" : "the victim marks nothing");
        engine_options o = base_options(dense_model());
        o.cache_parked_sequences = 1;
        o.cache_ram_bytes = 3u << 20;  // about two prompts of this size
        engine e(o);
        e.start();
        const tokens victim = tokenize(e, chatml(words(300, 401), {words(10, 402)}));
        generate(e, victim, 4, "victim", victim_marks ? static_cast<int>(victim.size()) : 0);
        for (unsigned i = 0; i < 8; ++i) {
            const tokens flood = tokenize(e, chatml(words(300, 410 + i), {words(10, 420 + i)}));
            generate(e, flood, 4, "flooder", static_cast<int>(flood.size()), 3600s);
            EXPECT_LE(e.cache_stats().ram.bytes, o.cache_ram_bytes);
        }
        const result again = generate(e, victim, 4, "victim");
        EXPECT_GE(again.stats.reused_tokens, static_cast<int>(victim.size()) / 64 * 64 - 64)
            << "the flooder's own entries went first";
        EXPECT_GT(e.cache_stats().ram.evictions, 0u);
    }
}

// The prefix cache on sliding-window models (tiny-swa: Gemma 3's layout, a 512-token window, conversations four
// times longer; tiny-gpt-oss: gpt-oss's alternating layers with a 128-token window and attention sinks, conversations
// twelve windows long), each with a windowed SWA cache (the default: windows kept as checkpoints) and a full-size one
// (--swa-full): a conversation's next turn reuses its whole prefix and answers as a cold run does, whether its KV
// stayed in the slot, was parked by another conversation, went to RAM or disk, or came back after a restart; a branch
// from inside a conversation reuses all before it (full-size) or all up to the last checkpoint before it (windowed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "common.h"
#include "engine/engine.h"
#include "engine/llama-runtime.h"
#include "generated-models.h"
#include "greedy-runs.h"
#include "model/model-builder.h"
#include "test-prose.h"
#include "test-temp-dir.h"

using namespace keepwarm;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

using tokens = std::vector<llama_token>;
using greedy_runs::expect_same_output;
using greedy_runs::result;
using test_prose::words;

result generate(engine& e, const tokens& prompt, int n = 16) {
    return greedy_runs::generate(e, prompt, n);
}

// Gemma 4's turn markup, as its chat template renders it.
std::string gemma_turns(const std::string& system, const std::vector<std::string>& users) {
    std::string out = "<|turn>system\n" + system + "<turn|>\n";
    for (size_t i = 0; i < users.size(); ++i) {
        out += "<|turn>user\n" + users[i] + "<turn|>\n<|turn>model\n";
        if (i + 1 < users.size()) out += "Noted: " + words(12, 700 + static_cast<unsigned>(i)) + "<turn|>\n";
    }
    return out;
}

// Harmony's markup, as gpt-oss's template renders it (the system text as the developer message; an earlier answer
// keeps only its final channel).
std::string harmony_turns(const std::string& system, const std::vector<std::string>& users) {
    std::string out = "<|start|>developer<|message|># Instructions\n\n" + system + "<|end|>";
    for (size_t i = 0; i < users.size(); ++i) {
        out += "<|start|>user<|message|>" + users[i] + "<|end|><|start|>assistant";
        if (i + 1 < users.size()) {
            out += "<|channel|>final<|message|>Noted: " + words(12, 700 + static_cast<unsigned>(i)) + "<|end|>";
        }
    }
    return out;
}

// A sliding-window test model: its preset, its window and its chat markup. `all_experts`: a MoE preset with every
// expert used for every token. Top-k routing is not continuous: the float noise of KV computed in other batch splits
// (0.02 in a logit range of 3.7 on tiny-gpt-oss) once flipped an expert choice at the 16th generated token and moved
// that step's logits by 0.64, so the greedy tokens parted without a cold-run near tie. With every expert used the
// router only weighs them, and what is compared is the cache's KV, not the routing's sensitivity.
struct swa_model {
    const char* preset;
    int window;
    std::string (*turns)(const std::string& system, const std::vector<std::string>& users);
    bool all_experts = false;
};

const swa_model k_models[] = {{"tiny-swa", 512, gemma_turns}, {"tiny-gpt-oss", 128, harmony_turns, true}};

const swa_model* g_model = nullptr;  // the model of the running test (set by the fixture)
bool g_swa_full = false;             // ... and its SWA cache layout

int window() {
    return g_model->window;
}

std::string turns(const std::string& system, const std::vector<std::string>& users) {
    return g_model->turns(system, users);
}

std::string model_path() {
    if (!g_model->all_experts) return test_models::generated_model("unit-prompt-cache-swa", g_model->preset);
    const fs::path path = fs::path(KEEPWARM_TEST_MODELS_DIR) / "unit-prompt-cache-swa" /
                          (std::string(g_model->preset) + "-all-experts.gguf");
    if (!fs::exists(path)) {
        model_spec spec = preset_spec(g_model->preset);
        spec.preset += "-all-experts";
        spec.n_expert_used = spec.n_expert;
        spec.seed = 1;
        fs::create_directories(path.parent_path());
        build_model(spec, path.string());
    }
    return path.string();
}

engine_options base_options() {
    engine_options o;
    o.model_path = model_path();
    o.context_size = 8192;
    o.slots = 1;
    o.threads = 2;
    o.cache_block_tokens = 256;
    o.cache_parked_sequences = 2;
    // Conversations stay parked on the device while the next long prompt is computed (by default one of 1024
    // tokens or more moves idle ones to RAM, the path ram_and_disk_restores_equal_a_cold_run covers).
    o.idle_to_ram_tokens = 0;
    o.swa_full = g_swa_full;
    return o;
}

// What a branch from a cached conversation `common` tokens in reuses: all of it with a full-size SWA cache; with a
// windowed one, all up to the last checkpoint before it (checkpoints every `interval` tokens and at message starts).
void expect_branch_reuse(const result& r, int common, const engine& e) {
    if (g_swa_full) {
        EXPECT_EQ(r.stats.reused_tokens, common);
        return;
    }
    EXPECT_LE(r.stats.reused_tokens, common);
    EXPECT_GT(r.stats.reused_tokens, common - e.options().checkpoint_interval);
    EXPECT_EQ(r.stats.checkpoint_pos, r.stats.reused_tokens);
}

result cold(const tokens& prompt) {
    engine e(base_options());
    e.start();
    result r = generate(e, prompt);
    EXPECT_EQ(r.stats.reused_tokens, 0);
    return r;
}

tokens tokenize(engine& e, const std::string& text) {
    return common_tokenize(e.vocab(), text, true, true);
}

// A first turn several windows long, and the next turn: the first prompt, the answer, a new user message.
struct conversation {
    tokens first, next;
};

conversation long_conversation(engine& e, unsigned seed) {
    conversation c;
    c.first = tokenize(e, turns(words(1500, seed), {words(40, seed + 1)}));
    c.next = tokenize(e, turns(words(1500, seed), {words(40, seed + 1), words(30, seed + 2)}));
    return c;
}

// The tokens the next turn shares with the first prompt.
int shared(const conversation& c) {
    return static_cast<int>(std::mismatch(c.first.begin(), c.first.end(), c.next.begin(), c.next.end()).first -
                            c.first.begin());
}

class prompt_cache_swa : public ::testing::TestWithParam<std::tuple<swa_model, bool>> {
protected:
    void SetUp() override {
        g_model = &std::get<0>(GetParam());
        g_swa_full = std::get<1>(GetParam());
    }
    void TearDown() override { g_model = nullptr; }
};

}  // namespace

TEST_P(prompt_cache_swa, the_next_turn_reuses_the_whole_prefix_from_the_slot) {
    engine e(base_options());
    e.start();
    const conversation c = long_conversation(e, 1);
    ASSERT_GT(shared(c), 3 * window());
    const result expected = cold(c.next);
    generate(e, c.first);
    const result r = generate(e, c.next);
    EXPECT_EQ(r.stats.reused_tokens, shared(c));
    EXPECT_EQ(r.stats.computed_tokens, static_cast<int>(c.next.size()) - shared(c));
    expect_same_output(r, expected);
}

TEST_P(prompt_cache_swa, a_parked_conversation_comes_back_whole) {
    engine e(base_options());
    e.start();
    const conversation a = long_conversation(e, 11), b = long_conversation(e, 21);
    const result expected = cold(a.next);
    generate(e, a.first);
    generate(e, b.first);  // the only slot takes B: A is parked
    const result r = generate(e, a.next);
    EXPECT_EQ(r.stats.reused_device, shared(a))
        << "the parked sequence shares its cells; reused " << r.stats.reused_tokens << " (ram " << r.stats.reused_ram
        << ", disk " << r.stats.reused_disk << "), matched " << r.stats.matched_tokens << ", computed "
        << r.stats.computed_tokens;
    expect_same_output(r, expected);
}

// A branch from well inside a parked conversation: the positions in the window before the branch point must still
// be there, although they were outside the window of the conversation's own last token while it was parked.
TEST_P(prompt_cache_swa, a_branch_from_inside_a_parked_conversation_answers_as_a_cold_run) {
    engine e(base_options());
    e.start();
    const conversation a = long_conversation(e, 31), b = long_conversation(e, 41);
    // The first 900 words of A's 1500-word system prompt, then other text: a branch point about 750 tokens before
    // A's end.
    const tokens branch = tokenize(e, turns(words(900, 31) + "zebra " + words(40, 98), {words(25, 99)}));
    const int common = static_cast<int>(
        std::mismatch(a.first.begin(), a.first.end(), branch.begin(), branch.end()).first - a.first.begin());
    ASSERT_LT(common + window(), static_cast<int>(a.first.size()));
    ASSERT_GT(common, 2 * window());
    const result expected = cold(branch);
    generate(e, a.first);
    generate(e, b.first);  // A parked; B fills more cells of the one pool
    generate(e, b.next);
    const result r = generate(e, branch);
    expect_branch_reuse(r, common, e);
    expect_same_output(r, expected);
}

// An agent's usual branch: the same system prompt, then another user message, after a user message longer than the
// window. The positions before the branch are outside the window of the parked conversation's last token, so a
// windowed cache has them from the checkpoint taken at the message start (unless llama.cpp has not given those cells
// away yet): what is recomputed is the message markup the two prompts share past it (a few tokens), not up to a
// checkpoint interval. On gpt-oss the message start is <|start|>, which llama.cpp makes a user-defined token, not a
// control token: no checkpoint was taken there before it counted, and the branch reused nothing.
TEST_P(prompt_cache_swa, another_last_message_reuses_up_to_its_start) {
    engine e(base_options());
    e.start();
    const std::string system = words(400, 111);
    const tokens a = tokenize(e, turns(system, {words(1000, 112)}));
    const tokens b = tokenize(e, turns(words(300, 113), {words(20, 114)}));
    const tokens branch = tokenize(e, turns(system, {words(60, 115)}));
    const int common =
        static_cast<int>(std::mismatch(a.begin(), a.end(), branch.begin(), branch.end()).first - a.begin());
    ASSERT_GT(static_cast<int>(a.size()) - common, 2 * window());
    const result expected = cold(branch);
    generate(e, a);
    generate(e, b);  // A parked
    const result r = generate(e, branch);
    EXPECT_LE(r.stats.reused_tokens, common);
    EXPECT_GE(r.stats.reused_tokens, common - 4);
    EXPECT_EQ(r.stats.reused_device, r.stats.reused_tokens);
    expect_same_output(r, expected);
}

// Two slots at once, the second taking a long prefix from the first while it generates. llama_memory_seq_cp shares
// every cell of the range, so the second slot would also hold every SWA cell the first has left behind its window
// (llama.cpp gives such a cell to a new token only when one sequence holds it); the windowed SWA layers hold about a
// window per sequence, so on tiny-gpt-oss (128-token window) the next decode found no cell, with nothing idle to
// evict, and both requests failed. Now a sequence drops the cells it left behind at each checkpoint, and a slot that
// shares cells copies its window into cells of its own (prompt_cache::reseat_window).
TEST_P(prompt_cache_swa, a_slot_taking_a_prefix_from_a_generating_slot_leaves_it_room) {
    engine_options o = base_options();
    o.slots = 2;
    o.context_size = 8192;
    engine e(o);
    e.start();
    const tokens first = tokenize(e, turns(words(1400, 121), {words(20, 122)}));
    const tokens second = tokenize(e, turns(words(1400, 121), {words(60, 123)}));
    const int common =
        static_cast<int>(std::mismatch(first.begin(), first.end(), second.begin(), second.end()).first - first.begin());
    ASSERT_GT(common, 3 * window());
    const result expected = cold(second);
    auto answering = greedy_runs::greedy_request(e, first, 300);
    e.submit(answering);
    ASSERT_TRUE(answering->output.pop(120s).has_value());  // its first token: it is generating now
    const result r = generate(e, second);
    const result a = greedy_runs::wait_for(*answering);
    EXPECT_EQ(a.generated.size(), 300u);
    EXPECT_GT(r.stats.reused_tokens, common - e.options().checkpoint_interval);
    expect_same_output(r, expected);
}

// Blocks larger than the window: a block saved alone holds only its own last window of sliding-window KV.
TEST_P(prompt_cache_swa, ram_and_disk_restores_equal_a_cold_run) {
    const test_support::temp_dir dir("swa-disk");
    for (int block : {256, 1024}) {
        SCOPED_TRACE("block of " + std::to_string(block) + " tokens");
        engine_options o = base_options();
        o.cache_parked_sequences = 0;
        o.idle_to_ram_tokens = 1024;
        o.cache_block_tokens = block;
        o.cache_dir = (dir.path / std::to_string(block)).string();
        conversation a;
        result expected;
        {
            engine e(o);
            e.start();
            a = long_conversation(e, 51);
            const conversation b = long_conversation(e, 61);
            expected = cold(a.next);
            generate(e, a.first);
            generate(e, b.first);  // no parking: A goes to RAM
            const result r = generate(e, a.next);
            EXPECT_GE(r.stats.reused_ram, shared(a) / block * block - block);
            EXPECT_EQ(r.stats.reused_tokens, shared(a));
            expect_same_output(r, expected);
        }
        engine e(o);  // a restart: A's blocks and its tail come back from disk
        e.start();
        const result r = generate(e, a.next);
        EXPECT_GT(r.stats.reused_disk, 0);
        EXPECT_GE(r.stats.reused_tokens, shared(a) / block * block);
        expect_same_output(r, expected);
    }
}

// llama.cpp's sliding-window cache may give a new token a cell that holds, for one sequence only, a position outside
// that sequence's window (llama_kv_cache::find_slot), even in a full-size cache. A parked conversation's cells have
// one sequence, so a prompt computed while its cells lie after the cache's head could take its early positions'
// sliding-window KV: here X leaves the head at cell 0 when it is evicted, and D fills X's cells and goes on. The
// cache's guard sequence shares every cell, so A's stay whole and a branch from inside A reuses all it shares with A
// (before the guard it reused less, as swa_window_intact found the holes; before that check, it reused the holes
// and answered differently from a cold run: first logits off by 0.88 in a range of 3.9). A windowed cache has no
// guard and gives those cells away by design: the branch goes on from a checkpoint, with A's full-attention KV.
TEST_P(prompt_cache_swa, a_branch_from_a_parked_conversation_after_the_cache_head_passed_it) {
    engine_options o = base_options();
    o.cache_parked_sequences = 1;
    engine e(o);
    e.start();
    const tokens x = tokenize(e, turns(words(450, 71), {words(20, 72)}));
    const conversation a = long_conversation(e, 81);
    const tokens d = tokenize(e, turns(words(1200, 91), {words(20, 92)}));
    const tokens branch = tokenize(e, turns(words(900, 81) + "zebra " + words(40, 98), {words(25, 99)}));
    const int common = static_cast<int>(
        std::mismatch(a.first.begin(), a.first.end(), branch.begin(), branch.end()).first - a.first.begin());
    const result expected = cold(branch);
    generate(e, x);
    generate(e, a.first);  // X parked
    generate(e, d);        // X evicted to RAM (cells from 0 free), A parked, D computed from cell 0 on
    const result r = generate(e, branch);
    expect_branch_reuse(r, common, e);
    EXPECT_EQ(r.stats.reused_device, r.stats.reused_tokens);
    expect_same_output(r, expected);
}

// The same holes, then A evicted to RAM by the next conversation: the blocks whose sliding-window KV before their end
// has holes are not kept (before the check they were, and the branch restored from them answered differently).
TEST_P(prompt_cache_swa, a_conversation_demoted_after_the_cache_head_passed_it_keeps_only_whole_blocks) {
    engine_options o = base_options();
    o.cache_parked_sequences = 1;
    engine e(o);
    e.start();
    const tokens x = tokenize(e, turns(words(450, 71), {words(20, 72)}));
    const conversation a = long_conversation(e, 81);
    const tokens d = tokenize(e, turns(words(1200, 91), {words(20, 92)}));
    const tokens f = tokenize(e, turns(words(300, 93), {words(20, 94)}));
    const tokens branch = tokenize(e, turns(words(900, 81) + "zebra " + words(40, 98), {words(25, 99)}));
    const result expected = cold(branch);
    generate(e, x);
    generate(e, a.first);  // X parked
    generate(e, d);        // X to RAM, A parked, D's SWA KV takes A's early cells
    generate(e, f);        // D parked in A's place: A to RAM
    const result r = generate(e, branch);
    expect_same_output(r, expected);
}

INSTANTIATE_TEST_SUITE_P(models, prompt_cache_swa, ::testing::Combine(::testing::ValuesIn(k_models), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<swa_model, bool>>& info) {
                             std::string name = std::get<0>(info.param).preset;
                             std::replace(name.begin(), name.end(), '-', '_');
                             return name + (std::get<1>(info.param) ? "_swa_full" : "_windowed");
                         });

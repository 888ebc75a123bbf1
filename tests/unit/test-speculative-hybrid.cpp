// Speculative decoding on hybrid models (gated delta-net + attention: tiny-hybrid is Qwen3.5's shape, tiny-hybrid-moe
// Qwen3.5-MoE's): a draft's rejected tokens leave the recurrent state through the snapshots llama.cpp keeps per
// sequence (n_rs_seq, engine_options::rollback_tokens), so at temperature 0 the answer with drafts is the one without,
// rejected drafts, warm turns, parked conversations and two slots at once included (docs/speculative.md).
#include <gtest/gtest.h>

#include <cstring>
#include <utility>
#include <vector>

#include "common.h"
#include "engine/engine.h"
#include "generated-models.h"
#include "greedy-runs.h"

using namespace keepwarm;

namespace {

using tokens = std::vector<llama_token>;
using greedy_runs::chat_prompt;
using greedy_runs::next_turn;
using greedy_runs::other_prompt;
using greedy_runs::result;

engine_options base_options(const std::string& preset, int slots = 2) {
    engine_options o;
    o.model_path = test_models::generated_model("unit-speculative", preset);
    o.context_size = 4096;
    o.slots = slots;
    o.threads = 1;
    o.cache_block_tokens = 64;
    o.cache_parked_sequences = 2;
    o.whole_drafts = true;  // what is drafted must not depend on the host's speed (test-speculative.cpp)
    return o;
}

engine_options plain_options(const std::string& preset, int slots = 2) {
    engine_options o = base_options(preset, slots);
    o.spec_type = "none";
    return o;
}

tokens tokenize(engine& e, const std::string& text) {
    return common_tokenize(e.vocab(), text, true, true);
}

tokens tokenize_more(engine& e, const std::string& text) {
    return common_tokenize(e.vocab(), text, false, true);
}

// `conversation(engine, draft_max)` on a one-slot engine that never drafts (draft_max 0), then on one that drafts
// (-1: the server's bound): the answers without drafts, then with them.
template <typename Conversation>
std::pair<std::vector<result>, std::vector<result>> without_and_with_drafts(const std::string& preset,
                                                                            Conversation&& conversation) {
    engine plain(plain_options(preset, 1));
    plain.start();
    std::vector<result> expected = conversation(plain, 0);
    plain.stop();
    engine drafting(base_options(preset, 1));
    drafting.start();
    return {std::move(expected), conversation(drafting, -1)};
}

size_t first_difference(const result& a, const result& b) {
    const size_t n = std::min(a.logits.size(), b.logits.size());
    for (size_t i = 0; i < n; ++i) {
        if (std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * sizeof(float)) != 0) return i;
    }
    return n;
}

// A request of `tenant`: a tenant's finished answers join its drafting history, and its cached prefixes are its own.
std::shared_ptr<generation_request> request(engine& e, const tokens& prompt, int n, int draft_max,
                                            const std::string& tenant = {}) {
    auto r = greedy_runs::greedy_request(e, prompt, n, tenant);
    r->draft_max = draft_max;
    return r;
}

result run(engine& e, const tokens& prompt, int n, int draft_max = -1, const std::string& tenant = {}) {
    auto r = request(e, prompt, n, draft_max, tenant);
    e.submit(r);
    return greedy_runs::wait_for(*r);
}

// Answers that follow the prompt's sentence and part from it now and then (forced: the engine emits these tokens
// whatever the model says, and keeps the logits it computed for each position). The drafter proposes the prompt's
// sentence (and the tenant's earlier answers), so drafts are accepted up to each word changed here and the rest is
// rejected: what the model computes after that position shows whether the rejected rows left the recurrent state.
tokens parting_answer(engine& e, int variant) {
    const tokens t =
        tokenize(e, variant == 0 ? "the quick brown fox jumps over the lazy cat. the quick brown fox jumps "
                                   "over the lazy dog. the quick red fox jumps over the lazy dog. the "
                                   "slow brown fox jumps over the lazy dog. the quick brown fox walks."
                                 : "the quick brown fox jumps over the lazy dog. the quick brown cat jumps "
                                   "over the lazy dog. the quick red fox jumps under the lazy dog. the "
                                   "slow brown fox jumps over the lazy cat. the quick brown fox runs.");
    return tokens(t.begin() + 1, t.end());  // without the BOS the tokenizer added
}

std::shared_ptr<generation_request> forced_request(engine& e, const tokens& prompt, const tokens& answer, int draft_max,
                                                   const std::string& tenant = {}) {
    auto r = request(e, prompt, static_cast<int>(answer.size()), draft_max, tenant);
    r->forced_answer = answer;
    r->keep_logits = static_cast<int>(answer.size());
    return r;
}

result run_forced(engine& e, const tokens& prompt, const tokens& answer, int draft_max = -1,
                  const std::string& tenant = {}) {
    auto r = forced_request(e, prompt, answer, draft_max, tenant);
    e.submit(r);
    return greedy_runs::wait_for(*r);
}

// Drafts were verified, some accepted and some rejected (the recurrent state was rolled back), each accepted token
// saving a step, and none longer than the snapshots kept.
void expect_rolled_back_drafts(const result& r, int rollback_tokens) {
    EXPECT_GT(r.stats.draft_accepted, 0);
    EXPECT_GT(r.stats.draft_tokens, r.stats.draft_accepted);
    EXPECT_LE(r.stats.draft_tokens, rollback_tokens * r.stats.draft_steps);
    EXPECT_EQ(r.stats.decode_steps + r.stats.draft_accepted, r.stats.generated_tokens - 1);
}

class hybrid_speculative : public ::testing::TestWithParam<std::string> {};

// Cold and warm (the same prompt again, from the slot's own state at the prompt's checkpoint): the greedy answer is
// the one a server that never drafts gives, token for token; and the one the same server gives a request that does
// not draft, logits bit for bit (one thread; the same recurrent kernels, which keep snapshots either way).
TEST_P(hybrid_speculative, greedy_answers_are_the_same_with_and_without_drafts) {
    engine plain(plain_options(GetParam()));
    plain.start();
    const tokens prompt = tokenize(plain, chat_prompt);
    const result plain_cold = run(plain, prompt, 200, 0);
    const result plain_warm = run(plain, prompt, 200, 0);
    plain.stop();

    const engine_options o = base_options(GetParam());
    engine drafting(o);
    drafting.start();
    const result undrafted = run(drafting, prompt, 200, 0, "undrafted");  // not in the drafting tenant's history
    const result first = run(drafting, prompt, 200);
    const result again = run(drafting, prompt, 200);

    EXPECT_EQ(undrafted.stats.draft_tokens, 0);
    EXPECT_EQ(plain_cold.generated, undrafted.generated);
    EXPECT_EQ(plain_cold.generated, first.generated);
    EXPECT_EQ(plain_warm.generated, again.generated);
    EXPECT_EQ(first_difference(undrafted, first), undrafted.logits.size());
    EXPECT_EQ(first_difference(undrafted, again), undrafted.logits.size());
    EXPECT_EQ(first_difference(plain_cold, first), plain_cold.logits.size());
    EXPECT_EQ(first_difference(plain_warm, again), plain_warm.logits.size());
    for (const result* r : {&first, &again}) {
        EXPECT_GT(r->stats.draft_accepted, 0);
        EXPECT_LE(r->stats.draft_tokens, o.rollback_tokens * r->stats.draft_steps);
        EXPECT_EQ(r->stats.decode_steps + r->stats.draft_accepted, r->stats.generated_tokens - 1);
    }
    EXPECT_EQ(plain_cold.stats.draft_tokens, 0);
}

// A conversation goes on after a drafted turn, in its own slot (the recurrent state the last rollback left) and,
// with one slot, after another conversation took the slot (the first one parked, then copied back): each turn
// answers as on a server that never drafts.
TEST_P(hybrid_speculative, later_turns_after_drafted_ones_answer_as_without_drafts) {
    const auto conversation = [&](engine& e, int draft_max) {
        std::vector<result> answers;
        const tokens a1 = tokenize(e, chat_prompt);
        answers.push_back(run(e, a1, 90, draft_max));
        const tokens a2 = next_turn(e, a1, answers.back(), "again, the quick brown fox");
        answers.push_back(run(e, a2, 90, draft_max));
        answers.push_back(run(e, tokenize(e, other_prompt), 90, draft_max));  // takes the only slot
        const tokens a3 = next_turn(e, a2, answers[1], "and once more: the lazy dog");
        answers.push_back(run(e, a3, 90, draft_max));
        return answers;
    };
    const auto [expected, drafted] = without_and_with_drafts(GetParam(), conversation);
    ASSERT_EQ(drafted.size(), expected.size());
    int accepted = 0;
    for (size_t i = 0; i < expected.size(); ++i) {
        SCOPED_TRACE("turn " + std::to_string(i));
        EXPECT_EQ(drafted[i].generated, expected[i].generated);
        accepted += drafted[i].stats.draft_accepted;
    }
    EXPECT_GT(accepted, 0);
    // The last turn came from the parked copy (or the RAM tier), not from a cold prompt.
    EXPECT_GT(drafted.back().stats.reused_tokens, 0);
}

// Drafts that the answer parts from: the logits of every position are the ones computed without drafts, bit for bit,
// on a first turn and on a warm one (the prompt's checkpoint, another answer); and the ones of a server that keeps no
// snapshots (spec_type none: llama.cpp's recurrent kernels without them). Logits bit for bit on the dense-FFN model
// only: on the MoE the last bits of a few positions differ with drafts even in a run where none was rejected (the
// verifying rows go through the expert layers together), so there the answer is compared.
TEST_P(hybrid_speculative, rejected_drafts_leave_the_state_as_without_drafts) {
    const bool bit_for_bit = GetParam() == "tiny-hybrid";
    engine plain(plain_options(GetParam()));
    plain.start();
    const tokens prompt = tokenize(plain, chat_prompt);
    const tokens answers[] = {parting_answer(plain, 0), parting_answer(plain, 1)};
    const result plain_first = run_forced(plain, prompt, answers[0], 0);
    const result plain_again = run_forced(plain, prompt, answers[1], 0);
    plain.stop();

    const engine_options o = base_options(GetParam());
    engine drafting(o);
    drafting.start();
    // Without drafts, in a tenant of their own (the drafting tenant's history would hold these answers).
    const result undrafted[] = {run_forced(drafting, prompt, answers[0], 0, "undrafted"),
                                run_forced(drafting, prompt, answers[1], 0, "undrafted")};
    const result drafted[] = {run_forced(drafting, prompt, answers[0]), run_forced(drafting, prompt, answers[1])};
    for (int i = 0; i < 2; ++i) {
        SCOPED_TRACE("answer " + std::to_string(i));
        ASSERT_EQ(undrafted[i].logits.size(), answers[i].size());
        EXPECT_EQ(drafted[i].generated, answers[i]);
        expect_rolled_back_drafts(drafted[i], o.rollback_tokens);
        if (bit_for_bit) EXPECT_EQ(first_difference(undrafted[i], drafted[i]), undrafted[i].logits.size());
    }
    if (bit_for_bit) {
        EXPECT_EQ(first_difference(plain_first, drafted[0]), plain_first.logits.size());
        EXPECT_EQ(first_difference(plain_again, drafted[1]), plain_again.logits.size());
    }
}

// An answer that ends (end of generation) inside a draft leaves its rollback pending: llama.cpp applies it at the
// sequence's next decode. When another conversation takes the slot first, the cache parks this one, and the parked
// copy must hold the rolled-back state (prompt_cache::settle_rollback): the next turn goes on from it.
TEST_P(hybrid_speculative, a_conversation_parked_after_a_rejected_draft_goes_on_from_the_right_state) {
    const bool bit_for_bit = GetParam() == "tiny-hybrid";
    const auto conversation = [&](engine& e, int draft_max) {
        const tokens prompt = tokenize(e, chat_prompt);
        // The answer ends where the prompt's sentence goes on ("... jumps over the" | "lazy dog"), so the draft that
        // reaches its end proposes more, and the rows past the end are rejected.
        tokens answer =
            tokenize_more(e, "the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the");
        const size_t end = answer.size();
        answer.push_back(e.eog_tokens().front());
        const tokens after = tokenize_more(e, " lazy dog.");
        answer.insert(answer.end(), after.begin(), after.end());
        std::vector<result> out;
        auto first = forced_request(e, prompt, answer, draft_max);
        e.submit(first);
        out.push_back(greedy_runs::wait_for(*first));
        out.back().generated.resize(std::min(out.back().generated.size(), end));
        out.push_back(run(e, tokenize(e, other_prompt), 40, draft_max));  // takes the only slot: the first is parked
        result said = out.front();
        said.generated.assign(answer.begin(), answer.begin() + static_cast<std::ptrdiff_t>(end));
        out.push_back(run(e, next_turn(e, prompt, said, "and once more: the lazy dog"), 60, draft_max));
        return out;
    };
    const auto [expected, drafted] = without_and_with_drafts(GetParam(), conversation);
    ASSERT_EQ(drafted.size(), expected.size());
    EXPECT_GT(drafted[0].stats.draft_tokens, drafted[0].stats.draft_accepted);
    EXPECT_EQ(drafted[2].generated, expected[2].generated);
    if (bit_for_bit) EXPECT_EQ(first_difference(expected[2], drafted[2]), expected[2].logits.size());
    // From the parked copy: the first turn's prompt and answer were not computed again.
    EXPECT_GT(drafted[2].stats.reused_tokens, static_cast<int>(drafted[0].stats.prompt_tokens));
}

// Two slots verifying drafts in one step (one answer partly rejected, the other greedy): each as alone, undrafted.
TEST_P(hybrid_speculative, two_slots_drafting_at_once_give_each_its_own_answer) {
    const bool bit_for_bit = GetParam() == "tiny-hybrid";
    engine e(base_options(GetParam()));
    e.start();
    const tokens a = tokenize(e, chat_prompt);
    const tokens b = tokenize(e, other_prompt);
    const tokens answer = parting_answer(e, 0);
    const result a_alone = run_forced(e, a, answer, 0, "undrafted");
    const result b_alone = run(e, b, 120, 0, "undrafted");
    auto ra = forced_request(e, a, answer, -1);
    auto rb = request(e, b, 120, -1);
    e.submit(ra);
    e.submit(rb);
    const result a_drafted = greedy_runs::wait_for(*ra);
    const result b_drafted = greedy_runs::wait_for(*rb);
    EXPECT_EQ(a_drafted.generated, answer);
    EXPECT_EQ(b_drafted.generated, b_alone.generated);
    if (bit_for_bit) {
        EXPECT_EQ(first_difference(a_alone, a_drafted), a_alone.logits.size());
        EXPECT_EQ(first_difference(b_alone, b_drafted), b_alone.logits.size());
    }
    expect_rolled_back_drafts(a_drafted, 4);
    EXPECT_GT(b_drafted.stats.draft_accepted, 0);
}

INSTANTIATE_TEST_SUITE_P(presets, hybrid_speculative, ::testing::Values("tiny-hybrid", "tiny-hybrid-moe"),
                         [](const auto& info) { return info.param == "tiny-hybrid" ? "qwen35" : "qwen35moe"; });

// A forced answer that repeats the prompt: drafts come from the prompt and are accepted, capped at the snapshots
// kept (llama.cpp refuses to drop more tokens than that).
TEST(hybrid_speculative_limits, drafts_are_no_longer_than_the_snapshots_kept) {
    engine_options o = base_options("tiny-hybrid");
    o.rollback_tokens = 3;
    engine e(o);
    e.start();
    const tokens prompt = tokenize(e, chat_prompt);
    const tokens forced = tokenize(e, "the quick brown fox jumps over the lazy dog. the quick brown fox jumps over");
    auto r = request(e, prompt, 1000, -1);
    r->keep_logits = 0;
    r->forced_answer = tokens(forced.begin() + 1, forced.end());
    e.submit(r);
    const result out = greedy_runs::wait_for(*r);
    EXPECT_EQ(out.generated, r->forced_answer);
    EXPECT_GT(out.stats.draft_accepted, static_cast<int>(r->forced_answer.size()) / 2);
    EXPECT_LE(out.stats.draft_tokens, 3 * out.stats.draft_steps);
}

// No snapshots, no drafts: the hybrid answers as before.
TEST(hybrid_speculative_limits, no_rollback_tokens_no_drafts) {
    engine_options o = base_options("tiny-hybrid");
    o.rollback_tokens = 0;
    engine e(o);
    e.start();
    EXPECT_EQ(run(e, tokenize(e, chat_prompt), 60).stats.draft_tokens, 0);
}

}  // namespace

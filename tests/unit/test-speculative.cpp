// Speculative decoding in the engine (docs/speculative.md): a draft is verified with the request's own sampler and
// accepted up to the first token the sampler did not pick, so the answer is the one decoding without drafts gives.
// On one thread the logits are the same bit for bit; on several, ggml's CPU attention sums a lone row's KV in
// per-thread chunks once it spans 512 cells, and a verifying step of several rows does not (the last test). Hybrid
// models: test-speculative-hybrid.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "common.h"
#include "engine/draft-control.h"
#include "engine/engine.h"
#include "generated-models.h"
#include "greedy-runs.h"

using namespace keepwarm;
using namespace std::chrono_literals;

namespace {

using tokens = std::vector<llama_token>;
using greedy_runs::chat_prompt;
using greedy_runs::result;

engine_options base_options(const std::string& model, int threads = 1) {
    engine_options o;
    o.model_path = model;
    o.context_size = 4096;
    o.slots = 2;
    o.threads = threads;
    o.cache_block_tokens = 64;
    o.cache_parked_sequences = 2;
    // Drafts verified whole: these tests check what drafting does, and a draft sized by the costs measured on a busy
    // host may be none (the forced answer's drafts went from 7 accepted to 4 beside a parallel test).
    o.whole_drafts = true;
    return o;
}

std::string dense_model() {
    return test_models::generated_model("unit-speculative", "tiny");
}

tokens tokenize(engine& e, const std::string& text) {
    return common_tokenize(e.vocab(), text, true, true);
}

// The first generated position whose logits are not the same bit for bit (the number kept: none).
size_t first_difference(const result& a, const result& b) {
    const size_t n = std::min(a.logits.size(), b.logits.size());
    for (size_t i = 0; i < n; ++i) {
        if (std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * sizeof(float)) != 0) return i;
    }
    return n;
}

std::shared_ptr<generation_request> request(engine& e, const tokens& prompt, int n, int draft_max) {
    auto r = greedy_runs::greedy_request(e, prompt, n);
    r->draft_max = draft_max;
    return r;
}

result run(engine& e, const tokens& prompt, int n, int draft_max) {
    auto r = request(e, prompt, n, draft_max);
    e.submit(r);
    return greedy_runs::wait_for(*r);
}

TEST(speculative, greedy_answers_are_bit_for_bit_the_same_with_and_without_drafts) {
    const engine_options o = base_options(dense_model());
    engine plain(o);
    plain.start();
    const tokens prompt = tokenize(plain, chat_prompt);
    // 300 tokens: the KV passes 256 cells, so attention spans 512 (llama.cpp pads the span it attends over).
    const result plain_cold = run(plain, prompt, 300, 0);
    const result plain_warm = run(plain, prompt, 300, 0);
    plain.stop();
    engine drafting(o);
    drafting.start();
    const result cold = run(drafting, prompt, 300, -1);
    // The same prompt again: a warm turn, and the first answer is in the tenant's history now.
    const result warm = run(drafting, prompt, 300, -1);

    EXPECT_EQ(plain_cold.stats.draft_tokens, 0);
    EXPECT_EQ(first_difference(plain_cold, cold), plain_cold.logits.size());
    EXPECT_EQ(plain_cold.generated, cold.generated);
    EXPECT_EQ(first_difference(plain_warm, warm), plain_warm.logits.size());
    EXPECT_EQ(plain_warm.generated, warm.generated);
    // Drafts were verified and most were right (the answer repeats itself), and each accepted token saved a step.
    for (const result* r : {&cold, &warm}) {
        EXPECT_GT(r->stats.draft_tokens, 0);
        EXPECT_GT(r->stats.draft_accepted, r->stats.draft_tokens / 2);
        EXPECT_EQ(r->stats.decode_steps + r->stats.draft_accepted, r->stats.generated_tokens - 1);
    }
    EXPECT_EQ(plain_cold.stats.decode_steps, plain_cold.stats.generated_tokens - 1);
    const auto& by_request = drafting.counters().drafts[static_cast<size_t>(draft_source::request)];
    const auto& by_history = drafting.counters().drafts[static_cast<size_t>(draft_source::history)];
    EXPECT_EQ(by_request.accepted + by_history.accepted,
              static_cast<uint64_t>(cold.stats.draft_accepted + warm.stats.draft_accepted));
}

TEST(speculative, two_slots_drafting_at_once_give_each_its_own_answer) {
    const engine_options o = base_options(dense_model());
    engine e(o);
    e.start();
    const tokens a = tokenize(e, chat_prompt);
    const tokens b =
        tokenize(e, "<|im_start|>user\nSay something else entirely, twice.<|im_end|>\n<|im_start|>assistant\n");
    const result a_alone = run(e, a, 120, 0);
    const result b_alone = run(e, b, 120, 0);
    auto ra = request(e, a, 120, -1);
    auto rb = request(e, b, 120, -1);
    e.submit(ra);
    e.submit(rb);
    const result a_drafted = greedy_runs::wait_for(*ra);
    const result b_drafted = greedy_runs::wait_for(*rb);
    EXPECT_EQ(a_drafted.generated, a_alone.generated);
    EXPECT_EQ(b_drafted.generated, b_alone.generated);
    EXPECT_GT(a_drafted.stats.draft_accepted + b_drafted.stats.draft_accepted, 0);
}

// One request drafting beside one that does not: each answers as it does alone without drafts.
TEST(speculative, a_drafting_request_beside_one_without_answers_as_alone) {
    const engine_options o = base_options(dense_model());
    engine e(o);
    e.start();
    const tokens a = tokenize(e, chat_prompt);
    const tokens b = tokenize(
        e,
        "<|im_start|>user\nalpha beta gamma delta alpha beta gamma delta alpha beta gamma delta alpha beta gamma "
        "delta<|im_end|>\n<|im_start|>assistant\n");
    run(e, a, 120, 0);
    run(e, b, 120, 0);
    const result a_alone = run(e, a, 120, 0);
    const result b_alone = run(e, b, 120, 0);
    auto ra = request(e, a, 120, 0);
    auto rb = request(e, b, 120, -1);
    e.submit(ra);
    e.submit(rb);
    const result a_beside = greedy_runs::wait_for(*ra);
    const result b_drafted = greedy_runs::wait_for(*rb);
    EXPECT_EQ(first_difference(a_alone, a_beside), a_alone.logits.size());
    EXPECT_EQ(first_difference(b_alone, b_drafted), b_alone.logits.size());
    EXPECT_EQ(a_beside.generated, a_alone.generated);
    EXPECT_EQ(b_drafted.generated, b_alone.generated);
    EXPECT_GT(b_drafted.stats.draft_tokens, 0);
}

// With sampling, each position is sampled once with the request's sampler whether its token was drafted or not, so a
// seeded answer is the same token for token: drafts change how many steps it takes, never what it says.
TEST(speculative, sampled_answers_follow_the_same_draws_with_and_without_drafts) {
    engine e(base_options(dense_model()));
    e.start();
    const tokens prompt = tokenize(e, chat_prompt);
    const auto sampled = [&](int draft_max) {
        auto r = request(e, prompt, 160, draft_max);
        r->sampling.temp = 0.8f;
        r->sampling.top_k = 40;
        r->sampling.seed = 1234;
        e.submit(r);
        return greedy_runs::wait_for(*r);
    };
    const result plain = sampled(0);
    const result drafted = sampled(-1);
    EXPECT_EQ(plain.generated, drafted.generated);
    EXPECT_GT(drafted.stats.draft_tokens, 0);
}

// A grammar constrains every verified position as it constrains decoding: the drafted answer is the grammar's too.
TEST(speculative, grammar_constrains_drafted_positions) {
    engine e(base_options(dense_model()));
    e.start();
    const tokens prompt = tokenize(e, chat_prompt);
    const auto constrained = [&](int draft_max) {
        auto r = request(e, prompt, 60, draft_max);
        r->sampling.logit_bias.clear();
        r->sampling.grammar = common_grammar(COMMON_GRAMMAR_TYPE_USER, R"(root ::= ("ab " | "abc ")+ "end")");
        e.submit(r);
        return greedy_runs::wait_for(*r);
    };
    const result plain = constrained(0);
    const result drafted = constrained(-1);
    EXPECT_EQ(plain.generated, drafted.generated);
    std::string text;
    for (const llama_token t : drafted.generated) text += common_token_to_piece(e.vocab(), t, false);
    EXPECT_EQ(text.rfind("ab", 0), 0u) << text;
}

// The bench's teacher forcing: the forced answer comes back verbatim, and drafts of it are verified against it.
TEST(speculative, forced_answer_is_emitted_and_drafted_from_the_prompt) {
    engine e(base_options(dense_model()));
    e.start();
    const tokens prompt = tokenize(e, chat_prompt);
    const tokens forced = tokenize(e, "the quick brown fox jumps over the lazy dog. the quick brown fox jumps over");
    auto r = request(e, prompt, 1000, -1);
    r->keep_logits = 0;
    r->forced_answer = tokens(forced.begin() + 1, forced.end());  // without the BOS the tokenizer added
    e.submit(r);
    const result out = greedy_runs::wait_for(*r);
    EXPECT_EQ(out.generated, r->forced_answer);
    EXPECT_GT(out.stats.draft_accepted, static_cast<int>(r->forced_answer.size()) / 2);
}

TEST(speculative, a_request_or_the_server_can_turn_drafting_off) {
    engine_options o = base_options(dense_model());
    o.spec_type = "none";
    engine off(o);
    off.start();
    const tokens prompt = tokenize(off, chat_prompt);
    EXPECT_EQ(run(off, prompt, 80, -1).stats.draft_tokens, 0);
    off.stop();
    engine on(base_options(dense_model()));
    on.start();
    EXPECT_EQ(run(on, prompt, 80, 0).stats.draft_tokens, 0);
    const result limited = run(on, prompt, 80, 2);
    EXPECT_GT(limited.stats.draft_tokens, 0);
    EXPECT_LE(limited.stats.draft_tokens, 2 * limited.stats.draft_steps);
}

// llama.cpp's n-gram drafters, driven through common: ngram-simple drafts the 48 tokens after an earlier occurrence
// of the last 12, so an answer that repeats a long sentence (forced here) is drafted from its first round.
TEST(speculative, llama_cpp_ngram_types_draft_through_common) {
    engine_options o = base_options(dense_model());
    o.spec_type = "ngram-simple";
    engine e(o);
    e.start();
    const tokens prompt = tokenize(e, chat_prompt);
    std::string sentence;
    for (int i = 0; i < 6; ++i) sentence += "the quick brown fox jumps over the lazy dog, and then it runs away. ";
    const tokens text = tokenize(e, sentence);
    auto r = request(e, prompt, 1000, -1);
    r->keep_logits = 0;
    r->forced_answer = tokens(text.begin() + 1, text.end());
    e.submit(r);
    const result out = greedy_runs::wait_for(*r);
    EXPECT_EQ(out.generated, r->forced_answer);
    EXPECT_GT(out.stats.draft_accepted, 0);
    EXPECT_EQ(e.counters().drafts[static_cast<size_t>(draft_source::llama)].accepted.load(),
              static_cast<uint64_t>(out.stats.draft_accepted));
}

TEST(speculative, unknown_spec_type_is_refused_with_the_known_ones) {
    engine_options o = base_options(dense_model());
    o.spec_type = "ngram-typo";
    try {
        engine e(o);
        FAIL() << "accepted";
    } catch (const std::invalid_argument& err) {
        EXPECT_NE(std::string(err.what()).find("ngram-mod"), std::string::npos) << err.what();
    }
}

// Several threads: a lone row's attention over 512 cells or more takes ggml's split-KV path (per-thread chunks,
// then a reduction), a verifying step of several rows does not. The two differ in their last bits from the first
// position that path is taken, and only from there (docs/speculative.md).
TEST(speculative, several_threads_part_only_where_attention_takes_the_split_path) {
    const engine_options o = base_options(dense_model(), 2);
    engine plain(o);
    plain.start();
    const tokens prompt = tokenize(plain, chat_prompt);
    const result p = run(plain, prompt, 300, 0);
    plain.stop();
    engine drafting(o);
    drafting.start();
    const result d = run(drafting, prompt, 300, -1);
    ASSERT_GT(d.stats.draft_tokens, 0);
    // Under 256 cells attention spans 256 and the paths agree bit for bit.
    EXPECT_GE(prompt.size() + first_difference(p, d), 256u);
}

TEST(draft_control, drafts_only_where_the_expected_tokens_pay_for_the_rows) {
    // Right half the time, rows cheap: a few tokens; rows as dear as a step: none.
    EXPECT_GT(draft_control::best_length(0.5, 10, 0.5, 16), 0u);
    EXPECT_EQ(draft_control::best_length(0.5, 10, 10, 16), 0u);
    // Almost always right: as long as allowed; never right: none.
    EXPECT_EQ(draft_control::best_length(0.99, 10, 0.2, 16), 16u);
    EXPECT_EQ(draft_control::best_length(0.0, 10, 0.01, 16), 0u);
    EXPECT_EQ(draft_control::best_length(0.9, 0, 0.1, 16), 0u);  // a step's cost not measured yet
    EXPECT_EQ(draft_control::best_length(0.9, 10, 0.1, 0), 0u);
}

TEST(draft_control, acceptance_follows_recent_drafts) {
    draft_control c;
    EXPECT_DOUBLE_EQ(c.acceptance(), 0.5);
    for (int i = 0; i < 40; ++i) c.record(8, 0);
    EXPECT_LT(c.acceptance(), 0.1);
    for (int i = 0; i < 40; ++i) c.record(8, 8);
    EXPECT_GT(c.acceptance(), 0.9);
    c.record(0, 0);  // nothing drafted: nothing learnt
    EXPECT_GT(c.acceptance(), 0.9);
}

}  // namespace

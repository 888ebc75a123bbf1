// Speculative decoding with a draft model (serve -md; engine/draft-model.h): drafts from a second model, through
// llama.cpp's common, verified by the target as every draft is, so that the answer is the one decoding without them
// gives. The test draft models: tiny-draft (random weights of its own, the tiny preset's tokenizer: it agrees with the
// target only by chance) and the target itself (it agrees almost always: the mechanism's ceiling).
#include <gtest/gtest.h>

#include <cstring>

#include "common.h"
#include "engine/engine.h"
#include "generated-models.h"
#include "greedy-runs.h"

using namespace keepwarm;

namespace {

using tokens = std::vector<llama_token>;
using greedy_runs::result;

std::string target_model() {
    return test_models::generated_model("unit-draft-model", "tiny");
}
std::string random_draft_model() {
    return test_models::generated_model("unit-draft-model", "tiny-draft");
}

// One thread: a verifying step's rows and a lone row then give the same logits bit for bit (test-speculative).
engine_options base_options() {
    engine_options o;
    o.model_path = target_model();
    o.context_size = 4096;
    o.slots = 2;
    o.threads = 1;
    o.cache_block_tokens = 64;
    o.cache_parked_sequences = 2;
    return o;
}

// Drafting with `draft` as the draft model; `whole`: every proposal verified whole (what a draft costs aside), so
// that drafts are verified even where they do not pay.
engine_options with_draft_model(const std::string& draft, bool whole) {
    engine_options o = base_options();
    o.spec_type = "draft-simple";
    o.draft_model.path = draft;
    o.whole_drafts = whole;
    return o;
}

const std::string chat_prompt =
    "<|im_start|>user\nRepeat: the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the lazy "
    "dog. the quick brown fox<|im_end|>\n<|im_start|>assistant\n";

tokens tokenize(engine& e, const std::string& text) {
    return common_tokenize(e.vocab(), text, true, true);
}

std::shared_ptr<generation_request> request(engine& e, const tokens& prompt, int n, int draft_max) {
    auto r = greedy_runs::greedy_request(e, prompt, n);
    r->draft_max = draft_max;
    return r;
}

result run(engine& e, const tokens& prompt, int n, int draft_max = -1) {
    auto r = request(e, prompt, n, draft_max);
    e.submit(r);
    return greedy_runs::wait_for(*r);
}

size_t first_difference(const result& a, const result& b) {
    const size_t n = std::min(a.logits.size(), b.logits.size());
    for (size_t i = 0; i < n; ++i) {
        if (std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * sizeof(float)) != 0) return i;
    }
    return n;
}

constexpr uint64_t prompt_size_floor = 30;  // chat_prompt is longer than this in tokens

const engine_counters::draft_counts& model_drafts(const engine& e) {
    return e.counters().drafts[static_cast<size_t>(draft_source::draft_model)];
}

// The answer without drafting, for comparison.
result plain_answer(const std::string& text, int n) {
    engine_options o = base_options();
    o.spec_type = "none";
    engine plain(o);
    plain.start();
    return run(plain, tokenize(plain, text), n, 0);
}

TEST(draft_model, greedy_answers_are_bit_for_bit_the_same_with_a_random_draft_model) {
    const result plain = plain_answer(chat_prompt, 200);
    engine e(with_draft_model(random_draft_model(), true));
    e.start();
    const tokens prompt = tokenize(e, chat_prompt);
    const result drafted = run(e, prompt, 200);
    EXPECT_EQ(drafted.generated, plain.generated);
    EXPECT_EQ(first_difference(plain, drafted), plain.logits.size());
    // Drafts were verified, counted under the draft model. (Random models of this kind mostly repeat their input's
    // last tokens, so even a random draft model is often right on a prompt that loops.)
    EXPECT_GT(drafted.stats.draft_steps, 0);
    EXPECT_EQ(model_drafts(e).tokens.load(), static_cast<uint64_t>(drafted.stats.draft_tokens));
    EXPECT_EQ(model_drafts(e).accepted.load(), static_cast<uint64_t>(drafted.stats.draft_accepted));
    EXPECT_EQ(drafted.stats.decode_steps + drafted.stats.draft_accepted, drafted.stats.generated_tokens - 1);
    // The request's own switch.
    EXPECT_EQ(run(e, prompt, 40, 0).stats.draft_tokens, 0);
}

// The target as its own draft model drafts what the target will say: nearly every draft token is accepted, and the
// answer is still the target's.
TEST(draft_model, the_target_as_its_own_draft_model_is_almost_always_right) {
    const result plain = plain_answer(chat_prompt, 200);
    engine e(with_draft_model(target_model(), true));
    e.start();
    const result drafted = run(e, tokenize(e, chat_prompt), 200);
    EXPECT_EQ(drafted.generated, plain.generated);
    EXPECT_EQ(first_difference(plain, drafted), plain.logits.size());
    EXPECT_GT(drafted.stats.draft_accepted, drafted.stats.draft_tokens * 8 / 10);
    EXPECT_LT(drafted.stats.decode_steps, drafted.stats.generated_tokens / 4);
}

// With sampling, each position is sampled once with the request's sampler whether a draft model drafted it or not.
TEST(draft_model, sampled_answers_follow_the_same_draws_with_and_without_a_draft_model) {
    engine e(with_draft_model(random_draft_model(), true));
    e.start();
    const tokens prompt = tokenize(e, chat_prompt);
    const auto sampled = [&](int draft_max) {
        auto r = request(e, prompt, 120, draft_max);
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

// Sized by what drafts cost and how often they are right, drafting stops where the draft model is never right (here
// the answer is sampled at temperature 1.5 from the whole vocabulary: noise no drafter guesses); it is probed now and
// then, in shadow drafts that are never verified.
TEST(draft_model, drafting_stops_where_a_draft_model_does_not_pay) {
    engine e(with_draft_model(random_draft_model(), false));
    e.start();
    auto r = request(e, tokenize(e, chat_prompt), 300, -1);
    r->keep_logits = 0;
    r->sampling.temp = 1.5f;
    r->sampling.top_k = 0;
    r->sampling.seed = 7;
    e.submit(r);
    const result noise = greedy_runs::wait_for(*r);
    EXPECT_EQ(noise.generated.size(), 300u);
    EXPECT_LE(noise.stats.draft_steps, 10)
        << noise.stats.draft_tokens << " tokens drafted, " << noise.stats.draft_accepted << " accepted";
    // The draft model did run: it computed the prompt and was probed, now and then. (Asked for a draft every step,
    // it would have drafted 16 tokens a step, 4,800 in all.)
    EXPECT_GT(e.counters().draft_model_computed.load(), prompt_size_floor);
    EXPECT_GT(e.counters().draft_model_drafted.load(), 0u);
    EXPECT_LT(e.counters().draft_model_drafted.load(), 300u);
}

TEST(draft_model, two_slots_draft_with_one_draft_model_at_once) {
    const std::string other =
        "<|im_start|>user\nalpha beta gamma delta alpha beta gamma delta alpha beta gamma delta<|im_end|>\n"
        "<|im_start|>assistant\n";
    const result a_alone = plain_answer(chat_prompt, 120);
    const result b_alone = plain_answer(other, 120);
    engine e(with_draft_model(target_model(), true));
    e.start();
    auto ra = request(e, tokenize(e, chat_prompt), 120, -1);
    auto rb = request(e, tokenize(e, other), 120, -1);
    e.submit(ra);
    e.submit(rb);
    const result a = greedy_runs::wait_for(*ra);
    const result b = greedy_runs::wait_for(*rb);
    EXPECT_EQ(a.generated, a_alone.generated);
    EXPECT_EQ(b.generated, b_alone.generated);
    EXPECT_GT(a.stats.draft_accepted, a.stats.draft_tokens / 2);
    EXPECT_GT(b.stats.draft_accepted, b.stats.draft_tokens / 2);
}

// A conversation's next turn finds its earlier turn in the draft context too: only the new tokens are computed there.
TEST(draft_model, a_warm_turn_reuses_the_draft_models_kv) {
    engine e(with_draft_model(target_model(), true));
    e.start();
    const tokens first = tokenize(e, chat_prompt);
    const result answer = run(e, first, 60);
    tokens second = first;
    second.insert(second.end(), answer.generated.begin(), answer.generated.end());
    const tokens more = tokenize(e, "<|im_end|>\n<|im_start|>user\nAgain, please.<|im_end|>\n<|im_start|>assistant\n");
    second.insert(second.end(), more.begin() + 1, more.end());  // without the BOS
    const uint64_t reused = e.counters().draft_model_reused, computed = e.counters().draft_model_computed;
    run(e, second, 20);
    EXPECT_GE(e.counters().draft_model_reused - reused, first.size());
    EXPECT_LT(e.counters().draft_model_computed - computed, second.size() - first.size() + 20);
}

TEST(draft_model, a_draft_model_with_another_tokenizer_is_refused) {
    // tiny-swa has Gemma 4's tokenizer; tiny has Qwen's.
    try {
        engine e(with_draft_model(test_models::generated_model("unit-draft-model", "tiny-swa"), false));
        FAIL() << "accepted";
    } catch (const std::runtime_error& err) {
        EXPECT_NE(std::string(err.what()).find("tokenizer"), std::string::npos) << err.what();
    }
}

TEST(draft_model, spec_type_and_draft_model_go_together) {
    engine_options o = base_options();
    o.spec_type = "draft-simple";
    EXPECT_THROW(engine{o}, std::invalid_argument);
    o = with_draft_model(random_draft_model(), false);
    o.spec_type = "ngram-mod";
    EXPECT_THROW(engine{o}, std::invalid_argument);
    o.spec_type = "none";  // drafting off: the draft model is not loaded
    engine off(o);
    off.start();
    EXPECT_EQ(run(off, tokenize(off, chat_prompt), 20).stats.draft_tokens, 0);
}

}  // namespace

// Speculative decoding with the model's own multi-token prediction heads (--spec-type draft-mtp: Qwen3.5's nextn
// layer, tiny-hybrid-mtp here): the MTP context is fed every batch the model decodes, drafts from the head are
// verified by the model, and at temperature 0 the answers are the ones without drafts: one slot, two at once, and a
// later turn of the same conversation after rejected drafts. A model without the heads is refused at start.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
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

engine_options options(const std::string& spec_type, int slots, const std::string& preset = "tiny-hybrid-mtp") {
    engine_options o;
    o.model_path = test_models::generated_model("unit-speculative-mtp", preset);
    o.context_size = 4096;
    o.slots = slots;
    o.threads = 1;
    o.cache_block_tokens = 64;
    o.cache_parked_sequences = 2;
    o.spec_type = spec_type;
    o.whole_drafts = true;  // what is drafted must not depend on the host's speed (test-speculative.cpp)
    return o;
}

tokens tokenize(engine& e, const std::string& text) {
    return common_tokenize(e.vocab(), text, true, true);
}

constexpr int answer_tokens = 40;

uint64_t mtp_drafted(const engine& e) {
    return e.counters().drafts[static_cast<size_t>(draft_source::mtp)].tokens.load();
}

TEST(SpeculativeMtp, OneSlotAnswersAsWithoutDrafts) {
    engine plain(options("none", 1));
    plain.start();
    const result expected = greedy_runs::generate(plain, tokenize(plain, chat_prompt), answer_tokens);
    plain.stop();

    engine drafting(options("draft-mtp", 1));
    drafting.start();
    const result actual = greedy_runs::generate(drafting, tokenize(drafting, chat_prompt), answer_tokens);
    EXPECT_EQ(actual.generated, expected.generated);
    EXPECT_GT(actual.stats.draft_tokens, 0) << "the MTP head proposed no draft the model verified";
    EXPECT_GT(mtp_drafted(drafting), 0u);
    // Random weights: the head agrees with the model only by chance, so drafts were rejected too.
    EXPECT_LT(actual.stats.draft_accepted, actual.stats.draft_tokens);
}

TEST(SpeculativeMtp, TwoSlotsAtOnceAnswerAsWithoutDrafts) {
    engine plain(options("none", 2));
    plain.start();
    const result expected_a = greedy_runs::generate(plain, tokenize(plain, chat_prompt), answer_tokens);
    const result expected_b = greedy_runs::generate(plain, tokenize(plain, other_prompt), answer_tokens);
    plain.stop();

    engine drafting(options("draft-mtp", 2));
    drafting.start();
    auto a = greedy_runs::greedy_request(drafting, tokenize(drafting, chat_prompt), answer_tokens);
    auto b = greedy_runs::greedy_request(drafting, tokenize(drafting, other_prompt), answer_tokens);
    drafting.submit(a);
    drafting.submit(b);
    const result actual_a = greedy_runs::wait_for(*a);
    const result actual_b = greedy_runs::wait_for(*b);
    EXPECT_EQ(actual_a.generated, expected_a.generated);
    EXPECT_EQ(actual_b.generated, expected_b.generated);
    EXPECT_GT(actual_a.stats.draft_tokens + actual_b.stats.draft_tokens, 0);
}

// The second turn's prompt holds the first turn's answer, whose rejected draft rows the MTP context dropped; the
// prefix cache restores the conversation's KV, and the answers stay the ones without drafts.
TEST(SpeculativeMtp, LaterTurnAfterRejectedDraftsAnswersAsWithoutDrafts) {
    const auto conversation = [](engine& e) {
        const tokens first = tokenize(e, chat_prompt);
        const result one = greedy_runs::generate(e, first, answer_tokens);
        const result two = greedy_runs::generate(e, next_turn(e, first, one, "and once more"), answer_tokens);
        return std::vector<result>{one, two};
    };
    engine plain(options("none", 1));
    plain.start();
    const std::vector<result> expected = conversation(plain);
    plain.stop();

    engine drafting(options("draft-mtp", 1));
    drafting.start();
    const std::vector<result> actual = conversation(drafting);
    ASSERT_EQ(actual.size(), 2u);
    EXPECT_EQ(actual[0].generated, expected[0].generated);
    EXPECT_EQ(actual[1].generated, expected[1].generated);
    EXPECT_LT(actual[0].stats.draft_accepted, actual[0].stats.draft_tokens) << "no draft was rejected";
    EXPECT_GT(actual[1].stats.draft_tokens, 0);
}

TEST(SpeculativeMtp, ModelWithoutHeadsIsRefusedNamingTheFlag) {
    try {
        engine e(options("draft-mtp", 1, "tiny-hybrid"));
        FAIL() << "a model without MTP heads was accepted";
    } catch (const std::invalid_argument& error) {
        EXPECT_NE(std::string(error.what()).find("--spec-type draft-mtp"), std::string::npos) << error.what();
        EXPECT_NE(std::string(error.what()).find("nextn_predict_layers"), std::string::npos) << error.what();
    }
}

}  // namespace

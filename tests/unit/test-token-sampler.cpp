// token_sampler against common_sampler, token for token: a lazy grammar whose trigger words keepwarm watches must
// trigger where llama.cpp's own search would (a word split over tokens, one that starts inside a token, one after a
// long text, none inside a thinking block), and sample the same tokens before and after.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common.h"
#include "engine/llama-runtime.h"
#include "engine/token-sampler.h"
#include "generated-models.h"
#include "llama-cpp.h"
#include "sampling.h"

using namespace keepwarm;

namespace {

class token_sampler_test : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        init_llama_runtime();
        model.reset(llama_model_load_from_file(test_models::generated_model("unit-token-sampler").c_str(),
                                               llama_model_default_params()));
        ASSERT_TRUE(model);
        llama_context_params cparams = llama_context_default_params();
        cparams.n_ctx = 256;
        cparams.n_threads = 1;
        ctx.reset(llama_init_from_model(model.get(), cparams));
        ASSERT_TRUE(ctx);
        // One decoded token: its logits are what every sample below draws from.
        llama_token first = llama_vocab_bos(vocab());
        if (first == LLAMA_TOKEN_NULL) first = 0;
        llama_batch batch = llama_batch_get_one(&first, 1);
        ASSERT_EQ(llama_decode(ctx.get(), batch), 0);
    }
    static void TearDownTestSuite() {
        ctx.reset();
        model.reset();
    }
    static const llama_vocab* vocab() { return llama_model_get_vocab(model.get()); }

    static std::vector<llama_token> tokens(const std::string& text) {
        return common_tokenize(vocab(), text, false, true);
    }
    static std::string text_of(const std::vector<llama_token>& ids) {
        std::string out;
        for (const llama_token t : ids) out += common_token_to_piece(vocab(), t, true);
        return out;
    }

    // A tool-call-like lazy grammar: after "CALL:", six digits.
    static common_params_sampling lazy_digits() {
        common_params_sampling p;
        p.seed = 42;
        p.grammar =
            common_grammar(COMMON_GRAMMAR_TYPE_TOOL_CALLS, R"(root ::= "CALL:" [0-9] [0-9] [0-9] [0-9] [0-9] [0-9])");
        p.grammar_lazy = true;
        common_grammar_trigger word;
        word.type = COMMON_GRAMMAR_TRIGGER_TYPE_WORD;
        word.value = "CALL:";
        p.grammar_triggers.push_back(word);
        return p;
    }

    // Both samplers accept `forced`, then sample and accept `n` tokens each; what they sampled must agree.
    struct side_by_side {
        common_params_sampling params;  // common_sampler_init takes it by reference
        common_sampler_ptr reference;
        token_sampler ours;
        explicit side_by_side(const common_params_sampling& p)
            : params(p), reference(common_sampler_init(model.get(), params)), ours(model.get(), p) {}
        void force(const std::vector<llama_token>& forced) {
            for (const llama_token t : forced) {
                common_sampler_accept(reference.get(), t, true);
                ours.accept(t);
            }
        }
        std::vector<llama_token> sample(int n) {
            std::vector<llama_token> out;
            for (int i = 0; i < n; ++i) {
                const llama_token expected = common_sampler_sample(reference.get(), ctx.get(), 0);
                const llama_token got = ours.sample(ctx.get(), 0);
                EXPECT_EQ(got, expected) << "sample " << i;
                common_sampler_accept(reference.get(), expected, true);
                ours.accept(got);
                out.push_back(expected);
            }
            return out;
        }
    };

    static bool all_digits(const std::string& s) {
        return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
    }

    static inline llama_model_ptr model;
    static inline llama_context_ptr ctx;
};

}  // namespace

TEST_F(token_sampler_test, a_trigger_word_split_over_tokens_constrains_from_the_next_token) {
    side_by_side s(lazy_digits());
    EXPECT_TRUE(s.ours.waiting_for_trigger());
    s.sample(5);  // free text, the same draws
    s.force(tokens("Sure, here it is"));
    for (const char* piece : {" CA", "LL", ":"}) s.force(tokens(piece));
    EXPECT_FALSE(s.ours.waiting_for_trigger());
    // Six digits, in both: the reference's grammar triggered too, so the sample is constrained.
    const std::string digits = text_of(s.sample(6));
    EXPECT_TRUE(all_digits(digits.substr(0, 6))) << digits;
}

TEST_F(token_sampler_test, a_trigger_that_starts_inside_a_token_replays_from_its_first_byte) {
    side_by_side s(lazy_digits());
    const std::vector<llama_token> forced = tokens("xCALL:");  // the word begins after "x", maybe inside a token
    s.force(forced);
    EXPECT_FALSE(s.ours.waiting_for_trigger());
    EXPECT_TRUE(all_digits(text_of(s.sample(6)).substr(0, 6)));
}

TEST_F(token_sampler_test, a_trigger_after_a_long_answer_is_found_in_the_window) {
    side_by_side s(lazy_digits());
    std::string filler;
    for (int i = 0; i < 300; ++i) filler += " the CAL word: and CALL or ALL:";  // near misses only
    s.force(tokens(filler));
    EXPECT_TRUE(s.ours.waiting_for_trigger());
    s.sample(3);
    s.force(tokens(" now CALL:"));
    EXPECT_FALSE(s.ours.waiting_for_trigger());
    EXPECT_TRUE(all_digits(text_of(s.sample(6)).substr(0, 6)));
}

TEST_F(token_sampler_test, a_trigger_inside_a_thinking_block_waits_for_its_end) {
    common_params_sampling p = lazy_digits();
    p.reasoning_budget_start = tokens("<think>");
    p.reasoning_budget_end = {tokens("</think>")};
    p.reasoning_budget_forced = p.reasoning_budget_end.front();
    side_by_side s(p);
    s.force(tokens("<think>"));
    s.force(tokens(" maybe CALL: later"));
    EXPECT_TRUE(s.ours.waiting_for_trigger());  // common's grammar is not given thinking text
    s.sample(4);
    s.force(tokens("</think>"));
    s.force(tokens("CALL:"));
    EXPECT_FALSE(s.ours.waiting_for_trigger());
    EXPECT_TRUE(all_digits(text_of(s.sample(6)).substr(0, 6)));
}

TEST_F(token_sampler_test, a_trigger_token_constrains_from_the_next_token) {
    common_params_sampling p;
    p.seed = 7;
    p.grammar = common_grammar(COMMON_GRAMMAR_TYPE_TOOL_CALLS, R"(root ::= ":" [0-9] [0-9] [0-9] [0-9] [0-9] [0-9])");
    p.grammar_lazy = true;
    common_grammar_trigger token;
    token.type = COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN;
    token.value = ":";
    token.token = tokens(":").front();
    p.grammar_triggers.push_back(token);
    side_by_side s(p);
    s.force(tokens("no colon here, but a long text without one"));
    EXPECT_TRUE(s.ours.waiting_for_trigger());
    s.sample(3);
    s.force({token.token});
    EXPECT_FALSE(s.ours.waiting_for_trigger());
    EXPECT_TRUE(all_digits(text_of(s.sample(6)).substr(0, 6)));
}

TEST_F(token_sampler_test, regex_triggers_stay_with_llama_cpp) {
    common_params_sampling p = lazy_digits();
    p.grammar_triggers.front().type = COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN;
    side_by_side s(p);
    EXPECT_FALSE(s.ours.waiting_for_trigger());
    s.force(tokens("ok CALL:"));
    EXPECT_TRUE(all_digits(text_of(s.sample(6)).substr(0, 6)));
}

TEST_F(token_sampler_test, a_grammar_that_does_not_parse_throws_before_anything_is_built) {
    common_params_sampling p;
    p.grammar = common_grammar(COMMON_GRAMMAR_TYPE_USER, "root ::= (");
    EXPECT_THROW(token_sampler(model.get(), p), std::runtime_error);
    p.grammar = common_grammar(COMMON_GRAMMAR_TYPE_USER, "%llguidance {}");
    EXPECT_THROW(token_sampler(model.get(), p), std::runtime_error);
}

// Issue 39 (F2): a plain grammar is checked by token_sampler itself, slice by slice, so that its pass over the
// vocabulary can stop at a deadline. Without a deadline it samples exactly what common_sampler does with the grammar
// inside, token for token (including picks the grammar turns down, whose resampling checks the whole vocabulary).
TEST_F(token_sampler_test, a_plain_grammar_samples_what_common_does) {
    for (const auto type : {COMMON_GRAMMAR_TYPE_USER, COMMON_GRAMMAR_TYPE_OUTPUT_FORMAT}) {
        common_params_sampling p;
        p.seed = 7;
        p.grammar = common_grammar(type, R"(root ::= ("alpha" | "beta" | "gamma" | [0-9]+) " " [a-z]+ "!")");
        side_by_side s(p);
        const std::string text = text_of(s.sample(8));
        EXPECT_NE(text.find(' '), std::string::npos) << text;
    }
}

// When the chain's pick does not fit, the whole vocabulary is checked; past the deadline that gives up: nothing is
// sampled (LLAMA_TOKEN_NULL), and the grammar's state is untouched, so the same sampler samples normally afterwards.
TEST_F(token_sampler_test, a_plain_grammars_pass_over_the_vocabulary_stops_at_the_deadline) {
    common_params_sampling p;
    p.seed = 7;
    p.grammar = common_grammar(COMMON_GRAMMAR_TYPE_USER, R"(root ::= "zq" [0-9]+)");
    // The chain always picks "hello", which the grammar never allows: every sample pays for the whole vocabulary.
    const llama_token hello = tokens("hello").front();
    p.logit_bias.push_back({hello, 1000.0f});
    token_sampler ours(model.get(), p);
    EXPECT_EQ(ours.sample(ctx.get(), 0, std::chrono::steady_clock::now() - std::chrono::seconds(1)), LLAMA_TOKEN_NULL);
    const llama_token t = ours.sample(ctx.get(), 0);
    ASSERT_NE(t, LLAMA_TOKEN_NULL);
    EXPECT_NE(t, hello);
    EXPECT_EQ(text_of({t})[0], 'z') << text_of({t});
}

// A lazy grammar past its trigger is checked the same way: its pass stops at the deadline too.
TEST_F(token_sampler_test, a_triggered_lazy_grammars_pass_stops_at_the_deadline) {
    common_params_sampling p = lazy_digits();
    const llama_token hello = tokens("hello").front();
    p.logit_bias.push_back({hello, 1000.0f});  // never a digit: every sample past the trigger checks the vocabulary
    token_sampler ours(model.get(), p);
    for (const llama_token t : tokens("ok CALL:")) ours.accept(t);
    ASSERT_FALSE(ours.waiting_for_trigger());
    EXPECT_EQ(ours.sample(ctx.get(), 0, std::chrono::steady_clock::now() - std::chrono::seconds(1)), LLAMA_TOKEN_NULL);
    const llama_token t = ours.sample(ctx.get(), 0);
    EXPECT_TRUE(all_digits(text_of({t}))) << text_of({t});
}

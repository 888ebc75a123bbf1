// What the engine-level prefix-cache tests share: a greedy request with its logits kept (end of generation masked, so
// it always runs `n` tokens), its result, and the comparison of a run on restored KV with a cold run.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common.h"
#include "engine/engine.h"

namespace greedy_runs {

struct result {
    std::vector<llama_token> generated;
    keepwarm::generation_stats stats;
    std::vector<std::vector<float>> logits;  // per generated position
};

// A greedy request for `n` tokens with their logits kept, not yet submitted.
inline std::shared_ptr<keepwarm::generation_request> greedy_request(keepwarm::engine& e,
                                                                    const std::vector<llama_token>& prompt, int n,
                                                                    const std::string& tenant = {}) {
    auto r = std::make_shared<keepwarm::generation_request>();
    r->prompt = prompt;
    r->tenant = tenant;
    r->sampling.temp = 0;
    r->sampling.seed = 42;
    r->max_tokens = n;
    r->keep_logits = n;
    for (const llama_token t : e.eog_tokens()) r->sampling.logit_bias.push_back({t, -INFINITY});
    return r;
}

// The drafting tests' ChatML prompts: one whose answer the random test models fill with repeats a drafter finds in
// it, and another.
inline const std::string chat_prompt =
    "<|im_start|>user\nRepeat: the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the lazy "
    "dog. the quick brown fox<|im_end|>\n<|im_start|>assistant\n";
inline const std::string other_prompt =
    "<|im_start|>user\nalpha beta gamma delta alpha beta gamma delta alpha beta gamma delta alpha beta gamma "
    "delta<|im_end|>\n<|im_start|>assistant\n";

// The request's final numbers, tokens and logits; a hang guard of `limit`, not a speed check.
inline result wait_for(keepwarm::generation_request& r, std::chrono::seconds limit = std::chrono::seconds(120)) {
    for (;;) {
        auto ev = r.output.pop(limit);
        if (!ev) {
            ADD_FAILURE() << "no event within " << limit.count() << " s";
            return {};
        }
        if (ev->done) {
            EXPECT_NE(ev->reason, keepwarm::finish_reason::error) << ev->error;
            return {ev->generated, ev->stats, ev->logits};
        }
    }
}

// Submits a greedy request for `n` tokens and waits for it.
inline result generate(keepwarm::engine& e, const std::vector<llama_token>& prompt, int n,
                       const std::string& tenant = {}) {
    auto r = greedy_request(e, prompt, n, tenant);
    e.submit(r);
    return wait_for(*r);
}

// The next turn of a ChatML conversation: its prompt, the answer, and a new user message.
inline std::vector<llama_token> next_turn(keepwarm::engine& e, const std::vector<llama_token>& prompt,
                                          const result& answer, const std::string& message) {
    std::vector<llama_token> t = prompt;
    t.insert(t.end(), answer.generated.begin(), answer.generated.end());
    const std::vector<llama_token> more = common_tokenize(
        e.vocab(), "<|im_end|>\n<|im_start|>user\n" + message + "<|im_end|>\n<|im_start|>assistant\n", false, true);
    t.insert(t.end(), more.begin(), more.end());
    return t;
}

// Restored KV is not bit-identical to a cold computation (other batch splits sum floats in another order; the
// checked difference is ~1e-3), so: the first position's logits agree within a tolerance, and the greedy tokens are
// the same, except that they may part at a step where the cold run itself had a near tie between the two.
inline void expect_same_output(const result& actual, const result& cold) {
    ASSERT_FALSE(actual.logits.empty());
    ASSERT_FALSE(cold.logits.empty());
    ASSERT_EQ(actual.logits[0].size(), cold.logits[0].size());
    const auto [lo, hi] = std::minmax_element(cold.logits[0].begin(), cold.logits[0].end());
    // 3% of the logits' range: batch-split noise measured here is < 1% on the dense and MoE test models and 0 on
    // the hybrid one; another prompt's logits differ by far more (tolerance_separates_prompts checks that). KV that
    // lost positions inside a sliding window moves them far more too (test-prompt-cache-swa).
    const float tolerance = 0.03f * (*hi - *lo);
    float worst = 0;
    for (size_t i = 0; i < cold.logits[0].size(); ++i) {
        worst = std::max(worst, std::fabs(actual.logits[0][i] - cold.logits[0][i]));
    }
    EXPECT_LE(worst, tolerance) << "first-position logits differ from the cold run (range " << *hi - *lo << ")";
    ASSERT_EQ(actual.generated.size(), cold.generated.size());
    for (size_t i = 0; i < cold.generated.size(); ++i) {
        if (actual.generated[i] == cold.generated[i]) continue;
        const auto& l = cold.logits.at(i);
        const float gap =
            std::fabs(l[static_cast<size_t>(cold.generated[i])] - l[static_cast<size_t>(actual.generated[i])]);
        EXPECT_LE(gap, tolerance) << "greedy tokens part at step " << i << " without a near tie";
        return;
    }
}

}  // namespace greedy_runs

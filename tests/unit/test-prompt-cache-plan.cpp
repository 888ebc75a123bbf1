// acquire()'s plan (prompt_cache::plan_acquire) on a prompt cache of its own over a dense test model's context: the
// plan names where a prompt's KV comes back from (another sequence's cells, RAM blocks) and what the slot's content
// must give way to, planning changes nothing, and acquire() then does what the plan said.
#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "cache/prompt-cache.h"
#include "engine/llama-runtime.h"
#include "generated-models.h"
#include "llama-cpp.h"

using namespace keepwarm;

namespace {

using tokens = std::vector<llama_token>;

class prompt_cache_plan : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        init_llama_runtime();
        model.reset(llama_model_load_from_file(test_models::generated_model("unit-prompt-cache-plan").c_str(),
                                               llama_model_default_params()));
        ASSERT_TRUE(model);
    }
    static void TearDownTestSuite() { model.reset(); }

    // A fresh context and cache: `slots` slots, one parked sequence, blocks of 64 positions, no disk tier.
    void open(int slots) {
        options.slots = slots;
        options.parked_sequences = 1;
        options.block_tokens = 64;
        llama_context_params cparams = llama_context_default_params();
        cparams.n_ctx = 2048;
        cparams.n_threads = 1;
        cparams.n_threads_batch = 1;
        cparams.n_seq_max = static_cast<uint32_t>(prompt_cache::sequences_needed(options));
        cparams.kv_unified = true;
        cache.reset();
        ctx.reset(llama_init_from_model(model.get(), cparams));
        ASSERT_TRUE(ctx);
        cache = std::make_unique<prompt_cache>(ctx.get(), options);
    }

    // A prompt of `n` tokens, distinct for each `seed`.
    static tokens prompt(int n, int seed) {
        const int vocab = llama_vocab_n_tokens(llama_model_get_vocab(model.get()));
        tokens out;
        for (int i = 0; i < n; ++i) out.push_back(static_cast<llama_token>(10 + (seed * 131 + i * 7) % (vocab - 20)));
        return out;
    }

    // One request: acquire the slot, compute the rest of the prompt into it, release it.
    cache_restore serve(int slot, const tokens& p) {
        const cache_restore r = cache->acquire(slot, p, static_cast<int>(p.size()) - 1);
        const tokens rest(p.begin() + r.reused, p.end());
        llama_batch batch = llama_batch_init(static_cast<int32_t>(rest.size()), 0, 1);
        for (size_t i = 0; i < rest.size(); ++i) {
            batch.token[i] = rest[i];
            batch.pos[i] = r.reused + static_cast<llama_pos>(i);
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = slot;
            batch.logits[i] = i + 1 == rest.size();
        }
        batch.n_tokens = static_cast<int32_t>(rest.size());
        EXPECT_EQ(llama_decode(ctx.get(), batch), 0);
        llama_batch_free(batch);
        cache->append(slot, rest);
        cache->release_slot(slot, false);
        return r;
    }

    static void expect_same(const acquire_plan& a, const acquire_plan& b) {
        EXPECT_EQ(a.matched, b.matched);
        EXPECT_EQ(a.holder, b.holder);
        EXPECT_EQ(a.device, b.device);
        EXPECT_EQ(a.blocks, b.blocks);
        EXPECT_EQ(a.ram_blocks, b.ram_blocks);
        EXPECT_EQ(a.target, b.target);
        EXPECT_EQ(a.own_reused, b.own_reused);
        EXPECT_EQ(a.slot_leaves, b.slot_leaves);
        EXPECT_EQ(a.slot_cut, b.slot_cut);
    }

    static inline llama_model_ptr model;
    prompt_cache_options options;
    llama_context_ptr ctx;
    std::unique_ptr<prompt_cache> cache;
};

TEST_F(prompt_cache_plan, a_prompt_whose_prefix_is_in_ram_only_plans_those_blocks) {
    open(1);
    const tokens p = prompt(300, 1);
    EXPECT_EQ(serve(0, p).reused, 0);
    std::vector<int> emptied;
    for (int i = 0; i < 100 && !cache->make_way(std::chrono::hours(1), emptied); ++i) {
    }
    ASSERT_EQ(emptied, std::vector<int>{0}) << "the idle slot went to RAM";
    ASSERT_EQ(cache->snapshot().device.tokens, 0u);

    const int limit = static_cast<int>(p.size()) - 1;
    const acquire_plan plan = cache->plan_acquire(0, p, limit);
    EXPECT_EQ(plan.matched, 300);
    EXPECT_EQ(plan.holder, -1) << "no device sequence holds it";
    EXPECT_EQ(plan.device, 0);
    EXPECT_EQ(plan.blocks, (std::vector<int32_t>{64, 128, 192, 256, 300})) << "its four blocks and its tail";
    EXPECT_EQ(plan.ram_blocks, 5);
    EXPECT_EQ(plan.target, limit);
    EXPECT_FALSE(plan.slot_leaves);
    EXPECT_FALSE(plan.slot_cut);
    expect_same(cache->plan_acquire(0, p, limit), plan);  // planning changed nothing a plan reads

    const cache_restore r = cache->acquire(0, p, limit);
    EXPECT_EQ(r.reused, plan.target);
    EXPECT_EQ(r.device, 0);
    EXPECT_EQ(r.ram, plan.target);
    EXPECT_EQ(cache->snapshot().lookups, 2u) << "planning counted no lookup";
}

TEST_F(prompt_cache_plan, a_prompt_another_slot_holds_shares_its_cells) {
    open(2);
    const tokens p = prompt(200, 2);
    serve(0, p);
    const int limit = static_cast<int>(p.size()) - 1;
    const acquire_plan plan = cache->plan_acquire(1, p, limit);
    EXPECT_EQ(plan.holder, 0);
    EXPECT_EQ(plan.device, limit);
    EXPECT_TRUE(plan.blocks.empty());
    EXPECT_EQ(plan.target, limit);
    EXPECT_FALSE(plan.slot_leaves) << "slot 1 holds nothing";

    const cache_restore r = cache->acquire(1, p, limit);
    EXPECT_EQ(r.device, plan.device);
    EXPECT_EQ(r.reused, plan.target);
}

TEST_F(prompt_cache_plan, a_slot_holding_another_conversation_gives_way_and_keeps_it_parked) {
    open(1);
    const tokens a = prompt(200, 3), b = prompt(150, 4);
    serve(0, a);
    const acquire_plan plan = cache->plan_acquire(0, b, static_cast<int>(b.size()) - 1);
    EXPECT_EQ(plan.matched, 0);
    EXPECT_EQ(plan.holder, -1);
    EXPECT_TRUE(plan.slot_leaves);
    EXPECT_EQ(plan.target, 0);
    EXPECT_EQ(cache->slot_length(0), 200) << "planning left the slot's content where it was";

    serve(0, b);  // a is parked on the way
    const acquire_plan back = cache->plan_acquire(0, a, static_cast<int>(a.size()) - 1);
    EXPECT_EQ(back.holder, 1) << "the parked sequence holds a";
    EXPECT_EQ(back.device, 199);
    EXPECT_TRUE(back.slot_leaves) << "slot 0 holds b";
}

TEST_F(prompt_cache_plan, a_tenant_with_nothing_cached_plans_nothing) {
    open(1);
    const tokens p = prompt(100, 5);
    serve(0, p);
    const acquire_plan plan = cache->plan_acquire(0, p, 99, "another-tenant");
    EXPECT_EQ(plan.matched, 0);
    EXPECT_EQ(plan.holder, -1);
    EXPECT_TRUE(plan.blocks.empty());
    EXPECT_EQ(plan.target, 0);
}

}  // namespace

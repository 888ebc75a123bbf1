// Speculative decoding's history rebuilt from the prefix cache's disk tier (docs/speculative.md, "History"): after a
// restart, the conversations the disk tier holds join their tenants' histories, so a new conversation that repeats an
// earlier answer drafts it from the first step; another tenant's entries never feed a tenant's history; damaged
// entries are skipped.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cache/block-key.h"
#include "cache/prompt-cache.h"
#include "common.h"
#include "engine/draft-sources.h"
#include "engine/engine.h"
#include "engine/llama-runtime.h"
#include "generated-models.h"
#include "greedy-runs.h"
#include "llama-cpp.h"
#include "test-temp-dir.h"

using namespace keepwarm;

namespace {

namespace fs = std::filesystem;
using tokens = std::vector<llama_token>;
using greedy_runs::result;
using test_support::temp_dir;

engine_options disk_options(const fs::path& dir) {
    engine_options o;
    o.model_path = test_models::generated_model("unit-spec-history", "tiny");
    o.context_size = 4096;
    o.slots = 1;
    o.threads = 1;
    o.cache_block_tokens = 64;
    o.cache_parked_sequences = 2;
    o.cache_dir = dir.string();
    o.whole_drafts = true;  // what is drafted must not depend on the host's speed
    return o;
}

tokens tokenize(engine& e, const std::string& text, bool bos = true) {
    return common_tokenize(e.vocab(), text, bos, true);
}

std::string chat(const std::string& user) {
    return "<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n";
}

// An answer that does not repeat itself, so that drafting it from the request's own tokens finds little.
const std::string answer_text =
    " Paris is the capital of France and the Seine runs through it; Berlin lies on the Spree, Vienna on the Danube, "
    "while Rome sits beside the Tiber and Lisbon faces the Atlantic at the mouth of the Tagus.";

// Runs `user`'s conversation for `tenant` with the answer forced to answer_text, and returns its numbers.
result converse(engine& e, const std::string& user, const std::string& tenant) {
    auto r = greedy_runs::greedy_request(e, tokenize(e, chat(user)), 1000, tenant);
    r->keep_logits = 0;
    r->forced_answer = tokenize(e, answer_text, false);
    e.submit(r);
    result out = greedy_runs::wait_for(*r);
    EXPECT_EQ(out.generated, r->forced_answer);
    return out;
}

uint64_t history_accepted(const engine& e) {
    return e.counters().drafts[static_cast<size_t>(draft_source::history)].accepted.load();
}

// Writes the conversation to the disk tier: the engine's shutdown persists what the device holds.
void first_run(const engine_options& o, const std::string& tenant) {
    engine e(o);
    e.start();
    converse(e, "Name the capitals of five countries and their rivers.", tenant);
    EXPECT_EQ(history_accepted(e), 0u);  // nothing earlier to draft from
}

TEST(spec_history, a_restarted_engine_drafts_an_earlier_answer_from_its_disk_tier) {
    const temp_dir dir("spec-history");
    const engine_options o = disk_options(dir.path);
    first_run(o, "alice");
    engine e(o);
    e.start();
    // A new conversation (its prompt shares no message with the first) whose answer is the first one's.
    const result r = converse(e, "Which rivers run through European capitals?", "alice");
    EXPECT_GT(history_accepted(e), r.generated.size() / 2);
    EXPECT_EQ(r.stats.draft_accepted,
              static_cast<int>(history_accepted(e) +
                               e.counters().drafts[static_cast<size_t>(draft_source::request)].accepted.load()));
}

TEST(spec_history, another_tenants_disk_entries_do_not_feed_a_tenants_history) {
    const temp_dir dir("spec-history");
    const engine_options o = disk_options(dir.path);
    first_run(o, "alice");
    engine e(o);
    e.start();
    converse(e, "Which rivers run through European capitals?", "bob");
    converse(e, "Which rivers run through European capitals?", "");  // the shared tenant is another tenant too
    EXPECT_EQ(history_accepted(e), 0u);
    // The same request as alice's drafts from her history: the entries were there, only not bob's.
    converse(e, "Which rivers run through European capitals?", "alice");
    EXPECT_GT(history_accepted(e), 0u);
}

TEST(spec_history, damaged_entries_are_skipped_and_the_rest_feed_the_history) {
    const temp_dir dir("spec-history");
    const engine_options o = disk_options(dir.path);
    first_run(o, "alice");
    // Beside the intact entries: one cut short, one of noise, one empty, and a directory named like an entry.
    std::vector<fs::path> entries;
    for (const auto& f : fs::directory_iterator(dir.path)) {
        if (f.path().extension() == ".kwkv") entries.push_back(f.path());
    }
    ASSERT_FALSE(entries.empty());
    const fs::path cut = dir.path / (std::string(32, 'a') + ".kwkv");
    fs::copy_file(entries.front(), cut);
    fs::resize_file(cut, fs::file_size(cut) / 2);
    std::ofstream(dir.path / (std::string(32, 'b') + ".kwkv"), std::ios::binary) << std::string(4096, '\x7f');
    std::ofstream(dir.path / (std::string(32, 'c') + ".kwkv"), std::ios::binary);
    fs::create_directory(dir.path / (std::string(32, 'd') + ".kwkv"));

    engine e(o);
    e.start();
    EXPECT_EQ(e.cache_stats().disk_rejected, 3u);
    const result r = converse(e, "Which rivers run through European capitals?", "alice");
    EXPECT_GT(history_accepted(e), r.generated.size() / 2);
}

// The history's side alone: conversations listed by the cache are filed under the tenant whose root key they carry.
TEST(spec_history, recalled_conversations_draft_for_their_own_tenant_only) {
    const std::string fingerprint = "0123456789abcdef0123456789abcdef";
    draft_sources sources("suffix", 1, 1 << 20, nullptr, fingerprint);
    const tokens earlier = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    const std::vector<cached_conversation> held = {
        {.tenant_root = tenant_root_block_key(fingerprint, "alice"), .tokens = earlier, .written = {}},
    };
    EXPECT_EQ(sources.recall(held), earlier.size());
    const tokens prompt = {50, 51, 2, 3, 4};
    const draft_proposal alice = sources.begin(0, "alice", prompt)->propose(4);
    EXPECT_EQ(alice.tokens, (tokens{5, 6, 7, 8}));
    EXPECT_EQ(alice.source, draft_source::history);
    EXPECT_TRUE(sources.begin(0, "bob", prompt)->propose(4).tokens.empty());
    EXPECT_TRUE(sources.begin(0, "", prompt)->propose(4).tokens.empty());
    // A request's own conversation, once remembered, is filed under the same name as the recalled ones.
    sources.remember("alice", tokens{60, 61, 62, 63, 64, 65});
    EXPECT_EQ(sources.begin(0, "alice", tokens{70, 60, 61})->propose(2).tokens, (tokens{62, 63}));
}

// Within --spec-history's budget the newest conversations are kept: the list comes newest first.
TEST(spec_history, recall_keeps_the_newest_within_the_budget) {
    draft_sources sources("suffix", 1, 16, nullptr, "fp");
    const block_key alice = tenant_root_block_key("fp", "alice");
    const std::vector<cached_conversation> newest_first = {
        {.tenant_root = alice, .tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, .written = {}},
        {.tenant_root = alice, .tokens = {21, 22, 23, 24, 25, 26, 27, 28, 29, 30}, .written = {}},
    };
    sources.recall(newest_first);
    EXPECT_EQ(sources.history_stats().tokens, 10u);
    EXPECT_EQ(sources.begin(0, "alice", tokens{2, 3})->propose(2).tokens, (tokens{4, 5}));
    EXPECT_TRUE(sources.begin(0, "alice", tokens{22, 23})->propose(2).tokens.empty());
}

// The cache's side: what prompt_cache::conversations lists from a disk tier after a restart. Tokens are made up (no
// model answers): prompts computed into the cache, persisted, and the tier opened again by a new cache.
class cached_conversations : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        init_llama_runtime();
        model.reset(llama_model_load_from_file(test_models::generated_model("unit-spec-history", "tiny").c_str(),
                                               llama_model_default_params()));
        ASSERT_TRUE(model);
    }
    static void TearDownTestSuite() { model.reset(); }

    void open(const fs::path& dir) {
        options.slots = 1;
        options.parked_sequences = 2;
        options.block_tokens = 64;
        options.disk_dir = dir;
        options.model_fingerprint = fingerprint;
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

    // `n` made-up tokens, distinct for each `seed`.
    static tokens made_up(int n, int seed) {
        tokens out;
        for (int i = 0; i < n; ++i) out.push_back(static_cast<llama_token>(10 + (seed * 131 + i * 7) % 20000));
        return out;
    }

    // One request of `tenant`: its prompt computed into slot 0, the slot released.
    void serve(const tokens& p, const std::string& tenant) {
        const cache_restore r = cache->acquire(0, p, static_cast<int>(p.size()) - 1, tenant);
        const tokens rest(p.begin() + r.reused, p.end());
        llama_batch batch = llama_batch_init(static_cast<int32_t>(rest.size()), 0, 1);
        for (size_t i = 0; i < rest.size(); ++i) {
            batch.token[i] = rest[i];
            batch.pos[i] = r.reused + static_cast<llama_pos>(i);
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i] = i + 1 == rest.size();
        }
        batch.n_tokens = static_cast<int32_t>(rest.size());
        EXPECT_EQ(llama_decode(ctx.get(), batch), 0);
        llama_batch_free(batch);
        cache->append(0, rest);
        cache->release_slot(0, false);
    }

    static constexpr const char* fingerprint = "spec-history-test-fingerprint";
    static inline llama_model_ptr model;
    prompt_cache_options options;
    llama_context_ptr ctx;
    std::unique_ptr<prompt_cache> cache;
};

TEST_F(cached_conversations, a_restart_lists_each_tenants_conversations_newest_first_with_shared_starts_once) {
    const temp_dir dir("spec-history-cache");
    const tokens start = made_up(100, 1);  // a system prompt both of alice's conversations begin with
    auto with_start = [&](int n, int seed) {
        tokens t = start;
        const tokens own = made_up(n, seed);
        t.insert(t.end(), own.begin(), own.end());
        return t;
    };
    const tokens a = with_start(80, 2), b = with_start(90, 3), c = with_start(70, 4);
    open(dir.path);
    serve(a, "alice");
    serve(b, "alice");
    serve(c, "bob");  // the same start, for another tenant
    cache->persist_all();
    open(dir.path);  // the restart: a new cache on the same folder

    const std::vector<cached_conversation> listed = cache->conversations(1 << 20);
    ASSERT_EQ(listed.size(), 3u);
    for (size_t i = 1; i < listed.size(); ++i) EXPECT_GE(listed[i - 1].written, listed[i].written);
    const block_key alice = tenant_root_block_key(fingerprint, "alice");
    const block_key bob = tenant_root_block_key(fingerprint, "bob");
    std::vector<tokens> alices, bobs;
    for (const cached_conversation& l : listed) {
        if (l.tenant_root == alice) alices.push_back(l.tokens);
        if (l.tenant_root == bob) bobs.push_back(l.tokens);
    }
    EXPECT_EQ(bobs, std::vector<tokens>{c});  // bob's whole: alice's start is not his
    ASSERT_EQ(alices.size(), 2u);
    // The newer of alice's two is listed whole; the older without the start the newer gave.
    const bool a_newer = alices[0] == a;
    EXPECT_EQ(alices[0], a_newer ? a : b);
    EXPECT_EQ(alices[1], a_newer ? tokens(b.begin() + 100, b.end()) : tokens(a.begin() + 100, a.end()));

    // A budget cuts the list: the newest first, the last one listed by its end.
    const std::vector<cached_conversation> cut = cache->conversations(listed[0].tokens.size() + 30);
    ASSERT_EQ(cut.size(), 2u);
    EXPECT_EQ(cut[0].tokens, listed[0].tokens);
    EXPECT_EQ(cut[1].tokens, tokens(listed[1].tokens.end() - 30, listed[1].tokens.end()));
}

}  // namespace

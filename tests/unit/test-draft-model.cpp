// Speculative decoding with a draft model (serve -md; engine/draft-model.h): drafts from a second model, through
// llama.cpp's common, verified by the target as every draft is, so that the answer is the one decoding without them
// gives. The test draft models: tiny-draft (random weights of its own, the tiny preset's tokenizer: it agrees with the
// target only by chance) and the target itself (it agrees almost always: the mechanism's ceiling).
#include <gtest/gtest.h>

#include <cstring>

#include "common.h"
#include "engine/draft-model.h"
#include "engine/engine.h"
#include "engine/llama-runtime.h"
#include "generated-models.h"
#include "greedy-runs.h"

using namespace keepwarm;

namespace {

using tokens = std::vector<llama_token>;
using greedy_runs::chat_prompt;
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

// The draft model's own flags (-td/-tbd, -ctkd/-ctvd, -devd, -otd) reach its load and its context. The draft model is
// loaded here beside a target context of its own, as the engine loads it.
struct target_context {
    llama_model_ptr model;
    llama_context_ptr ctx;
};

target_context load_target(int threads, int threads_batch) {
    init_llama_runtime(false);
    target_context t;
    t.model.reset(llama_model_load_from_file(target_model().c_str(), llama_model_default_params()));
    llama_context_params c = llama_context_default_params();
    c.n_ctx = 1024;
    c.n_batch = c.n_ubatch = 256;
    c.n_seq_max = 2;
    c.n_threads = threads;
    c.n_threads_batch = threads_batch;
    t.ctx.reset(llama_init_from_model(t.model.get(), c));
    return t;
}

draft_model_options draft_options() {
    draft_model_options o;
    o.path = random_draft_model();
    return o;
}

// Drafts after the draft model has computed `prompt` (one call catches up with a prompt this short).
std::vector<llama_token> draft_after(draft_model& d, const tokens& prompt) {
    const int seq = d.acquire(prompt);
    std::vector<llama_token> drafted = d.draft(seq, prompt, 8);
    if (drafted.empty()) drafted = d.draft(seq, prompt, 8);
    d.release(seq);
    return drafted;
}

TEST(draft_model, its_threads_are_the_models_unless_td_and_tbd_say_otherwise) {
    target_context t = load_target(2, 2);
    {
        draft_model d(draft_options(), t.model.get(), t.ctx.get(), 2, nullptr, nullptr);
        EXPECT_EQ(llama_n_threads(d.context()), 2);
        EXPECT_EQ(llama_n_threads_batch(d.context()), 2);
    }
    draft_model_options o = draft_options();
    o.threads = 1;
    o.threads_batch = 3;
    draft_model d(o, t.model.get(), t.ctx.get(), 2, nullptr, nullptr);
    EXPECT_EQ(llama_n_threads(d.context()), 1);
    EXPECT_EQ(llama_n_threads_batch(d.context()), 3);
    // On its own thread pools it computes and drafts.
    const tokens prompt = common_tokenize(llama_model_get_vocab(t.model.get()), chat_prompt, true, true);
    EXPECT_FALSE(draft_after(d, prompt).empty());
    EXPECT_EQ(d.stats().computed_tokens, prompt.size() - 1);
}

TEST(draft_model, its_kv_cache_takes_ctkd_and_ctvd) {
    target_context t = load_target(1, 1);
    const tokens prompt = common_tokenize(llama_model_get_vocab(t.model.get()), chat_prompt, true, true);
    const auto sequence_bytes = [&](ggml_type type) {
        draft_model_options o = draft_options();
        o.cache_type_k = o.cache_type_v = type;
        draft_model d(o, t.model.get(), t.ctx.get(), 2, nullptr, nullptr);
        draft_after(d, prompt);
        return llama_state_seq_get_size(d.context(), 0);
    };
    const size_t f16 = sequence_bytes(GGML_TYPE_F16);
    const size_t q8 = sequence_bytes(GGML_TYPE_Q8_0);
    ASSERT_GT(f16, 0u);
    // q8_0 keeps 34 bytes per 32 values where f16 keeps 64: about 0.53 of the KV, the state's header aside.
    EXPECT_LT(q8, f16 * 6 / 10) << "f16 " << f16 << ", q8_0 " << q8;
    EXPECT_GT(q8, f16 * 4 / 10) << "f16 " << f16 << ", q8_0 " << q8;
}

// llama.cpp logs (at debug level) each tensor an override places: the draft model's load logs the pattern's tensors.
std::vector<std::string>* captured_log = nullptr;
void capture_log(ggml_log_level, const char* text, void*) {
    if (captured_log && text) captured_log->push_back(text);
}

TEST(draft_model, otd_places_the_matching_tensors_and_devd_none_keeps_it_on_the_cpu) {
    target_context t = load_target(1, 1);
    draft_model_options o = draft_options();
    o.tensor_overrides = {"blk\\.0\\.ffn_.*=CPU"};
    o.devices = "none";
    std::vector<std::string> lines;
    ggml_log_callback previous = nullptr;
    void* previous_data = nullptr;
    llama_log_get(&previous, &previous_data);
    captured_log = &lines;
    llama_log_set(capture_log, nullptr);
    {
        draft_model d(o, t.model.get(), t.ctx.get(), 2, nullptr, nullptr);
        llama_log_set(previous, previous_data);
        captured_log = nullptr;
        const tokens prompt = common_tokenize(llama_model_get_vocab(t.model.get()), chat_prompt, true, true);
        EXPECT_FALSE(draft_after(d, prompt).empty());
    }
    size_t overridden = 0;
    for (const std::string& line : lines) {
        if (line.find("buffer type overridden to CPU") == std::string::npos) continue;
        EXPECT_NE(line.find("blk.0.ffn_"), std::string::npos) << line;
        ++overridden;
    }
    EXPECT_GE(overridden, 3u);  // the block's gate, up and down weights at least
}

TEST(draft_model, a_bad_device_or_buffer_type_is_refused_naming_the_flag) {
    target_context t = load_target(1, 1);
    const auto refusal = [&](const draft_model_options& o) -> std::string {
        try {
            draft_model d(o, t.model.get(), t.ctx.get(), 2, nullptr, nullptr);
        } catch (const std::invalid_argument& e) {
            return e.what();
        }
        return "accepted";
    };
    draft_model_options o = draft_options();
    o.devices = "GPU77";
    const std::string device = refusal(o);
    EXPECT_NE(device.find("-devd"), std::string::npos) << device;
    EXPECT_NE(device.find("GPU77"), std::string::npos) << device;
    o = draft_options();
    o.devices = "CPU";  // the CPU is not an offload device, as llama-server says too
    EXPECT_NE(refusal(o).find("-devd"), std::string::npos);
    o = draft_options();
    o.tensor_overrides = {"ffn_.*=VRAM9"};
    const std::string buffer = refusal(o);
    EXPECT_NE(buffer.find("-otd"), std::string::npos) << buffer;
    EXPECT_NE(buffer.find("CPU"), std::string::npos) << buffer;  // the buffer types there are
    o.tensor_overrides = {"no equals sign"};
    EXPECT_NE(refusal(o).find("PATTERN=BUFFER_TYPE"), std::string::npos);
    o.tensor_overrides = {"ffn_(=CPU"};
    EXPECT_NE(refusal(o).find("regular expression"), std::string::npos);
}

}  // namespace

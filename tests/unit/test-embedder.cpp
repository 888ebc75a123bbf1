// The embedder on its own, without HTTP, on the tiny-embed preset (qwen3, last-token pooling, EOS appended): vectors
// are deterministic, normalised as llama-server normalises them, the same in a batch as alone, and bad inputs are
// refused before they reach llama.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "base/request-error.h"
#include "common.h"
#include "engine/embedder.h"
#include "generated-models.h"

using namespace keepwarm;

namespace {

std::string embed_model() {
    static const std::string path = test_models::generated_model("unit-embedder", "tiny-embed");
    return path;
}

double norm(const std::vector<float>& v) {
    double sum = 0;
    for (const float x : v) sum += double(x) * double(x);
    return std::sqrt(sum);
}

float max_difference(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    float d = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
    return d;
}

class embedder_test : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        embedder_options o;
        o.model_path = embed_model();
        o.context_size = 512;
        o.batch_size = 1024;
        o.max_sequences = 16;
        o.threads = 1;
        model = std::make_unique<embedder>(o);
    }
    static void TearDownTestSuite() { model.reset(); }

    static std::vector<llama_token> tokens(const std::string& text) {
        return common_tokenize(model->vocab(), text, /*add_special=*/true, /*parse_special=*/true);
    }

    static inline std::unique_ptr<embedder> model;
};

const std::vector<std::string> texts = {
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings map text to vectors.",
    "a",
    "keepwarm serves embedding models as models like the others, with its own context and thread.",
    "1 2 3 4 5 6 7 8 9 10",
};

}  // namespace

TEST(embedding_model_file, the_preset_declares_last_pooling_and_a_chat_model_none) {
    EXPECT_EQ(model_file_pooling(embed_model()), LLAMA_POOLING_TYPE_LAST);
    EXPECT_EQ(model_file_pooling(test_models::generated_model("unit-embedder", "tiny")), LLAMA_POOLING_TYPE_NONE);
    EXPECT_THROW(model_file_pooling("/nonexistent.gguf"), std::runtime_error);
}

TEST(embedding_model_file, a_chat_model_without_a_pooling_type_is_refused) {
    embedder_options o;
    o.model_path = test_models::generated_model("unit-embedder", "tiny");
    o.context_size = 64;
    o.threads = 1;
    EXPECT_THROW(embedder{o}, std::invalid_argument);
    o.pooling = LLAMA_POOLING_TYPE_MEAN;  // --pooling mean makes it one
    embedder mean(o);
    EXPECT_EQ(mean.pooling(), LLAMA_POOLING_TYPE_MEAN);
    const auto v = mean.embed({common_tokenize(mean.vocab(), "hello", true, true)});
    ASSERT_EQ(v.size(), 1u);
    EXPECT_NEAR(norm(v[0]), 1.0, 1e-5);
}

// A reranker's "vector" is its classifier's softmax over yes/no (llama.cpp's qwen3 head), never normalised: the first
// value is the relevance llama-server reports.
TEST(embedding_model_file, a_reranker_gives_its_classifiers_scores) {
    embedder_options o;
    o.model_path = test_models::generated_model("unit-embedder", "tiny-rerank");
    o.context_size = 256;
    o.threads = 1;
    embedder reranker(o);
    EXPECT_EQ(reranker.pooling(), LLAMA_POOLING_TYPE_RANK);
    ASSERT_EQ(reranker.n_embd(), 2);
    const auto scores = reranker.embed({common_tokenize(reranker.vocab(), "query and document", false, true),
                                        common_tokenize(reranker.vocab(), "another pair", false, true)});
    ASSERT_EQ(scores.size(), 2u);
    for (const auto& s : scores) {
        EXPECT_GT(s[0], 0.0f);
        EXPECT_LT(s[0], 1.0f);
        EXPECT_NEAR(s[0] + s[1], 1.0f, 1e-5);
    }
    EXPECT_NE(scores[0][0], scores[1][0]);
}

// Qwen3-Embedding's tokenizer appends <|endoftext|>, whose hidden state last-token pooling takes.
TEST_F(embedder_test, the_tokenizer_appends_eos_to_every_input) {
    const auto ids = tokens("hello");
    ASSERT_GE(ids.size(), 2u);
    EXPECT_EQ(common_token_to_piece(model->vocab(), ids.back(), true), "<|endoftext|>");
    EXPECT_EQ(model->pooling(), LLAMA_POOLING_TYPE_LAST);
    EXPECT_EQ(model->n_embd(), 128);
}

TEST_F(embedder_test, vectors_are_deterministic_and_unit_length) {
    const auto a = model->embed({tokens(texts[1])});
    const auto b = model->embed({tokens(texts[1])});
    ASSERT_EQ(a.size(), 1u);
    ASSERT_EQ(a[0].size(), 128u);
    EXPECT_EQ(a[0], b[0]);
    EXPECT_NEAR(norm(a[0]), 1.0, 1e-5);
    // Different texts, different vectors.
    const auto c = model->embed({tokens(texts[0])});
    EXPECT_GT(max_difference(a[0], c[0]), 1e-3f);
}

// llama-server's embd_normalize: -1 leaves the pooled vector as it is; 2 divides it by its Euclidean norm.
TEST_F(embedder_test, normalisation_is_llama_servers) {
    const auto raw = model->embed({tokens(texts[2])}, -1);
    const auto unit = model->embed({tokens(texts[2])}, euclidean_norm);
    const double n = norm(raw[0]);
    EXPECT_GT(std::fabs(n - 1.0), 1e-3);
    for (size_t i = 0; i < raw[0].size(); ++i) EXPECT_NEAR(raw[0][i] / n, unit[0][i], 1e-6);
    const auto max_abs = model->embed({tokens(texts[2])}, 0);
    float top = 0;
    for (const float x : max_abs[0]) top = std::max(top, std::fabs(x));
    EXPECT_NEAR(top, 32760.0f, 0.5f);
}

// Several inputs go through one llama_decode as sequences of their own; each equals its vector computed alone within
// batch_tolerance: ggml's CPU flash attention takes a tiled path from 64 rows of a batch on and a row-by-row one
// below, which round differently (up to 2.5e-3 on these unit vectors of random weights; 0 with flash attention off,
// see below). llama-server, flash attention on by default, has the same.
constexpr float batch_tolerance = 5e-3f;
TEST_F(embedder_test, a_batch_of_n_equals_n_singles) {
    std::vector<std::vector<llama_token>> inputs;
    for (const auto& t : texts) inputs.push_back(tokens(t));
    const auto before = model->stats();
    const auto batch = model->embed(inputs);
    EXPECT_EQ(model->stats().decodes - before.decodes, 1u) << "six short inputs fit one batch";
    ASSERT_EQ(batch.size(), texts.size());
    for (size_t i = 0; i < texts.size(); ++i) {
        const auto single = model->embed({inputs[i]});
        EXPECT_LT(max_difference(batch[i], single[0]), batch_tolerance) << texts[i];
    }
}

// Without flash attention the batch shape changes only the order of the matrix kernels' sums over the weights, the
// same for every row: a batch of 12 copies (132 rows, past the 64-row tile) gives the single vector.
TEST(embedder_without_flash_attention, a_batch_equals_singles_closely) {
    embedder_options o;
    o.model_path = embed_model();
    o.context_size = 256;
    o.batch_size = 512;
    o.threads = 1;
    o.flash_attn = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    embedder m(o);
    const auto t = common_tokenize(m.vocab(), texts[1], true, true);
    const auto single = m.embed({t});
    const auto batch = m.embed(std::vector<std::vector<llama_token>>(12, t));
    for (const auto& v : batch) EXPECT_LT(max_difference(v, single[0]), 1e-5f);
}

// A request of more inputs than one batch holds is cut into batches of max_sequences inputs: 40 inputs, 3 calls.
TEST_F(embedder_test, many_inputs_take_batches_of_max_sequences) {
    std::vector<std::vector<llama_token>> inputs;
    for (int i = 0; i < 40; ++i) inputs.push_back(tokens("input number " + std::to_string(i)));
    const auto before = model->stats();
    const auto vectors = model->embed(inputs);
    ASSERT_EQ(vectors.size(), 40u);
    EXPECT_EQ(model->stats().decodes - before.decodes, 3u);
    EXPECT_EQ(model->stats().inputs - before.inputs, 40u);
    const auto alone = model->embed({inputs[37]});
    EXPECT_LT(max_difference(vectors[37], alone[0]), batch_tolerance);
}

// Requests from several threads at once share batches; each still gets its own inputs' vectors, in order.
TEST_F(embedder_test, concurrent_requests_get_their_own_vectors) {
    std::vector<std::vector<float>> expected;
    for (const auto& t : texts) expected.push_back(model->embed({tokens(t)})[0]);
    std::vector<std::vector<std::vector<float>>> got(texts.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < texts.size(); ++i) {
        threads.emplace_back([&, i] {
            got[i] = model->embed({tokens(texts[i]), tokens(texts[(i + 1) % texts.size()])});
        });
    }
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < texts.size(); ++i) {
        ASSERT_EQ(got[i].size(), 2u);
        EXPECT_LT(max_difference(got[i][0], expected[i]), batch_tolerance);
        EXPECT_LT(max_difference(got[i][1], expected[(i + 1) % texts.size()]), batch_tolerance);
    }
}

TEST_F(embedder_test, bad_inputs_are_refused_before_llama_cpp) {
    auto status_of = [](const std::vector<std::vector<llama_token>>& inputs) {
        try {
            model->embed(inputs);
        } catch (const request_error& e) {
            return e.status;
        }
        return 200;
    };
    EXPECT_EQ(status_of({{}}), 400);                                         // empty input
    EXPECT_EQ(status_of({std::vector<llama_token>(513, 100)}), 400);         // over the context
    EXPECT_EQ(status_of({{1, 2, -5}}), 400);                                 // negative id
    EXPECT_EQ(status_of({{1, llama_vocab_n_tokens(model->vocab())}}), 400);  // outside the vocab
    EXPECT_EQ(status_of({std::vector<llama_token>(512, 100)}), 200);         // the context exactly
    EXPECT_TRUE(model->embed({}).empty());
    // The embedder still serves.
    EXPECT_EQ(model->embed({tokens("still here")}).size(), 1u);
}

TEST_F(embedder_test, a_client_that_left_gets_nothing_and_the_rest_go_on) {
    std::vector<std::vector<llama_token>> inputs(64, tokens(texts[4]));
    const auto gone = model->embed(inputs, euclidean_norm, [] { return true; });
    EXPECT_TRUE(gone.empty());
    EXPECT_EQ(model->embed({tokens("next")}).size(), 1u);
}

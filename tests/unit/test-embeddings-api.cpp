// The embedding requests and answers of OpenAI, Ollama and llama-server: every input shape each accepts, every bad
// one a 400 naming the field, and the answers' exact fields.
#include <gtest/gtest.h>

#include <cstring>

#include "api/embeddings-api.h"
#include "base/request-error.h"

using namespace keepwarm;
using namespace keepwarm::api;
using json = nlohmann::ordered_json;

namespace {

template <typename Request>
int status_of(Request (*parse)(const json&), const json& body) {
    try {
        parse(body);
    } catch (const request_error& e) {
        return e.status;
    }
    return 200;
}

}  // namespace

TEST(embeddings_api, openai_takes_its_four_input_shapes) {
    auto one = parse_openai_embedding_request({{"input", "hello"}});
    ASSERT_EQ(one.inputs.size(), 1u);
    EXPECT_EQ(one.inputs[0][0].text, "hello");
    EXPECT_EQ(one.answer, embedding_answer::openai);

    auto strings = parse_openai_embedding_request({{"input", {"a", "b", "c"}}});
    ASSERT_EQ(strings.inputs.size(), 3u);
    EXPECT_EQ(strings.inputs[2][0].text, "c");

    auto ids = parse_openai_embedding_request({{"input", {1, 2, 3}}});
    ASSERT_EQ(ids.inputs.size(), 1u);
    ASSERT_EQ(ids.inputs[0].size(), 3u);
    EXPECT_EQ(ids.inputs[0][1].token, 2);

    auto id_arrays = parse_openai_embedding_request({{"input", {{1, 2}, {3}}}});
    ASSERT_EQ(id_arrays.inputs.size(), 2u);
    EXPECT_EQ(id_arrays.inputs[1][0].token, 3);

    // llama-server's mixed input: text and ids in one input.
    auto mixed = parse_openai_embedding_request({{"input", {"a", 5}}});
    ASSERT_EQ(mixed.inputs.size(), 1u);
    EXPECT_EQ(mixed.inputs[0][1].token, 5);
}

TEST(embeddings_api, openai_options) {
    EXPECT_TRUE(parse_openai_embedding_request({{"input", "x"}, {"encoding_format", "base64"}}).base64);
    EXPECT_FALSE(parse_openai_embedding_request({{"input", "x"}, {"encoding_format", "float"}}).base64);
    EXPECT_EQ(parse_openai_embedding_request({{"input", "x"}, {"dimensions", 64}}).dimensions, 64);
    // llama-server's "content" answers in its native shape.
    EXPECT_EQ(parse_openai_embedding_request({{"content", "x"}}).answer, embedding_answer::native);
}

TEST(embeddings_api, bad_openai_requests_are_400) {
    const auto p = parse_openai_embedding_request;
    EXPECT_EQ(status_of(p, json::object()), 400);
    EXPECT_EQ(status_of(p, {{"input", 5}}), 400);
    EXPECT_EQ(status_of(p, {{"input", json::array()}}), 400);
    EXPECT_EQ(status_of(p, {{"input", {{1, -2}}}}), 400);
    EXPECT_EQ(status_of(p, {{"input", {1, 2.5}}}), 400);
    EXPECT_EQ(status_of(p, {{"input", {1, 4294967296LL}}}), 400);
    EXPECT_EQ(status_of(p, {{"input", {json::object()}}}), 400);
    EXPECT_EQ(status_of(p, {{"input", "x"}, {"encoding_format", "int8"}}), 400);
    EXPECT_EQ(status_of(p, {{"input", "x"}, {"dimensions", 0}}), 400);
    EXPECT_EQ(status_of(p, {{"input", "x"}, {"dimensions", "64"}}), 400);
    EXPECT_EQ(status_of(p, {{"input", json(std::vector<std::string>(max_embedding_inputs + 1, "a"))}}), 400);
    EXPECT_EQ(status_of(p, {{"input", json(std::vector<std::string>(max_embedding_inputs, "a"))}}), 200);
    EXPECT_EQ(status_of(parse_native_embedding_request, {{"content", "x"}, {"embd_normalize", 99}}), 400);
}

TEST(embeddings_api, ollama_embed_and_legacy) {
    auto embed = parse_ollama_embed_request({{"model", "m"}, {"input", {"a", "b"}}});
    EXPECT_EQ(embed.inputs.size(), 2u);
    EXPECT_TRUE(embed.truncate);  // Ollama's default
    EXPECT_FALSE(parse_ollama_embed_request({{"input", "a"}, {"truncate", false}}).truncate);
    EXPECT_TRUE(parse_ollama_embed_request({{"model", "m"}}).inputs.empty());
    EXPECT_EQ(status_of(parse_ollama_embed_request, {{"input", {1, 2}}}), 400);
    EXPECT_EQ(status_of(parse_ollama_embed_request, {{"input", "a"}, {"options", 3}}), 400);

    auto legacy = parse_ollama_legacy_embedding_request({{"model", "m"}, {"prompt", "hello"}});
    ASSERT_EQ(legacy.inputs.size(), 1u);
    EXPECT_EQ(legacy.normalize, -1);
    EXPECT_TRUE(parse_ollama_legacy_embedding_request({{"prompt", ""}}).inputs.empty());
    EXPECT_EQ(status_of(parse_ollama_legacy_embedding_request, {{"prompt", 1}}), 400);
}

TEST(embeddings_api, answers_in_each_apis_shape) {
    embedding_result r;
    r.vectors = {{1.0f, 0.0f}, {0.0f, -1.0f}};
    r.input_tokens = {3, 4};
    r.total_ns = 12345;

    const json openai = openai_embeddings_json("m", r, false);
    EXPECT_EQ(openai["object"], "list");
    EXPECT_EQ(openai["model"], "m");
    EXPECT_EQ(openai["data"][1]["object"], "embedding");
    EXPECT_EQ(openai["data"][1]["index"], 1);
    EXPECT_EQ(openai["data"][1]["embedding"][1], -1.0);
    EXPECT_EQ(openai["usage"]["prompt_tokens"], 7);
    EXPECT_EQ(openai["usage"]["total_tokens"], 7);

    const json native = native_embeddings_json(r);
    EXPECT_EQ(native[1]["index"], 1);
    EXPECT_EQ(native[1]["embedding"][0][1], -1.0);  // one pooled vector in an array, as llama-server

    const json ollama = ollama_embed_json("m:latest", r);
    EXPECT_EQ(ollama["embeddings"][0][0], 1.0);
    EXPECT_EQ(ollama["prompt_eval_count"], 7);
    EXPECT_EQ(ollama["total_duration"], 12345);
    EXPECT_EQ(ollama_legacy_embedding_json(r)["embedding"].size(), 2u);
}

TEST(embeddings_api, base64_is_little_endian_float32) {
    EXPECT_EQ(base64_floats({}), "");
    EXPECT_EQ(base64_floats({1.0f}), "AACAPw==");             // 00 00 80 3f
    EXPECT_EQ(base64_floats({1.0f, -2.0f}), "AACAPwAAAMA=");  // ... 00 00 00 c0
    EXPECT_EQ(base64_floats({0.0f, 0.0f, 0.0f}), "AAAAAAAAAAAAAAAA");
}

TEST(embeddings_api, dimensions_shorten_and_renormalise) {
    std::vector<std::vector<float>> v = {{3.0f, 4.0f, 12.0f}};
    shorten_embeddings(v, 2);
    ASSERT_EQ(v[0].size(), 2u);
    EXPECT_NEAR(v[0][0], 0.6f, 1e-6);
    EXPECT_NEAR(v[0][1], 0.8f, 1e-6);
    std::vector<std::vector<float>> w = {{1.0f, 0.0f}};
    EXPECT_THROW(shorten_embeddings(w, 3), request_error);
}

TEST(embeddings_api, rerank_requests_and_answers) {
    auto jina = parse_rerank_request({{"query", "q"}, {"documents", {"a", "b", "c"}}, {"top_n", 2}});
    EXPECT_EQ(jina.documents.size(), 3u);
    EXPECT_EQ(jina.top_n, 2u);
    EXPECT_FALSE(jina.tei);
    const json answer = rerank_json("m", jina, {0.1f, 0.9f, 0.5f}, 30);
    EXPECT_EQ(answer["object"], "list");
    EXPECT_EQ(answer["usage"]["prompt_tokens"], 30);
    ASSERT_EQ(answer["results"].size(), 2u);  // top_n, the best first
    EXPECT_EQ(answer["results"][0]["index"], 1);
    EXPECT_EQ(answer["results"][1]["index"], 2);
    EXPECT_TRUE(answer["results"][0].contains("relevance_score"));

    auto tei = parse_rerank_request({{"query", "q"}, {"texts", {"a", "b"}}, {"return_text", true}});
    EXPECT_TRUE(tei.tei);
    EXPECT_EQ(tei.top_n, 2u);  // all by default
    const json tei_answer = rerank_json("m", tei, {0.2f, 0.7f}, 10);
    ASSERT_TRUE(tei_answer.is_array());
    EXPECT_EQ(tei_answer[0]["index"], 1);
    EXPECT_EQ(tei_answer[0]["text"], "b");
    EXPECT_TRUE(tei_answer[0].contains("score"));
    EXPECT_EQ(parse_rerank_request({{"query", "q"}, {"documents", {"a"}}, {"top_n", 99}}).top_n, 1u);

    const auto p = parse_rerank_request;
    EXPECT_EQ(status_of(p, {{"documents", {"a"}}}), 400);
    EXPECT_EQ(status_of(p, {{"query", 1}, {"documents", {"a"}}}), 400);
    EXPECT_EQ(status_of(p, {{"query", "q"}, {"documents", json::array()}}), 400);
    EXPECT_EQ(status_of(p, {{"query", "q"}, {"documents", {"a", 2}}}), 400);
    EXPECT_EQ(status_of(p, {{"query", "q"}, {"documents", {"a"}}, {"top_n", -1}}), 400);
    EXPECT_EQ(status_of(p, {{"query", "q"}, {"documents", json(std::vector<std::string>(2049, "a"))}}), 400);
}

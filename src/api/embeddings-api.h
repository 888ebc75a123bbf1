// The embedding requests and answers of the three APIs, as each speaks them: OpenAI's POST /v1/embeddings, Ollama's
// POST /api/embed and legacy /api/embeddings, llama-server's POST /embedding and /embeddings (its pinned source:
// tools/server/server-context.cpp handle_embeddings_impl, server-common.cpp format_embeddings_response_oaicompat).
// Pure functions: no model, no engine. Bad input throws keepwarm::request_error(400, message naming the field).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/chat-request.h"

namespace keepwarm::api {

using json = nlohmann::ordered_json;

// The most inputs one request may embed (OpenAI's limit), and the most tokens they may have together (OpenAI's
// 300,000 per request; each input is also held to the server's context).
inline constexpr size_t max_embedding_inputs = 2048;
inline constexpr size_t max_embedding_request_tokens = 300000;
// The most elements (token ids and strings) one input given as an array may have: more than any context holds.
inline constexpr size_t max_prompt_pieces_per_input = size_t{1} << 20;

// Which answer a request gets: each route's own, except that llama-server's /v1/embeddings with "content" instead of
// "input" answers in its native shape.
enum class embedding_answer { openai, native, ollama_embed, ollama_legacy };

struct embedding_request {
    std::string model;  // as the client named it ("": none)
    // Each input's pieces: a text input is one text piece; token ids are pieces of one id each (checked against the
    // vocab by whoever has one). Text is tokenized with the vocab's special tokens (BOS/EOS where the model adds
    // them) when it comes first in its input, as llama-server's tokenize_mixed.
    std::vector<std::vector<prompt_piece>> inputs;
    embedding_answer answer = embedding_answer::openai;
    bool base64 = false;                // OpenAI encoding_format "base64": little-endian float32, base64
    std::optional<int64_t> dimensions;  // OpenAI, Ollama: the first N values of each vector, normalised again
    bool truncate = false;              // Ollama (its default: true): an input over the context is cut to it
    int normalize = 2;                  // llama-server's embd_normalize (-1 none, 0 max-abs, 2 Euclidean, p > 2)
};

// POST /v1/embeddings: `input` a string, an array of strings, an array of token ids or an array of arrays of token
// ids (and llama-server's mixed arrays); `encoding_format` float or base64; `dimensions`. llama-server's "content"
// in place of "input" makes the answer its native one.
embedding_request parse_openai_embedding_request(const json& body);
// POST /embedding, /embeddings (llama-server): `input` or `content` as above, `embd_normalize`.
embedding_request parse_native_embedding_request(const json& body);
// POST /api/embed (Ollama): `input` a string or an array of strings (none or empty: no embeddings), `truncate`
// (default true), `dimensions`; `options` and `keep_alive` are accepted and not used.
embedding_request parse_ollama_embed_request(const json& body);
// POST /api/embeddings (Ollama's legacy): `prompt` a string (empty: an empty embedding), not normalised, as Ollama.
embedding_request parse_ollama_legacy_embedding_request(const json& body);

// What the server computed for one request.
struct embedding_result {
    std::vector<std::vector<float>> vectors;  // one per input, in order
    std::vector<int> input_tokens;            // tokens each input was computed with
    int64_t total_ns = 0;                     // from the request's arrival to its answer (Ollama's total_duration)
};

// The first `dimensions` values of each vector, normalised again to unit length (Matryoshka embeddings; what OpenAI
// and Ollama do with `dimensions`). 400 unless 1 <= dimensions <= the vectors' size.
void shorten_embeddings(std::vector<std::vector<float>>& vectors, int64_t dimensions);

// OpenAI's list: {object: "list", data: [{object: "embedding", index, embedding}], model, usage: {prompt_tokens,
// total_tokens}}; base64: each embedding the float32 bytes in base64.
json openai_embeddings_json(const std::string& model, const embedding_result& r, bool base64);
// llama-server's native answer: [{index, embedding: [[...]]}] (one pooled vector per input).
json native_embeddings_json(const embedding_result& r);
// Ollama's /api/embed: {model, embeddings, total_duration, load_duration, prompt_eval_count}.
json ollama_embed_json(const std::string& model, const embedding_result& r);
// Ollama's /api/embeddings: {embedding}.
json ollama_legacy_embedding_json(const embedding_result& r);

// llama-server's POST /rerank (and /reranking, /v1/rerank, /v1/reranking): a query and documents, answered in Jina's
// shape, or TEI's when the documents come as `texts`.
struct rerank_request {
    std::string model;
    std::string query;
    std::vector<std::string> documents;
    size_t top_n = 0;          // results kept, the best first (default: all)
    bool tei = false;          // `texts` given: TEI's answer, [{index, score, text?}]
    bool return_text = false;  // TEI: each result carries its document
};
// `query` a string; `documents` (or `texts`) a non-empty array of strings, at most max_embedding_inputs; `top_n` an
// integer of at least 0.
rerank_request parse_rerank_request(const json& body);
// The results sorted by score, the best first, cut to top_n: Jina's {model, object: "list", usage: {prompt_tokens,
// total_tokens}, results: [{index, relevance_score}]}, or TEI's array (llama-server's format_response_rerank).
json rerank_json(const std::string& model, const rerank_request& req, const std::vector<float>& scores,
                 int prompt_tokens);

// The bytes of `values` (little-endian float32) in base64, as OpenAI's encoding_format "base64".
std::string base64_floats(const std::vector<float>& values);

}  // namespace keepwarm::api

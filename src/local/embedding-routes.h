// `keepwarm serve` on an embedding model: the embedding routes of the three APIs over the embedder, each in its API's
// shape (OpenAI's POST /v1/embeddings; llama-server's POST /embedding and /embeddings; Ollama's POST /api/embed and
// legacy /api/embeddings), GET /health and GET /metrics (the embedder's counters). A chat server answers the same
// paths with a 400 in their API's shape (register_embedding_refusals), and an embedding server its chat routes (the
// openers below).
// Threading: handlers run on their connection's thread; they tokenize there and wait for the embedder's thread.
#pragma once

#include <string>

#include "backend/frontend-context.h"
#include "backend/generation-source.h"
#include "engine/embedder.h"
#include "http/http-server.h"

namespace keepwarm {

// The embedding routes over `model` (which outlives the server's routes). Inputs are bounded: at most
// api::max_embedding_inputs inputs and api::max_embedding_request_tokens tokens in one request, each input within the
// embedder's context (Ollama's `truncate`, its default, cuts a longer one to it); anything else is a 400.
void register_embedding_routes(http::http_server& server, const frontend_context& ctx, embedder& model);

// On a chat server: the embedding paths answer a 400 in their API's shape saying the model makes no embeddings.
void register_embedding_refusals(http::http_server& server, const std::string& model_id);

// On an embedding server: what the chat, completion and count_tokens routes get in place of a generation, a 400 in
// their API's shape saying the model is an embedding model.
generation_opener chat_refused(const std::string& model_id);
raw_generation_opener raw_completion_refused(const std::string& model_id);
token_counter token_count_refused(const std::string& model_id);

}  // namespace keepwarm

// The local model as Ollama's /api/tags, /api/show and /api/ps describe it (api::ollama::model_card), read once at
// start-up from the loaded model, its chat template and its GGUF file's header; routes/ollama-routes.h serves it.
#pragma once

#include <string>

#include "api/ollama-api.h"
#include "chat/chat-renderer.h"
#include "engine/embedder.h"
#include "engine/engine.h"

namespace keepwarm {

// What /api/tags, /api/show and /api/ps report about a local model, read once: the loaded model's own numbers and
// the GGUF file's metadata (its header only; the model is not loaded again).
api::ollama::model_card make_model_card(const engine& llm, const chat_renderer& renderer, const std::string& model_path,
                                        const std::string& model_id);

// The same for an embedding model: capabilities ["embedding"], no chat template, the context of one input.
api::ollama::model_card make_embedding_model_card(const embedder& model, const std::string& model_path,
                                                  const std::string& model_id);

}  // namespace keepwarm

// The Ollama API: POST /api/chat, /api/generate and /api/show; GET /api/tags, /api/ps and /api/version; GET and
// HEAD / ("Ollama is running", which clients probe). Errors in Ollama's shape, {"error": "..."}.
#pragma once

#include "http/http-server.h"
#include "local/chat-generation.h"
#include "routes/server-context.h"

namespace keepwarm {

// Reads what /api/tags, /api/show and /api/ps report about the model once, here: the loaded model's own numbers and
// the GGUF file's metadata (its header only; the model is not loaded again).
// Chat and generate requests go to `open` (default: this server's engine). Without a local engine (ctx.llm null:
// `keepwarm proxy`) /api/tags lists ctx.model_id alone, and what needs the local model (raw /api/generate, /api/show,
// /api/ps) answers 501.
void register_ollama_routes(http::http_server& server, server_context& ctx, generation_opener open = nullptr);

}  // namespace keepwarm

// What only `keepwarm serve` has: the loaded model's engine, its chat renderer and prompt tokenizers (one shared, one
// per isolated tenant), and the model file. The frontend's side (policy, counters, model name) is
// backend/frontend-context.h. Built once by the serve command; read-only afterwards (the engine and the prompt
// tokenizers are thread-safe themselves).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "chat/chat-renderer.h"
#include "chat/prompt-tokenizer.h"
#include "engine/engine.h"

namespace keepwarm {

namespace events {
class kv_event_publisher;
}  // namespace events

struct local_model {
    std::unique_ptr<engine> llm;
    std::unique_ptr<chat_renderer> renderer;
    std::unique_ptr<prompt_tokenizer> tokenizer;  // over the engine's vocab; knows what the model saw and wrote
    // Tenants (--api-keys-file): each has its own prompt index, so the ids a prompt is given (and the token counts a
    // client reads) never depend on what another tenant's model answered. Filled at start-up, read-only afterwards.
    std::map<std::string, std::unique_ptr<prompt_tokenizer>> tenant_tokenizers;
    std::string model_path;
    // What a request's unset sampling fields take (--temp, --top-k, --top-p, --min-p; else llama.cpp's defaults).
    common_params_sampling default_sampling;
    bool random_weights = false;  // generated test model: output is noise
    // serve --kv-events: the publisher the engine's prefix cache reports its blocks to (owned by the command, which
    // keeps it alive past the engine); null when off.
    const events::kv_event_publisher* kv_events = nullptr;

    // The prompt tokenizer of a tenant's requests ("": the shared one). Throws std::out_of_range for a tenant that
    // was not set up at start-up (a bug: falling back to another index would share it).
    prompt_tokenizer& tokenizer_for(const std::string& tenant) const {
        return tenant.empty() ? *tokenizer : *tenant_tokenizers.at(tenant);
    }
};

}  // namespace keepwarm

// What every route handler needs: the engine, the chat renderer, the prompt tokenizer, the policy, the served model's
// name and settings. Built once by `keepwarm serve`; read-only afterwards except for the atomic counters, the prompt
// tokenizer and the policy's span rules (both thread-safe themselves).
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "chat/chat-renderer.h"
#include "chat/prompt-tokenizer.h"
#include "engine/engine.h"
#include "policy/busters.h"
#include "policy/policy.h"

namespace keepwarm {

struct http_counters {
    std::atomic<uint64_t> chat_completions{0};  // OpenAI
    std::atomic<uint64_t> completions{0};       // OpenAI, raw prompt
    std::atomic<uint64_t> messages{0};          // Anthropic
    std::atomic<uint64_t> ollama_chats{0};
    std::atomic<uint64_t> ollama_generates{0};
    std::atomic<uint64_t> client_errors{0};  // 4xx answered by the API routes
    std::atomic<uint64_t> disconnects{0};    // clients gone before their answer was complete
};

struct server_context {
    std::unique_ptr<engine> llm;
    std::unique_ptr<chat_renderer> renderer;
    std::unique_ptr<prompt_tokenizer> tokenizer;  // over the engine's vocab; knows what the model saw and wrote
    // What requests go through before rendering (--policy FILE); without a file it changes nothing but reports.
    std::unique_ptr<policy::request_policy> policy = std::make_unique<policy::request_policy>();
    std::string model_id;  // name reported by /v1/models and in responses
    std::string model_path;
    bool random_weights = false;  // generated test model: output is noise
    std::chrono::system_clock::time_point started = std::chrono::system_clock::now();
    http_counters http;
    std::unique_ptr<policy::cache_buster_detector> busters;  // per-client prompt comparison (GET /v1/cache/busters)

    // Tenants (--api-keys-file): each has its own prompt index, so the ids a prompt is given (and the token counts a
    // client reads) never depend on what another tenant's model answered. Filled at start-up, read-only afterwards.
    std::map<std::string, std::unique_ptr<prompt_tokenizer>> tenant_tokenizers;
    bool log_prompts = false;  // --log-prompts: log lines may quote prompt text (a divergence, a cache buster)
    bool reuse_report = true;  // --no-reuse-report turns it off: responses say nothing about what was reused

    // The prompt tokenizer of a tenant's requests ("": the shared one). Throws std::out_of_range for a tenant that
    // was not set up at start-up (a bug: falling back to another index would share it).
    prompt_tokenizer& tokenizer_for(const std::string& tenant) const {
        return tenant.empty() ? *tokenizer : *tenant_tokenizers.at(tenant);
    }
};

}  // namespace keepwarm

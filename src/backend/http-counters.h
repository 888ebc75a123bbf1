// The API routes' counters (requests per API, 4xx answers, clients gone early), served on /metrics by `keepwarm serve`
// and `keepwarm proxy` alike. Thread-safe: atomics, incremented by the routes' connection threads.
#pragma once

#include <atomic>
#include <cstdint>

#include "base/metrics-text.h"

namespace keepwarm {

struct http_counters {
    std::atomic<uint64_t> chat_completions{0};  // OpenAI
    std::atomic<uint64_t> completions{0};       // OpenAI, raw prompt
    std::atomic<uint64_t> responses{0};         // OpenAI Responses API
    std::atomic<uint64_t> messages{0};          // Anthropic
    std::atomic<uint64_t> ollama_chats{0};
    std::atomic<uint64_t> ollama_generates{0};
    std::atomic<uint64_t> client_errors{0};  // 4xx answered by the API routes
    std::atomic<uint64_t> disconnects{0};    // clients gone before their answer was complete
};

// The counters in Prometheus text.
void write_http_metrics(metrics_text& out, const http_counters& c);

}  // namespace keepwarm

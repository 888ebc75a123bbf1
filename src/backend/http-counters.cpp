// See http-counters.h.
#include "backend/http-counters.h"

namespace keepwarm {

void write_http_metrics(metrics_text& out, const http_counters& c) {
    out.counter("keepwarm_chat_completion_requests_total", "POST /v1/chat/completions requests (OpenAI)",
                c.chat_completions.load());
    out.counter("keepwarm_completion_requests_total", "POST /v1/completions requests (OpenAI, raw prompt)",
                c.completions.load());
    out.counter("keepwarm_responses_requests_total", "POST /v1/responses requests (OpenAI Responses API)",
                c.responses.load());
    out.counter("keepwarm_messages_requests_total", "POST /v1/messages requests (Anthropic)", c.messages.load());
    out.counter("keepwarm_ollama_chat_requests_total", "POST /api/chat requests (Ollama)", c.ollama_chats.load());
    out.counter("keepwarm_ollama_generate_requests_total", "POST /api/generate requests (Ollama)",
                c.ollama_generates.load());
    out.counter("keepwarm_client_errors_total", "Requests answered with a 4xx", c.client_errors.load());
    out.counter("keepwarm_client_disconnects_total", "Clients gone before their answer was complete",
                c.disconnects.load());
}

}  // namespace keepwarm

// Fuzz target: an Ollama request body (POST /api/chat, /api/generate, /api/show) through the parsers the routes
// call. A bad body must come back as a 4xx, never as a crash or another exception.
#include "api/ollama-api.h"
#include "fuzz-support.h"

using namespace keepwarm;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const auto body = fuzz::request_body(data, size);
    if (!body) return 0;
    fuzz::expect_accepted_or_4xx("ollama::parse_chat_request", [&] {
        const chat_request chat = api::ollama::parse_chat_request(*body);
        validate_sampling(chat.sampling);
    });
    fuzz::expect_accepted_or_4xx("ollama::parse_generate_request", [&] {
        const api::ollama::generate_request generate = api::ollama::parse_generate_request(*body);
        validate_sampling(generate.chat.sampling);
    });
    fuzz::expect_accepted_or_4xx("ollama::parse_show_request", [&] { api::ollama::parse_show_request(*body); });
    return 0;
}

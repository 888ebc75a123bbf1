// Fuzz target: an OpenAI request body (POST /v1/chat/completions, /v1/completions) through the parsers the routes
// call. A bad body must come back as a 4xx, never as a crash or another exception.
#include "api/openai-api.h"
#include "fuzz-support.h"

using namespace keepwarm;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const auto body = fuzz::request_body(data, size);
    if (!body) return 0;
    fuzz::expect_accepted_or_4xx("parse_chat_request", [&] {
        const chat_request chat = api::parse_chat_request(*body);
        validate_sampling(chat.sampling);
    });
    fuzz::expect_accepted_or_4xx("parse_completion_request", [&] {
        const completion_request completion = api::parse_completion_request(*body);
        validate_sampling(completion.sampling);
    });
    return 0;
}

// Fuzz target: an Anthropic request body (POST /v1/messages, /v1/messages/count_tokens) through the parser the routes
// call. A bad body must come back as a 4xx, never as a crash or another exception.
#include "api/anthropic-api.h"
#include "fuzz-support.h"

using namespace keepwarm;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const auto body = fuzz::request_body(data, size);
    if (!body) return 0;
    fuzz::expect_accepted_or_4xx("anthropic::parse_messages_request", [&] {
        const chat_request chat = api::anthropic::parse_messages_request(*body);
        validate_sampling(chat.sampling);
    });
    fuzz::expect_accepted_or_4xx("anthropic::parse_messages_request(count_tokens)", [&] {
        api::anthropic::parse_messages_request(*body, api::anthropic::endpoint::count_tokens);
    });
    return 0;
}

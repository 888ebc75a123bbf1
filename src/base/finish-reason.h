// How a generation ended: a word every layer shares, from the engine that decides it to the routes that write it in
// each API's terms (OpenAI's finish_reason, Anthropic's stop_reason, Ollama's done_reason) and a proxied upstream's
// answer read back into it.
#pragma once

namespace keepwarm {

enum class finish_reason { stop, length, cancelled, error };

// "stop", "length", "cancelled", "error": the log's word for it.
constexpr const char* finish_reason_name(finish_reason reason) {
    switch (reason) {
        case finish_reason::stop:
            return "stop";
        case finish_reason::length:
            return "length";
        case finish_reason::cancelled:
            return "cancelled";
        case finish_reason::error:
            return "error";
    }
    return "error";
}

}  // namespace keepwarm

// Fuzz target: a KV-events message as an upstream of `keepwarm proxy` publishes it (kv-event-message.h), decoded and
// applied to the proxy's block index. The input is the sequence frame (its first 8 bytes) and the msgpack payload
// (the rest); a message that is not the format must be refused with its reason, never crash, and the index must stay
// within its bound whatever the events say.
#include <string>
#include <string_view>

#include "fuzz-support.h"
#include "proxy/kv-block-index.h"
#include "proxy/kv-event-message.h"

using namespace keepwarm;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 8) return 0;
    const std::string_view text = fuzz::as_text(data, size);
    const std::string_view frames[] = {"kv@fuzz@model", text.substr(0, 8), text.substr(8)};
    std::string error;
    const auto m = proxy::decode_kv_event_message(frames, error);
    if (!m) {
        if (error.empty()) fuzz::finding("a refused message has no reason");
        return 0;
    }
    proxy::kv_block_index index(1, 64);
    // Twice: the first as the start of a stream, the second as a repeat the index must ignore or take as a restart.
    index.apply(0, *m);
    index.apply(0, *m);
    const auto s = index.stats(0);
    size_t held = 0;
    for (const size_t n : s.blocks) held += n;
    if (held > 3 * 64) fuzz::finding("the index holds more blocks than its bound");
    return 0;
}

// Fuzz target: what an upstream engine sends `keepwarm proxy` back, in one dialect (KEEPWARM_FUZZ_DIALECT: openai,
// anthropic or ollama; one executable each). The stream decoder reads it whole, in uneven pieces and line by line as a
// socket may deliver it, and must build the same message each time, with deltas that add up to that message; the error
// and listing parsers read the same bytes as an error answer and a health answer.
#include <string>
#include <vector>

#include "fuzz-support.h"
#include "proxy/upstream-dialects.h"

using namespace keepwarm;

namespace {

#define KEEPWARM_FUZZ_STR2(x) #x
#define KEEPWARM_FUZZ_STR(x) KEEPWARM_FUZZ_STR2(x)
const proxy::upstream_dialect dialect = proxy::parse_dialect(KEEPWARM_FUZZ_STR(KEEPWARM_FUZZ_DIALECT));

struct decoded {
    common_chat_msg message;  // what the decoder built
    common_chat_msg relayed;  // what a streaming client rebuilds from the deltas
    bool done = false;
    std::string error;
    bool threw = false;
};

void apply(common_chat_msg& msg, const common_chat_msg_diff& diff) {
    msg.reasoning_content += diff.reasoning_content_delta;
    msg.content += diff.content_delta;
    if (diff.tool_call_index == std::string::npos) return;
    if (diff.tool_call_index >= msg.tool_calls.size()) msg.tool_calls.resize(diff.tool_call_index + 1);
    common_chat_tool_call& call = msg.tool_calls[diff.tool_call_index];
    if (!diff.tool_call_delta.name.empty()) call.name = diff.tool_call_delta.name;
    if (!diff.tool_call_delta.id.empty()) call.id = diff.tool_call_delta.id;
    call.arguments += diff.tool_call_delta.arguments;
}

// Feeds `bytes` in pieces of the given sizes (cycled); one piece of everything when `pieces` is empty.
decoded decode(std::string_view bytes, const std::vector<size_t>& pieces) {
    decoded out;
    proxy::stream_decoder decoder(dialect);
    out.relayed.role = "assistant";
    try {
        for (size_t at = 0, i = 0; at < bytes.size(); ++i) {
            const size_t n = pieces.empty() ? bytes.size() : std::min(pieces[i % pieces.size()], bytes.size() - at);
            for (const auto& diff : decoder.push(bytes.substr(at, n))) apply(out.relayed, diff);
            at += n;
        }
    } catch (const std::exception& e) {
        fuzz::finding(std::string("stream_decoder::push threw (the proxy's data path must not): ") + e.what());
        out.threw = true;
    }
    out.message = decoder.message();
    out.done = decoder.done();
    out.error = decoder.error();
    return out;
}

// Ollama's decoder makes up ids for calls that came without one: compare those by presence only.
bool same_calls(const common_chat_msg& a, const common_chat_msg& b) {
    if (a.tool_calls.size() != b.tool_calls.size()) return false;
    for (size_t i = 0; i < a.tool_calls.size(); ++i) {
        const auto &x = a.tool_calls[i], &y = b.tool_calls[i];
        const bool ids_match = dialect == proxy::upstream_dialect::ollama ? x.id.empty() == y.id.empty() : x.id == y.id;
        if (x.name != y.name || x.arguments != y.arguments || !ids_match) return false;
    }
    return true;
}

bool same_message(const common_chat_msg& a, const common_chat_msg& b) {
    return a.content == b.content && a.reasoning_content == b.reasoning_content && same_calls(a, b);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view bytes = fuzz::as_text(data, size);
    const decoded whole = decode(bytes, {});
    // A handful of pieces, sized from the input's length, so that every input is also read split at awkward places
    // (inside "\r\n", a UTF-8 sequence, a JSON string) without thousands of pushes per input.
    const decoded split = decode(bytes, {1 + size % 7, size / 3 + 1, 2, size / 5 + 1});
    // And line by line, as a socket delivers an upstream that flushes each event: every event's deltas on their own.
    std::vector<size_t> lines;
    for (size_t at = 0; at < size;) {
        const size_t nl = bytes.find('\n', at);
        const size_t end = nl == std::string_view::npos ? size : nl + 1;
        lines.push_back(end - at);
        at = end;
    }
    const decoded by_line = decode(bytes, lines);
    if (!whole.threw && !split.threw && !by_line.threw) {
        for (const decoded* d : {&split, &by_line}) {
            if (!same_message(whole.message, d->message) || whole.done != d->done || whole.error != d->error)
                fuzz::finding("stream_decoder: the message depends on how the bytes were split");
        }
        if (!same_message(by_line.message, by_line.relayed))
            fuzz::finding(
                "stream_decoder: the deltas do not add up to the message (a streaming client gets another "
                "answer than a whole one)");
    }

    const std::string text(bytes);
    try {
        proxy::parse_error_body(text);
        proxy::upstream_request_error(500, text, "http://upstream");
        proxy::upstream_request_error(400, text, "http://upstream");
        proxy::parse_listing(dialect, text);
    } catch (const std::exception& e) {
        fuzz::finding(std::string("upstream error/listing parser threw: ") + e.what());
    }
    try {
        proxy::parse_count_answer(bytes);
    } catch (const std::invalid_argument&) {
        // its documented answer to another shape
    } catch (const std::exception& e) {
        fuzz::finding(std::string("parse_count_answer threw other than invalid_argument: ") + e.what());
    }
    return 0;
}

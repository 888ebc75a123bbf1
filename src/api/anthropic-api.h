// The Anthropic Messages API at the edge (POST /v1/messages, /v1/messages/count_tokens): request bodies -> the
// chat_request every API shares, and results -> Anthropic's message, stream-event and error JSON. Pure functions: no
// model, no engine. Bad input throws keepwarm::request_error(400, message naming the field).
//
// Requests, as keepwarm reads them:
// - system: a string or text blocks -> one system message (block fields other than text and cache_control ignored).
// - messages: user/assistant (and system, which Claude Code sends under a beta: before the first user/assistant
//   message it joins the system prompt, later it becomes a user turn, since most chat templates reject a system
//   message after the first), content a string or blocks. User text blocks stay one user message; each tool_result
//   becomes a "tool" message (tool_call_id = tool_use_id; is_error prefixes the text with "Error: "). Assistant text
//   -> content, thinking -> reasoning_content, tool_use -> a tool call whose arguments are the input as JSON text.
//   redacted_thinking is dropped: its data is ciphertext only Anthropic's models can read. image, document and
//   Anthropic's server-side blocks get a 400. The last message may be an empty or partial assistant turn (prefill).
// - tools: custom tools only; one with defer_loading true is left out (Anthropic loads it only through its tool
//   search, which keepwarm does not have). A server tool (a "type" such as web_search_20250305 or bash_20250124) gets a
//   400 naming it: keepwarm cannot run Anthropic's server tools, and silently dropping one would let the model answer
//   as if it had searched or run something.
// - tool_choice: auto -> auto, any -> required, tool -> required with the tool list narrowed to that tool (common has
//   no named choice), none -> none; disable_parallel_tool_use -> parallel_tool_calls false.
// - thinking: enabled (budget_tokens required, not enforced beyond max_tokens) and adaptive -> enable_thinking true;
//   disabled or absent -> false, Anthropic's default.
// - output_config.format (or the earlier beta's output_format) {type json_schema, schema} -> json_schema: the answer is
//   constrained to that JSON. output_config.effort, metadata, context_management: ignored.
// - cache_control breakpoints ({type ephemeral, ttl 5m or 1h}) on tools, system blocks, message blocks or the request
//   itself -> chat_request::hint: the prompt up to the end of the last marked message (tools and system: up to the
//   first message; the request: all of it), kept for the longest ttl asked. Anthropic caches only what is marked;
//   keepwarm caches everything, and keeps marked prefixes longer under memory pressure.
//
// Usage: Anthropic's whole prompt is input_tokens + cache_read_input_tokens + cache_creation_input_tokens (the SDK and
// Claude Code add the three up for the context size). keepwarm caches every prompt token it computes, so
//   cache_read_input_tokens     = prompt tokens reused from keepwarm's prefix cache (device, RAM or disk),
//   cache_creation_input_tokens = prompt tokens this request computed (cached from now on),
//   input_tokens                = the rest, always 0.
// keepwarm's own detail (reuse per tier, checkpoint, setup_ms, ...) is the response's `timings` object, the one the
// OpenAI routes send. A stream cannot know the split before the generation ends, so message_start counts the whole
// prompt as cache_creation_input_tokens and message_delta carries the final three numbers: the SDK overwrites its
// snapshot with them, and Claude Code, which keeps an earlier value when the later one is 0, ends with the same
// (input_tokens and cache reads start at 0, and at least the last prompt token is always computed).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "api/openai-api.h"
#include "chat.h"

namespace keepwarm::api::anthropic {

enum class endpoint { messages, count_tokens };

// The body of POST /v1/messages (max_tokens required) or /v1/messages/count_tokens (max_tokens not needed).
chat_request parse_messages_request(const json& body, endpoint kind = endpoint::messages);

// {"type":"error","error":{"type":...,"message":...}}; the type follows the status (400 invalid_request_error,
// 401 authentication_error, 403 permission_error, 404 not_found_error, 413 request_too_large, 429 rate_limit_error,
// 503/529 overloaded_error, other 5xx api_error). An http::error_formatter.
// A prompt over the context ("exceed_context_size_error") is worded as Anthropic words it, "prompt is too long:
// N tokens > M maximum", which Claude Code recognizes to compact its conversation.
std::string error_body(int status, const std::string& type, const std::string& message);
// keepwarm's "the prompt has N tokens but the context holds M ..." (the first two numbers) in Anthropic's words.
std::string context_error_message(const std::string& message);
json error_json(const std::string& error_type, const std::string& message);
std::string error_type_for_status(int status);

inline std::string gen_message_id() {
    return random_id("msg_");
}
// The tool_use id for a parsed tool call: keepwarm's own "call_" ids become Anthropic's "toolu_" form; an id the
// model wrote itself is kept.
std::string tool_use_id(const std::string& call_id);

// end_turn, max_tokens (the token limit cut the answer), stop_sequence (one of the request's stop_sequences ended
// it) or tool_use (the message has tool calls).
std::string stop_reason(const common_chat_msg& msg, bool hit_token_limit, bool hit_stop_sequence = false);

// The final usage (see the mapping above).
json message_usage_json(const usage_info& usage);

// Content blocks of a finished message, in Anthropic's order: thinking (signature ""), text, tool_use (input parsed
// from the arguments; {} when they are empty).
json content_json(const common_chat_msg& msg);

// The message object of a non-streamed answer. `model` is the name the client asked for, echoed like Anthropic does.
json message_json(const std::string& id, const std::string& model, const common_chat_msg& msg,
                  const std::string& stop_reason, const usage_info& usage,
                  const std::optional<timings_info>& timings = std::nullopt, const std::string& stop_sequence = "");

json count_tokens_json(int input_tokens);

// One server-sent event: "event: <name>\ndata: <json>\n\n".
struct stream_event {
    std::string name;
    json data;
};
std::string to_sse(const stream_event& event);

stream_event ping_event();
stream_event error_event(const std::string& error_type, const std::string& message);

// Anthropic's event sequence for one streamed message, built from the message deltas the output parser yields:
// message_start; per content block content_block_start, its deltas (text_delta, thinking_delta then a closing
// signature_delta, input_json_delta) and content_block_stop, in index order, a new block whenever the kind of delta
// changes; then message_delta (stop reason, usage) and message_stop. Not thread-safe; one per response.
class message_stream {
public:
    message_stream(std::string id, std::string model) : id_(std::move(id)), model_(std::move(model)) {}

    // message_start: the message with no content; usage counts the prompt's tokens as described above.
    stream_event start(int prompt_tokens) const;
    // The events for these deltas (possibly none).
    std::vector<stream_event> push(const std::vector<common_chat_msg_diff>& diffs);
    // Closes the open block and ends the message: content_block_stop, message_delta (with `timings` when given),
    // message_stop.
    // `stop_sequence`: the one that ended the answer, or "" (null).
    std::vector<stream_event> finish(const std::string& stop_reason, const usage_info& usage,
                                     const std::optional<timings_info>& timings = std::nullopt,
                                     const std::string& stop_sequence = "");

private:
    enum class block_kind { none, thinking, text, tool_use };

    void open(block_kind kind, std::vector<stream_event>& out);
    void close(std::vector<stream_event>& out);
    void open_pending_tool_use(std::vector<stream_event>& out);

    std::string id_;
    std::string model_;
    block_kind open_kind_ = block_kind::none;
    int index_ = -1;  // index of the open (or last) content block
    // A tool call whose name may still grow: its block starts once its arguments begin or another block comes.
    size_t tool_call_ = std::string::npos;  // parser index of the open or pending tool call
    bool tool_pending_ = false;
    std::string tool_id_;
    std::string tool_name_;
};

}  // namespace keepwarm::api::anthropic

// OpenAI-compatible request parsing (/v1/chat/completions, /v1/completions) and response/chunk JSON formatting.
// Pure functions: no model, no engine. Bad input throws keepwarm::request_error(400, message naming the field).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chat.h"
#include "chat/chat-request.h"
#include "common.h"

namespace keepwarm::api {

using json = nlohmann::ordered_json;

chat_request parse_chat_request(const json& body);
// The body's `tools`, a list of function tools [{type: "function", function: {name, description, parameters}}], as
// OpenAI's and Ollama's APIs send them; throws request_error 400 naming the field that is wrong.
std::vector<common_chat_tool> parse_function_tools(const json& body);
completion_request parse_completion_request(const json& body);
// `stop`: a string or an array of strings, at most max_stop_strings of max_stop_bytes; empty strings dropped.
std::vector<std::string> parse_stop(const json& body);
// llama-server's n_predict: -1 or missing is no request limit (nullopt), else a positive integer. Read by the Chat
// Completions and Completions parsers too, where it wins over max_tokens as in llama-server's oaicompat parsing.
std::optional<int> parse_n_predict(const json& body);
// llama-server's speculative decoding fields, flat keys as its schema spells them: "speculative.n_max" (an integer
// 0..max_request_draft_tokens; 0: no drafting), returned; "speculative.n_min" (0..max_request_draft_tokens) and
// "speculative.p_min" (0..1) are checked and not applied (the server's --draft-min stands; keepwarm's drafters do not
// weigh draft tokens by probability). `where` prefixes the field names in messages (Ollama's "options."). The pinned
// llama-server's schema (server-schema.cpp) holds these fields disabled, with n_max's meaning; keepwarm applies it.
// Shared by every API's parser.
std::optional<int> parse_speculative(const json& fields, const std::string& where = "");
// The sampling fields of an OpenAI body (temperature, top_p, min_p, top_k, penalties, seed, logit_bias, and
// llama-server's ignore_eos), checked; shared by the Chat Completions and Responses parsers.
sampling_options parse_sampling(const json& body);
// prompt_cache_key and prompt_cache_retention, checked: the key, and a hint that keeps the whole prompt cached (10
// minutes after its last use, or a day for "24h"). Shared by the Chat Completions and Responses parsers.
void parse_prompt_cache_key(const json& body, chat_request& req);

// Response ids in OpenAI's shapes (see random_id).
inline std::string gen_chat_completion_id() {
    return random_id("chatcmpl-");
}
inline std::string gen_completion_id() {
    return random_id("cmpl-");
}

json usage_json(const usage_info& usage);
json timings_json(const timings_info& timings);  // llama-server's field names

// "length" when the token limit cut the reply, else "tool_calls" when the message has tool calls, else "stop".
std::string chat_finish_reason(const common_chat_msg& msg, bool hit_token_limit);

// OpenAI assistant message: content (null when empty and tool calls present), reasoning_content when non-empty,
// tool_calls [{id, type, function{name, arguments}}].
json assistant_message_json(const common_chat_msg& msg);

// chat.completion object. finish_reason "stop" becomes "tool_calls" when msg has tool calls.
json chat_completion_json(const std::string& id, const std::string& model, int64_t created, const common_chat_msg& msg,
                          const std::string& finish_reason, const usage_info& usage,
                          const std::optional<timings_info>& timings = std::nullopt);

// One delta object for one diff (mirrors llama-server's common_chat_msg_diff_to_json_oaicompat): content /
// reasoning_content deltas, or tool_calls [{index, id+type (first fragment), function{name?, arguments?}}].
json chat_delta_json(const common_chat_msg_diff& diff);

// Array of chat.completion.chunk objects, one per diff. With first=true a role chunk
// ({"role":"assistant","content":null}) comes first, even when there are no diffs, so the client sees the role early.
json chat_chunk_json(const std::string& id, const std::string& model, int64_t created,
                     const std::vector<common_chat_msg_diff>& diffs, bool first = false);

// Closing chunk: empty delta + finish_reason ("stop" becomes "tool_calls" when final_msg has tool calls).
// llama-server puts timings on the last chunk: pass them here when there is no usage chunk.
json chat_final_chunk_json(const std::string& id, const std::string& model, int64_t created,
                           const common_chat_msg& final_msg, const std::string& finish_reason,
                           const std::optional<timings_info>& timings = std::nullopt);

// Usage chunk sent last when stream_options.include_usage: choices [] + usage (+ timings).
json chat_usage_chunk_json(const std::string& id, const std::string& model, int64_t created, const usage_info& usage,
                           const std::optional<timings_info>& timings = std::nullopt);

// text_completion object for /v1/completions.
json completion_json(const std::string& id, const std::string& model, int64_t created, const std::string& text,
                     const std::string& finish_reason, const usage_info& usage,
                     const std::optional<timings_info>& timings = std::nullopt);

// Streamed text_completion chunk; finish_reason null until the last one.
json completion_chunk_json(const std::string& id, const std::string& model, int64_t created, const std::string& text,
                           const std::optional<std::string>& finish_reason = std::nullopt,
                           const std::optional<timings_info>& timings = std::nullopt);

json completion_usage_chunk_json(const std::string& id, const std::string& model, int64_t created,
                                 const usage_info& usage, const std::optional<timings_info>& timings = std::nullopt);

// OpenAI's model object (GET /v1/models/{id}); `meta` (e.g. n_ctx, n_params) is added when it is a non-empty object,
// and its n_ctx_slot (the tokens one request may hold) also as context_length and max_model_len, the names clients
// read a model's context from.
json model_json(const std::string& model_id, int64_t created, const std::string& owned_by,
                const json& meta = json::object());

// GET /v1/models with our single model (model_json).
json models_list_json(const std::string& model_id, int64_t created, const std::string& owned_by,
                      const json& meta = json::object());

}  // namespace keepwarm::api

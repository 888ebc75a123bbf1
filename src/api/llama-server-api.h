// llama-server's native API (POST /completion, /infill, /apply-template), as its pinned source (tools/server) speaks
// it: request parsing into the neutral request model and the response and stream-chunk JSON. Pure functions: no
// model, no engine. Bad input throws keepwarm::request_error(400, message naming the field).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/chat-request.h"

namespace keepwarm::api {

using json = nlohmann::ordered_json;

// The most elements a prompt array may have (text pieces and token ids): more than any context holds.
inline constexpr size_t max_prompt_pieces = size_t{1} << 22;

// A /completion request: the prompt (text, or text and token ids mixed), and the switches of the neutral model.
struct native_completion_request {
    chat_request params;  // model, stream, n_predict (as max_tokens), stop, sampling, return_progress; no messages
    std::string prompt;   // the prompt when it is one string
    std::vector<prompt_piece> pieces;  // else: its pieces (token ids, text)
    bool return_tokens = false;        // the generated token ids in `tokens`
};

// `prompt`: a string, an array of token ids, or an array mixing strings and token ids (llama-server's
// tokenize_mixed); a one-string array is that string. Several prompts (an array of strings or of arrays) are refused.
// n_predict -1 (the default) leaves the limit to the server; cache_prompt is accepted (keepwarm always caches).
native_completion_request parse_native_completion_request(const json& body);

// A /infill request: llama-server's fill-in-the-middle fields, and the rest as for /completion (`prompt`, when given,
// is the text after the cursor's line that the answer continues).
struct infill_request {
    native_completion_request completion;
    infill_parts parts;  // input_prefix, input_suffix, input_extra [{filename, text}]
};
infill_request parse_infill_request(const json& body);

// What a finished /completion reports, in llama-server's words.
struct native_completion_result {
    std::string content;              // the generated text (empty in a stream's last chunk)
    std::vector<llama_token> tokens;  // the generated ids when return_tokens (empty in a stream's last chunk)
    int id_slot = -1;
    std::string model;
    int tokens_predicted = 0;
    int tokens_evaluated = 0;  // prompt tokens
    std::string prompt;
    std::string stop_type;  // "eos", "limit", "word"
    std::string stopping_word;
    int tokens_cached = 0;  // tokens the slot's KV holds at the end (prompt and answer)
    timings_info timings;
};

// llama-server's stop_type of a finished generation: "word" when a stop string ended it, "limit" when a token limit
// did, else "eos".
std::string native_stop_type(bool hit_token_limit, const std::string& stopping_word);

// The whole answer (stream false), or a stream's last chunk: {content, tokens, id_slot, stop: true, model,
// tokens_predicted, tokens_evaluated, prompt, stop_type, stopping_word, tokens_cached, truncated, timings, ...}.
json native_completion_json(const native_completion_result& r, bool has_new_line = false);

// A stream's chunk before the last: {index, content, tokens, stop: false, id_slot, tokens_predicted,
// tokens_evaluated} and prompt_progress when given.
json native_chunk_json(const std::string& content, int tokens_predicted, int tokens_evaluated,
                       const std::optional<json>& prompt_progress = std::nullopt);

// llama-server's prompt_progress object: {total, cache, processed, time_ms}.
json prompt_progress_json(int total, int cache, int processed, double time_ms);

}  // namespace keepwarm::api

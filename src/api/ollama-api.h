// The Ollama API dialect at the edge (/api/chat, /api/generate, /api/tags, /api/show, /api/ps, /api/version): JSON
// bodies -> chat_request (every bad field named in a 400), and typed results -> response objects and the lines
// of Ollama's newline-delimited JSON streams. Pure functions: no model, no engine. Bad input throws
// keepwarm::request_error(400, message naming the field).
//
// The numbers in every final response (Ollama's names; durations in nanoseconds):
//   total_duration            request received -> this response formatted
//   load_duration             request received -> first model call with its tokens: parsing, rendering, tokenizing,
//                             waiting for a slot, restoring cached KV. The model itself is loaded once at start-up.
//   prompt_eval_count         tokens in the prompt, reused ones included. This is what Ollama reports today (its
//                             "logical input total"); Ollama's llama.cpp-runner releases of 2024 counted only the
//                             tokens they evaluated and left the field out when that was 0.
//   prompt_eval_cached_count  prompt tokens whose KV was reused, not recomputed (the field Ollama added to report
//                             cache hits)
//   prompt_eval_duration      computing the rest of the prompt, up to the first sampled token
//   eval_count                tokens generated
//   eval_duration             generating after the first token (whose time is in prompt_eval_duration)
// and keepwarm's own beside them:
//   prompt_eval_computed_count                  prompt tokens computed for this request (count - cached count)
//   prompt_eval_cached_{device,ram,disk}_count  where the reused tokens came from (the prefix cache's tiers)
//   prompt_eval_checkpoint_pos                  hybrid models: position of the restored state checkpoint (-1: none)
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "api/openai-api.h"
#include "chat.h"
#include "llama.h"

namespace keepwarm::api::ollama {

using json = nlohmann::ordered_json;

// What /api/version reports. Clients compare it with the version that brought a feature: GitHub Copilot wants at
// least 0.6.4 (capabilities in /api/show) and reads each dot-separated part as a number; thinking needs 0.9, its
// "low"/"medium"/"high" levels 0.11. 0.11.0 claims all of these, which keepwarm serves, and nothing later
// (logprobs, cloud models, web search, image generation), which it does not.
inline constexpr const char* compatible_version = "0.11.0";

// POST /api/chat. stream defaults to true (Ollama's default); messages may be empty: Ollama's "load the model" call,
// answered by load_json without generating. options.num_ctx lands in requested_context and is never applied.
chat_request parse_chat_request(const json& body);

// POST /api/generate, as a chat: without raw, the system text and the prompt are a system and a user message that go
// through the chat template; with raw, `prompt` is what the model reads, as is, and chat.messages stays empty.
struct generate_request {
    chat_request chat;  // model, sampling, limits, stops, format, think, stream, requested_context; messages unless raw
    std::string prompt;  // empty: Ollama's "load the model" call
    bool raw = false;
};
generate_request parse_generate_request(const json& body);

// POST /api/show: the model name asked for ("model", or the deprecated "name"). Every name is served by the loaded
// model; only a missing name is an error.
std::string parse_show_request(const json& body);

// One response's numbers (see the top of this file).
struct metrics {
    int64_t total_ns = 0;
    int64_t load_ns = 0;
    int64_t prompt_eval_ns = 0;
    int64_t eval_ns = 0;
    int prompt_tokens = 0;
    int cached_tokens = 0;
    int generated_tokens = 0;
    cache_detail cache;
};

// A response's neutral numbers (chat/generation-report) in Ollama's fields and units: load_duration is the setup time,
// prompt_eval_duration the prompt's, eval_duration the generation's, each in nanoseconds; `total`: request received
// -> now.
metrics metrics_of(const usage_info& usage, const timings_info& timings, std::chrono::nanoseconds total);

// Go's time.RFC3339Nano in UTC, as Ollama writes created_at: "2024-05-01T12:00:00.123456789Z", trailing zeros of the
// fraction dropped (and the dot with them when the time is a whole second).
std::string rfc3339(std::chrono::system_clock::time_point t);

// "length" when the token limit cut the answer, else "stop" (tool calls too: Ollama has no separate reason).
std::string done_reason(bool hit_token_limit);

// Ollama's tool calls: [{id, function {index, name, arguments (an object)}}]; `first_index` numbers the first one.
json tool_calls_json(std::span<const common_chat_tool_call> calls, size_t first_index = 0);
// {role "assistant", content, thinking (when any), tool_calls (when any)}.
json assistant_message_json(const common_chat_msg& msg);

// /api/chat: the whole answer (stream false).
json chat_response_json(const std::string& model, const std::string& created_at, const common_chat_msg& msg,
                        const std::string& done_reason, const metrics& m);
// /api/chat stream line with new text and/or whole tool calls (done false).
json chat_chunk_json(const std::string& model, const std::string& created_at, const std::string& content,
                     const std::string& thinking, std::span<const common_chat_tool_call> tool_calls = {},
                     size_t first_tool_index = 0);
// /api/chat stream's last line: empty message, done true, done_reason and the numbers.
json chat_final_chunk_json(const std::string& model, const std::string& created_at, const std::string& done_reason,
                           const metrics& m);

// /api/generate: the whole answer; thinking only when non-empty.
json generate_response_json(const std::string& model, const std::string& created_at, const std::string& response,
                            const std::string& thinking, const std::string& done_reason, const metrics& m);
json generate_chunk_json(const std::string& model, const std::string& created_at, const std::string& response,
                         const std::string& thinking);
json generate_final_chunk_json(const std::string& model, const std::string& created_at, const std::string& done_reason,
                               const metrics& m);

// The answer to a "load the model" call (empty messages / empty prompt): done, done_reason "load", no numbers.
json chat_load_json(const std::string& model, const std::string& created_at);
json generate_load_json(const std::string& model, const std::string& created_at);

// One line of an application/x-ndjson stream.
std::string ndjson_line(const json& object);
// {"error": message}: Ollama's error body, for route_options::format_error (and as a stream line).
std::string error_body(int status, const std::string& type, const std::string& message);

// What /api/tags, /api/show and /api/ps say about the served model.
struct model_card {
    std::string name;  // as listed, with a tag: "<model id>:latest" unless the id has one
    std::string architecture;
    std::string parameter_size;      // Ollama's style: "494.03M", "8.2B"
    std::string quantization_level;  // Ollama's style: "Q4_K_M", "Q8_0", "F16"
    uint64_t file_bytes = 0;
    std::string digest;
    std::chrono::system_clock::time_point modified_at;
    std::string path;
    std::string chat_template;              // Jinja source (Ollama's own are Go templates; clients show it as text)
    json model_info = json::object();       // GGUF metadata with its types; big arrays (the vocabulary) as null
    std::vector<std::string> capabilities;  // "completion", plus "tools" / "thinking" when the template has them
    int context_length = 0;                 // tokens one request may use, prompt and answer (a slot's context)
    uint64_t memory_bytes = 0;              // weights + KV cache + recurrent states, as loaded
    uint64_t vram_bytes = 0;                // ... of which on a GPU
};

// "<id>:latest" when `model_id` has no tag, else `model_id`.
std::string tagged_name(const std::string& model_id);
// Ollama's parameter_size: "137K", "494.03M", "8B", "8.2B", "1.5T".
std::string parameter_size(uint64_t n_params);
// Ollama's quantization_level for a GGUF file type: "Q4_K_M", "Q8_0", "F16", "IQ2_XXS", ...
std::string quantization_level(llama_ftype ftype);

json tags_json(const model_card& card);
json show_json(const model_card& card);
// /api/ps; `expires_at` is formatted as given (the model is never unloaded).
json ps_json(const model_card& card, const std::string& expires_at);
json version_json(const std::string& keepwarm_version);

}  // namespace keepwarm::api::ollama

// The one request model of keepwarm, whatever API a request came in through: the three dialects (api/) parse their
// bodies into a chat_request (or a raw completion_request), the policy layer rewrites it, either backend serves it,
// and the numbers it reports come back as usage_info and timings_info for the dialect to format. No JSON, no HTTP.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat.h"
#include "common.h"

namespace keepwarm {

// Per-request sampling overrides; unset fields keep the server defaults (see to_sampling_params).
struct sampling_options {
    std::optional<float> temperature;        // 0..2
    std::optional<float> top_p;              // 0..1
    std::optional<float> min_p;              // 0..1
    std::optional<float> repeat_penalty;     // > 0 (1 = off)
    std::optional<float> presence_penalty;   // -2..2
    std::optional<float> frequency_penalty;  // -2..2
    std::optional<int> top_k;                // >= 0 (0 = off)
    std::optional<int> repeat_last_n;        // >= -1 (-1 = whole context)
    std::optional<uint32_t> seed;            // request seed -1 maps to LLAMA_DEFAULT_SEED (random)
    // OpenAI's logit_bias: token id -> bias in -100..100; -100 bans the token. Ids are checked against the vocab
    // by the caller (this layer has no model).
    std::vector<std::pair<llama_token, float>> logit_bias;
    bool ignore_eos = false;  // llama-server's extension: never sample end-of-generation tokens
};

// One cap on stop strings for all three APIs (OpenAI's own limit is 16): each is matched against every generated
// token, and the longest is text held back from the stream.
inline constexpr size_t max_stop_strings = 16;
inline constexpr size_t max_stop_bytes = 1024;

// A prefix of the prompt a client asked to keep cached (Anthropic's cache_control breakpoints, OpenAI's
// prompt_cache_key): the prefix cache evicts it after what nobody marked, until `ttl` after its last use.
struct cache_hint {
    // The prefix ends where messages[messages] starts in the rendered prompt: the tools and the system prompt, and
    // the messages before that one. messages.size() or more: the whole prompt.
    size_t messages = 0;
    std::chrono::seconds ttl{300};
};

// The longest a client may ask a prefix to be kept (OpenAI's prompt_cache_retention "24h").
inline constexpr std::chrono::seconds max_cache_hint_ttl{24 * 3600};
// prompt_cache_key: a routing key, not prompt text; OpenAI's own limit is 64 characters.
inline constexpr size_t max_prompt_cache_key_bytes = 1024;

struct chat_request {
    std::string model;
    // Roles: system, developer (common maps it to system, except for GPT-OSS which has a real developer role),
    // user, assistant, tool. Content is either `content` or text `content_parts`, never both.
    std::vector<common_chat_msg> messages;
    // Already narrowed to the one named function when tool_choice named it (then tool_choice is REQUIRED).
    std::vector<common_chat_tool> tools;
    common_chat_tool_choice tool_choice = COMMON_CHAT_TOOL_CHOICE_AUTO;
    std::optional<bool> parallel_tool_calls;  // unset: the template's capability decides (like llama-server)
    bool stream = false;
    bool include_usage = false;  // stream_options.include_usage
    // max_completion_tokens (preferred) or max_tokens; >= 1. Unset: no request limit (until EOS/stop/context).
    std::optional<int> max_tokens;
    std::vector<std::string> stop;  // at most max_stop_strings of max_stop_bytes, empty strings dropped
    sampling_options sampling;
    // chat_template_kwargs.enable_thinking, overridden by reasoning_effort "none" (-> false). Unset: template default.
    std::optional<bool> enable_thinking;
    std::string json_schema;  // JSON text from response_format (json_schema or json_object); empty: none
    // Extra template variables; values are JSON text (as common expects), e.g. {"preserve_reasoning", "true"}.
    std::map<std::string, std::string> chat_template_kwargs;
    int n = 1;  // only 1 is accepted
    // Which API the request came in through ("openai", "anthropic", "ollama"): the policy layer and the log name it.
    std::string api = "openai";
    // A context size the client asked for (Ollama's options.num_ctx). Never applied: the context is the server's;
    // the policy layer reports that it ignored it.
    std::optional<int> requested_context;
    std::optional<cache_hint> hint;
    // OpenAI's prompt_cache_key (Chat Completions, Responses): requests with one key share a prefix. The proxy sends
    // them to one upstream; the hint above keeps the prefix. Empty: none.
    std::string prompt_cache_key;
    // llama-server's return_progress: a stream also carries the prompt's processing progress (prompt_progress).
    bool return_progress = false;
    // llama-server's speculative.n_max (Ollama: options."speculative.n_max"): the most draft tokens one step may
    // verify for this request, 0..max_request_draft_tokens; 0 turns speculative decoding off. Unset: the server's.
    std::optional<int> draft_max;
};

// The most draft tokens a request may ask one step to verify (speculative.n_max); the server's --draft-max caps it too.
inline constexpr int max_request_draft_tokens = 1024;

// One piece of a prompt given as text and token ids mixed (llama-server's /completion): text, or one token id.
struct prompt_piece {
    std::string text;                      // token == LLAMA_TOKEN_NULL
    llama_token token = LLAMA_TOKEN_NULL;  // else this token id (checked against the vocab by whoever has one)
};

// A fill-in-the-middle request (llama-server's /infill): the code before and after the cursor, and other files for
// context. Whoever has the vocab turns it into a prompt of its FIM tokens (llama-server's format_prompt_infill).
struct infill_parts {
    std::string prefix;
    std::string suffix;
    struct file {
        std::string name;
        std::string text;
    };
    std::vector<file> extra;
};

struct completion_request {
    std::string model;
    std::string prompt;  // non-empty; a one-element string array is accepted too
    bool stream = false;
    bool include_usage = false;
    // Unset: no request limit (llama-server's default; OpenAI's legacy default of 16 is NOT applied).
    std::optional<int> max_tokens;
    std::vector<std::string> stop;
    sampling_options sampling;
    bool echo = false;             // echo=true is rejected with 400
    std::optional<int> draft_max;  // speculative.n_max, as chat_request's
};

// Throws request_error 400 naming the field when a value is out of range.
void validate_sampling(const sampling_options& options);
// Copies `defaults` and applies the overrides (temp, top_k, top_p, min_p, penalty_*, seed). Validates first.
common_params_sampling to_sampling_params(const sampling_options& options, const common_params_sampling& defaults);

// Where a response's reused prompt tokens came from (keepwarm's prefix cache tiers).
struct cache_detail {
    int device = 0, ram = 0, disk = 0;  // reused tokens per tier
    int checkpoint_pos = -1;            // hybrid models: the recurrent-state checkpoint restored (-1: none)
};

struct usage_info {
    int prompt_tokens = 0;
    int completion_tokens = 0;
    int cached_tokens = 0;  // prompt tokens reused from the KV cache
    cache_detail cache;
};

struct timings_info {
    int prompt_n = 0;  // prompt tokens computed
    int cache_n = 0;   // prompt tokens reused
    double prompt_ms = 0;
    int predicted_n = 0;
    double predicted_ms = 0;
    cache_detail cache;
    double setup_ms = 0;     // request received -> first model call with its tokens (parse, render, tokenize, match)
    double queued_ms = 0;    // waiting for a free slot (part of setup_ms)
    double prepare_ms = 0;   // parse, render, tokenize (part of setup_ms)
    double sampling_ms = 0;  // in the sampler over every generated token (a grammar's checks included)
    double sampling_max_ms = 0;  // ... the longest one token took
    int draft_n = 0;             // speculative decoding: draft tokens verified (shown only when > 0, as llama-server)
    int draft_n_accepted = 0;    // ... of them accepted
};

// "<prefix><32 random alphanumerics>"; thread-safe.
std::string random_id(std::string_view prefix);
// For tool calls the model did not give an id (OpenAI's prefix, which the other APIs accept as well).
inline std::string gen_tool_call_id() {
    return random_id("call_");
}

}  // namespace keepwarm

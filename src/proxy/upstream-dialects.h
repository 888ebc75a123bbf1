// The APIs an upstream engine may speak to `keepwarm proxy` (OpenAI chat completions, Anthropic Messages, Ollama
// chat): an api::chat_request as that API's streamed request body, and that API's stream back as the message it
// builds (common_chat_msg), its deltas, and the usage and reuse numbers it reports. Every client API reaches every
// upstream through these two conversions, so there is no client-by-upstream translation matrix.
// Pure functions and a decoder object: no sockets, no threads.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api/openai-api.h"
#include "chat.h"
#include "http/http-server.h"

namespace keepwarm::proxy {

enum class upstream_dialect { openai, anthropic, ollama };

// "openai", "anthropic", "ollama".
const char* dialect_name(upstream_dialect dialect);
// Throws std::invalid_argument for another name.
upstream_dialect parse_dialect(std::string_view name);

// One streamed chat call: POST `target` with `body` (JSON) and `headers`.
struct upstream_call {
    std::string target;
    std::string body;
    http::header_list headers;
};

// Anthropic requires max_tokens; a request that set none is sent with this (a local engine stops at its context).
constexpr int anthropic_default_max_tokens = 32768;

// The request as `dialect`'s streamed chat call, for the upstream's `model` (each upstream serves one pinned model,
// whatever name the client used). `api_key` (may be empty) goes in the header that API reads. The answer is always
// requested as a stream, with usage, so one decoder serves streamed and whole answers to the client.
upstream_call build_call(upstream_dialect dialect, const api::chat_request& chat, const std::string& model,
                         const std::string& api_key = "");

// Anthropic's POST /v1/messages/count_tokens for the request (what a count needs of it: model, system, messages,
// tools, tool_choice, thinking). keepwarm and llama-server answer it too, so OpenAI-dialect upstreams get it as well
// (with their bearer key); nullopt for Ollama, which cannot count a chat.
std::optional<upstream_call> build_count_call(upstream_dialect dialect, const api::chat_request& chat,
                                              const std::string& model, const std::string& api_key = "");
// The count in its answer ({"input_tokens": N}); throws std::invalid_argument for another shape.
int parse_count_answer(std::string_view body);

// What an upstream reported about one answer.
struct upstream_usage {
    int prompt_tokens = 0;
    int cached_tokens = 0;  // prompt tokens the upstream reused from its cache (0 when it does not say)
    int completion_tokens = 0;
    bool hit_token_limit = false;  // the answer was cut by max tokens
};

// Reads an upstream's streamed answer (SSE for OpenAI and Anthropic, NDJSON for Ollama) piece by piece, in whatever
// pieces the socket gives, and builds the assistant message from it.
class stream_decoder {
public:
    explicit stream_decoder(upstream_dialect dialect);

    // Feeds the next bytes of the body; returns the message's new deltas (common's diffs, as the local output parser
    // gives them). After the stream's last event, done() is true; an error event sets error() and done().
    std::vector<common_chat_msg_diff> push(std::string_view bytes);

    bool done() const { return done_; }
    // Set when the upstream reported an error inside its stream (empty otherwise).
    const std::string& error() const { return error_; }
    const common_chat_msg& message() const { return msg_; }
    const upstream_usage& usage() const { return usage_; }

private:
    void on_event(const std::string& event, const std::string& data);
    void on_openai(const nlohmann::ordered_json& chunk);
    void on_anthropic(const std::string& type, const nlohmann::ordered_json& event);
    void on_ollama(const nlohmann::ordered_json& line);
    void fail(std::string message);

    upstream_dialect dialect_;
    std::string buffer_;  // bytes not yet making a whole event (SSE) or line (NDJSON)
    common_chat_msg msg_;
    upstream_usage usage_;
    std::vector<int> anthropic_blocks_;  // per content block index: -1 text/thinking, else its tool call's index
    std::vector<std::string> anthropic_block_types_;
    bool done_ = false;
    std::string error_;
};

// The message of an upstream's error answer (`status`, `body` in any of the three shapes, or plain text), and its
// error type when the body names one (e.g. "exceed_context_size_error", which the client APIs word specially).
struct upstream_error_info {
    std::string message;
    std::string type;
};
upstream_error_info parse_error_body(const std::string& body);
// What the client gets for an upstream's error answer (`status` >= 400, `body` its error body): a 4xx as is, with
// the upstream's message and type; a 5xx as 502 naming the upstream (`url`).
http::http_error upstream_http_error(int status, const std::string& body, const std::string& url);

// The sampling options as OpenAI-style request fields (temperature, top_p, ..., seed, ignore_eos, logit_bias with a
// ban as -100), written into `body`; unset options are left out.
void write_openai_sampling(nlohmann::ordered_json& body, const api::sampling_options& s);

// The cheap call that says whether an upstream is up, never running inference: GET /v1/models (OpenAI, Anthropic)
// or /api/tags (Ollama).
std::string health_target(upstream_dialect dialect);
// What a health answer says: the first model it lists, and which running instance answered, when it says (keepwarm
// lists its model with the server's start time as "created"; other engines' "created" means nothing stable).
struct upstream_listing {
    std::string model;     // empty: none listed
    std::string instance;  // empty: not known
};
upstream_listing parse_listing(upstream_dialect dialect, const std::string& body);

}  // namespace keepwarm::proxy

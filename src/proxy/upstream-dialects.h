// The APIs an upstream engine may speak to `keepwarm proxy` (OpenAI chat completions, Anthropic Messages, Ollama
// chat): an chat_request as that API's streamed request body, and that API's stream back as the message it
// builds (common_chat_msg), its deltas, and the usage and reuse numbers it reports. Every client API reaches every
// upstream through these two conversions, so there is no client-by-upstream translation matrix.
// Pure functions and a decoder object: no sockets, no threads.
#pragma once

#include <cstddef>
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
upstream_call build_call(upstream_dialect dialect, const chat_request& chat, const std::string& model,
                         const std::string& api_key = "");

// Anthropic's POST /v1/messages/count_tokens for the request (what a count needs of it: model, system, messages,
// tools, tool_choice, thinking). keepwarm and llama-server answer it too, so OpenAI-dialect upstreams get it as well
// (with their bearer key); nullopt for Ollama, which cannot count a chat.
std::optional<upstream_call> build_count_call(upstream_dialect dialect, const chat_request& chat,
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

// What one upstream answer may cost the proxy before the decoder calls it bad. Everything an upstream sends is
// untrusted: these bound the memory and work of one answer whatever the upstream sends, and the defaults sit far
// above any real answer (a 128K-token answer is about 0.5 MB of text and 30 MB of OpenAI chunks).
struct stream_limits {
    size_t max_event_bytes = 8u << 20;     // one SSE event or NDJSON line (a tool call's arguments may come whole)
    size_t max_answer_bytes = 64u << 20;   // the message: content, reasoning, tool names, ids and arguments
    size_t max_stream_bytes = 256u << 20;  // everything received, events the decoder skips included
    size_t max_tool_calls = 256;
    size_t max_content_blocks = 1024;  // Anthropic's content blocks
    size_t max_name_bytes = 1024;      // a tool call's name or id
    int max_nesting = 128;             // JSON depth of one event (dump() and the destructor recurse)
};

// Reads an upstream's streamed answer (SSE for OpenAI and Anthropic, NDJSON for Ollama) piece by piece, in whatever
// pieces the socket gives, and builds the assistant message from it. Never throws: whatever the upstream sends, a
// stream it cannot read ends with error() set (an index out of order, a wrong type, an event or answer over its
// limits), and the message built so far stays valid.
class stream_decoder {
public:
    explicit stream_decoder(upstream_dialect dialect, stream_limits limits = {});

    // Feeds the next bytes of the body; returns the message's new deltas (common's diffs, as the local output parser
    // gives them). After the stream's last event, done() is true; an error event sets error() and done().
    std::vector<common_chat_msg_diff> push(std::string_view bytes);
    // The body ended: a last NDJSON line or SSE event without its terminator is read, and a stream that had not
    // reached its end event ends with error() set.
    std::vector<common_chat_msg_diff> end_of_body();

    bool done() const { return done_; }
    // Set when the upstream reported an error inside its stream, or sent one the decoder cannot read (empty
    // otherwise).
    const std::string& error() const { return error_; }
    const common_chat_msg& message() const { return msg_; }
    const upstream_usage& usage() const { return usage_; }

private:
    // Where the message stood before a push: the deltas are what was appended since (the decoder only appends, and
    // only to the last tool call or a new one), so no copy of the message is made per piece.
    struct mark {
        size_t reasoning = 0, content = 0, tool_calls = 0, last_name = 0, last_arguments = 0;
        std::string last_id;
    };
    mark mark_now() const;
    std::vector<common_chat_msg_diff> diffs_since(const mark& before) const;

    void take_lines(bool at_end);
    void take_events(bool at_end);
    void on_block(std::string_view block);
    void on_event(const std::string& event, const std::string& data);
    void on_openai(const nlohmann::json& chunk);
    void on_anthropic(const std::string& type, const nlohmann::json& event);
    void on_ollama(const nlohmann::json& line, const std::string& text);
    // Appends to a part of the message, within max_answer_bytes; false (and the stream failed) past it.
    bool grow(std::string& part, const std::string& piece);
    // A tool call's name or id, within max_name_bytes.
    bool set_name(std::string& field, const std::string& value, bool append);
    void fail(std::string message);

    upstream_dialect dialect_;
    stream_limits limits_;
    std::string buffer_;  // bytes not yet making a whole event (SSE) or line (NDJSON)
    size_t scanned_ = 0;  // buffer_ before this holds no terminator: the next search starts here
    size_t received_ = 0;
    size_t answer_bytes_ = 0;
    common_chat_msg msg_;
    upstream_usage usage_;
    std::vector<int> anthropic_blocks_;  // per content block index: -1 text/thinking, else its tool call's index
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
request_error upstream_request_error(int status, const std::string& body, const std::string& url);
// What an upstream's 3xx answer is, for the log and the client: "upstream URL answered 302 redirect to LOCATION;
// keepwarm does not follow redirects (give the upstream's final URL)". `headers` are the answer's, names lowercased;
// the Location is shown cut to 200 bytes, without control characters.
std::string redirect_message(int status, const http::header_list& headers, const std::string& url);
// The 502 the client gets for it.
request_error upstream_redirect_error(int status, const http::header_list& headers, const std::string& url);

// The sampling options as OpenAI-style request fields (temperature, top_p, ..., seed, ignore_eos, logit_bias with a
// ban as -100), written into `body`; unset options are left out.
void write_openai_sampling(nlohmann::ordered_json& body, const sampling_options& s);

// The cheap call that says whether an upstream is up, never running inference: GET /v1/models (OpenAI, Anthropic)
// or /api/tags (Ollama).
std::string health_target(upstream_dialect dialect);
// What a health answer says: the models it lists, and which running instance answered, when it says (keepwarm
// lists its model with the server's start time as "created"; other engines' "created" means nothing stable).
// The list is bounded: at most max_listed_models names, each of at most max_model_name_bytes (a longer name, an
// empty one, one that is not a string, and a repeat are left out); the answer itself is at most 1 MiB.
inline constexpr size_t max_listed_models = 256;
inline constexpr size_t max_model_name_bytes = 512;
struct upstream_listing {
    std::string model;                // the first entry's name; empty: none listed
    std::vector<std::string> models;  // every name it lists, in its order, within the bounds above
    std::string instance;             // empty: not known
};
upstream_listing parse_listing(upstream_dialect dialect, const std::string& body);

}  // namespace keepwarm::proxy

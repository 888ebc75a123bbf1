// OpenAI's Responses API (POST /v1/responses), what Codex speaks: the request parsed into the one chat_request, and
// the answer as a response object or as its stream of typed events. Pure functions and one per-response stream
// builder: no model, no engine. Bad input throws request_error(400, message naming the field).
//
// Input: `input` as a string (one user message) or a list of items: messages (role system/developer/user/assistant,
// content a string or input_text/output_text parts), `function_call` items (the assistant's calls, merged into its
// turn), `function_call_output` items (tool results), and `reasoning` items carried back (their reasoning_text
// content, else their summary, becomes the next assistant turn's reasoning, so the history renders as generated and
// its KV cache is reused). `instructions` is a system message before them. Tools are function tools (`name`,
// `parameters` at the top level, not under `function`), and namespaces of them (their functions are offered); tools
// that run on OpenAI's servers (web search, file search, code interpreter, computer use, MCP, image generation) are
// not offered to the model and named in request_echo::ignored_tools, as Codex offers web_search whatever the server;
// other types (custom, local_shell) are a 400 naming them, as are image, file and audio inputs.
//
// Output items, in the order the model writes them: a `reasoning` item (its text as reasoning_text content, and the
// same text as `encrypted_content`, which clients carry back without reading), a `message` item with one output_text
// part, then one `function_call` item per call.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/request-error.h"
#include "chat.h"
#include "chat/chat-request.h"

namespace keepwarm::api::responses {

using json = nlohmann::ordered_json;

// What a response object echoes of its request besides the chat (the Responses API returns its parameters).
struct request_echo {
    std::string instructions;
    std::optional<int> max_output_tokens;
    json tools = json::array();
    json tool_choice = "auto";
    bool parallel_tool_calls = true;
    json text_format = {{"type", "text"}};
    json reasoning = {{"effort", nullptr}, {"summary", nullptr}};
    bool store = true;  // the API's default: the response is kept and a later request may continue it
    std::optional<std::string> previous_response_id;
    json metadata = json::object();
    std::optional<std::string> prompt_cache_key;
    // Tools that run on OpenAI's servers (web_search, file_search, ...): echoed, never offered to the model.
    std::vector<std::string> ignored_tools;
};

struct parsed_request {
    chat_request chat;
    request_echo echo;
};

// `body.input` must already hold a previous response's conversation when the body names one (the route looks it up
// and prepends it with continue_input).
parsed_request parse_request(const json& body);

// The body's `input` as a list of items (a string becomes one user message item); throws a 400 when it is neither.
json input_items(const json& body);

// What an error message echoes of an id a client sent (a response id, a call_id): its first max_shown_id_bytes bytes
// and "..." when it is longer, so that a 10 KB id is not sent back.
inline constexpr size_t max_shown_id_bytes = 64;
std::string shown_id(const std::string& id);
// A response id a client names (previous_response_id, the {id} of GET and DELETE /v1/responses/{id}): a 400 naming
// `field` when it is longer than any id could be (keepwarm's are 37 characters, OpenAI's about 50).
inline constexpr size_t max_requested_id_bytes = 256;
void check_requested_id(const std::string& id, const std::string& field);
// The 404 for an id that names no stored response of the tenant ("Previous response with id ... not found." when
// `previous`, as OpenAI words it), the id shown as shown_id() shows it.
request_error response_not_found(const std::string& id, bool previous);
// `body` with its input after `previous_items` (a stored conversation): what the model reads when a request names
// previous_response_id.
json continue_input(json body, const json& previous_items);

inline std::string gen_response_id() {
    return random_id("resp_");
}

// Where the answer stands: completed, incomplete (the token limit cut it: incomplete_details.reason
// "max_output_tokens"), or failed (with `error_message`).
enum class status { completed, incomplete, failed };

// usage: input_tokens (with input_tokens_details.cached_tokens from the prefix cache), output_tokens, total_tokens;
// keepwarm's per-tier detail as in the Chat Completions usage.
json usage_json(const usage_info& usage);

// The output items of a finished message (see above); item ids are made from `id`. `cut_by_token_limit`: the last
// item's status is "incomplete".
json output_json(const std::string& id, const common_chat_msg& msg, bool cut_by_token_limit = false);

// The response object. `msg` may be empty (in_progress, failed). `usage` null before the end.
json response_json(const std::string& id, const std::string& model, int64_t created_at, const request_echo& echo,
                   const std::string& status_word, const json& output, const json& usage,
                   const std::optional<timings_info>& timings = std::nullopt, const std::string& error_message = "",
                   bool cut_by_token_limit = false);

// One server-sent event: "event: <type>\ndata: <json with type and sequence_number>\n\n".
struct stream_event {
    std::string type;
    json data;
};

// The event sequence of one streamed response, built from the message deltas the output parser yields:
// response.created, response.in_progress; per output item response.output_item.added, its deltas
// (response.content_part.added + response.reasoning_text.delta or response.output_text.delta,
// response.function_call_arguments.delta) and their .done events, response.output_item.done; then
// response.completed / response.incomplete / response.failed with the whole response. Every event carries its
// sequence_number. Not thread-safe; one per response.
class event_stream {
public:
    event_stream(std::string id, std::string model, int64_t created_at, request_echo echo);

    std::vector<stream_event> start();
    std::vector<stream_event> push(const std::vector<common_chat_msg_diff>& diffs);
    // Closes the open item and ends the response with its status and the final message's items.
    std::vector<stream_event> finish(const common_chat_msg& final_msg, status st, const usage_info& usage,
                                     const std::optional<timings_info>& timings = std::nullopt);
    std::vector<stream_event> fail(const std::string& message);

    // The SSE text of an event, with its sequence number.
    std::string to_sse(const stream_event& event);

private:
    enum class item_kind { none, reasoning, message, function_call };

    void open(item_kind kind, std::vector<stream_event>& out);
    void close(std::vector<stream_event>& out);
    void open_pending_call(std::vector<stream_event>& out);
    json item_now(bool done) const;

    std::string id_;
    std::string model_;
    int64_t created_at_;
    request_echo echo_;
    int sequence_ = 0;
    item_kind kind_ = item_kind::none;
    int output_index_ = -1;
    std::string item_id_;
    std::string text_;  // the open item's text so far (reasoning, message text, or call arguments)
    // A call whose name may still grow: its item is added once its arguments begin or another item comes.
    size_t call_index_ = std::string::npos;
    bool call_pending_ = false;
    std::string call_id_;
    std::string call_name_;
    json done_items_ = json::array();  // the items closed so far, as response.output_item.done gave them
};

}  // namespace keepwarm::api::responses

// The gauntlet's workload: one JSONL line per request (when to send it, which agent sends it, in which API, the body
// and its events), reading and writing that format, and the generator of an agentic workload with chosen cache
// killers. docs/gauntlet.md describes the format.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace keepwarm::bench::gauntlet {

using json = nlohmann::ordered_json;  // ordered: a body's keys (tool schemas) reach the template in the file's order

enum class wire_api { openai, anthropic };
const char* api_name(wire_api api);
// "openai" | "anthropic"; throws std::invalid_argument otherwise.
wire_api parse_api(const std::string& name);

struct request_events {
    bool ping = false;            // a health check: sent alone, never part of an agent's conversation
    int cancel_after_chunks = 0;  // > 0: the client closes the stream after this many answer chunks
    bool restart_before = false;  // the target is restarted (when the bench launched it) before this request
};

struct workload_line {
    size_t line_number = 0;  // 1-based line in the file it came from (0: generated)
    double send_at_s = 0;    // earliest send time, seconds after the replay started
    std::string agent;       // requests of one agent are sent in order, one at a time
    wire_api api = wire_api::openai;
    // The request body. With `with_history`, `messages` holds only what this request adds to the agent's
    // conversation (OpenAI: leading system messages replace the conversation's; the rest are appended); no
    // messages at all continues the previous, cancelled answer. Without it the body is sent as it is.
    json body;
    bool with_history = true;
    bool strip_reasoning = false;  // the client drops the reasoning of earlier answers when it sends them back
    // What the generator put at the very start of the system prompt (nonce headers): the ideal removes it.
    std::string injected_system_prefix;
    // The tool call the agent makes after this answer when the model made none ({"name", "arguments"}), so that
    // tool rounds happen whatever a random-weight model writes.
    std::optional<json> tool_call;
    // > 0: before this request's messages, each tool call of the previous answer gets a result of this many chars.
    size_t tool_result_chars = 0;
    request_events events;
};

// One line of JSONL (without its newline); throws std::invalid_argument("line N: ...") naming the bad field.
workload_line parse_workload_line(std::string_view text, size_t line_number);
std::string format_workload_line(const workload_line& line);
// Blank lines and lines starting with '#' are skipped. Throws std::invalid_argument naming the line.
std::vector<workload_line> parse_workload(std::string_view jsonl);
std::string format_workload(const std::vector<workload_line>& lines);

struct killer_set {
    bool cch = true;              // per-request cch= nonce in a Claude-Code-style billing header
    bool request_id = true;       // per-request "request-id: <uuid>" line at the start of the system prompt
    double ping_every_s = 30;     // a max_tokens 1 health ping every N seconds (0: none)
    bool model_change = true;     // every other turn asks for another model name
    bool num_ctx_change = true;   // every other turn asks for another num_ctx (a field the chat APIs ignore)
    bool cancel = true;           // one stream per agent cancelled mid-answer, then continued with the partial text
    bool restart = true;          // the target restarts once, half-way through agent 1's turns
    bool strip_reasoning = true;  // earlier answers' reasoning is dropped when sent back
    bool clock = true;            // "Current time: <date-time>" in the system prompt, a few seconds later per request

    // "all", "none", or a comma list of cch,request-id,ping,model,num-ctx,cancel,restart,reasoning,clock.
    // Throws std::invalid_argument naming an unknown entry.
    static killer_set parse(const std::string& list, double ping_every_s);
    std::string describe() const;  // the comma list of those on
};

struct generator_options {
    uint32_t seed = 1;
    int system_tokens = 16384;  // system prompt without the tool definitions
    int tools = 26;
    int agents = 3;
    int turns = 6;        // user messages per agent
    int tool_rounds = 2;  // tool call + result rounds after each user message
    int answer_tokens = 64;
    int tool_result_tokens = 400;
    double think_time_s = 0;  // pause between an agent's turns (0: back to back)
    wire_api api = wire_api::anthropic;
    std::string model;  // in the requests; "": claude-sonnet-4-5 (Anthropic) or gpt-4o (OpenAI)
    killer_set killers;
    // Token count of a text, to size the system prompt and tool results; unset: 4 characters per token.
    std::function<size_t(const std::string&)> count_tokens;
};

// Deterministic for a seed (and token counter).
std::vector<workload_line> generate_workload(const generator_options& options);

// The synthetic tool output a replay sends back (lines that look like file contents and listings), deterministic
// for its seed.
std::string synthetic_tool_result(size_t chars, uint64_t seed);

}  // namespace keepwarm::bench::gauntlet

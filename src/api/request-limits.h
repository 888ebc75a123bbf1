// The sizes a chat request may have in every API (Chat Completions, Anthropic Messages, Ollama, Responses), checked
// on the parsed JSON before a dialect converts it, so that nothing renders a request too large to serve: rendering
// is what costs (5,000 tools took 144 s and 1.66 GB before the context check refused them). The limits are generous
// for real agents (Claude Code sends ~25 tools and a few hundred messages; a long agent session has thousands).
// Pure functions; a request over a limit is a request_error 400 naming the limit and its value.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

namespace keepwarm::api {

struct request_limits {
    size_t max_messages = 10000;     // messages (Chat Completions, Anthropic, Ollama)
    size_t max_input_items = 20000;  // Responses input items (a tool round is two: the call and its output)
    size_t max_tools = 1024;         // tools offered, a Responses namespace's functions included
    // Content parts (blocks) and tool calls in all messages together, system blocks included.
    size_t max_content_parts = 20000;
    // Every string in the body (values and keys), what no template renders included (a reasoning item carried back,
    // a Responses conversation kept for previous_response_id): a 30 MiB reasoning item rendered to 21 tokens and was
    // stored whole. 16 MiB is about 4M tokens of text, more than any context holds.
    size_t max_text_bytes = 16u << 20;
};

inline constexpr request_limits default_request_limits{};

// request_error 400 when `body` (a chat request of any API, after a previous Responses conversation was put before
// its input) is over a limit. `list_field`: where its messages are ("messages", or "input" for Responses).
void check_request_limits(const nlohmann::ordered_json& body, const std::string& list_field,
                          const request_limits& limits = default_request_limits);

}  // namespace keepwarm::api

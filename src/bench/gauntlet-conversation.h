// One agent's conversation as the gauntlet's client keeps it: the messages so far in the agent's API, with the
// answers the target really gave; from it, each workload line becomes the body sent (killers in) and the body the
// ideal is computed from (the killers the bench injected taken out).
// Threading: one conversation belongs to one agent's replay thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/gauntlet-workload.h"

namespace keepwarm::bench::gauntlet {

struct tool_call_record {
    std::string id;
    std::string name;
    std::string arguments;  // JSON text
};

struct assistant_answer {
    std::string content;
    std::string reasoning;
    std::vector<tool_call_record> tool_calls;
};

// The system prompt without `prefix` when it starts with it (string or first text block / message part).
json without_system_prefix(const json& body, wire_api api, const std::string& prefix);
// Assistant messages without their reasoning (OpenAI reasoning_content, Anthropic thinking blocks).
json without_reasoning(const json& messages, wire_api api);

class conversation {
public:
    struct bodies {
        json sent;
        json normalized;
    };

    // The next request of this agent. `tool_seed` makes its synthetic tool results.
    bodies next(const workload_line& line, uint64_t tool_seed);
    // The answer the target gave to the request `next` made (partial when the stream was cut, empty on failure).
    void answered(const workload_line& line, const assistant_answer& answer);

    const json& messages() const { return history_; }

private:
    json answer_message(const workload_line& line, const assistant_answer& answer);

    json history_ = json::array();              // reasoning kept: what the model said
    json pending_ = json::array();              // messages `next` added, committed by `answered`
    bool continues_ = false;                    // `next` continues the last assistant message
    std::vector<tool_call_record> open_calls_;  // the last answer's tool calls, for the next tool results
    int scripted_calls_ = 0;
};

}  // namespace keepwarm::bench::gauntlet

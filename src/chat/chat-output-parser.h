// Incrementally parses generated text into an assistant message (content, reasoning_content, tool calls) and yields
// the OpenAI-style deltas between successive partial parses, like llama-server's task_result_state.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chat.h"

namespace keepwarm {

class chat_output_parser {
public:
    explicit chat_output_parser(common_chat_parser_params params);

    // Appends generated text and re-parses everything so far as partial output. Returns the new deltas (possibly none).
    // Never throws: a partial parse that fails, or that would contradict what was already emitted, is skipped until
    // more text arrives.
    // A parse costs time linear in the text so far, so parsing at every token would make a long answer quadratic
    // (Qwen3's parser: ~6 ns a byte, 3 us a push at the start, 250 us at 40 KB). Past `always_parse_bytes`, the next
    // parse waits until `idle_per_parse` times what it will cost has passed since the last one ended (the cost from
    // the fastest rate per byte seen, so that a parse slowed by the machine does not hold the text back): the text
    // pushed meanwhile comes with that next parse (or finish()), and parsing keeps a bounded share of the thread
    // however long the answer grows, for a delay of a few milliseconds on text of tens of kilobytes.
    std::vector<common_chat_msg_diff> push(std::string_view text_delta);

    // Final parse (is_partial = false). If the text does not match the template's format (e.g. cut off mid tool call),
    // the whole raw text becomes the content. `final_diffs`, when given, receives the deltas from the last streamed
    // state to the final message (empty when there are none, or when the raw-text fallback cannot be expressed as
    // deltas of what was streamed). Never throws.
    common_chat_msg finish(std::vector<common_chat_msg_diff>* final_diffs = nullptr);

    // At most `n` tool calls (parallel_tool_calls false: 1). The pinned llama.cpp's grammar for some templates
    // (Qwen3's <tool_call> JSON) repeats calls whatever the request says, so the limit is kept here: calls beyond it
    // are never emitted, and the final message is the one with the first `n` calls.
    void limit_tool_calls(size_t n) { max_tool_calls_ = n; }
    // A call beyond the limit has begun: the generation can stop, nothing after it is used.
    bool tool_calls_overflowed() const { return overflowed_; }

    using clock = std::chrono::steady_clock;
    static constexpr size_t always_parse_bytes = 16 * 1024;
    static constexpr int idle_per_parse = 30;
    // The time source of the throttling above (tests give their own).
    void set_clock(std::function<clock::time_point()> now) { now_ = std::move(now); }

    // All text pushed so far.
    const std::string& text() const { return text_; }
    // The message as last emitted (after push) or finished.
    const common_chat_msg& message() const { return msg_; }
    bool has_tool_calls() const { return !msg_.tool_calls.empty(); }

private:
    common_chat_msg parse(bool is_partial) const;
    void assign_ids(common_chat_msg& msg);
    bool parse_due() const;
    std::optional<common_chat_msg> timed_partial_parse();  // nullopt: the text does not parse yet

    common_chat_parser_params params_;
    std::string text_;
    common_chat_msg msg_;
    // Ids handed out per tool-call index, so streamed deltas and the final message agree.
    std::vector<std::string> tool_call_ids_;
    size_t max_tool_calls_ = 0;  // 0: no limit
    bool overflowed_ = false;
    std::function<clock::time_point()> now_ = [] { return clock::now(); };
    clock::time_point last_parse_end_{};
    double parse_ns_per_byte_ = 0;  // the fastest seen past always_parse_bytes (0: none yet)
};

}  // namespace keepwarm

// Streaming parse of model output with common_chat_parse + common_chat_msg_diff::compute_diffs; the state machine
// follows llama-server's task_result_state::update_chat_msg.
#include "chat/chat-output-parser.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <utility>

#include "chat/chat-request.h"

namespace keepwarm {

chat_output_parser::chat_output_parser(common_chat_parser_params params) : params_(std::move(params)) {
    msg_.role = "assistant";
    if (params_.is_continuation && !params_.echo) {
        // The prefilled assistant text is part of the generation prompt the parser sees; start from its parse so
        // it is not streamed back to the client as if it were new.
        try {
            common_chat_msg start = parse(true);
            if (!start.empty()) {
                msg_ = std::move(start);
            }
        } catch (const std::exception&) {
        }
    }
}

common_chat_msg chat_output_parser::parse(bool is_partial) const {
    return common_chat_parse(text_, is_partial, params_);
}

void chat_output_parser::assign_ids(common_chat_msg& msg) {
    msg.set_tool_call_ids(tool_call_ids_, gen_tool_call_id);
}

bool chat_output_parser::parse_due() const {
    if (text_.size() < always_parse_bytes || parse_ns_per_byte_ == 0) return true;
    const double cost_ns = parse_ns_per_byte_ * static_cast<double>(text_.size());
    return std::chrono::duration<double, std::nano>(now_() - last_parse_end_).count() >= idle_per_parse * cost_ns;
}

std::optional<common_chat_msg> chat_output_parser::timed_partial_parse() {
    const clock::time_point started = now_();
    std::optional<common_chat_msg> msg;
    try {
        msg = parse(true);
    } catch (const std::exception&) {
        // The partial text does not parse yet.
    }
    last_parse_end_ = now_();
    if (text_.size() >= always_parse_bytes) {
        const double ns_per_byte = std::chrono::duration<double, std::nano>(last_parse_end_ - started).count() /
                                   static_cast<double>(text_.size());
        parse_ns_per_byte_ = parse_ns_per_byte_ == 0 ? ns_per_byte : std::min(parse_ns_per_byte_, ns_per_byte);
    }
    return msg;
}

std::vector<common_chat_msg_diff> chat_output_parser::push(std::string_view text_delta) {
    if (text_delta.empty() || overflowed_) {
        return {};
    }
    text_.append(text_delta);
    if (!parse_due()) return {};
    std::optional<common_chat_msg> next = timed_partial_parse();
    if (!next || next->empty()) {
        return {};
    }
    if (max_tool_calls_ > 0 && next->tool_calls.size() > max_tool_calls_) {
        // The calls before it are whole: a call ends before the next one begins.
        next->tool_calls.resize(max_tool_calls_);
        overflowed_ = true;
    }
    try {
        assign_ids(*next);
        auto diffs = common_chat_msg_diff::compute_diffs(msg_, *next);
        msg_ = std::move(*next);
        return diffs;
    } catch (const std::exception&) {
        // The new parse is not an extension of what was already sent (compute_diffs throws then); keep the last
        // emitted state and wait for more text.
        return {};
    }
}

common_chat_msg chat_output_parser::finish(std::vector<common_chat_msg_diff>* final_diffs) {
    common_chat_msg final_msg;
    try {
        // Past the limit, the message is what was emitted: the text after the last allowed call is not used.
        final_msg = overflowed_ ? msg_ : parse(false);
        for (auto& call : final_msg.tool_calls) {
            if (call.arguments.empty()) {
                call.arguments = "{}";  // a call without parameters; clients JSON.parse this field
            } else if (!nlohmann::ordered_json::accept(call.arguments)) {
                // The lenient final parse accepts a call cut off mid-arguments (e.g. at max_tokens); a tool call
                // whose arguments are not JSON is worse for clients than the honest raw text.
                throw std::runtime_error("tool call arguments are not valid JSON");
            }
        }
    } catch (const std::exception&) {
        final_msg = common_chat_msg();
        final_msg.content = text_;
    }
    final_msg.role = "assistant";
    assign_ids(final_msg);
    if (final_diffs) {
        final_diffs->clear();
        try {
            *final_diffs = common_chat_msg_diff::compute_diffs(msg_, final_msg);
        } catch (const std::exception&) {
            // The raw-text fallback is usually not an extension of what was streamed.
            final_diffs->clear();
        }
    }
    msg_ = final_msg;
    return final_msg;
}

}  // namespace keepwarm

// See gauntlet-conversation.h.
#include "bench/gauntlet-conversation.h"

namespace keepwarm::bench::gauntlet {

namespace {

bool is_system(const json& message) {
    return message.is_object() && message.value("role", "") == "system";
}

// Strips `prefix` from a string, or from the first text part of a content array.
void strip_text_prefix(json& content, const std::string& prefix) {
    if (content.is_string()) {
        const std::string text = content.get<std::string>();
        if (text.starts_with(prefix)) content = text.substr(prefix.size());
        return;
    }
    if (content.is_array() && !content.empty() && content[0].is_object() && content[0].contains("text") &&
        content[0]["text"].is_string()) {
        const std::string text = content[0]["text"].get<std::string>();
        if (text.starts_with(prefix)) content[0]["text"] = text.substr(prefix.size());
    }
}

json parse_arguments(const std::string& text) {
    try {
        json args = json::parse(text.empty() ? "{}" : text);
        if (args.is_object()) return args;
    } catch (const json::parse_error&) {
    }
    return json::object();  // a model's broken arguments: the agent would report an error; an empty call is enough
}

}  // namespace

json without_system_prefix(const json& body, wire_api api, const std::string& prefix) {
    json out = body;
    if (prefix.empty()) return out;
    if (api == wire_api::anthropic) {
        if (out.contains("system")) strip_text_prefix(out["system"], prefix);
        return out;
    }
    if (out.contains("messages") && out["messages"].is_array() && !out["messages"].empty() &&
        is_system(out["messages"][0]) && out["messages"][0].contains("content")) {
        strip_text_prefix(out["messages"][0]["content"], prefix);
    }
    return out;
}

json without_reasoning(const json& messages, wire_api api) {
    json out = json::array();
    for (json message : messages) {
        if (message.is_object() && message.value("role", "") == "assistant") {
            if (api == wire_api::openai) {
                message.erase("reasoning_content");
            } else if (message.contains("content") && message["content"].is_array()) {
                json kept = json::array();
                for (const json& block : message["content"]) {
                    const std::string type = block.is_object() ? block.value("type", "") : "";
                    if (type != "thinking" && type != "redacted_thinking") kept.push_back(block);
                }
                message["content"] = kept;
            }
        }
        out.push_back(std::move(message));
    }
    return out;
}

conversation::bodies conversation::next(const workload_line& line, uint64_t tool_seed) {
    pending_ = json::array();
    continues_ = false;
    if (!line.with_history) {
        // A captured request: sent as it is; it becomes the conversation from here on.
        history_ = json::array();
        for (const json& m : line.body.value("messages", json::array())) {
            if (!is_system(m)) pending_.push_back(m);
        }
        return {line.body, without_system_prefix(line.body, line.api, line.injected_system_prefix)};
    }

    json system = json::array();
    const json added = line.body.value("messages", json::array());
    size_t first_added = 0;
    if (line.api == wire_api::openai) {
        while (first_added < added.size() && is_system(added[first_added])) system.push_back(added[first_added++]);
    }
    if (line.tool_result_chars > 0) {
        const std::string output = synthetic_tool_result(line.tool_result_chars, tool_seed);
        if (open_calls_.empty()) {
            pending_.push_back({{"role", "user"}, {"content", "Command output:\n" + output}});
        } else if (line.api == wire_api::openai) {
            for (const tool_call_record& call : open_calls_) {
                pending_.push_back({{"role", "tool"}, {"tool_call_id", call.id}, {"content", output}});
            }
        } else {
            json results = json::array();
            for (const tool_call_record& call : open_calls_) {
                results.push_back({{"type", "tool_result"}, {"tool_use_id", call.id}, {"content", output}});
            }
            pending_.push_back({{"role", "user"}, {"content", results}});
        }
    }
    for (size_t i = first_added; i < added.size(); ++i) pending_.push_back(added[i]);
    continues_ = pending_.empty() && !history_.empty() && history_.back().value("role", "") == "assistant";

    json full = history_;
    for (const json& m : pending_) full.push_back(m);
    const auto body_with = [&](const json& messages) {
        json body = line.body;
        json all = system;
        for (const json& m : messages) all.push_back(m);
        body["messages"] = all;
        return body;
    };
    bodies out;
    out.sent = body_with(line.strip_reasoning ? without_reasoning(full, line.api) : full);
    out.normalized = without_system_prefix(body_with(full), line.api, line.injected_system_prefix);
    return out;
}

json conversation::answer_message(const workload_line& line, const assistant_answer& answer) {
    std::vector<tool_call_record> calls = answer.tool_calls;
    if (calls.empty() && line.tool_call) {
        // The agent's scripted call: a random-weight model rarely writes one.
        calls.push_back({"call_gauntlet_" + std::to_string(++scripted_calls_), (*line.tool_call)["name"],
                         line.tool_call->value("arguments", json::object()).dump()});
    }
    open_calls_ = calls;
    if (line.api == wire_api::openai) {
        json m = {{"role", "assistant"}, {"content", answer.content}};
        if (!answer.reasoning.empty()) m["reasoning_content"] = answer.reasoning;
        if (!calls.empty()) {
            json tool_calls = json::array();
            for (const tool_call_record& c : calls) {
                tool_calls.push_back(
                    {{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
            }
            m["tool_calls"] = tool_calls;
        }
        return m;
    }
    json content = json::array();
    if (!answer.reasoning.empty()) {
        content.push_back({{"type", "thinking"}, {"thinking", answer.reasoning}, {"signature", ""}});
    }
    if (!answer.content.empty() || calls.empty()) content.push_back({{"type", "text"}, {"text", answer.content}});
    for (const tool_call_record& c : calls) {
        content.push_back(
            {{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", parse_arguments(c.arguments)}});
    }
    return {{"role", "assistant"}, {"content", content}};
}

void conversation::answered(const workload_line& line, const assistant_answer& answer) {
    for (json& m : pending_) history_.push_back(std::move(m));
    pending_ = json::array();
    if (!continues_) {
        history_.push_back(answer_message(line, answer));
        return;
    }
    // The continuation's text joins the cut answer it continues.
    assistant_answer whole;
    const json& last = history_.back();
    if (line.api == wire_api::openai) {
        whole.content = last.value("content", "");
        whole.reasoning = last.value("reasoning_content", "");
    } else {
        for (const json& block : last.value("content", json::array())) {
            if (block.value("type", "") == "text") whole.content += block.value("text", "");
            if (block.value("type", "") == "thinking") whole.reasoning += block.value("thinking", "");
        }
    }
    whole.content += answer.content;
    whole.reasoning += answer.reasoning;
    whole.tool_calls = answer.tool_calls;
    history_.back() = answer_message(line, whole);
}

}  // namespace keepwarm::bench::gauntlet

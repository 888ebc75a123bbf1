// See anthropic-api.h. Validation follows Anthropic's documented request shape but checks every type itself, so bad
// input is a 400 naming the field (as Anthropic's "messages.0.content.1.type" paths do), never a crash.
#include "api/anthropic-api.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>

#include "api/openai-api.h"
#include "api/request-limits.h"
#include "base/request-error.h"
#include "json/bounded-json.h"
#include "json/json-fields.h"

namespace keepwarm::api::anthropic {

namespace {

using namespace json_fields;

std::string require_string(const json& obj, const std::string& key, const std::string& field) {
    auto v = get_string(obj, key, field);
    if (!v || v->empty()) fail(in_quotes(field) + " must be a non-empty string");
    return *v;
}

std::optional<float> get_unit_interval(const json& obj, const std::string& key) {
    const json* v = find(obj, key);
    if (!v) return std::nullopt;
    if (!v->is_number() || !(v->get<double>() >= 0.0 && v->get<double>() <= 1.0)) {
        fail(in_quotes(key) + " must be a number between 0 and 1");
    }
    return v->get<float>();
}

const std::string& block_type(const json& block, const std::string& field) {
    if (!block.is_object()) fail(in_quotes(field) + " must be an object");
    const json* type = find(block, "type");
    if (!type || !type->is_string()) fail(in_quotes(field + ".type") + " must be a string");
    return type->get_ref<const std::string&>();
}

// Blocks keepwarm cannot feed a text model, with what to say about them.
[[noreturn]] void fail_unsupported_block(const std::string& field, const std::string& type) {
    if (type == "image" || type == "document" || type == "search_result" || type == "container_upload") {
        fail(in_quotes(field) + ": " + type + " blocks are not supported (keepwarm serves text models)");
    }
    fail(in_quotes(field + ".type") + ": '" + type + "' blocks are not supported here");
}

// A text block's text. Empty text is allowed: nothing reaches the model from it.
std::string text_of(const json& block, const std::string& field) {
    auto text = get_string(block, "text", field + ".text");
    if (!text) fail(in_quotes(field + ".text") + " must be a string");
    return *text;
}

// tool_result content: a string or text blocks, joined by newlines.
std::string tool_result_text(const json& block, const std::string& field) {
    const json* content = find(block, "content");
    std::string text;
    if (content && content->is_string()) {
        text = content->get<std::string>();
    } else if (content && content->is_array()) {
        for (size_t k = 0; k < content->size(); k++) {
            const std::string part_field = indexed(field + ".content", k);
            const std::string& type = block_type((*content)[k], part_field);
            if (type != "text") fail_unsupported_block(part_field, type);
            if (k > 0) text += '\n';
            text += text_of((*content)[k], part_field);
        }
    } else if (content) {
        fail(in_quotes(field + ".content") + " must be a string or an array of text blocks");
    }
    // The model sees that the call failed; Claude Code's own error texts say so too, but not every client's do.
    if (get_bool(block, "is_error", field + ".is_error").value_or(false)) text = "Error: " + text;
    return text;
}

// A string stays `content`; several text blocks become content parts, rendered the way the template joins them.
void set_text(common_chat_msg& msg, std::vector<std::string> texts) {
    if (texts.size() == 1) {
        msg.content = std::move(texts[0]);
        return;
    }
    for (auto& text : texts) msg.content_parts.push_back({"text", std::move(text)});
}

std::string parse_model(const json& body) {
    auto model = get_string(body, "model", "model");
    if (!model || model->empty()) fail("'model' is required (a non-empty string)");
    return *model;
}

// A system prompt: a string or text blocks.
std::vector<std::string> system_texts(const json& system, const std::string& field) {
    if (system.is_string()) return {system.get<std::string>()};
    if (!system.is_array()) fail(in_quotes(field) + " must be a string or an array of text blocks");
    std::vector<std::string> texts;
    for (size_t i = 0; i < system.size(); i++) {
        const std::string block_field = indexed(field, i);
        if (const std::string& type = block_type(system[i], block_field); type != "text") {
            fail(in_quotes(block_field + ".type") + " must be 'text' (got '" + type + "')");
        }
        texts.push_back(text_of(system[i], block_field));
    }
    return texts;
}

// A cache_control breakpoint on a block, tool or the request ({"type": "ephemeral"}, with "ttl" "5m" or "1h"): its
// time to live, or nullopt when `holder` has none.
std::optional<std::chrono::seconds> cache_breakpoint(const json& holder, const std::string& field) {
    const json* v = find(holder, "cache_control");
    if (!v || v->is_null()) return std::nullopt;
    const std::string control = field.empty() ? "cache_control" : field + ".cache_control";
    if (!v->is_object()) fail(in_quotes(control) + " must be an object such as {\"type\": \"ephemeral\"}");
    if (get_string(*v, "type", control + ".type") != "ephemeral")
        fail(in_quotes(control + ".type") + " must be 'ephemeral'");
    const auto ttl = get_string(*v, "ttl", control + ".ttl");
    if (!ttl || *ttl == "5m") return std::chrono::minutes(5);
    if (*ttl == "1h") return std::chrono::hours(1);
    fail(in_quotes(control + ".ttl") + " must be '5m' or '1h'");
}

// The breakpoints among `blocks` (content blocks, system blocks or tools, already checked to be objects) extend the
// request's hint to the messages before `messages` (counted without the system prompt, which is added later).
void mark_breakpoints(const json& blocks, const std::string& field, size_t messages, std::optional<cache_hint>& hint) {
    if (!blocks.is_array()) return;
    for (size_t i = 0; i < blocks.size(); i++) {
        if (const auto ttl = cache_breakpoint(blocks[i], indexed(field, i))) {
            if (!hint) hint.emplace(cache_hint{.messages = 0, .ttl = *ttl});
            hint->messages = std::max(hint->messages, messages);
            hint->ttl = std::max(hint->ttl, *ttl);
        }
    }
}

// Finds the name of the tool a tool_result answers, for templates that render it.
std::string tool_name_of(const std::vector<common_chat_msg>& messages, const std::string& tool_use_id) {
    for (auto it = messages.rbegin(); it != messages.rend(); ++it) {
        for (const auto& call : it->tool_calls) {
            if (call.id == tool_use_id) return call.name;
        }
    }
    return "";
}

// A user turn: runs of text blocks become user messages, each tool_result a tool message, in block order.
void parse_user_blocks(const json& content, const std::string& field, std::vector<common_chat_msg>& out) {
    std::vector<std::string> texts;
    const auto flush_texts = [&] {
        if (texts.empty()) return;
        common_chat_msg msg;
        msg.role = "user";
        set_text(msg, std::move(texts));
        texts.clear();
        out.push_back(std::move(msg));
    };
    for (size_t j = 0; j < content.size(); j++) {
        const json& block = content[j];
        const std::string block_field = indexed(field, j);
        const std::string& type = block_type(block, block_field);
        if (type == "text") {
            texts.push_back(text_of(block, block_field));
        } else if (type == "tool_result") {
            flush_texts();
            common_chat_msg msg;
            msg.role = "tool";
            msg.tool_call_id = require_string(block, "tool_use_id", block_field + ".tool_use_id");
            msg.tool_name = tool_name_of(out, msg.tool_call_id);
            msg.content = tool_result_text(block, block_field);
            out.push_back(std::move(msg));
        } else if (type == "tool_use" || type == "thinking" || type == "redacted_thinking") {
            fail(in_quotes(block_field) + ": '" + type + "' blocks belong in assistant messages");
        } else {
            fail_unsupported_block(block_field, type);
        }
    }
    flush_texts();
}

common_chat_msg parse_assistant_blocks(const json& content, const std::string& field) {
    common_chat_msg msg;
    msg.role = "assistant";
    std::vector<std::string> texts;
    for (size_t j = 0; j < content.size(); j++) {
        const json& block = content[j];
        const std::string block_field = indexed(field, j);
        const std::string& type = block_type(block, block_field);
        if (type == "text") {
            texts.push_back(text_of(block, block_field));
        } else if (type == "thinking") {
            auto thinking = get_string(block, "thinking", block_field + ".thinking");
            if (!thinking) fail(in_quotes(block_field + ".thinking") + " must be a string");
            msg.reasoning_content += (msg.reasoning_content.empty() ? "" : "\n") + *thinking;
        } else if (type == "redacted_thinking") {
            // Encrypted reasoning from Anthropic's models: nothing a local model can read.
        } else if (type == "tool_use") {
            common_chat_tool_call call;
            call.id = require_string(block, "id", block_field + ".id");
            call.name = require_string(block, "name", block_field + ".name");
            const json* input = find(block, "input");
            if (!input || !input->is_object()) fail(in_quotes(block_field + ".input") + " must be an object");
            bounded_json::require_shape(*input, block_field + ".input");  // the template parses and walks it again
            call.arguments = input->dump();
            msg.tool_calls.push_back(std::move(call));
        } else if (type == "tool_result") {
            fail(in_quotes(block_field) + ": 'tool_result' blocks belong in user messages");
        } else {
            fail_unsupported_block(block_field, type);
        }
    }
    if (!texts.empty()) set_text(msg, std::move(texts));
    return msg;
}

// The conversation. System messages inside it (Claude Code sends them under a beta) are appended to `system` while
// nothing else came before them; later ones become user turns, since most chat templates (Qwen3.5's among them)
// reject a system message after the first.
// Breakpoints in a message's blocks extend `hint` to the end of that message.
std::vector<common_chat_msg> parse_messages(const json& body, std::vector<std::string>& system,
                                            std::optional<cache_hint>& hint) {
    const json* messages = find(body, "messages");
    if (!messages || !messages->is_array() || messages->empty()) fail("'messages' must be a non-empty array");
    std::vector<common_chat_msg> out;
    for (size_t i = 0; i < messages->size(); i++) {
        const json& message = (*messages)[i];
        const std::string path = indexed("messages", i);
        if (!message.is_object()) fail(in_quotes(path) + " must be an object");
        auto role = get_string(message, "role", path + ".role");
        if (!role || (*role != "user" && *role != "assistant" && *role != "system")) {
            fail(in_quotes(path + ".role") + " must be 'user', 'assistant' or 'system'");
        }
        const bool assistant = *role == "assistant";
        const std::string field = path + ".content";
        const json* content = find(message, "content");
        if (!content || !(content->is_string() || content->is_array())) {
            fail(in_quotes(field) + " must be a string or an array of content blocks");
        }
        // Anthropic's rule: every message has content, except that a final assistant turn may be empty (prefill).
        const bool empty = content->is_string() ? content->get_ref<const std::string&>().empty() : content->empty();
        if (empty && !(assistant && i + 1 == messages->size())) fail(in_quotes(field) + " must not be empty");
        if (*role == "system") {
            std::vector<std::string> texts = system_texts(*content, field);
            if (out.empty()) {
                system.insert(system.end(), texts.begin(), texts.end());
                continue;
            }
            common_chat_msg msg;
            msg.role = "user";
            set_text(msg, std::move(texts));
            out.push_back(std::move(msg));
        } else if (content->is_string()) {
            common_chat_msg msg;
            msg.role = *role;
            msg.content = content->get<std::string>();
            out.push_back(std::move(msg));
        } else if (assistant) {
            out.push_back(parse_assistant_blocks(*content, field));
        } else {
            parse_user_blocks(*content, field, out);
        }
        mark_breakpoints(*content, field, out.size(), hint);
    }
    return out;
}

std::vector<common_chat_tool> parse_tools(const json& body) {
    std::vector<common_chat_tool> tools;
    const json* v = find(body, "tools");
    if (!v) return tools;
    if (!v->is_array()) fail("'tools' must be an array");
    std::set<std::string> names;
    for (size_t i = 0; i < v->size(); i++) {
        const json& tool = (*v)[i];
        const std::string field = indexed("tools", i);
        if (!tool.is_object()) fail(in_quotes(field) + " must be an object");
        if (auto type = get_string(tool, "type", field + ".type"); type && *type != "custom") {
            fail(in_quotes(field) + " is Anthropic's server tool '" + *type +
                 "', which keepwarm cannot run; define a custom tool (name, description, input_schema) instead");
        }
        // A deferred tool is loaded into the model's context only when a tool search finds it (Anthropic's tool
        // search); keepwarm has no tool search, so it is not offered (Claude Code sends a placeholder this way).
        if (get_bool(tool, "defer_loading", field + ".defer_loading").value_or(false)) continue;
        common_chat_tool t;
        t.name = require_string(tool, "name", field + ".name");
        if (t.name.size() > 128 || t.name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                            "0123456789_-") != std::string::npos) {
            fail(in_quotes(field + ".name") + " must be 1 to 128 letters, digits, '_' or '-'");
        }
        if (!names.insert(t.name).second) fail(in_quotes(field + ".name") + ": duplicate tool name '" + t.name + "'");
        t.description = get_string(tool, "description", field + ".description").value_or("");
        const json* schema = find(tool, "input_schema");
        if (!schema || !schema->is_object())
            fail(in_quotes(field + ".input_schema") + " must be an object (a JSON schema)");
        if (auto type = get_string(*schema, "type", field + ".input_schema.type"); type && *type != "object") {
            fail(in_quotes(field + ".input_schema.type") + " must be 'object'");
        }
        bounded_json::require_schema(*schema, field + ".input_schema");
        t.parameters = schema->dump();
        tools.push_back(std::move(t));
    }
    return tools;
}

void parse_tool_choice(const json& body, chat_request& req) {
    const json* v = find(body, "tool_choice");
    if (!v) return;
    if (!v->is_object()) fail("'tool_choice' must be an object such as {\"type\": \"auto\"}");
    auto type = get_string(*v, "type", "tool_choice.type");
    if (!type) fail("'tool_choice.type' must be one of auto, any, tool, none");
    if (*type == "auto") {
        req.tool_choice = COMMON_CHAT_TOOL_CHOICE_AUTO;
    } else if (*type == "any") {
        req.tool_choice = COMMON_CHAT_TOOL_CHOICE_REQUIRED;
    } else if (*type == "none") {
        req.tool_choice = COMMON_CHAT_TOOL_CHOICE_NONE;
    } else if (*type == "tool") {
        const std::string name = require_string(*v, "name", "tool_choice.name");
        std::vector<common_chat_tool> chosen;
        for (const auto& t : req.tools) {
            if (t.name == name) chosen.push_back(t);
        }
        if (chosen.empty()) fail("'tool_choice.name' names '" + name + "', which is not in 'tools'");
        req.tools = std::move(chosen);
        req.tool_choice = COMMON_CHAT_TOOL_CHOICE_REQUIRED;
    } else {
        fail("'tool_choice.type' must be one of auto, any, tool, none (got '" + *type + "')");
    }
    if (req.tool_choice == COMMON_CHAT_TOOL_CHOICE_REQUIRED && req.tools.empty()) {
        fail("'tool_choice' requires a tool call but no 'tools' were given");
    }
    if (get_bool(*v, "disable_parallel_tool_use", "tool_choice.disable_parallel_tool_use").value_or(false)) {
        req.parallel_tool_calls = false;
    }
}

std::vector<std::string> parse_stop_sequences(const json& body) {
    std::vector<std::string> stop;
    const json* v = find(body, "stop_sequences");
    if (!v) return stop;
    if (!v->is_array()) fail("'stop_sequences' must be an array of strings");
    if (v->size() > max_stop_strings) {
        fail("'stop_sequences' has " + std::to_string(v->size()) + " strings; at most " +
             std::to_string(max_stop_strings) + " are allowed");
    }
    for (size_t i = 0; i < v->size(); i++) {
        const json& s = (*v)[i];
        // An empty one would end every answer before it starts.
        if (!s.is_string() || s.get_ref<const std::string&>().empty()) {
            fail(in_quotes(indexed("stop_sequences", i)) + " must be a non-empty string");
        }
        if (s.get_ref<const std::string&>().size() > max_stop_bytes) {
            fail(in_quotes(indexed("stop_sequences", i)) + " is longer than " + std::to_string(max_stop_bytes) +
                 " bytes");
        }
        stop.push_back(s.get<std::string>());
    }
    return stop;
}

void parse_thinking(const json& body, chat_request& req) {
    req.enable_thinking = false;  // Anthropic thinks only when asked to
    const json* v = find(body, "thinking");
    if (!v) return;
    if (!v->is_object()) fail("'thinking' must be an object such as {\"type\": \"enabled\", \"budget_tokens\": 2048}");
    auto type = get_string(*v, "type", "thinking.type");
    if (type == "enabled") {
        auto budget = get_integer(*v, "budget_tokens", "thinking.budget_tokens");
        if (!budget || *budget < 1) fail("'thinking.budget_tokens' must be a positive integer");
        req.enable_thinking = true;
    } else if (type == "adaptive") {
        req.enable_thinking = true;
    } else if (type != "disabled") {
        fail("'thinking.type' must be one of enabled, disabled, adaptive");
    }
}

// Structured outputs: output_config.format, or output_format of the earlier beta; Claude Code asks for its session
// titles this way.
std::string parse_output_format(const json& body) {
    const json* format = nullptr;
    std::string field;
    if (const json* config = find(body, "output_config")) {
        if (!config->is_object()) fail("'output_config' must be an object");
        format = find(*config, "format");
        field = "output_config.format";
    }
    if (!format) {
        format = find(body, "output_format");
        field = "output_format";
    }
    if (!format) return "";
    if (!format->is_object()) fail(in_quotes(field) + " must be an object");
    if (get_string(*format, "type", field + ".type") != "json_schema") {
        fail(in_quotes(field + ".type") + " must be 'json_schema'");
    }
    const json* schema = find(*format, "schema");
    if (!schema || !schema->is_object()) fail(in_quotes(field + ".schema") + " must be an object (a JSON schema)");
    bounded_json::require_schema(*schema, field + ".schema");
    return schema->dump();
}

json tool_input(const std::string& arguments) {
    if (arguments.empty()) return json::object();
    std::optional<json> input = bounded_json::try_parse(arguments);
    // The output parser only finishes a call whose arguments are JSON; Anthropic's input is always an object.
    return input && input->is_object() ? std::move(*input) : json::object();
}

}  // namespace

chat_request parse_messages_request(const json& body, endpoint kind) {
    if (!body.is_object()) fail("request body must be a JSON object");
    check_request_limits(body, "messages");
    chat_request req;
    req.api = "anthropic";
    req.model = parse_model(body);
    std::vector<std::string> system;
    if (const json* v = find(body, "system")) {
        system = system_texts(*v, "system");
        mark_breakpoints(*v, "system", 0, req.hint);
    }
    std::vector<common_chat_msg> messages = parse_messages(body, system, req.hint);
    std::erase_if(system, [](const std::string& text) { return text.empty(); });
    const size_t system_messages = system.empty() ? 0 : 1;
    if (!system.empty()) {
        common_chat_msg msg;
        msg.role = "system";
        set_text(msg, std::move(system));
        req.messages.push_back(std::move(msg));
        if (req.hint) req.hint->messages++;  // the system prompt counts as the first message now
    }
    for (auto& msg : messages) req.messages.push_back(std::move(msg));
    req.tools = parse_tools(body);
    if (const json* tools = find(body, "tools")) mark_breakpoints(*tools, "tools", system_messages, req.hint);
    // A breakpoint on the request itself (Anthropic's automatic caching) marks the whole prompt.
    if (const auto ttl = cache_breakpoint(body, "")) {
        req.hint = cache_hint{.messages = std::numeric_limits<size_t>::max(),
                              .ttl = std::max(*ttl, req.hint ? req.hint->ttl : *ttl)};
    }
    parse_tool_choice(body, req);
    parse_thinking(body, req);
    req.json_schema = parse_output_format(body);
    if (kind == endpoint::count_tokens) return req;

    auto max_tokens = get_integer(body, "max_tokens", "max_tokens");
    if (!max_tokens) fail("'max_tokens' is required");
    if (*max_tokens < 1) fail("'max_tokens' must be a positive integer");
    req.max_tokens = int(std::min<int64_t>(*max_tokens, std::numeric_limits<int32_t>::max()));
    req.stream = get_bool(body, "stream", "stream").value_or(false);
    req.stop = parse_stop_sequences(body);
    req.draft_max = parse_speculative(body);  // llama-server's field, read here as on its other endpoints
    req.sampling.temperature = get_unit_interval(body, "temperature");
    req.sampling.top_p = get_unit_interval(body, "top_p");
    if (auto top_k = get_integer(body, "top_k", "top_k")) {
        if (*top_k < 0 || *top_k > std::numeric_limits<int32_t>::max()) {
            fail("'top_k' must be a non-negative integer");
        }
        req.sampling.top_k = int(*top_k);
    }
    return req;
}

std::string error_type_for_status(int status) {
    switch (status) {
        case 401:
            return "authentication_error";
        case 403:
            return "permission_error";
        case 404:
            return "not_found_error";
        case 413:
            return "request_too_large";
        case 429:
            return "rate_limit_error";
        case 503:
        case 529:
            return "overloaded_error";
        default:
            return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

json error_json(const std::string& error_type, const std::string& message) {
    return json{{"type", "error"}, {"error", {{"type", error_type}, {"message", message}}}};
}

std::string context_error_message(const std::string& message) {
    std::vector<std::string> numbers;
    for (size_t i = message.find_first_of("0123456789"); i != std::string::npos && numbers.size() < 2;
         i = message.find_first_of("0123456789", i)) {
        const size_t end = message.find_first_not_of("0123456789", i);
        numbers.push_back(message.substr(i, end - i));
        i = end;
    }
    if (numbers.size() < 2) return "prompt is too long: " + message;
    return "prompt is too long: " + numbers[0] + " tokens > " + numbers[1] + " maximum (" + message + ")";
}

std::string error_body(int status, const std::string& type, const std::string& message) {
    const std::string text = type == "exceed_context_size_error" ? context_error_message(message) : message;
    return error_json(error_type_for_status(status), text).dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string tool_use_id(const std::string& call_id) {
    static const std::string ours = "call_";
    return call_id.compare(0, ours.size(), ours) == 0 ? "toolu_" + call_id.substr(ours.size()) : call_id;
}

std::string stop_reason(const common_chat_msg& msg, bool hit_token_limit, bool hit_stop_sequence) {
    if (hit_token_limit) return "max_tokens";
    if (hit_stop_sequence && msg.tool_calls.empty()) return "stop_sequence";
    return msg.tool_calls.empty() ? "end_turn" : "tool_use";
}

json message_usage_json(const usage_info& usage) {
    return json{
        {"input_tokens", 0},  // every prompt token is either reused or computed, and all computed ones are cached
        {"cache_creation_input_tokens", usage.prompt_tokens - usage.cached_tokens},
        {"cache_read_input_tokens", usage.cached_tokens},
        {"output_tokens", usage.completion_tokens},
    };
}

json content_json(const common_chat_msg& msg) {
    json content = json::array();
    if (!msg.reasoning_content.empty()) {
        content.push_back({{"type", "thinking"}, {"thinking", msg.reasoning_content}, {"signature", ""}});
    }
    std::string text = msg.content;
    for (const auto& part : msg.content_parts) text += part.text;
    if (!text.empty()) content.push_back({{"type", "text"}, {"text", text}});
    for (const auto& call : msg.tool_calls) {
        content.push_back({{"type", "tool_use"},
                           {"id", tool_use_id(call.id)},
                           {"name", call.name},
                           {"input", tool_input(call.arguments)}});
    }
    return content;
}

json message_json(const std::string& id, const std::string& model, const common_chat_msg& msg,
                  const std::string& stop_reason, const usage_info& usage, const std::optional<timings_info>& timings,
                  const std::string& stop_sequence) {
    json message{
        {"id", id},
        {"type", "message"},
        {"role", "assistant"},
        {"model", model},
        {"content", content_json(msg)},
        {"stop_reason", stop_reason},
        {"stop_sequence", stop_sequence.empty() ? json(nullptr) : json(stop_sequence)},
        {"usage", message_usage_json(usage)},
    };
    if (timings) message["timings"] = timings_json(*timings);
    return message;
}

json count_tokens_json(int input_tokens) {
    return json{{"input_tokens", input_tokens}};
}

std::string to_sse(const stream_event& event) {
    return "event: " + event.name + "\ndata: " + event.data.dump(-1, ' ', false, json::error_handler_t::replace) +
           "\n\n";
}

stream_event ping_event() {
    return {"ping", json{{"type", "ping"}}};
}

stream_event error_event(const std::string& error_type, const std::string& message) {
    return {"error", error_json(error_type, message)};
}

stream_event message_stream::start(int prompt_tokens) const {
    json message{
        {"id", id_},
        {"type", "message"},
        {"role", "assistant"},
        {"model", model_},
        {"content", json::array()},
        {"stop_reason", nullptr},
        {"stop_sequence", nullptr},
        {"usage",
         {{"input_tokens", 0},
          {"cache_creation_input_tokens", prompt_tokens},
          {"cache_read_input_tokens", 0},
          {"output_tokens", 0}}},
    };
    return {"message_start", json{{"type", "message_start"}, {"message", std::move(message)}}};
}

void message_stream::open(block_kind kind, std::vector<stream_event>& out) {
    close(out);
    index_++;
    open_kind_ = kind;
    json block;
    switch (kind) {
        case block_kind::thinking:
            block = {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}};
            break;
        case block_kind::text:
            block = {{"type", "text"}, {"text", ""}};
            break;
        case block_kind::tool_use:
            block = {
                {"type", "tool_use"}, {"id", tool_use_id(tool_id_)}, {"name", tool_name_}, {"input", json::object()}};
            tool_pending_ = false;
            break;
        case block_kind::none:
            return;
    }
    out.push_back({"content_block_start",
                   json{{"type", "content_block_start"}, {"index", index_}, {"content_block", std::move(block)}}});
}

void message_stream::close(std::vector<stream_event>& out) {
    if (open_kind_ == block_kind::none) return;
    if (open_kind_ == block_kind::thinking) {
        // Anthropic signs each thinking block; keepwarm has nothing to sign, and clients expect the delta.
        out.push_back({"content_block_delta", json{{"type", "content_block_delta"},
                                                   {"index", index_},
                                                   {"delta", {{"type", "signature_delta"}, {"signature", ""}}}}});
    }
    out.push_back({"content_block_stop", json{{"type", "content_block_stop"}, {"index", index_}}});
    open_kind_ = block_kind::none;
}

void message_stream::open_pending_tool_use(std::vector<stream_event>& out) {
    if (tool_pending_) open(block_kind::tool_use, out);
}

std::vector<stream_event> message_stream::push(const std::vector<common_chat_msg_diff>& diffs) {
    std::vector<stream_event> out;
    const auto delta = [&](json d) {
        out.push_back(
            {"content_block_delta", json{{"type", "content_block_delta"}, {"index", index_}, {"delta", std::move(d)}}});
    };
    for (const auto& diff : diffs) {
        if (!diff.reasoning_content_delta.empty()) {
            open_pending_tool_use(out);
            if (open_kind_ != block_kind::thinking) open(block_kind::thinking, out);
            delta({{"type", "thinking_delta"}, {"thinking", diff.reasoning_content_delta}});
        }
        if (!diff.content_delta.empty()) {
            open_pending_tool_use(out);
            if (open_kind_ != block_kind::text) open(block_kind::text, out);
            delta({{"type", "text_delta"}, {"text", diff.content_delta}});
        }
        if (diff.tool_call_index == std::string::npos) continue;
        if (diff.tool_call_index != tool_call_) {
            // A new call: the previous one (if its block never started) starts and ends first.
            open_pending_tool_use(out);
            close(out);
            tool_call_ = diff.tool_call_index;
            tool_pending_ = true;
            tool_id_.clear();
            tool_name_.clear();
        }
        // common sends the whole id and name again whenever either changed; a name may grow while it is parsed.
        if (!diff.tool_call_delta.id.empty()) tool_id_ = diff.tool_call_delta.id;
        if (!diff.tool_call_delta.name.empty()) tool_name_ = diff.tool_call_delta.name;
        if (!diff.tool_call_delta.arguments.empty()) {
            open_pending_tool_use(out);
            delta({{"type", "input_json_delta"}, {"partial_json", diff.tool_call_delta.arguments}});
        }
    }
    return out;
}

std::vector<stream_event> message_stream::finish(const std::string& stop_reason, const usage_info& usage,
                                                 const std::optional<timings_info>& timings,
                                                 const std::string& stop_sequence) {
    std::vector<stream_event> out;
    open_pending_tool_use(out);
    close(out);
    json message_delta{
        {"type", "message_delta"},
        {"delta",
         {{"stop_reason", stop_reason},
          {"stop_sequence", stop_sequence.empty() ? json(nullptr) : json(stop_sequence)}}},
        {"usage", message_usage_json(usage)},
    };
    if (timings) message_delta["timings"] = timings_json(*timings);
    out.push_back({"message_delta", std::move(message_delta)});
    out.push_back({"message_stop", json{{"type", "message_stop"}}});
    return out;
}

}  // namespace keepwarm::api::anthropic

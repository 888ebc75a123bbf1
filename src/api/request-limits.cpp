// See request-limits.h. Counts first (they read array sizes only), then one walk over the body's strings.
#include "api/request-limits.h"

#include "base/request-error.h"
#include "json/json-fields.h"

namespace keepwarm::api {

namespace {

using json = nlohmann::ordered_json;
using json_fields::in_quotes;

// "'tools' holds 5000 tools; keepwarm's request limit max_tools is 1024".
[[noreturn]] void over(const std::string& where, size_t count, const std::string& what, const char* limit_name,
                       size_t limit) {
    throw request_error(400, where + " holds " + std::to_string(count) + " " + what + "; keepwarm's request limit " +
                                 limit_name + " is " + std::to_string(limit));
}

const json* array_at(const json& obj, const char* key) {
    if (!obj.is_object()) return nullptr;
    const auto it = obj.find(key);
    return it != obj.end() && it->is_array() ? &*it : nullptr;
}

size_t array_size(const json& obj, const char* key) {
    const json* array = array_at(obj, key);
    return array ? array->size() : 0;
}

// The parts of one message or item: its content blocks (and those nested in a tool result), its tool calls (Chat
// Completions, Ollama), a function call output's parts, a reasoning item's content and summary.
size_t parts_of(const json& message) {
    size_t parts = array_size(message, "content") + array_size(message, "tool_calls") + array_size(message, "output") +
                   array_size(message, "summary");
    if (const json* content = array_at(message, "content")) {
        for (const json& block : *content) parts += array_size(block, "content");
    }
    return parts;
}

// The bytes of every string and key in `value`; depth is bounded by bounded_json (128 levels).
size_t text_bytes(const json& value) {
    switch (value.type()) {
        case json::value_t::string:
            return value.get_ref<const json::string_t&>().size();
        case json::value_t::array: {
            size_t bytes = 0;
            for (const json& v : value) bytes += text_bytes(v);
            return bytes;
        }
        case json::value_t::object: {
            size_t bytes = 0;
            for (auto it = value.begin(); it != value.end(); ++it) bytes += it.key().size() + text_bytes(it.value());
            return bytes;
        }
        default:
            return 0;
    }
}

}  // namespace

void check_request_limits(const json& body, const std::string& list_field, const request_limits& limits) {
    if (!body.is_object()) return;  // the dialect's parser says what is wrong with it
    const json* list = array_at(body, list_field.c_str());
    const size_t listed = list ? list->size() : 0;
    if (list_field == "input" && listed > limits.max_input_items) {
        over("'input'", listed, "items", "max_input_items", limits.max_input_items);
    }
    if (list_field != "input" && listed > limits.max_messages) {
        over(in_quotes(list_field), listed, "messages", "max_messages", limits.max_messages);
    }
    if (const json* tools = array_at(body, "tools")) {
        size_t count = tools->size();
        if (count <= limits.max_tools) {
            for (const json& tool : *tools) count += array_size(tool, "tools");  // a Responses namespace's functions
        }
        if (count > limits.max_tools) over("'tools'", count, "tools", "max_tools", limits.max_tools);
    }
    size_t parts = array_size(body, "system");  // Anthropic's system blocks
    if (list) {
        for (const json& message : *list) parts += parts_of(message);
    }
    if (parts > limits.max_content_parts) {
        over("the request", parts, "content parts", "max_content_parts", limits.max_content_parts);
    }
    if (const size_t bytes = text_bytes(body); bytes > limits.max_text_bytes) {
        over("the request's text", bytes, "bytes", "max_text_bytes", limits.max_text_bytes);
    }
}

}  // namespace keepwarm::api

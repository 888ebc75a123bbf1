// See responses-api.h. Field names and event shapes follow OpenAI's API reference for /v1/responses; every field is
// type-checked here so that bad input is a 400 naming it, never a crash.
#include "api/responses-api.h"

#include <algorithm>
#include <limits>
#include <set>

#include "api/openai-api.h"
#include "api/request-limits.h"
#include "base/request-error.h"
#include "json/bounded-json.h"
#include "json/json-fields.h"

namespace keepwarm::api::responses {

namespace {

using namespace json_fields;

// The text of a message's content: a string, or input_text / output_text / text parts (a refusal part's text too).
std::string content_text(const json& item, const std::string& field) {
    const json* content = find(item, "content");
    if (!content) return "";
    if (content->is_string()) return content->get<std::string>();
    if (!content->is_array()) fail(in_quotes(field + ".content") + " must be a string or an array of content parts");
    std::string text;
    for (size_t j = 0; j < content->size(); ++j) {
        const json& part = (*content)[j];
        const std::string part_field = indexed(field + ".content", j);
        if (!part.is_object()) fail(in_quotes(part_field) + " must be an object");
        const std::string type = get_string(part, "type", part_field + ".type").value_or("");
        if (type == "input_text" || type == "output_text" || type == "text") {
            const auto t = get_string(part, "text", part_field + ".text");
            if (!t) fail(in_quotes(part_field + ".text") + " must be a string");
            text += *t;
        } else if (type == "refusal") {
            text += get_string(part, "refusal", part_field + ".refusal").value_or("");
        } else if (type == "input_image" || type == "input_file" || type == "input_audio") {
            fail(in_quotes(part_field) + ": " + type + " is not supported: keepwarm serves text only");
        } else {
            fail(in_quotes(part_field + ".type") + " must be input_text or output_text (got '" + type + "')");
        }
    }
    return text;
}

// A reasoning item's text: its reasoning_text content (what keepwarm returns), else the encrypted_content (keepwarm
// puts the same text there, and clients that store reasoning send that field back), else its summary.
std::string reasoning_text(const json& item, const std::string& field) {
    std::string text;
    if (const json* content = find(item, "content")) {
        if (!content->is_array()) fail(in_quotes(field + ".content") + " must be an array");
        for (size_t j = 0; j < content->size(); ++j) {
            const json& part = (*content)[j];
            if (!part.is_object()) fail(in_quotes(indexed(field + ".content", j)) + " must be an object");
            text += get_string(part, "text", indexed(field + ".content", j) + ".text").value_or("");
        }
    }
    if (text.empty()) text = get_string(item, "encrypted_content", field + ".encrypted_content").value_or("");
    if (text.empty()) {
        if (const json* summary = find(item, "summary")) {
            if (!summary->is_array()) fail(in_quotes(field + ".summary") + " must be an array");
            for (size_t j = 0; j < summary->size(); ++j) {
                const json& part = (*summary)[j];
                if (!part.is_object()) fail(in_quotes(indexed(field + ".summary", j)) + " must be an object");
                text += (text.empty() ? "" : "\n\n") +
                        get_string(part, "text", indexed(field + ".summary", j) + ".text").value_or("");
            }
        }
    }
    return text;
}

// The assistant turn items add to: the last message when it is the assistant's and `fits` it, else a new one.
common_chat_msg& assistant_turn(std::vector<common_chat_msg>& messages, bool fits) {
    if (messages.empty() || messages.back().role != "assistant" || !fits) {
        common_chat_msg msg;
        msg.role = "assistant";
        messages.push_back(std::move(msg));
    }
    return messages.back();
}

bool open_turn(const std::vector<common_chat_msg>& messages) {
    return !messages.empty() && messages.back().role == "assistant";
}

std::vector<common_chat_msg> parse_input(const json& body) {
    std::vector<common_chat_msg> messages;
    const json* input = find(body, "input");
    if (!input) fail("'input' is required: a string or an array of input items");
    if (input->is_string()) {
        common_chat_msg msg;
        msg.role = "user";
        msg.content = input->get<std::string>();
        messages.push_back(std::move(msg));
        return messages;
    }
    if (!input->is_array()) fail("'input' must be a string or an array of input items");
    static const std::set<std::string> roles = {"system", "developer", "user", "assistant"};
    std::set<std::string> call_ids;                       // of the function_call items
    std::vector<std::pair<size_t, std::string>> outputs;  // function_call_output items: index, call_id
    for (size_t i = 0; i < input->size(); ++i) {
        const json& item = (*input)[i];
        const std::string field = indexed("input", i);
        if (!item.is_object()) fail(in_quotes(field) + " must be an object");
        // An item without a type but with a role is a message (the API's "easy input message").
        const std::string type =
            get_string(item, "type", field + ".type").value_or(find(item, "role") ? "message" : "");
        if (type == "message") {
            const auto role = get_string(item, "role", field + ".role");
            if (!role || !roles.count(*role)) {
                fail(in_quotes(field + ".role") + " must be one of user, assistant, system, developer");
            }
            std::string text = content_text(item, field);
            if (*role == "assistant") {
                // Text that follows the turn's reasoning belongs to that turn; after text or calls, a new turn.
                common_chat_msg& turn =
                    assistant_turn(messages, open_turn(messages) && messages.back().content.empty() &&
                                                 messages.back().tool_calls.empty());
                turn.content = std::move(text);
            } else {
                common_chat_msg msg;
                msg.role = *role;
                msg.content = std::move(text);
                messages.push_back(std::move(msg));
            }
        } else if (type == "function_call") {
            common_chat_tool_call call;
            const auto name = get_string(item, "name", field + ".name");
            if (!name || name->empty()) fail(in_quotes(field + ".name") + " must be a non-empty string");
            call.name = *name;
            call.id = get_string(item, "call_id", field + ".call_id").value_or("");
            if (call.id.empty()) fail(in_quotes(field + ".call_id") + " must be a non-empty string");
            call.arguments = get_string(item, "arguments", field + ".arguments").value_or("");
            if (call.arguments.empty()) call.arguments = "{}";
            bounded_json::require_json_text(call.arguments, field + ".arguments");
            call_ids.insert(call.id);
            assistant_turn(messages, open_turn(messages)).tool_calls.push_back(std::move(call));
        } else if (type == "function_call_output") {
            common_chat_msg msg;
            msg.role = "tool";
            msg.tool_call_id = get_string(item, "call_id", field + ".call_id").value_or("");
            if (msg.tool_call_id.empty()) fail(in_quotes(field + ".call_id") + " must be a non-empty string");
            outputs.emplace_back(i, msg.tool_call_id);
            const json* output = find(item, "output");
            if (output && output->is_string()) {
                msg.content = output->get<std::string>();
            } else if (output && output->is_array()) {
                json wrapper = {{"content", *output}};
                msg.content = content_text(wrapper, field + ".output");
            } else {
                fail(in_quotes(field + ".output") + " must be a string or an array of content parts");
            }
            messages.push_back(std::move(msg));
        } else if (type == "reasoning") {
            common_chat_msg& turn = assistant_turn(messages, false);
            turn.reasoning_content = reasoning_text(item, field);
        } else if (type.empty()) {
            fail(in_quotes(field + ".type") +
                 " is required (message, function_call, function_call_output or "
                 "reasoning)");
        } else {
            fail(in_quotes(field + ".type") + ": '" + type +
                 "' items are not supported (keepwarm takes message, function_call, function_call_output and "
                 "reasoning items; send the whole conversation as input)");
        }
    }
    // A tool's output answers a call of this conversation (the input, a previous response's included), as OpenAI
    // requires: one that answers nothing would render as a result of a call the model never made.
    for (const auto& [i, call_id] : outputs) {
        if (!call_ids.count(call_id)) {
            fail("No tool call found for function call output with call_id " + shown_id(call_id) + " (" +
                 in_quotes(indexed("input", i)) + ")");
        }
    }
    // A turn made of a reasoning item alone has nothing the templates render.
    std::erase_if(messages, [](const common_chat_msg& m) {
        return m.role == "assistant" && m.content.empty() && m.tool_calls.empty() && m.reasoning_content.empty();
    });
    if (messages.empty()) fail("'input' must hold at least one message");
    return messages;
}

// Tools that run on OpenAI's servers. A client that offers one (Codex sends web_search, with external access off)
// still works: the model is not offered it, and request_echo::ignored_tools names it.
bool hosted_tool(const std::string& type) {
    static const std::set<std::string> hosted = {"web_search",
                                                 "web_search_preview",
                                                 "web_search_preview_2025_03_11",
                                                 "web_search_2025_08_26",
                                                 "file_search",
                                                 "code_interpreter",
                                                 "image_generation",
                                                 "computer_use_preview",
                                                 "computer_use",
                                                 "mcp"};
    return hosted.count(type) > 0;
}

void parse_tool_list(const json& list, const std::string& list_field, std::vector<common_chat_tool>& tools,
                     std::set<std::string>& names, request_echo& echo, bool nested) {
    if (!list.is_array()) fail(in_quotes(list_field) + " must be an array");
    for (size_t i = 0; i < list.size(); ++i) {
        const json& tool = list[i];
        const std::string field = indexed(list_field, i);
        if (!tool.is_object()) fail(in_quotes(field) + " must be an object");
        const std::string type = get_string(tool, "type", field + ".type").value_or("");
        if (type == "namespace" && !nested) {
            // A group of function tools (Codex's sub-agent tools): the model is offered its functions.
            const json* members = find(tool, "tools");
            if (!members) fail(in_quotes(field + ".tools") + " must be an array");
            echo.tools.push_back(tool);
            parse_tool_list(*members, field + ".tools", tools, names, echo, true);
            continue;
        }
        if (hosted_tool(type)) {
            echo.ignored_tools.push_back(type);
            echo.tools.push_back(tool);
            continue;
        }
        if (type != "function") {
            fail(in_quotes(field + ".type") + ": '" + type +
                 "' tools are not supported (keepwarm offers the model function tools; tools that run on OpenAI's "
                 "servers, such as web_search, are left out)");
        }
        const auto name = get_string(tool, "name", field + ".name");
        if (!name || name->empty()) fail(in_quotes(field + ".name") + " must be a non-empty string");
        if (!names.insert(*name).second) fail(in_quotes(field + ".name") + ": duplicate tool name '" + *name + "'");
        common_chat_tool t;
        t.name = *name;
        t.description = get_string(tool, "description", field + ".description").value_or("");
        const json* params = find(tool, "parameters");
        if (params && !params->is_object())
            fail(in_quotes(field + ".parameters") + " must be an object (a JSON schema)");
        if (params) bounded_json::require_schema(*params, field + ".parameters");
        t.parameters = params ? params->dump() : R"({"type":"object","properties":{}})";
        json echoed = {{"type", "function"},
                       {"name", t.name},
                       {"description", t.description},
                       {"parameters", params ? *params : json::parse(t.parameters)},
                       {"strict", get_bool(tool, "strict", field + ".strict").value_or(false)}};
        if (!nested) echo.tools.push_back(std::move(echoed));
        tools.push_back(std::move(t));
    }
}

std::vector<common_chat_tool> parse_tools(const json& body, request_echo& echo) {
    std::vector<common_chat_tool> tools;
    const json* v = find(body, "tools");
    if (!v) return tools;
    std::set<std::string> names;
    parse_tool_list(*v, "tools", tools, names, echo, false);
    return tools;
}

// "auto" | "none" | "required" | {"type": "function", "name": ...}: a named function narrows the tools to it.
void parse_tool_choice(const json& body, chat_request& req, request_echo& echo) {
    const json* v = find(body, "tool_choice");
    if (!v) return;
    echo.tool_choice = *v;
    if (v->is_string()) {
        const std::string s = v->get<std::string>();
        if (s == "auto") {
            req.tool_choice = COMMON_CHAT_TOOL_CHOICE_AUTO;
        } else if (s == "none") {
            req.tool_choice = COMMON_CHAT_TOOL_CHOICE_NONE;
        } else if (s == "required") {
            req.tool_choice = COMMON_CHAT_TOOL_CHOICE_REQUIRED;
        } else {
            fail("'tool_choice' must be auto, none, required or {\"type\": \"function\", \"name\": ...}");
        }
    } else if (v->is_object()) {
        const std::string type = get_string(*v, "type", "tool_choice.type").value_or("");
        if (type != "function") {
            fail("'tool_choice.type' must be 'function' (keepwarm takes function tools only)");
        }
        const auto name = get_string(*v, "name", "tool_choice.name");
        if (!name || name->empty()) fail("'tool_choice.name' must be a non-empty string");
        const auto it = std::find_if(req.tools.begin(), req.tools.end(),
                                     [&](const common_chat_tool& t) { return t.name == *name; });
        if (it == req.tools.end()) fail("'tool_choice.name' names '" + *name + "', which is not in 'tools'");
        req.tools = {*it};
        req.tool_choice = COMMON_CHAT_TOOL_CHOICE_REQUIRED;
    } else {
        fail("'tool_choice' must be a string or an object");
    }
    if (req.tool_choice == COMMON_CHAT_TOOL_CHOICE_REQUIRED && req.tools.empty()) {
        fail("'tool_choice' requires a tool call but no 'tools' were given");
    }
}

// text.format: {type: text} | {type: json_object} | {type: json_schema, name, schema, strict}.
std::string parse_text_format(const json& body, request_echo& echo) {
    const json* text = find(body, "text");
    if (!text) return "";
    if (!text->is_object()) fail("'text' must be an object");
    const json* format = find(*text, "format");
    if (!format) return "";
    if (!format->is_object()) fail("'text.format' must be an object");
    echo.text_format = *format;
    const std::string type = get_string(*format, "type", "text.format.type").value_or("text");
    if (type == "text") return "";
    if (type == "json_object") return R"({"type":"object"})";
    if (type != "json_schema") fail("'text.format.type' must be text, json_object or json_schema");
    const json* schema = find(*format, "schema");
    if (!schema || !schema->is_object()) fail("'text.format.schema' must be an object");
    bounded_json::require_schema(*schema, "text.format.schema");
    return schema->dump();
}

// reasoning.effort: "none" turns thinking off; another level is the template's reasoning_effort variable.
void parse_reasoning(const json& body, chat_request& req, request_echo& echo) {
    const json* r = find(body, "reasoning");
    if (!r) return;
    if (!r->is_object()) fail("'reasoning' must be an object");
    echo.reasoning = {{"effort", find(*r, "effort") ? (*r)["effort"] : json(nullptr)},
                      {"summary", find(*r, "summary") ? (*r)["summary"] : json(nullptr)}};
    const auto effort = get_string(*r, "effort", "reasoning.effort");
    if (!effort) return;
    static const std::set<std::string> efforts = {"none", "minimal", "low", "medium", "high", "xhigh"};
    if (!efforts.count(*effort)) fail("'reasoning.effort' must be one of none, minimal, low, medium, high, xhigh");
    if (*effort == "none") {
        req.enable_thinking = false;
    } else {
        req.chat_template_kwargs["reasoning_effort"] = json(*effort).dump();
    }
}

json call_item(const std::string& item_id, const common_chat_tool_call& call, const std::string& status) {
    return {{"type", "function_call"},     {"id", item_id},   {"call_id", call.id}, {"name", call.name},
            {"arguments", call.arguments}, {"status", status}};
}

json reasoning_part(const std::string& text) {
    return {{"type", "reasoning_text"}, {"text", text}};
}

json reasoning_item(const std::string& item_id, const std::string& text) {
    return {{"type", "reasoning"},
            {"id", item_id},
            {"summary", json::array()},
            {"content", json::array({reasoning_part(text)})},
            {"encrypted_content", text}};
}

json text_part(const std::string& text) {
    return {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}, {"logprobs", json::array()}};
}

json message_item(const std::string& item_id, const std::string& text, const std::string& status) {
    json content = json::array();
    if (status == "completed") content.push_back(text_part(text));
    return {{"type", "message"}, {"id", item_id}, {"status", status}, {"role", "assistant"}, {"content", content}};
}

// Item ids derived from the response's: rs_/msg_/fc_ + its random part + the item's index.
std::string item_id(const std::string& response_id, const char* prefix, int index) {
    const std::string tail = response_id.rfind("resp_", 0) == 0 ? response_id.substr(5) : response_id;
    return std::string(prefix) + tail + "_" + std::to_string(index);
}

}  // namespace

parsed_request parse_request(const json& body) {
    if (!body.is_object()) fail("request body must be a JSON object");
    check_request_limits(body, "input");
    parsed_request r;
    chat_request& req = r.chat;
    request_echo& echo = r.echo;
    req.api = "openai";
    req.model = get_string(body, "model", "model").value_or("");
    echo.previous_response_id = get_string(body, "previous_response_id", "previous_response_id");
    if (const auto conversation = find(body, "conversation")) {
        fail("'conversation' is not supported: send the whole conversation as 'input'");
    }
    echo.instructions = get_string(body, "instructions", "instructions").value_or("");
    req.messages = parse_input(body);
    if (!echo.instructions.empty()) {
        common_chat_msg system;
        system.role = "system";
        system.content = echo.instructions;
        req.messages.insert(req.messages.begin(), std::move(system));
    }
    req.tools = parse_tools(body, echo);
    parse_tool_choice(body, req, echo);
    req.parallel_tool_calls = get_bool(body, "parallel_tool_calls", "parallel_tool_calls");
    echo.parallel_tool_calls = req.parallel_tool_calls.value_or(true);
    req.stream = get_bool(body, "stream", "stream").value_or(false);
    if (const auto max = get_integer(body, "max_output_tokens", "max_output_tokens")) {
        if (*max < 1) fail("'max_output_tokens' must be a positive integer");
        req.max_tokens = static_cast<int>(std::min<int64_t>(*max, std::numeric_limits<int32_t>::max()));
        echo.max_output_tokens = req.max_tokens;
    }
    req.sampling = parse_sampling(body);
    req.draft_max = parse_speculative(body);
    parse_reasoning(body, req, echo);
    req.json_schema = parse_text_format(body, echo);
    echo.store = get_bool(body, "store", "store").value_or(true);
    if (const json* metadata = find(body, "metadata")) {
        if (!metadata->is_object()) fail("'metadata' must be an object");
        bounded_json::require_shape(*metadata, "metadata");
        echo.metadata = *metadata;
    }
    parse_prompt_cache_key(body, req);
    if (!req.prompt_cache_key.empty()) echo.prompt_cache_key = req.prompt_cache_key;
    if (get_integer(body, "top_logprobs", "top_logprobs").value_or(0) > 0) {
        fail("'top_logprobs' is not supported: keepwarm does not return token probabilities");
    }
    return r;
}

std::string shown_id(const std::string& id) {
    return id.size() <= max_shown_id_bytes ? id : id.substr(0, max_shown_id_bytes) + "...";
}

void check_requested_id(const std::string& id, const std::string& field) {
    if (id.size() > max_requested_id_bytes) {
        fail(in_quotes(field) + " is " + std::to_string(id.size()) + " characters long; a response id has at most " +
             std::to_string(max_requested_id_bytes));
    }
}

request_error response_not_found(const std::string& id, bool previous) {
    return request_error(
        404, std::string(previous ? "Previous response" : "Response") + " with id '" + shown_id(id) + "' not found.",
        "invalid_request_error");
}

json input_items(const json& body) {
    const json* input = find(body, "input");
    if (!input) fail("'input' is required: a string or an array of input items");
    if (input->is_string()) {
        return json::array({{{"type", "message"},
                             {"role", "user"},
                             {"content", json::array({{{"type", "input_text"}, {"text", *input}}})}}});
    }
    if (!input->is_array()) fail("'input' must be a string or an array of input items");
    return *input;
}

json continue_input(json body, const json& previous_items) {
    json items = previous_items;
    for (const json& item : input_items(body)) items.push_back(item);
    body["input"] = std::move(items);
    return body;
}

json usage_json(const usage_info& usage) {
    return {{"input_tokens", usage.prompt_tokens},
            {"input_tokens_details",
             {{"cached_tokens", usage.cached_tokens},
              {"computed_tokens", usage.prompt_tokens - usage.cached_tokens},
              {"cached_tokens_device", usage.cache.device},
              {"cached_tokens_ram", usage.cache.ram},
              {"cached_tokens_disk", usage.cache.disk},
              {"checkpoint_pos", usage.cache.checkpoint_pos}}},
            {"output_tokens", usage.completion_tokens},
            {"output_tokens_details", {{"reasoning_tokens", 0}}},
            {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

json output_json(const std::string& id, const common_chat_msg& msg, bool cut_by_token_limit) {
    json out = json::array();
    if (!msg.reasoning_content.empty()) {
        out.push_back(reasoning_item(item_id(id, "rs_", static_cast<int>(out.size())), msg.reasoning_content));
    }
    if (!msg.content.empty()) {
        out.push_back(message_item(item_id(id, "msg_", static_cast<int>(out.size())), msg.content, "completed"));
    }
    for (const auto& call : msg.tool_calls) {
        out.push_back(call_item(item_id(id, "fc_", static_cast<int>(out.size())), call, "completed"));
    }
    if (cut_by_token_limit && !out.empty()) out.back()["status"] = "incomplete";
    return out;
}

json response_json(const std::string& id, const std::string& model, int64_t created_at, const request_echo& echo,
                   const std::string& status_word, const json& output, const json& usage,
                   const std::optional<timings_info>& timings, const std::string& error_message,
                   bool cut_by_token_limit) {
    json r = {
        {"id", id},
        {"object", "response"},
        {"created_at", created_at},
        {"status", status_word},
        {"error", error_message.empty() ? json(nullptr) : json{{"code", "server_error"}, {"message", error_message}}},
        {"incomplete_details", cut_by_token_limit ? json{{"reason", "max_output_tokens"}} : json(nullptr)},
        {"instructions", echo.instructions.empty() ? json(nullptr) : json(echo.instructions)},
        {"max_output_tokens", echo.max_output_tokens ? json(*echo.max_output_tokens) : json(nullptr)},
        {"model", model},
        {"output", output},
        {"parallel_tool_calls", echo.parallel_tool_calls},
        {"previous_response_id", echo.previous_response_id ? json(*echo.previous_response_id) : json(nullptr)},
        {"reasoning", echo.reasoning},
        {"store", echo.store},
        {"text", {{"format", echo.text_format}}},
        {"tool_choice", echo.tool_choice},
        {"tools", echo.tools},
        {"truncation", "disabled"},
        {"usage", usage},
        {"metadata", echo.metadata}};
    if (echo.prompt_cache_key) r["prompt_cache_key"] = *echo.prompt_cache_key;
    if (timings) r["timings"] = timings_json(*timings);
    return r;
}

event_stream::event_stream(std::string id, std::string model, int64_t created_at, request_echo echo)
    : id_(std::move(id)), model_(std::move(model)), created_at_(created_at), echo_(std::move(echo)) {}

std::string event_stream::to_sse(const stream_event& event) {
    json data = {{"type", event.type}, {"sequence_number", sequence_++}};
    for (auto it = event.data.begin(); it != event.data.end(); ++it) data[it.key()] = it.value();
    return "event: " + event.type + "\ndata: " + data.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::vector<stream_event> event_stream::start() {
    const json response = response_json(id_, model_, created_at_, echo_, "in_progress", json::array(), json(nullptr));
    return {{"response.created", {{"response", response}}}, {"response.in_progress", {{"response", response}}}};
}

json event_stream::item_now(bool done) const {
    const std::string status = done ? "completed" : "in_progress";
    switch (kind_) {
        case item_kind::reasoning:
            return done ? reasoning_item(item_id_, text_)
                        : json{{"type", "reasoning"},
                               {"id", item_id_},
                               {"summary", json::array()},
                               {"content", json::array()}};
        case item_kind::message:
            return message_item(item_id_, text_, status);
        case item_kind::function_call:
            return call_item(item_id_, {call_name_, done ? text_ : "", call_id_}, status);
        case item_kind::none:
            break;
    }
    return json::object();
}

void event_stream::open(item_kind kind, std::vector<stream_event>& out) {
    close(out);
    kind_ = kind;
    ++output_index_;
    text_.clear();
    item_id_ = item_id(id_,
                       kind == item_kind::reasoning ? "rs_"
                       : kind == item_kind::message ? "msg_"
                                                    : "fc_",
                       output_index_);
    if (kind == item_kind::function_call) call_pending_ = false;
    out.push_back({"response.output_item.added", {{"output_index", output_index_}, {"item", item_now(false)}}});
    if (kind == item_kind::message || kind == item_kind::reasoning) {
        out.push_back({"response.content_part.added",
                       {{"item_id", item_id_},
                        {"output_index", output_index_},
                        {"content_index", 0},
                        {"part", kind == item_kind::message ? text_part("") : reasoning_part("")}}});
    }
}

void event_stream::close(std::vector<stream_event>& out) {
    const json where = {{"item_id", item_id_}, {"output_index", output_index_}};
    switch (kind_) {
        case item_kind::none:
            return;
        case item_kind::reasoning: {
            json done = where;
            done["content_index"] = 0;
            done["text"] = text_;
            out.push_back({"response.reasoning_text.done", done});
            json part = where;
            part["content_index"] = 0;
            part["part"] = reasoning_part(text_);
            out.push_back({"response.content_part.done", part});
            break;
        }
        case item_kind::message: {
            json done = where;
            done["content_index"] = 0;
            done["text"] = text_;
            done["logprobs"] = json::array();
            out.push_back({"response.output_text.done", done});
            json part = where;
            part["content_index"] = 0;
            part["part"] = text_part(text_);
            out.push_back({"response.content_part.done", part});
            break;
        }
        case item_kind::function_call: {
            json done = where;
            done["name"] = call_name_;
            done["arguments"] = text_;
            out.push_back({"response.function_call_arguments.done", done});
            break;
        }
    }
    json item = item_now(true);
    done_items_.push_back(item);
    out.push_back({"response.output_item.done", {{"output_index", output_index_}, {"item", std::move(item)}}});
    kind_ = item_kind::none;
}

void event_stream::open_pending_call(std::vector<stream_event>& out) {
    if (call_pending_) open(item_kind::function_call, out);
}

std::vector<stream_event> event_stream::push(const std::vector<common_chat_msg_diff>& diffs) {
    std::vector<stream_event> out;
    const auto delta = [&](const char* type, const std::string& text, bool with_content_index) {
        json d = {{"item_id", item_id_}, {"output_index", output_index_}, {"delta", text}};
        if (with_content_index) d["content_index"] = 0;
        if (kind_ == item_kind::message) d["logprobs"] = json::array();
        out.push_back({type, std::move(d)});
        text_ += text;
    };
    for (const auto& diff : diffs) {
        if (!diff.reasoning_content_delta.empty()) {
            open_pending_call(out);
            if (kind_ != item_kind::reasoning) open(item_kind::reasoning, out);
            delta("response.reasoning_text.delta", diff.reasoning_content_delta, true);
        }
        if (!diff.content_delta.empty()) {
            open_pending_call(out);
            if (kind_ != item_kind::message) open(item_kind::message, out);
            delta("response.output_text.delta", diff.content_delta, true);
        }
        if (diff.tool_call_index == std::string::npos) continue;
        if (diff.tool_call_index != call_index_) {
            // A new call: the previous one (if its item never started) starts and ends first.
            open_pending_call(out);
            close(out);
            call_index_ = diff.tool_call_index;
            call_pending_ = true;
            call_id_.clear();
            call_name_.clear();
        }
        // common sends the whole id and name again whenever either changed; a name may grow while it is parsed.
        if (!diff.tool_call_delta.id.empty()) call_id_ = diff.tool_call_delta.id;
        if (!diff.tool_call_delta.name.empty()) call_name_ = diff.tool_call_delta.name;
        if (!diff.tool_call_delta.arguments.empty()) {
            open_pending_call(out);
            delta("response.function_call_arguments.delta", diff.tool_call_delta.arguments, false);
        }
    }
    return out;
}

std::vector<stream_event> event_stream::finish(const common_chat_msg& final_msg, status st, const usage_info& usage,
                                               const std::optional<timings_info>& timings) {
    std::vector<stream_event> out;
    open_pending_call(out);
    close(out);
    // The items as streamed; the final parse's (same text, ids from the parser) when nothing was streamed.
    const bool cut = st == status::incomplete;
    json output = done_items_.empty() ? output_json(id_, final_msg) : done_items_;
    if (cut && !output.empty()) output.back()["status"] = "incomplete";
    const json response = response_json(id_, model_, created_at_, echo_, cut ? "incomplete" : "completed", output,
                                        usage_json(usage), timings, "", cut);
    out.push_back({cut ? "response.incomplete" : "response.completed", {{"response", response}}});
    return out;
}

std::vector<stream_event> event_stream::fail(const std::string& message) {
    std::vector<stream_event> out;
    close(out);
    const json response = response_json(id_, model_, created_at_, echo_, "failed", done_items_, json(nullptr),
                                        std::nullopt, message.empty() ? "generation failed" : message);
    out.push_back({"response.failed", {{"response", response}}});
    return out;
}

}  // namespace keepwarm::api::responses

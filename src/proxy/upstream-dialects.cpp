// See upstream-dialects.h.
#include "proxy/upstream-dialects.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>

namespace keepwarm::proxy {

using json = nlohmann::ordered_json;
// What an upstream sends is read into nlohmann's std::map objects: its order does not matter here, and ordered_json
// inserts each key in linear time (an event of 100,000 keys, 1 MB, takes 27 s to parse; 0.15 s this way).
using answer_json = nlohmann::json;

namespace {

// Tool parameters and call arguments travel as JSON text inside common's types; an API that wants objects gets them
// parsed, and text that is not JSON stays a string rather than failing the request.
json parse_or_string(const std::string& text, json empty) {
    if (text.empty()) return empty;
    try {
        return json::parse(text);
    } catch (const json::parse_error&) {
        return text;
    }
}

// The text of a message: `content`, or its text parts joined (parts are text only once parsed).
std::string text_of(const common_chat_msg& msg) {
    if (!msg.content_parts.empty()) {
        std::string text;
        for (const auto& part : msg.content_parts) text += part.text;
        return text;
    }
    return msg.content;
}

json openai_message(const common_chat_msg& msg) {
    json m = {{"role", msg.role}};
    m["content"] = text_of(msg);
    if (!msg.reasoning_content.empty()) m["reasoning_content"] = msg.reasoning_content;
    if (!msg.tool_calls.empty()) {
        json calls = json::array();
        for (const auto& call : msg.tool_calls) {
            calls.push_back({{"id", call.id},
                             {"type", "function"},
                             {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
        }
        m["tool_calls"] = std::move(calls);
    }
    if (!msg.tool_call_id.empty()) m["tool_call_id"] = msg.tool_call_id;
    if (!msg.tool_name.empty()) m["name"] = msg.tool_name;
    return m;
}

json function_tools(const std::vector<common_chat_tool>& tools) {
    json out = json::array();
    for (const auto& tool : tools) {
        out.push_back({{"type", "function"},
                       {"function",
                        {{"name", tool.name},
                         {"description", tool.description},
                         {"parameters", parse_or_string(tool.parameters, json::object())}}}});
    }
    return out;
}

json openai_body(const chat_request& chat, const std::string& model) {
    json body = {{"model", model}, {"stream", true}, {"stream_options", {{"include_usage", true}}}};
    json messages = json::array();
    for (const auto& msg : chat.messages) messages.push_back(openai_message(msg));
    body["messages"] = std::move(messages);
    if (!chat.tools.empty()) {
        body["tools"] = function_tools(chat.tools);
        body["tool_choice"] = chat.tool_choice == COMMON_CHAT_TOOL_CHOICE_REQUIRED ? "required"
                              : chat.tool_choice == COMMON_CHAT_TOOL_CHOICE_NONE   ? "none"
                                                                                   : "auto";
    }
    if (chat.parallel_tool_calls) body["parallel_tool_calls"] = *chat.parallel_tool_calls;
    if (chat.max_tokens) body["max_tokens"] = *chat.max_tokens;
    if (!chat.stop.empty()) body["stop"] = chat.stop;
    write_openai_sampling(body, chat.sampling);
    if (!chat.json_schema.empty()) {
        body["response_format"] = {{"type", "json_schema"},
                                   {"json_schema", {{"name", "response"}, {"schema", json::parse(chat.json_schema)}}}};
    }
    json kwargs = json::object();
    for (const auto& [key, value] : chat.chat_template_kwargs) kwargs[key] = parse_or_string(value, nullptr);
    if (chat.enable_thinking) kwargs["enable_thinking"] = *chat.enable_thinking;
    if (!kwargs.empty()) body["chat_template_kwargs"] = std::move(kwargs);
    // The routing key goes on (an Anthropic client's breakpoints have no OpenAI form: only keepwarm's own routing and
    // an Anthropic-dialect upstream see them).
    if (!chat.prompt_cache_key.empty()) body["prompt_cache_key"] = chat.prompt_cache_key;
    // llama-server's per-request drafting limit (keepwarm's too), only where the client set it: a client that sends it
    // expects an upstream that reads it.
    if (chat.draft_max) body["speculative.n_max"] = *chat.draft_max;
    return body;
}

namespace {
// The request's cache hint as one Anthropic breakpoint: on the last block of the last message it covers (the system
// prompt when it covers no message), 1h when the client asked for more than 5 minutes.
void write_cache_breakpoint(json& body, const std::optional<cache_hint>& hint, size_t marked_messages) {
    if (!hint) return;
    json control = {{"type", "ephemeral"}};
    if (hint->ttl > std::chrono::minutes(5)) control["ttl"] = "1h";
    json& messages = body["messages"];
    if (marked_messages > 0 && marked_messages <= messages.size()) {
        json& content = messages[marked_messages - 1]["content"];
        if (content.is_string()) content = json::array({{{"type", "text"}, {"text", content.get<std::string>()}}});
        if (!content.empty()) content.back()["cache_control"] = std::move(control);
    } else if (body.contains("system")) {
        body["system"] = json::array(
            {{{"type", "text"}, {"text", body["system"].get<std::string>()}, {"cache_control", std::move(control)}}});
    }
}
}  // namespace

json anthropic_body(const chat_request& chat, const std::string& model) {
    json body = {
        {"model", model}, {"max_tokens", chat.max_tokens.value_or(anthropic_default_max_tokens)}, {"stream", true}};
    std::string system;
    json messages = json::array();
    // Tool results are user turns of tool_result blocks; consecutive results share one turn, as Anthropic sends them.
    const auto user_turn = [&messages]() -> json& {
        if (messages.empty() || messages.back()["role"] != "user" || messages.back()["content"].is_string()) {
            messages.push_back({{"role", "user"}, {"content", json::array()}});
        }
        return messages.back()["content"];
    };
    size_t marked_messages = 0;  // Anthropic messages the hint covers, once built
    for (size_t i = 0; i < chat.messages.size(); i++) {
        const common_chat_msg& msg = chat.messages[i];
        if (chat.hint && i == chat.hint->messages) marked_messages = messages.size();
        const std::string text = text_of(msg);
        if ((msg.role == "system" || msg.role == "developer") && messages.empty()) {
            system += (system.empty() ? "" : "\n\n") + text;
        } else if (msg.role == "tool") {
            user_turn().push_back({{"type", "tool_result"}, {"tool_use_id", msg.tool_call_id}, {"content", text}});
        } else if (msg.role == "assistant") {
            json blocks = json::array();
            if (!msg.reasoning_content.empty()) {
                blocks.push_back({{"type", "thinking"}, {"thinking", msg.reasoning_content}, {"signature", ""}});
            }
            if (!text.empty()) blocks.push_back({{"type", "text"}, {"text", text}});
            for (const auto& call : msg.tool_calls) {
                blocks.push_back({{"type", "tool_use"},
                                  {"id", call.id},
                                  {"name", call.name},
                                  {"input", parse_or_string(call.arguments, json::object())}});
            }
            messages.push_back({{"role", "assistant"}, {"content", std::move(blocks)}});
        } else {  // user, or a system message after the conversation began (a user turn, as keepwarm reads it)
            if (!text.empty()) user_turn().push_back({{"type", "text"}, {"text", text}});
        }
    }
    if (chat.hint && chat.hint->messages >= chat.messages.size()) marked_messages = messages.size();
    if (!system.empty()) body["system"] = system;
    body["messages"] = std::move(messages);
    write_cache_breakpoint(body, chat.hint, marked_messages);
    if (!chat.tools.empty()) {
        json tools = json::array();
        for (const auto& tool : chat.tools) {
            tools.push_back({{"name", tool.name},
                             {"description", tool.description},
                             {"input_schema", parse_or_string(tool.parameters, json::object())}});
        }
        body["tools"] = std::move(tools);
        json choice = {{"type", chat.tool_choice == COMMON_CHAT_TOOL_CHOICE_REQUIRED ? "any"
                                : chat.tool_choice == COMMON_CHAT_TOOL_CHOICE_NONE   ? "none"
                                                                                     : "auto"}};
        if (chat.parallel_tool_calls == false && chat.tool_choice != COMMON_CHAT_TOOL_CHOICE_NONE) {
            choice["disable_parallel_tool_use"] = true;
        }
        body["tool_choice"] = std::move(choice);
    }
    if (!chat.stop.empty()) body["stop_sequences"] = chat.stop;
    const sampling_options& s = chat.sampling;
    if (s.temperature) body["temperature"] = *s.temperature;
    if (s.top_p) body["top_p"] = *s.top_p;
    if (s.top_k) body["top_k"] = *s.top_k;
    if (chat.enable_thinking.value_or(false)) {
        body["thinking"] = {{"type", "enabled"}, {"budget_tokens", 1024}};
    }
    if (!chat.json_schema.empty()) {
        body["output_config"] = {{"format", {{"type", "json_schema"}, {"schema", json::parse(chat.json_schema)}}}};
    }
    return body;
}

json ollama_body(const chat_request& chat, const std::string& model) {
    json body = {{"model", model}, {"stream", true}};
    json messages = json::array();
    for (const auto& msg : chat.messages) {
        json m = {{"role", msg.role}, {"content", text_of(msg)}};
        if (!msg.reasoning_content.empty()) m["thinking"] = msg.reasoning_content;
        if (!msg.tool_calls.empty()) {
            json calls = json::array();
            for (const auto& call : msg.tool_calls) {
                calls.push_back(
                    {{"function",
                      {{"name", call.name}, {"arguments", parse_or_string(call.arguments, json::object())}}}});
            }
            m["tool_calls"] = std::move(calls);
        }
        if (!msg.tool_name.empty()) m["tool_name"] = msg.tool_name;
        messages.push_back(std::move(m));
    }
    body["messages"] = std::move(messages);
    // Ollama has no tool_choice: "none" is served by not offering the tools; "required" cannot be said.
    if (!chat.tools.empty() && chat.tool_choice != COMMON_CHAT_TOOL_CHOICE_NONE)
        body["tools"] = function_tools(chat.tools);
    if (chat.enable_thinking) body["think"] = *chat.enable_thinking;
    if (!chat.json_schema.empty()) body["format"] = json::parse(chat.json_schema);
    json options = json::object();
    const sampling_options& s = chat.sampling;
    if (s.temperature) options["temperature"] = *s.temperature;
    if (s.top_p) options["top_p"] = *s.top_p;
    if (s.min_p) options["min_p"] = *s.min_p;
    if (s.top_k) options["top_k"] = *s.top_k;
    if (s.repeat_penalty) options["repeat_penalty"] = *s.repeat_penalty;
    if (s.repeat_last_n) options["repeat_last_n"] = *s.repeat_last_n;
    if (s.presence_penalty) options["presence_penalty"] = *s.presence_penalty;
    if (s.frequency_penalty) options["frequency_penalty"] = *s.frequency_penalty;
    if (s.seed) options["seed"] = *s.seed;
    if (chat.max_tokens) options["num_predict"] = *chat.max_tokens;
    if (!chat.stop.empty()) options["stop"] = chat.stop;
    if (!options.empty()) body["options"] = std::move(options);
    return body;
}

// A token count an upstream reported: 0 when absent or not a number, clamped to [0, INT_MAX] (a float as large as
// 1e300 does not fit an int; converting it would be undefined).
template <typename Json>
int int_at(const Json& obj, const char* key) {
    const auto it = obj.find(key);
    if (it == obj.end()) return 0;
    constexpr auto most = std::numeric_limits<int>::max();
    if (it->is_number_unsigned()) return static_cast<int>(std::min<uint64_t>(it->template get<uint64_t>(), most));
    if (it->is_number_integer()) return static_cast<int>(std::clamp<int64_t>(it->template get<int64_t>(), 0, most));
    if (it->is_number_float()) {
        const double value = it->template get<double>();
        return value >= 0 ? (value < most ? static_cast<int>(value) : most) : 0;  // NaN: 0
    }
    return 0;
}

int sum_of(int a, int b) {
    return static_cast<int>(std::min<int64_t>(int64_t{a} + b, std::numeric_limits<int>::max()));
}

// A non-negative integer (an index), or nullopt for anything else: -1, 2^64-1 read as signed, 1.5, "0".
template <typename Json>
std::optional<size_t> count_of(const Json& value) {
    if (value.is_number_unsigned()) return static_cast<size_t>(value.template get<uint64_t>());
    if (value.is_number_integer() && value.template get<int64_t>() >= 0)
        return static_cast<size_t>(value.template get<int64_t>());
    return std::nullopt;
}

template <typename Json>
const Json& empty_object() {
    static const Json empty = Json::object();
    return empty;
}

// Whether JSON text nests arrays and objects deeper than `limit`, by a scan that only counts brackets outside
// strings: nlohmann's dump() and destructor recurse once per level, so a deep upstream answer must be stopped before
// it is parsed. (A stand-in until the depth-bounded parser, api/bounded-json, takes over these parse calls.)
bool nesting_exceeds(std::string_view text, int limit) {
    int depth = 0;
    bool in_string = false, escaped = false;
    for (const char c : text) {
        if (in_string) {
            if (escaped) {
                escaped = false;
            } else if (c == '\\') {
                escaped = true;
            } else if (c == '"') {
                in_string = false;
            }
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > limit) return true;
        } else if (c == ']' || c == '}') {
            depth--;
        }
    }
    return false;
}

template <typename Json>
std::string string_at(const Json& obj, const char* key) {
    const auto it = obj.find(key);
    return it != obj.end() && it->is_string() ? it->template get<std::string>() : "";
}

}  // namespace

const char* dialect_name(upstream_dialect dialect) {
    switch (dialect) {
        case upstream_dialect::openai:
            return "openai";
        case upstream_dialect::anthropic:
            return "anthropic";
        case upstream_dialect::ollama:
            return "ollama";
    }
    return "?";
}

upstream_dialect parse_dialect(std::string_view name) {
    if (name == "openai") return upstream_dialect::openai;
    if (name == "anthropic") return upstream_dialect::anthropic;
    if (name == "ollama") return upstream_dialect::ollama;
    throw std::invalid_argument("dialect '" + std::string(name) + "' is not one of openai, anthropic, ollama");
}

void write_openai_sampling(json& body, const sampling_options& s) {
    if (s.temperature) body["temperature"] = *s.temperature;
    if (s.top_p) body["top_p"] = *s.top_p;
    if (s.min_p) body["min_p"] = *s.min_p;
    if (s.top_k) body["top_k"] = *s.top_k;
    if (s.repeat_penalty) body["repeat_penalty"] = *s.repeat_penalty;
    if (s.repeat_last_n) body["repeat_last_n"] = *s.repeat_last_n;
    if (s.presence_penalty) body["presence_penalty"] = *s.presence_penalty;
    if (s.frequency_penalty) body["frequency_penalty"] = *s.frequency_penalty;
    if (s.seed) body["seed"] = *s.seed;
    if (s.ignore_eos) body["ignore_eos"] = true;
    if (!s.logit_bias.empty()) {
        json bias = json::object();
        // A ban is -infinity here and -100 in the API (JSON has no infinity).
        for (const auto& [token, value] : s.logit_bias)
            bias[std::to_string(token)] = std::clamp(value, -100.0f, 100.0f);
        body["logit_bias"] = std::move(bias);
    }
}

request_error upstream_request_error(int status, const std::string& body, const std::string& url) {
    const upstream_error_info info = parse_error_body(body);
    if (status < 500) return {status, info.message, info.type.empty() ? "invalid_request_error" : info.type};
    return {502, "upstream " + url + " answered " + std::to_string(status) + ": " + info.message, "server_error"};
}

std::string redirect_message(int status, const http::header_list& headers, const std::string& url) {
    std::string location;
    for (const auto& [name, value] : headers) {
        if (name != "location") continue;
        for (const char c : value) {
            if (location.size() >= 200) {
                location += "...";
                break;
            }
            const auto byte = static_cast<unsigned char>(c);
            location += byte < 0x20 || byte == 0x7f ? '?' : c;
        }
        break;
    }
    return "upstream " + url + " answered " + std::to_string(status) + " redirect" +
           (location.empty() ? " without a Location" : " to " + location) +
           "; keepwarm does not follow redirects (give the upstream's final URL)";
}

request_error upstream_redirect_error(int status, const http::header_list& headers, const std::string& url) {
    return {502, redirect_message(status, headers, url), "server_error"};
}

upstream_call build_call(upstream_dialect dialect, const chat_request& chat, const std::string& model,
                         const std::string& api_key) {
    upstream_call call;
    json body;
    switch (dialect) {
        case upstream_dialect::openai:
            call.target = "/v1/chat/completions";
            body = openai_body(chat, model);
            if (!api_key.empty()) call.headers.emplace_back("authorization", "Bearer " + api_key);
            break;
        case upstream_dialect::anthropic:
            call.target = "/v1/messages";
            body = anthropic_body(chat, model);
            call.headers.emplace_back("anthropic-version", "2023-06-01");
            if (!api_key.empty()) call.headers.emplace_back("x-api-key", api_key);
            break;
        case upstream_dialect::ollama:
            call.target = "/api/chat";
            body = ollama_body(chat, model);
            if (!api_key.empty()) call.headers.emplace_back("authorization", "Bearer " + api_key);
            break;
    }
    call.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
    return call;
}

std::optional<upstream_call> build_count_call(upstream_dialect dialect, const chat_request& chat,
                                              const std::string& model, const std::string& api_key) {
    if (dialect == upstream_dialect::ollama) return std::nullopt;
    const json full = anthropic_body(chat, model);
    json body = json::object();
    for (const char* key : {"model", "system", "messages", "tools", "tool_choice", "thinking"}) {
        if (full.contains(key)) body[key] = full[key];
    }
    upstream_call call;
    call.target = "/v1/messages/count_tokens";
    call.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
    if (dialect == upstream_dialect::anthropic) {
        call.headers.emplace_back("anthropic-version", "2023-06-01");
        if (!api_key.empty()) call.headers.emplace_back("x-api-key", api_key);
    } else if (!api_key.empty()) {
        call.headers.emplace_back("authorization", "Bearer " + api_key);
    }
    return call;
}

int parse_count_answer(std::string_view body) {
    const answer_json answer =
        nesting_exceeds(body, 128) ? answer_json(nullptr) : answer_json::parse(body, nullptr, false);
    const auto count = answer.is_object() ? answer.find("input_tokens") : answer.end();
    if (!answer.is_object() || count == answer.end() || !count_of(*count) ||
        *count_of(*count) > static_cast<size_t>(std::numeric_limits<int>::max())) {
        throw std::invalid_argument("not a count_tokens answer: " + std::string(body.substr(0, 200)));
    }
    return static_cast<int>(*count_of(*count));
}

stream_decoder::stream_decoder(upstream_dialect dialect, stream_limits limits) : dialect_(dialect), limits_(limits) {
    msg_.role = "assistant";
}

stream_decoder::mark stream_decoder::mark_now() const {
    mark m{.reasoning = msg_.reasoning_content.size(),
           .content = msg_.content.size(),
           .tool_calls = msg_.tool_calls.size()};
    if (!msg_.tool_calls.empty()) {
        const common_chat_tool_call& last = msg_.tool_calls.back();
        m.last_name = last.name.size();
        m.last_arguments = last.arguments.size();
        m.last_id = last.id;  // at most max_name_bytes
    }
    return m;
}

// The same deltas as common_chat_msg_diff::compute_diffs(before, now), from the sizes before: that one compares and
// copies the whole message at every piece, quadratic in the answer's length.
std::vector<common_chat_msg_diff> stream_decoder::diffs_since(const mark& before) const {
    std::vector<common_chat_msg_diff> diffs;
    if (msg_.reasoning_content.size() > before.reasoning) {
        diffs.emplace_back().reasoning_content_delta = msg_.reasoning_content.substr(before.reasoning);
    }
    if (msg_.content.size() > before.content) diffs.emplace_back().content_delta = msg_.content.substr(before.content);
    if (before.tool_calls > 0) {
        const size_t index = before.tool_calls - 1;
        const common_chat_tool_call& call = msg_.tool_calls[index];
        const bool head_changed = call.name.size() != before.last_name || call.id != before.last_id;
        if (call.arguments.size() > before.last_arguments || head_changed) {
            common_chat_msg_diff& diff = diffs.emplace_back();
            diff.tool_call_index = index;
            if (head_changed) {
                diff.tool_call_delta.id = call.id;
                diff.tool_call_delta.name = call.name;
            }
            diff.tool_call_delta.arguments = call.arguments.substr(before.last_arguments);
        }
    }
    for (size_t index = before.tool_calls; index < msg_.tool_calls.size(); index++) {
        common_chat_msg_diff& diff = diffs.emplace_back();
        diff.tool_call_index = index;
        diff.tool_call_delta = msg_.tool_calls[index];
    }
    return diffs;
}

std::vector<common_chat_msg_diff> stream_decoder::push(std::string_view bytes) {
    if (done_) return {};
    const mark before = mark_now();
    received_ += bytes.size();
    if (received_ > limits_.max_stream_bytes) {
        fail("the upstream sent over " + std::to_string(limits_.max_stream_bytes) + " bytes in one answer");
        return {};
    }
    buffer_.append(bytes);
    if (dialect_ == upstream_dialect::ollama) {
        take_lines(false);
    } else {
        take_events(false);
    }
    if (!done_ && buffer_.size() > limits_.max_event_bytes) {
        fail("the upstream sent " + std::to_string(buffer_.size()) + " bytes without ending a" +
             (dialect_ == upstream_dialect::ollama ? " line" : "n event") + " (at most " +
             std::to_string(limits_.max_event_bytes) + ")");
    }
    return diffs_since(before);
}

std::vector<common_chat_msg_diff> stream_decoder::end_of_body() {
    if (done_) return {};
    const mark before = mark_now();
    if (dialect_ == upstream_dialect::ollama) {
        take_lines(true);
    } else {
        take_events(true);
    }
    if (!done_) fail("the upstream ended its answer before its end event");
    return diffs_since(before);
}

void stream_decoder::take_lines(bool at_end) {
    size_t start = 0;
    while (!done_ && start < buffer_.size()) {
        size_t nl = buffer_.find('\n', std::max(start, scanned_));
        if (nl == std::string::npos) {
            if (!at_end) break;
            nl = buffer_.size();
        }
        const std::string_view line = std::string_view(buffer_).substr(start, nl - start);
        start = nl + 1;
        if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
        on_event({}, std::string(line));
    }
    buffer_.erase(0, std::min(start, buffer_.size()));
    scanned_ = buffer_.size();
}

void stream_decoder::take_events(bool at_end) {
    // Server-sent events: blocks separated by a blank line, each of "event:" and "data:" lines.
    size_t start = 0;
    while (!done_ && start < buffer_.size()) {
        const size_t from = std::max(start, scanned_);
        size_t end = buffer_.find("\n\n", from), sep = 2;
        if (const size_t crlf = buffer_.find("\r\n\r\n", from); crlf < end) end = crlf, sep = 4;
        if (end == std::string::npos) {
            if (!at_end) break;
            end = buffer_.size(), sep = 0;
        }
        on_block(std::string_view(buffer_).substr(start, end - start));
        start = end + sep;
    }
    start = std::min(start, buffer_.size());
    buffer_.erase(0, start);
    // A terminator may straddle this piece and the next: search again from its possible start.
    scanned_ = buffer_.size() >= 3 ? buffer_.size() - 3 : 0;
}

void stream_decoder::on_block(std::string_view block) {
    std::string event, data;
    size_t pos = 0;
    while (pos <= block.size()) {
        size_t eol = block.find('\n', pos);
        if (eol == std::string_view::npos) eol = block.size();
        std::string_view line = block.substr(pos, eol - pos);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        pos = eol + 1;
        const auto value = [&line](size_t from) {
            return std::string(line.substr(from < line.size() && line[from] == ' ' ? from + 1 : from));
        };
        if (line.starts_with("event:")) event = value(6);
        if (line.starts_with("data:")) {
            if (!data.empty()) data += '\n';
            data += value(5);
        }
    }
    if (!data.empty()) on_event(event, data);
}

void stream_decoder::on_event(const std::string& event, const std::string& data) {
    if (dialect_ == upstream_dialect::openai && data == "[DONE]") {
        done_ = true;
        return;
    }
    if (nesting_exceeds(data, limits_.max_nesting)) {
        return fail("the upstream sent JSON nested over " + std::to_string(limits_.max_nesting) + " deep");
    }
    const answer_json parsed = answer_json::parse(data, nullptr, false);
    const char* what = dialect_ == upstream_dialect::ollama ? "a line" : "an event";
    if (parsed.is_discarded()) return fail(std::string("the upstream sent ") + what + " that is not JSON");
    if (!parsed.is_object()) return fail(std::string("the upstream sent ") + what + " that is not a JSON object");
    // Every field is checked for its type before it is read; this is the net for one that is not, so that a bad
    // answer ends as an error event and never as an exception through the route.
    try {
        switch (dialect_) {
            case upstream_dialect::openai:
                return on_openai(parsed);
            case upstream_dialect::anthropic:
                return on_anthropic(!event.empty() ? event : string_at(parsed, "type"), parsed);
            case upstream_dialect::ollama:
                return on_ollama(parsed, data);
        }
    } catch (const std::exception& e) {
        fail(std::string("the upstream sent ") + what + " the proxy cannot read: " + e.what());
    }
}

bool stream_decoder::grow(std::string& part, const std::string& piece) {
    if (done_) return false;
    if (piece.size() > limits_.max_answer_bytes - std::min(answer_bytes_, limits_.max_answer_bytes)) {
        fail("the upstream's answer is over " + std::to_string(limits_.max_answer_bytes) + " bytes");
        return false;
    }
    answer_bytes_ += piece.size();
    part += piece;
    return true;
}

bool stream_decoder::set_name(std::string& field, const std::string& value, bool append) {
    if ((append ? field.size() : 0) + value.size() > limits_.max_name_bytes) {
        fail("the upstream sent a tool call name or id over " + std::to_string(limits_.max_name_bytes) + " bytes");
        return false;
    }
    if (append) {
        field += value;
    } else {
        field = value;
    }
    return true;
}

void stream_decoder::on_openai(const answer_json& chunk) {
    if (chunk.contains("error")) return fail(parse_error_body(chunk.dump()).message);
    if (const auto choices = chunk.find("choices");
        choices != chunk.end() && choices->is_array() && !choices->empty() && choices->front().is_object()) {
        const answer_json& choice = choices->front();
        if (const auto delta = choice.find("delta"); delta != choice.end() && delta->is_object()) {
            if (!grow(msg_.content, string_at(*delta, "content"))) return;
            if (!grow(msg_.reasoning_content, string_at(*delta, "reasoning_content"))) return;
            // vLLM's and Ollama's name for it
            if (!grow(msg_.reasoning_content, string_at(*delta, "reasoning"))) return;
            if (const auto calls = delta->find("tool_calls"); calls != delta->end() && calls->is_array()) {
                for (const answer_json& call : *calls) {
                    if (!call.is_object()) return fail("the upstream sent a tool_calls entry that is not an object");
                    // Calls stream one after another: a delta continues the last call or starts the next one. An
                    // index anywhere else is a broken stream (and the -1 or 2^64-1 that would resize the list).
                    const size_t count = msg_.tool_calls.size();
                    size_t index = count;
                    if (const auto at = call.find("index"); at != call.end()) {
                        const std::optional<size_t> given = count_of(*at);
                        if (!given || *given > count || *given + 1 < count) {
                            return fail("the upstream sent tool call index " + at->dump() + " with " +
                                        std::to_string(count) + " call(s) so far (expected " +
                                        (count > 0 ? std::to_string(count - 1) + " or " : "") + std::to_string(count) +
                                        ")");
                        }
                        index = *given;
                    }
                    if (index == count) {
                        if (count >= limits_.max_tool_calls) {
                            return fail("the upstream sent over " + std::to_string(limits_.max_tool_calls) +
                                        " tool calls");
                        }
                        msg_.tool_calls.emplace_back();
                    }
                    common_chat_tool_call& target = msg_.tool_calls[index];
                    if (const std::string id = string_at(call, "id"); !id.empty()) {
                        if (!set_name(target.id, id, false)) return;
                    }
                    if (const auto fn = call.find("function"); fn != call.end() && fn->is_object()) {
                        if (!set_name(target.name, string_at(*fn, "name"), true)) return;
                        if (!grow(target.arguments, string_at(*fn, "arguments"))) return;
                    }
                }
            }
        }
        if (string_at(choice, "finish_reason") == "length") usage_.hit_token_limit = true;
    }
    if (const auto usage = chunk.find("usage"); usage != chunk.end() && usage->is_object()) {
        usage_.prompt_tokens = int_at(*usage, "prompt_tokens");
        usage_.completion_tokens = int_at(*usage, "completion_tokens");
        if (const auto details = usage->find("prompt_tokens_details");
            details != usage->end() && details->is_object()) {
            usage_.cached_tokens = int_at(*details, "cached_tokens");
        }
    }
    // llama-server reports reuse only in its timings (on the last chunk).
    if (const auto t = chunk.find("timings"); t != chunk.end() && t->is_object() && usage_.cached_tokens == 0) {
        usage_.cached_tokens = int_at(*t, "cache_n");
        if (usage_.prompt_tokens == 0) usage_.prompt_tokens = sum_of(int_at(*t, "cache_n"), int_at(*t, "prompt_n"));
        if (usage_.completion_tokens == 0) usage_.completion_tokens = int_at(*t, "predicted_n");
    }
    usage_.cached_tokens = std::min(usage_.cached_tokens, usage_.prompt_tokens);
}

void stream_decoder::on_anthropic(const std::string& type, const answer_json& event) {
    const auto read_usage = [this](const answer_json& usage) {
        if (!usage.is_object()) return;
        const int input = int_at(usage, "input_tokens"), read = int_at(usage, "cache_read_input_tokens"),
                  created = int_at(usage, "cache_creation_input_tokens");
        if (const int total = sum_of(sum_of(input, read), created); total > 0) {
            usage_.prompt_tokens = total;
            usage_.cached_tokens = read;
        }
        if (usage.contains("output_tokens")) usage_.completion_tokens = int_at(usage, "output_tokens");
    };
    const answer_json& none = empty_object<answer_json>();
    const auto object_at = [&none](const answer_json& obj, const char* key) -> const answer_json& {
        const auto it = obj.find(key);
        return it != obj.end() && it->is_object() ? *it : none;
    };
    if (type == "error") {
        fail(parse_error_body(event.dump()).message);
    } else if (type == "message_start") {
        read_usage(object_at(object_at(event, "message"), "usage"));
    } else if (type == "content_block_start") {
        // Blocks start in order, once each: the next index is the only one a start may name.
        const size_t count = anthropic_blocks_.size();
        size_t index = count;
        if (const auto at = event.find("index"); at != event.end()) {
            const std::optional<size_t> given = count_of(*at);
            if (!given || *given != count) {
                return fail("the upstream started content block " + at->dump() + " after " + std::to_string(count) +
                            " block(s) (expected " + std::to_string(count) + ")");
            }
            index = *given;
        }
        if (index >= limits_.max_content_blocks) {
            return fail("the upstream sent over " + std::to_string(limits_.max_content_blocks) + " content blocks");
        }
        anthropic_blocks_.push_back(-1);
        const answer_json& block = object_at(event, "content_block");
        const std::string block_type = string_at(block, "type");
        if (block_type == "tool_use") {
            if (msg_.tool_calls.size() >= limits_.max_tool_calls) {
                return fail("the upstream sent over " + std::to_string(limits_.max_tool_calls) + " tool calls");
            }
            common_chat_tool_call call;
            if (!set_name(call.name, string_at(block, "name"), false) ||
                !set_name(call.id, string_at(block, "id"), false))
                return;
            anthropic_blocks_[index] = static_cast<int>(msg_.tool_calls.size());
            msg_.tool_calls.push_back(std::move(call));
        } else if (block_type == "text") {
            grow(msg_.content, string_at(block, "text"));
        } else if (block_type == "thinking") {
            grow(msg_.reasoning_content, string_at(block, "thinking"));
        }
    } else if (type == "content_block_delta") {
        const answer_json& delta = object_at(event, "delta");
        const std::string delta_type = string_at(delta, "type");
        if (delta_type == "text_delta") {
            grow(msg_.content, string_at(delta, "text"));
        } else if (delta_type == "thinking_delta") {
            grow(msg_.reasoning_content, string_at(delta, "thinking"));
        } else if (delta_type == "input_json_delta") {
            // Arguments go to the last call only (see mark): a delta for an earlier or unknown block is a broken
            // stream, not something to index with.
            const auto at = event.find("index");
            const std::optional<size_t> index = at != event.end() ? count_of(*at) : std::optional<size_t>(0);
            const int call = index && *index < anthropic_blocks_.size() ? anthropic_blocks_[*index] : -1;
            if (call < 0 || static_cast<size_t>(call) + 1 != msg_.tool_calls.size()) {
                return fail("the upstream sent tool input for content block " +
                            (at != event.end() ? at->dump() : std::string("0")) +
                            ", which is not its last tool_use block");
            }
            grow(msg_.tool_calls[static_cast<size_t>(call)].arguments, string_at(delta, "partial_json"));
        }
    } else if (type == "message_delta") {
        if (string_at(object_at(event, "delta"), "stop_reason") == "max_tokens") usage_.hit_token_limit = true;
        read_usage(object_at(event, "usage"));
    } else if (type == "message_stop") {
        done_ = true;
    }
    usage_.cached_tokens = std::min(usage_.cached_tokens, usage_.prompt_tokens);
}

void stream_decoder::on_ollama(const answer_json& line, const std::string& text) {
    if (line.contains("error")) return fail(parse_error_body(line.dump()).message);
    if (const auto m = line.find("message"); m != line.end() && m->is_object()) {
        if (!grow(msg_.content, string_at(*m, "content"))) return;
        if (!grow(msg_.reasoning_content, string_at(*m, "thinking"))) return;
        if (const auto calls = m->find("tool_calls"); calls != m->end() && calls->is_array()) {
            // Arguments come as objects, and their text is what the model wrote: its keys keep their order (for the
            // prefix the next turn sends back) where the line is small enough for an ordered parse to stay cheap.
            constexpr size_t max_ordered_line = 64u << 10;
            json ordered_calls;
            if (text.size() <= max_ordered_line) {
                const json ordered = json::parse(text, nullptr, false);
                if (ordered.is_object() && ordered.contains("message") && ordered["message"].is_object()) {
                    ordered_calls = ordered["message"].value("tool_calls", json());
                }
            }
            const auto ordered_arguments = [&ordered_calls](size_t i) -> const json* {
                if (!ordered_calls.is_array() || i >= ordered_calls.size() || !ordered_calls[i].is_object()) {
                    return nullptr;
                }
                const json& call = ordered_calls[i];
                const auto fn = call.find("function");
                if (fn == call.end() || !fn->is_object()) return nullptr;
                const auto args = fn->find("arguments");
                return args != fn->end() ? &*args : nullptr;
            };
            // Ollama sends each call whole, once.
            for (size_t i = 0; i < calls->size(); i++) {
                const answer_json& call = (*calls)[i];
                if (!call.is_object()) return fail("the upstream sent a tool_calls entry that is not an object");
                if (msg_.tool_calls.size() >= limits_.max_tool_calls) {
                    return fail("the upstream sent over " + std::to_string(limits_.max_tool_calls) + " tool calls");
                }
                const auto fn = call.find("function");
                const answer_json& function = fn != call.end() && fn->is_object() ? *fn : empty_object<answer_json>();
                std::string arguments = "{}";
                if (const auto args = function.find("arguments"); args != function.end()) {
                    if (args->is_string()) {
                        arguments = args->get<std::string>();
                    } else if (const json* kept = ordered_arguments(i)) {
                        arguments = kept->dump(-1, ' ', false, json::error_handler_t::replace);
                    } else {
                        arguments = args->dump(-1, ' ', false, answer_json::error_handler_t::replace);
                    }
                }
                std::string id = string_at(call, "id");
                if (id.empty()) id = gen_tool_call_id();
                common_chat_tool_call parsed;
                if (!set_name(parsed.name, string_at(function, "name"), false) || !set_name(parsed.id, id, false))
                    return;
                if (!grow(parsed.arguments, arguments)) return;
                msg_.tool_calls.push_back(std::move(parsed));
            }
        }
    }
    if (const auto done = line.find("done"); done != line.end() && done->is_boolean() && done->get<bool>()) {
        usage_.prompt_tokens = int_at(line, "prompt_eval_count");
        usage_.completion_tokens = int_at(line, "eval_count");
        // keepwarm's addition; Ollama has none
        usage_.cached_tokens = std::min(int_at(line, "prompt_eval_cached_count"), usage_.prompt_tokens);
        usage_.hit_token_limit = string_at(line, "done_reason") == "length";
        done_ = true;
    }
}

void stream_decoder::fail(std::string message) {
    if (done_) return;
    error_ = message.empty() ? "the upstream reported an error" : std::move(message);
    done_ = true;
}

upstream_error_info parse_error_body(const std::string& body) {
    constexpr size_t max_message = 2000;  // an upstream's message goes into the client's error and the log
    upstream_error_info info;
    try {
        const answer_json parsed = nesting_exceeds(body, 128) ? answer_json() : answer_json::parse(body);
        if (parsed.is_object() && parsed.contains("error")) {
            const answer_json& error = parsed["error"];
            if (error.is_string()) {
                info.message = error.get<std::string>();
            } else if (error.is_object()) {
                info.message = string_at(error, "message");
                info.type = string_at(error, "type");
            }
        }
    } catch (const answer_json::exception&) {  // not JSON, or a number out of range (1e999)
    }
    if (info.message.empty()) info.message = body.substr(0, 500);
    if (info.message.size() > max_message) info.message = info.message.substr(0, max_message) + "...";
    if (info.type.size() > 100) info.type.clear();
    return info;
}

std::string health_target(upstream_dialect dialect) {
    return dialect == upstream_dialect::ollama ? "/api/tags" : "/v1/models";
}

upstream_listing parse_listing(upstream_dialect dialect, const std::string& body) {
    upstream_listing listing;
    try {
        if (nesting_exceeds(body, 128)) return listing;
        const answer_json parsed = answer_json::parse(body);
        const char* list = dialect == upstream_dialect::ollama ? "models" : "data";
        const char* key = dialect == upstream_dialect::ollama ? "name" : "id";
        if (parsed.is_object() && parsed.contains(list) && parsed[list].is_array() && !parsed[list].empty()) {
            const answer_json& first = parsed[list].front();
            listing.model = string_at(first, key);
            for (const answer_json& entry : parsed[list]) {
                if (listing.models.size() >= max_listed_models) break;
                std::string name = string_at(entry, key);
                if (name.empty() || name.size() > max_model_name_bytes) continue;
                if (std::find(listing.models.begin(), listing.models.end(), name) != listing.models.end()) continue;
                listing.models.push_back(std::move(name));
            }
            if (string_at(first, "owned_by") == "keepwarm" && first.contains("created")) {
                listing.instance = first["created"].dump();
            }
        }
    } catch (const answer_json::exception&) {  // not JSON, or a number out of range (1e999)
    }
    return listing;
}

}  // namespace keepwarm::proxy

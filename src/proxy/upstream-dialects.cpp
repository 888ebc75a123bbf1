// See upstream-dialects.h.
#include "proxy/upstream-dialects.h"

#include <algorithm>

#include <stdexcept>

namespace keepwarm::proxy {

using json = nlohmann::ordered_json;

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

json openai_body(const api::chat_request& chat, const std::string& model) {
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
    return body;
}

json anthropic_body(const api::chat_request& chat, const std::string& model) {
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
    for (const auto& msg : chat.messages) {
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
    if (!system.empty()) body["system"] = system;
    body["messages"] = std::move(messages);
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
    const api::sampling_options& s = chat.sampling;
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

json ollama_body(const api::chat_request& chat, const std::string& model) {
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
    const api::sampling_options& s = chat.sampling;
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

int int_at(const json& obj, const char* key) {
    const auto it = obj.find(key);
    return it != obj.end() && it->is_number() ? it->get<int>() : 0;
}

std::string string_at(const json& obj, const char* key) {
    const auto it = obj.find(key);
    return it != obj.end() && it->is_string() ? it->get<std::string>() : "";
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

void write_openai_sampling(json& body, const api::sampling_options& s) {
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

http::http_error upstream_http_error(int status, const std::string& body, const std::string& url) {
    const upstream_error_info info = parse_error_body(body);
    if (status < 500) return {status, info.message, info.type.empty() ? "invalid_request_error" : info.type};
    return {502, "upstream " + url + " answered " + std::to_string(status) + ": " + info.message, "server_error"};
}

upstream_call build_call(upstream_dialect dialect, const api::chat_request& chat, const std::string& model,
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

std::optional<upstream_call> build_count_call(upstream_dialect dialect, const api::chat_request& chat,
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
    const json answer = json::parse(body, nullptr, false);
    if (answer.is_discarded() || !answer.is_object() || !answer.contains("input_tokens") ||
        !answer["input_tokens"].is_number_integer()) {
        throw std::invalid_argument("not a count_tokens answer: " + std::string(body.substr(0, 200)));
    }
    return answer["input_tokens"].get<int>();
}

stream_decoder::stream_decoder(upstream_dialect dialect) : dialect_(dialect) {
    msg_.role = "assistant";
}

std::vector<common_chat_msg_diff> stream_decoder::push(std::string_view bytes) {
    const common_chat_msg before = msg_;
    buffer_.append(bytes);
    if (dialect_ == upstream_dialect::ollama) {
        for (size_t nl; !done_ && (nl = buffer_.find('\n')) != std::string::npos;) {
            const std::string line = buffer_.substr(0, nl);
            buffer_.erase(0, nl + 1);
            if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
            try {
                on_ollama(json::parse(line));
            } catch (const json::exception& e) {
                fail(std::string("the upstream sent a line that is not JSON: ") + e.what());
            }
        }
    } else {
        // Server-sent events: blocks separated by a blank line, each of "event:" and "data:" lines.
        for (;;) {
            size_t end = buffer_.find("\n\n");
            size_t sep = 2;
            if (const size_t crlf = buffer_.find("\r\n\r\n"); crlf < end) end = crlf, sep = 4;
            if (done_ || end == std::string::npos) break;
            const std::string block = buffer_.substr(0, end);
            buffer_.erase(0, end + sep);
            std::string event, data;
            size_t pos = 0;
            while (pos <= block.size()) {
                size_t eol = block.find('\n', pos);
                if (eol == std::string::npos) eol = block.size();
                std::string line = block.substr(pos, eol - pos);
                if (!line.empty() && line.back() == '\r') line.pop_back();
                pos = eol + 1;
                const auto value = [&line](size_t from) {
                    return line.substr(from < line.size() && line[from] == ' ' ? from + 1 : from);
                };
                if (line.starts_with("event:")) event = value(6);
                if (line.starts_with("data:")) data += (data.empty() ? "" : "\n") + value(5);
            }
            if (!data.empty()) on_event(event, data);
        }
    }
    return common_chat_msg_diff::compute_diffs(before, msg_);
}

void stream_decoder::on_event(const std::string& event, const std::string& data) {
    if (dialect_ == upstream_dialect::openai && data == "[DONE]") {
        done_ = true;
        return;
    }
    json parsed;
    try {
        parsed = json::parse(data);
    } catch (const json::parse_error& e) {
        return fail(std::string("the upstream sent an event that is not JSON: ") + e.what());
    }
    if (dialect_ == upstream_dialect::openai) return on_openai(parsed);
    on_anthropic(!event.empty() ? event : string_at(parsed, "type"), parsed);
}

void stream_decoder::on_openai(const json& chunk) {
    if (chunk.contains("error")) return fail(parse_error_body(chunk.dump()).message);
    if (const auto choices = chunk.find("choices");
        choices != chunk.end() && choices->is_array() && !choices->empty()) {
        const json& choice = choices->front();
        if (const auto delta = choice.find("delta"); delta != choice.end() && delta->is_object()) {
            msg_.content += string_at(*delta, "content");
            msg_.reasoning_content += string_at(*delta, "reasoning_content");
            msg_.reasoning_content += string_at(*delta, "reasoning");  // vLLM's and Ollama's name for it
            if (const auto calls = delta->find("tool_calls"); calls != delta->end() && calls->is_array()) {
                for (const json& call : *calls) {
                    const size_t index = call.contains("index") ? call["index"].get<size_t>() : msg_.tool_calls.size();
                    if (index >= msg_.tool_calls.size()) msg_.tool_calls.resize(index + 1);
                    common_chat_tool_call& target = msg_.tool_calls[index];
                    if (const std::string id = string_at(call, "id"); !id.empty()) target.id = id;
                    if (const auto fn = call.find("function"); fn != call.end() && fn->is_object()) {
                        target.name += string_at(*fn, "name");
                        target.arguments += string_at(*fn, "arguments");
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
        if (usage_.prompt_tokens == 0) usage_.prompt_tokens = int_at(*t, "cache_n") + int_at(*t, "prompt_n");
        if (usage_.completion_tokens == 0) usage_.completion_tokens = int_at(*t, "predicted_n");
    }
}

void stream_decoder::on_anthropic(const std::string& type, const json& event) {
    const auto read_usage = [this](const json& usage) {
        if (!usage.is_object()) return;
        const int input = int_at(usage, "input_tokens"), read = int_at(usage, "cache_read_input_tokens"),
                  created = int_at(usage, "cache_creation_input_tokens");
        if (input + read + created > 0) {
            usage_.prompt_tokens = input + read + created;
            usage_.cached_tokens = read;
        }
        if (usage.contains("output_tokens")) usage_.completion_tokens = int_at(usage, "output_tokens");
    };
    if (type == "error") {
        fail(parse_error_body(event.dump()).message);
    } else if (type == "message_start") {
        if (event.contains("message")) read_usage(event["message"].value("usage", json::object()));
    } else if (type == "content_block_start") {
        const size_t index = event.value("index", anthropic_blocks_.size());
        const json block = event.value("content_block", json::object());
        if (index >= anthropic_blocks_.size()) {
            anthropic_blocks_.resize(index + 1, -1);
            anthropic_block_types_.resize(index + 1);
        }
        const std::string block_type = string_at(block, "type");
        anthropic_block_types_[index] = block_type;
        if (block_type == "tool_use") {
            anthropic_blocks_[index] = static_cast<int>(msg_.tool_calls.size());
            msg_.tool_calls.push_back({string_at(block, "name"), "", string_at(block, "id")});
        } else if (block_type == "text") {
            msg_.content += string_at(block, "text");
        } else if (block_type == "thinking") {
            msg_.reasoning_content += string_at(block, "thinking");
        }
    } else if (type == "content_block_delta") {
        const size_t index = event.value("index", size_t{0});
        const json delta = event.value("delta", json::object());
        const std::string delta_type = string_at(delta, "type");
        if (delta_type == "text_delta") {
            msg_.content += string_at(delta, "text");
        } else if (delta_type == "thinking_delta") {
            msg_.reasoning_content += string_at(delta, "thinking");
        } else if (delta_type == "input_json_delta" && index < anthropic_blocks_.size() &&
                   anthropic_blocks_[index] >= 0) {
            msg_.tool_calls[anthropic_blocks_[index]].arguments += string_at(delta, "partial_json");
        }
    } else if (type == "message_delta") {
        if (string_at(event.value("delta", json::object()), "stop_reason") == "max_tokens") {
            usage_.hit_token_limit = true;
        }
        read_usage(event.value("usage", json::object()));
    } else if (type == "message_stop") {
        done_ = true;
    }
}

void stream_decoder::on_ollama(const json& line) {
    if (line.contains("error")) return fail(parse_error_body(line.dump()).message);
    if (const auto m = line.find("message"); m != line.end() && m->is_object()) {
        msg_.content += string_at(*m, "content");
        msg_.reasoning_content += string_at(*m, "thinking");
        if (const auto calls = m->find("tool_calls"); calls != m->end() && calls->is_array()) {
            // Ollama sends each call whole, once.
            for (const json& call : *calls) {
                const json fn = call.value("function", json::object());
                const json args = fn.value("arguments", json::object());
                std::string id = string_at(call, "id");
                if (id.empty()) id = api::gen_tool_call_id();
                msg_.tool_calls.push_back(
                    {string_at(fn, "name"), args.is_string() ? args.get<std::string>() : args.dump(), id});
            }
        }
    }
    if (line.value("done", false)) {
        usage_.prompt_tokens = int_at(line, "prompt_eval_count");
        usage_.completion_tokens = int_at(line, "eval_count");
        usage_.cached_tokens = int_at(line, "prompt_eval_cached_count");  // keepwarm's addition; Ollama has none
        usage_.hit_token_limit = string_at(line, "done_reason") == "length";
        done_ = true;
    }
}

void stream_decoder::fail(std::string message) {
    error_ = message.empty() ? "the upstream reported an error" : std::move(message);
    done_ = true;
}

upstream_error_info parse_error_body(const std::string& body) {
    upstream_error_info info;
    try {
        const json parsed = json::parse(body);
        if (parsed.is_object() && parsed.contains("error")) {
            const json& error = parsed["error"];
            if (error.is_string()) {
                info.message = error.get<std::string>();
            } else if (error.is_object()) {
                info.message = string_at(error, "message");
                info.type = string_at(error, "type");
            }
        }
    } catch (const json::parse_error&) {
    }
    if (info.message.empty()) info.message = body.substr(0, 500);
    return info;
}

std::string health_target(upstream_dialect dialect) {
    return dialect == upstream_dialect::ollama ? "/api/tags" : "/v1/models";
}

upstream_listing parse_listing(upstream_dialect dialect, const std::string& body) {
    upstream_listing listing;
    try {
        const json parsed = json::parse(body);
        const char* list = dialect == upstream_dialect::ollama ? "models" : "data";
        const char* key = dialect == upstream_dialect::ollama ? "name" : "id";
        if (parsed.is_object() && parsed.contains(list) && parsed[list].is_array() && !parsed[list].empty()) {
            const json& first = parsed[list].front();
            listing.model = string_at(first, key);
            if (string_at(first, "owned_by") == "keepwarm" && first.contains("created")) {
                listing.instance = first["created"].dump();
            }
        }
    } catch (const json::parse_error&) {
    }
    return listing;
}

}  // namespace keepwarm::proxy

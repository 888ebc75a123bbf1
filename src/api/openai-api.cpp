// OpenAI-compatible request parsing and response formatting; validation mirrors llama-server's
// oaicompat_chat_params_parse but checks every type itself so that bad input is a 400 naming the field, never a crash.
#include "api/openai-api.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <set>

#include "api/request-limits.h"
#include "base/request-error.h"
#include "json/bounded-json.h"
#include "json/json-fields.h"

namespace keepwarm::api {

namespace {

using namespace json_fields;

// The largest vocabularies in use (Gemma's) have 262,144 tokens: a logit_bias with more entries cannot be all valid.
constexpr size_t max_logit_bias_entries = 262'144;

std::optional<double> get_number(const json& obj, const std::string& key, const std::string& field) {
    const json* v = find(obj, key);
    if (!v) {
        return std::nullopt;
    }
    if (!v->is_number()) {
        fail(in_quotes(field) + " must be a number");
    }
    return v->get<double>();
}

std::optional<int> get_int_in(const json& obj, const std::string& key, int64_t lo, int64_t hi) {
    auto v = get_integer(obj, key, key);
    if (v && (*v < lo || *v > hi)) {
        fail(in_quotes(key) + " must be an integer between " + std::to_string(lo) + " and " + std::to_string(hi));
    }
    return v ? std::optional<int>(int(*v)) : std::nullopt;
}

std::vector<std::string> parse_stop_strings(const json& body) {
    std::vector<std::string> stop;
    const json* v = find(body, "stop");
    if (!v) {
        return stop;
    }
    if (v->is_string()) {
        if (!v->get_ref<const std::string&>().empty()) {
            stop.push_back(v->get<std::string>());
        }
        return stop;
    }
    if (!v->is_array()) {
        fail("'stop' must be a string or an array of strings");
    }
    if (v->size() > max_stop_strings) {
        fail("'stop' may hold at most " + std::to_string(max_stop_strings) + " strings");
    }
    for (size_t i = 0; i < v->size(); i++) {
        const json& s = (*v)[i];
        if (!s.is_string()) {
            fail(in_quotes(indexed("stop", i)) + " must be a string");
        }
        if (s.get_ref<const std::string&>().size() > max_stop_bytes) {
            fail(in_quotes(indexed("stop", i)) + " is longer than " + std::to_string(max_stop_bytes) + " bytes");
        }
        // An empty stop string would end generation immediately; llama-server drops them too.
        if (!s.get_ref<const std::string&>().empty()) {
            stop.push_back(s.get<std::string>());
        }
    }
    return stop;
}

// max_completion_tokens is OpenAI's current name, max_tokens the deprecated one; the newer one wins. llama-server's
// n_predict wins over both when given (its oaicompat parsing copies it over max_tokens), -1 meaning no request limit.
std::optional<int> parse_max_tokens(const json& body) {
    if (find(body, "n_predict")) return parse_n_predict(body);
    for (const char* key : {"max_completion_tokens", "max_tokens"}) {
        if (auto v = get_integer(body, key, key)) {
            if (*v < 1) {
                fail(in_quotes(key) + " must be a positive integer");
            }
            return int(std::min<int64_t>(*v, std::numeric_limits<int32_t>::max()));
        }
    }
    return std::nullopt;
}

void parse_n(const json& body) {
    if (auto n = get_integer(body, "n", "n"); n && *n != 1) {
        fail("'n' must be 1: multiple choices per request are not supported");
    }
}

void parse_stream(const json& body, bool& stream, bool& include_usage) {
    stream = get_bool(body, "stream", "stream").value_or(false);
    if (const json* opts = find(body, "stream_options")) {
        if (!opts->is_object()) {
            fail("'stream_options' must be an object");
        }
        include_usage = get_bool(*opts, "include_usage", "stream_options.include_usage").value_or(false);
    }
}

std::string parse_model(const json& body) {
    return get_string(body, "model", "model").value_or("");
}

void require_object(const json& body) {
    if (!body.is_object()) {
        fail("request body must be a JSON object");
    }
}

// content: string, array of text parts, or (assistant only) null / missing.
void parse_content(const json& message, const std::string& path, bool allow_null, common_chat_msg& msg) {
    const std::string field = path + ".content";
    const json* content = find(message, "content");
    if (!content) {
        if (!allow_null) {
            fail(in_quotes(field) + " must be a string or an array of content parts");
        }
        return;
    }
    if (content->is_string()) {
        msg.content = content->get<std::string>();
        return;
    }
    if (!content->is_array()) {
        fail(in_quotes(field) + " must be a string or an array of content parts");
    }
    for (size_t j = 0; j < content->size(); j++) {
        const json& part = (*content)[j];
        const std::string part_field = indexed(field, j);
        if (!part.is_object()) {
            fail(in_quotes(part_field) + " must be an object");
        }
        auto type = get_string(part, "type", part_field + ".type");
        if (!type) {
            fail(in_quotes(part_field + ".type") + " is required");
        }
        // OpenAI lets assistant messages carry back a refusal part; its text is ordinary content to the model.
        const std::string text_key = *type == "refusal" ? "refusal" : "text";
        if (*type == "text" || *type == "refusal") {
            auto text = get_string(part, text_key, part_field + "." + text_key);
            if (!text) {
                fail(in_quotes(part_field + "." + text_key) + " must be a string");
            }
            msg.content_parts.push_back({"text", *text});
        } else if (*type == "image_url" || *type == "image" || *type == "input_image") {
            fail(in_quotes(part_field) + ": images are not supported");
        } else if (*type == "input_audio" || *type == "audio" || *type == "input_video" || *type == "video" ||
                   *type == "file") {
            fail(in_quotes(part_field) + ": " + *type + " content is not supported");
        } else {
            fail(in_quotes(part_field + ".type") + " must be 'text' (got '" + *type + "')");
        }
    }
}

void parse_tool_calls(const json& message, const std::string& path, common_chat_msg& msg) {
    const json* calls = find(message, "tool_calls");
    if (!calls) {
        return;
    }
    const std::string field = path + ".tool_calls";
    if (!calls->is_array()) {
        fail(in_quotes(field) + " must be an array");
    }
    for (size_t j = 0; j < calls->size(); j++) {
        const json& call = (*calls)[j];
        const std::string call_field = indexed(field, j);
        if (!call.is_object()) {
            fail(in_quotes(call_field) + " must be an object");
        }
        common_chat_tool_call tc;
        tc.id = get_string(call, "id", call_field + ".id").value_or("");
        if (auto type = get_string(call, "type", call_field + ".type"); type && *type != "function") {
            fail(in_quotes(call_field + ".type") + " must be 'function'");
        }
        const json* function = find(call, "function");
        if (!function || !function->is_object()) {
            fail(in_quotes(call_field + ".function") + " must be an object");
        }
        auto name = get_string(*function, "name", call_field + ".function.name");
        if (!name || name->empty()) {
            fail(in_quotes(call_field + ".function.name") + " must be a non-empty string");
        }
        tc.name = *name;
        const json* args = find(*function, "arguments");
        if (!args) {
            tc.arguments = "{}";
        } else if (args->is_object()) {
            bounded_json::require_shape(*args, call_field + ".function.arguments");
            tc.arguments = args->dump();
        } else if (args->is_string()) {
            // Templates that take object arguments re-parse this string; catch bad JSON here with a clear message.
            tc.arguments = args->get<std::string>();
            if (tc.arguments.empty()) {
                tc.arguments = "{}";  // some clients echo a no-argument call back as ""
            } else {
                bounded_json::require_json_text(tc.arguments, call_field + ".function.arguments");
            }
        } else {
            fail(in_quotes(call_field + ".function.arguments") + " must be a JSON string or an object");
        }
        msg.tool_calls.push_back(std::move(tc));
    }
}

common_chat_msg parse_message(const json& message, size_t i) {
    const std::string path = indexed("messages", i);
    if (!message.is_object()) {
        fail(in_quotes(path) + " must be an object");
    }
    static const std::set<std::string> roles = {"system", "developer", "user", "assistant", "tool"};
    auto role = get_string(message, "role", path + ".role");
    if (!role || !roles.count(*role)) {
        fail(in_quotes(path + ".role") + " must be one of system, user, assistant, tool, developer");
    }
    common_chat_msg msg;
    msg.role = *role;
    const bool assistant = *role == "assistant";
    parse_content(message, path, assistant, msg);
    if (assistant) {
        parse_tool_calls(message, path, msg);
        // "reasoning" is what some clients (vLLM, OpenRouter) use for the same thing.
        auto reasoning = get_string(message, "reasoning_content", path + ".reasoning_content");
        if (!reasoning) {
            reasoning = get_string(message, "reasoning", path + ".reasoning");
        }
        msg.reasoning_content = reasoning.value_or("");
        if (!find(message, "content") && msg.tool_calls.empty() && msg.reasoning_content.empty()) {
            fail(in_quotes(path) + " (assistant) must have 'content' or 'tool_calls'");
        }
    } else if (find(message, "tool_calls")) {
        fail(in_quotes(path + ".tool_calls") + " is only allowed on assistant messages");
    }
    if (*role == "tool") {
        auto id = get_string(message, "tool_call_id", path + ".tool_call_id");
        if (!id || id->empty()) {
            fail(in_quotes(path + ".tool_call_id") + " must be a non-empty string (required for role tool)");
        }
        msg.tool_call_id = *id;
        msg.tool_name = get_string(message, "name", path + ".name").value_or("");
    }
    return msg;
}

std::vector<common_chat_msg> parse_messages(const json& body) {
    const json* messages = find(body, "messages");
    if (!messages || !messages->is_array() || messages->empty()) {
        fail("'messages' must be a non-empty array");
    }
    std::vector<common_chat_msg> out;
    out.reserve(messages->size());
    for (size_t i = 0; i < messages->size(); i++) {
        out.push_back(parse_message((*messages)[i], i));
    }
    return out;
}

// "auto" | "none" | "required" | {"type":"function","function":{"name":...}}. common has no named choice, so a named
// function narrows the tool list to that one and makes calling it required.
void parse_tool_choice(const json& body, chat_request& req) {
    const json* v = find(body, "tool_choice");
    const char* expected =
        "'tool_choice' must be one of none, auto, required, or "
        "{\"type\": \"function\", \"function\": {\"name\": ...}}";
    if (!v) {
        req.tool_choice = COMMON_CHAT_TOOL_CHOICE_AUTO;
    } else if (v->is_string()) {
        const std::string& s = v->get_ref<const std::string&>();
        if (s == "auto") {
            req.tool_choice = COMMON_CHAT_TOOL_CHOICE_AUTO;
        } else if (s == "none") {
            req.tool_choice = COMMON_CHAT_TOOL_CHOICE_NONE;
        } else if (s == "required") {
            req.tool_choice = COMMON_CHAT_TOOL_CHOICE_REQUIRED;
        } else {
            fail(expected);
        }
    } else if (v->is_object()) {
        auto type = get_string(*v, "type", "tool_choice.type");
        const json* function = find(*v, "function");
        if (!type || *type != "function" || !function || !function->is_object()) {
            fail(expected);
        }
        auto name = get_string(*function, "name", "tool_choice.function.name");
        if (!name || name->empty()) {
            fail("'tool_choice.function.name' must be a non-empty string");
        }
        std::vector<common_chat_tool> chosen;
        for (const auto& t : req.tools) {
            if (t.name == *name) {
                chosen.push_back(t);
            }
        }
        if (chosen.empty()) {
            fail("'tool_choice.function.name' names '" + *name + "', which is not in 'tools'");
        }
        req.tools = std::move(chosen);
        req.tool_choice = COMMON_CHAT_TOOL_CHOICE_REQUIRED;
    } else {
        fail(expected);
    }
    if (req.tool_choice == COMMON_CHAT_TOOL_CHOICE_REQUIRED && req.tools.empty()) {
        fail("'tool_choice' requires a tool call but no 'tools' were given");
    }
}

std::string parse_response_format(const json& body) {
    const json* rf = find(body, "response_format");
    if (!rf) {
        return "";
    }
    if (!rf->is_object()) {
        fail("'response_format' must be an object");
    }
    auto type = get_string(*rf, "type", "response_format.type");
    if (!type || *type == "text") {
        return "";
    }
    if (*type == "json_object") {
        // llama.cpp extension: json_object may carry a schema; otherwise constrain to "any JSON object".
        const json* schema = find(*rf, "schema");
        if (schema && !schema->is_object()) {
            fail("'response_format.schema' must be an object");
        }
        if (schema) bounded_json::require_schema(*schema, "response_format.schema");
        return schema ? schema->dump() : R"({"type":"object"})";
    }
    if (*type == "json_schema") {
        const json* wrapper = find(*rf, "json_schema");
        if (!wrapper || !wrapper->is_object()) {
            fail("'response_format.json_schema' must be an object");
        }
        const json* schema = find(*wrapper, "schema");
        if (!schema || !schema->is_object()) {
            fail("'response_format.json_schema.schema' must be an object");
        }
        bounded_json::require_schema(*schema, "response_format.json_schema.schema");
        return schema->dump();
    }
    fail("'response_format.type' must be one of text, json_object, json_schema");
}

void parse_thinking(const json& body, chat_request& req) {
    if (const json* kwargs = find(body, "chat_template_kwargs")) {
        if (!kwargs->is_object()) {
            fail("'chat_template_kwargs' must be an object");
        }
        // The chat template renders these: llama.cpp parses each one again and walks it recursively.
        bounded_json::require_shape(*kwargs, "chat_template_kwargs");
        for (const auto& [key, value] : kwargs->items()) {
            req.chat_template_kwargs[key] = value.dump();
        }
        if (const json* et = find(*kwargs, "enable_thinking")) {
            if (!et->is_boolean()) {
                fail("'chat_template_kwargs.enable_thinking' must be a boolean");
            }
            req.enable_thinking = et->get<bool>();
        }
        // Held in enable_thinking alone, so a later reasoning_effort "none" cannot be overridden by the kwarg.
        req.chat_template_kwargs.erase("enable_thinking");
    }
    if (auto effort = get_string(body, "reasoning_effort", "reasoning_effort"); effort && !effort->empty()) {
        if (*effort == "none") {
            req.enable_thinking = false;
            req.chat_template_kwargs.erase("reasoning_effort");
        } else {
            // Templates with effort levels (GPT-OSS, DeepSeek V4, ...) read it as a template variable.
            req.chat_template_kwargs["reasoning_effort"] = json(*effort).dump();
        }
    }
}

}  // namespace

std::vector<std::string> parse_stop(const json& body) {
    return parse_stop_strings(body);
}

std::optional<int> parse_n_predict(const json& body) {
    const auto v = get_integer(body, "n_predict", "n_predict");
    if (!v || *v == -1) return std::nullopt;
    if (*v < 1) fail("'n_predict' must be -1 (no limit) or a positive integer");
    return int(std::min<int64_t>(*v, std::numeric_limits<int32_t>::max()));
}

std::optional<int> parse_speculative(const json& fields, const std::string& where) {
    const auto draft_count = [&](const char* key) -> std::optional<int> {
        const std::string field = where + key;
        const std::optional<int64_t> n = get_integer(fields, key, field);
        if (n && (*n < 0 || *n > max_request_draft_tokens)) {
            fail(in_quotes(field) + " must be an integer between 0 and " + std::to_string(max_request_draft_tokens));
        }
        return n ? std::optional<int>(static_cast<int>(*n)) : std::nullopt;
    };
    const std::optional<int> n_max = draft_count("speculative.n_max");
    draft_count("speculative.n_min");
    if (auto p_min = get_number(fields, "speculative.p_min", where + "speculative.p_min");
        p_min && !(*p_min >= 0 && *p_min <= 1)) {
        fail(in_quotes(where + "speculative.p_min") + " must be a number between 0 and 1");
    }
    return n_max;
}

sampling_options parse_sampling(const json& body) {
    sampling_options s;
    auto as_float = [&](const char* key) -> std::optional<float> {
        auto v = get_number(body, key, key);
        if (!v) {
            return std::nullopt;
        }
        // Out-of-float-range values become inf and fail validation below instead of wrapping silently.
        return std::fabs(*v) > double(std::numeric_limits<float>::max()) ? std::numeric_limits<float>::infinity()
                                                                         : float(*v);
    };
    s.temperature = as_float("temperature");
    s.top_p = as_float("top_p");
    s.min_p = as_float("min_p");
    s.repeat_penalty = as_float("repeat_penalty");
    s.presence_penalty = as_float("presence_penalty");
    s.frequency_penalty = as_float("frequency_penalty");
    s.top_k = get_int_in(body, "top_k", 0, std::numeric_limits<int32_t>::max());
    s.repeat_last_n = get_int_in(body, "repeat_last_n", -1, std::numeric_limits<int32_t>::max());
    if (auto seed = get_integer(body, "seed", "seed")) {
        if (*seed == -1) {
            s.seed = LLAMA_DEFAULT_SEED;
        } else if (*seed >= 0 && *seed <= int64_t(std::numeric_limits<uint32_t>::max())) {
            s.seed = uint32_t(*seed);
        } else {
            fail("'seed' must be an integer between -1 and 4294967295");
        }
    }
    if (const json* bias = find(body, "logit_bias")) {
        if (!bias->is_object()) fail("'logit_bias' must be an object mapping token ids to numbers");
        // No vocab has this many tokens; bind_to_vocab() checks each id against the model's.
        if (bias->size() > max_logit_bias_entries) {
            fail("'logit_bias' has " + std::to_string(bias->size()) + " entries; at most " +
                 std::to_string(max_logit_bias_entries) + " are accepted");
        }
        for (const auto& [key, value] : bias->items()) {
            char* end = nullptr;
            const long id = std::strtol(key.c_str(), &end, 10);
            if (key.empty() || *end != '\0' || id < 0 || id > std::numeric_limits<int32_t>::max()) {
                fail("'logit_bias' keys must be token ids, got '" + key + "'");
            }
            if (!value.is_number() || value.get<double>() < -100 || value.get<double>() > 100) {
                fail("'logit_bias[" + key + "]' must be a number between -100 and 100");
            }
            const float b = value.get<float>();
            s.logit_bias.emplace_back(static_cast<llama_token>(id), b <= -100 ? -INFINITY : b);
        }
    }
    if (auto ignore = get_bool(body, "ignore_eos", "ignore_eos")) s.ignore_eos = *ignore;
    validate_sampling(s);
    return s;
}

std::vector<common_chat_tool> parse_function_tools(const json& body) {
    std::vector<common_chat_tool> tools;
    const json* v = find(body, "tools");
    if (!v) {
        return tools;
    }
    if (!v->is_array()) {
        fail("'tools' must be an array");
    }
    std::set<std::string> names;
    for (size_t i = 0; i < v->size(); i++) {
        const json& tool = (*v)[i];
        const std::string field = indexed("tools", i);
        if (!tool.is_object()) {
            fail(in_quotes(field) + " must be an object");
        }
        if (auto type = get_string(tool, "type", field + ".type"); type && *type != "function") {
            fail(in_quotes(field + ".type") + " must be 'function'");
        }
        const json* function = find(tool, "function");
        if (!function || !function->is_object()) {
            fail(in_quotes(field + ".function") + " must be an object");
        }
        auto name = get_string(*function, "name", field + ".function.name");
        if (!name || name->empty()) {
            fail(in_quotes(field + ".function.name") + " must be a non-empty string");
        }
        if (!names.insert(*name).second) {
            fail(in_quotes(field + ".function.name") + ": duplicate tool name '" + *name + "'");
        }
        common_chat_tool t;
        t.name = *name;
        t.description = get_string(*function, "description", field + ".function.description").value_or("");
        const json* params = find(*function, "parameters");
        if (params && !params->is_object()) {
            fail(in_quotes(field + ".function.parameters") + " must be an object (a JSON schema)");
        }
        if (params) bounded_json::require_schema(*params, field + ".function.parameters");
        // OpenAI allows omitting parameters for functions without arguments.
        t.parameters = params ? params->dump() : R"({"type":"object","properties":{}})";
        tools.push_back(std::move(t));
    }
    return tools;
}

void parse_prompt_cache_key(const json& body, chat_request& req) {
    const auto retention = get_string(body, "prompt_cache_retention", "prompt_cache_retention");
    if (retention && *retention != "in_memory" && *retention != "in-memory" && *retention != "24h") {
        fail("'prompt_cache_retention' must be 'in_memory' or '24h'");
    }
    auto key = get_string(body, "prompt_cache_key", "prompt_cache_key");
    if (!key || key->empty()) return;
    if (key->size() > max_prompt_cache_key_bytes) {
        fail("'prompt_cache_key' must be at most " + std::to_string(max_prompt_cache_key_bytes) + " bytes");
    }
    req.prompt_cache_key = std::move(*key);
    // OpenAI keeps an in-memory prefix 5-10 minutes after its last use; 24h asks for a day.
    req.hint = cache_hint{.messages = std::numeric_limits<size_t>::max(),
                          .ttl = retention == "24h" ? max_cache_hint_ttl : std::chrono::seconds(600)};
}

chat_request parse_chat_request(const json& body) {
    require_object(body);
    if (find(body, "functions") || find(body, "function_call")) {
        fail("'functions' and 'function_call' are deprecated and not supported; use 'tools' and 'tool_choice'");
    }
    check_request_limits(body, "messages");
    chat_request req;
    req.model = parse_model(body);
    req.messages = parse_messages(body);
    req.tools = parse_function_tools(body);
    parse_tool_choice(body, req);
    req.parallel_tool_calls = get_bool(body, "parallel_tool_calls", "parallel_tool_calls");
    parse_stream(body, req.stream, req.include_usage);
    req.max_tokens = parse_max_tokens(body);
    req.stop = parse_stop(body);
    req.sampling = parse_sampling(body);
    parse_thinking(body, req);
    req.json_schema = parse_response_format(body);
    parse_n(body);
    parse_prompt_cache_key(body, req);
    req.return_progress = get_bool(body, "return_progress", "return_progress").value_or(false);
    req.draft_max = parse_speculative(body);
    // Token probabilities are not returned yet: a client that asks for them is told, not given an answer without.
    if (get_bool(body, "logprobs", "logprobs").value_or(false)) {
        fail("'logprobs' is not supported: keepwarm does not return token probabilities (send false or leave it out)");
    }
    if (auto top = get_integer(body, "top_logprobs", "top_logprobs"); top && *top > 0) {
        fail("'top_logprobs' is not supported: keepwarm does not return token probabilities");
    }
    return req;
}

completion_request parse_completion_request(const json& body) {
    require_object(body);
    completion_request req;
    req.model = parse_model(body);
    const json* prompt = find(body, "prompt");
    if (prompt && prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
        prompt = &(*prompt)[0];
    }
    if (!prompt) {
        fail("'prompt' must be a non-empty string");
    }
    if (prompt->is_array()) {
        if (!prompt->empty() && (*prompt)[0].is_number_integer()) {
            fail("'prompt' as token ids is not supported; send a string");
        }
        fail("'prompt' must be a single string: batches of prompts are not supported");
    }
    if (!prompt->is_string() || prompt->get_ref<const std::string&>().empty()) {
        fail("'prompt' must be a non-empty string");
    }
    req.prompt = prompt->get<std::string>();
    parse_stream(body, req.stream, req.include_usage);
    req.max_tokens = parse_max_tokens(body);
    req.stop = parse_stop(body);
    req.sampling = parse_sampling(body);
    req.draft_max = parse_speculative(body);
    req.echo = get_bool(body, "echo", "echo").value_or(false);
    if (req.echo) {
        fail("'echo' is not supported");
    }
    if (auto suffix = get_string(body, "suffix", "suffix"); suffix && !suffix->empty()) {
        fail("'suffix' is not supported");
    }
    if (auto logprobs = get_integer(body, "logprobs", "logprobs"); logprobs && *logprobs > 0) {
        fail("'logprobs' is not supported: keepwarm does not return token probabilities");
    }
    if (auto best_of = get_integer(body, "best_of", "best_of"); best_of && *best_of != 1) {
        fail("'best_of' must be 1: multiple candidates per request are not supported");
    }
    parse_n(body);
    return req;
}

json usage_json(const usage_info& usage) {
    return json{
        {"prompt_tokens", usage.prompt_tokens},
        {"completion_tokens", usage.completion_tokens},
        {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
        {"prompt_tokens_details",
         {{"cached_tokens", usage.cached_tokens},
          {"computed_tokens", usage.prompt_tokens - usage.cached_tokens},
          {"cached_tokens_device", usage.cache.device},
          {"cached_tokens_ram", usage.cache.ram},
          {"cached_tokens_disk", usage.cache.disk},
          {"checkpoint_pos", usage.cache.checkpoint_pos}}},
    };
}

json timings_json(const timings_info& t) {
    auto per_token = [](double ms, int n) { return n > 0 ? ms / n : 0.0; };
    auto per_second = [](double ms, int n) { return ms > 0 ? 1e3 * n / ms : 0.0; };
    json j{
        {"cache_n", t.cache_n},
        {"prompt_n", t.prompt_n},
        {"prompt_ms", t.prompt_ms},
        {"prompt_per_token_ms", per_token(t.prompt_ms, t.prompt_n)},
        {"prompt_per_second", per_second(t.prompt_ms, t.prompt_n)},
        {"predicted_n", t.predicted_n},
        {"predicted_ms", t.predicted_ms},
        {"predicted_per_token_ms", per_token(t.predicted_ms, t.predicted_n)},
        {"predicted_per_second", per_second(t.predicted_ms, t.predicted_n)},
        {"cache_device_n", t.cache.device},
        {"cache_ram_n", t.cache.ram},
        {"cache_disk_n", t.cache.disk},
        {"checkpoint_pos", t.cache.checkpoint_pos},
        {"setup_ms", t.setup_ms},
        {"queued_ms", t.queued_ms},
        {"prepare_ms", t.prepare_ms},
        {"sampling_ms", t.sampling_ms},
        {"sampling_max_ms", t.sampling_max_ms},
    };
    // As llama-server: the speculative decoding counts only when the request verified drafts.
    if (t.draft_n > 0) {
        j["draft_n"] = t.draft_n;
        j["draft_n_accepted"] = t.draft_n_accepted;
    }
    return j;
}

std::string chat_finish_reason(const common_chat_msg& msg, bool hit_token_limit) {
    if (hit_token_limit) {
        return "length";
    }
    return msg.tool_calls.empty() ? "stop" : "tool_calls";
}

namespace {

std::string effective_finish_reason(const common_chat_msg& msg, const std::string& finish_reason) {
    return finish_reason == "stop" && !msg.tool_calls.empty() ? "tool_calls" : finish_reason;
}

json chunk_base(const std::string& id, const std::string& model, int64_t created, const char* object) {
    return json{{"id", id}, {"object", object}, {"created", created}, {"model", model}};
}

json chat_chunk(const std::string& id, const std::string& model, int64_t created, json delta,
                const json& finish_reason) {
    json chunk = chunk_base(id, model, created, "chat.completion.chunk");
    chunk["choices"] = json::array({json{{"index", 0}, {"delta", std::move(delta)}, {"finish_reason", finish_reason}}});
    return chunk;
}

}  // namespace

json assistant_message_json(const common_chat_msg& msg) {
    json m{{"role", "assistant"}};
    std::string content = msg.content;
    if (content.empty()) {
        // A parsed reply never has parts, but a hand-built message might.
        for (const auto& part : msg.content_parts) {
            content += part.text;
        }
    }
    m["content"] = content.empty() && !msg.tool_calls.empty() ? json(nullptr) : json(content);
    if (!msg.reasoning_content.empty()) {
        m["reasoning_content"] = msg.reasoning_content;
    }
    if (!msg.tool_calls.empty()) {
        json calls = json::array();
        for (const auto& tc : msg.tool_calls) {
            calls.push_back(json{
                {"id", tc.id},
                {"type", "function"},
                {"function", {{"name", tc.name}, {"arguments", tc.arguments}}},
            });
        }
        m["tool_calls"] = std::move(calls);
    }
    return m;
}

json chat_completion_json(const std::string& id, const std::string& model, int64_t created, const common_chat_msg& msg,
                          const std::string& finish_reason, const usage_info& usage,
                          const std::optional<timings_info>& timings) {
    json res = chunk_base(id, model, created, "chat.completion");
    res["choices"] = json::array({json{
        {"index", 0},
        {"message", assistant_message_json(msg)},
        {"finish_reason", effective_finish_reason(msg, finish_reason)},
    }});
    res["usage"] = usage_json(usage);
    if (timings) {
        res["timings"] = timings_json(*timings);
    }
    return res;
}

json chat_delta_json(const common_chat_msg_diff& diff) {
    json delta = json::object();
    if (!diff.reasoning_content_delta.empty()) {
        delta["reasoning_content"] = diff.reasoning_content_delta;
    }
    if (!diff.content_delta.empty()) {
        delta["content"] = diff.content_delta;
    }
    if (diff.tool_call_index != std::string::npos) {
        json call{{"index", diff.tool_call_index}};
        if (!diff.tool_call_delta.id.empty()) {
            call["id"] = diff.tool_call_delta.id;
            call["type"] = "function";
        }
        if (!diff.tool_call_delta.name.empty() || !diff.tool_call_delta.arguments.empty()) {
            json function = json::object();
            if (!diff.tool_call_delta.name.empty()) {
                function["name"] = diff.tool_call_delta.name;
            }
            if (!diff.tool_call_delta.arguments.empty()) {
                function["arguments"] = diff.tool_call_delta.arguments;
            }
            call["function"] = std::move(function);
        }
        delta["tool_calls"] = json::array({std::move(call)});
    }
    return delta;
}

json chat_chunk_json(const std::string& id, const std::string& model, int64_t created,
                     const std::vector<common_chat_msg_diff>& diffs, bool first) {
    json chunks = json::array();
    if (first) {
        chunks.push_back(chat_chunk(id, model, created, json{{"role", "assistant"}, {"content", nullptr}}, nullptr));
    }
    for (const auto& diff : diffs) {
        json delta = chat_delta_json(diff);
        if (!delta.empty()) {
            chunks.push_back(chat_chunk(id, model, created, std::move(delta), nullptr));
        }
    }
    return chunks;
}

json chat_final_chunk_json(const std::string& id, const std::string& model, int64_t created,
                           const common_chat_msg& final_msg, const std::string& finish_reason,
                           const std::optional<timings_info>& timings) {
    json chunk = chat_chunk(id, model, created, json::object(), effective_finish_reason(final_msg, finish_reason));
    if (timings) {
        chunk["timings"] = timings_json(*timings);
    }
    return chunk;
}

json chat_usage_chunk_json(const std::string& id, const std::string& model, int64_t created, const usage_info& usage,
                           const std::optional<timings_info>& timings) {
    json chunk = chunk_base(id, model, created, "chat.completion.chunk");
    chunk["choices"] = json::array();
    chunk["usage"] = usage_json(usage);
    if (timings) {
        chunk["timings"] = timings_json(*timings);
    }
    return chunk;
}

json completion_json(const std::string& id, const std::string& model, int64_t created, const std::string& text,
                     const std::string& finish_reason, const usage_info& usage,
                     const std::optional<timings_info>& timings) {
    json res = chunk_base(id, model, created, "text_completion");
    res["choices"] =
        json::array({json{{"text", text}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_reason}}});
    res["usage"] = usage_json(usage);
    if (timings) {
        res["timings"] = timings_json(*timings);
    }
    return res;
}

json completion_chunk_json(const std::string& id, const std::string& model, int64_t created, const std::string& text,
                           const std::optional<std::string>& finish_reason,
                           const std::optional<timings_info>& timings) {
    json chunk = chunk_base(id, model, created, "text_completion");
    chunk["choices"] = json::array({json{{"text", text},
                                         {"index", 0},
                                         {"logprobs", nullptr},
                                         {"finish_reason", finish_reason ? json(*finish_reason) : json(nullptr)}}});
    if (timings) {
        chunk["timings"] = timings_json(*timings);
    }
    return chunk;
}

json completion_usage_chunk_json(const std::string& id, const std::string& model, int64_t created,
                                 const usage_info& usage, const std::optional<timings_info>& timings) {
    json chunk = chunk_base(id, model, created, "text_completion");
    chunk["choices"] = json::array();
    chunk["usage"] = usage_json(usage);
    if (timings) {
        chunk["timings"] = timings_json(*timings);
    }
    return chunk;
}

json model_json(const std::string& model_id, int64_t created, const std::string& owned_by, const json& meta) {
    json model{{"id", model_id}, {"object", "model"}, {"created", created}, {"owned_by", owned_by}};
    if (meta.is_object() && !meta.empty()) {
        // The tokens one request may hold, where clients look for a model's context: OpenRouter's and LM Studio's
        // context_length, vLLM's max_model_len.
        if (const auto slot = meta.find("n_ctx_slot"); slot != meta.end() && slot->is_number_integer()) {
            model["context_length"] = *slot;
            model["max_model_len"] = *slot;
        }
        model["meta"] = meta;
    }
    return model;
}

json models_list_json(const std::string& model_id, int64_t created, const std::string& owned_by, const json& meta) {
    return json{{"object", "list"}, {"data", json::array({model_json(model_id, created, owned_by, meta)})}};
}

}  // namespace keepwarm::api

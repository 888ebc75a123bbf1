// Ollama request parsing and response formatting. Where Ollama is lenient by design (unknown options are ignored,
// keep_alive is a hint) this is too; everything else is type-checked so that bad input is a 400 naming the field.
#include "api/ollama-api.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>
#include <set>

#include "api/openai-api.h"
#include "api/request-limits.h"
#include "base/request-error.h"
#include "json/bounded-json.h"
#include "json/json-fields.h"

namespace keepwarm::api::ollama {

namespace {

using namespace json_fields;

std::optional<float> get_float(const json& obj, const std::string& key, const std::string& field) {
    const json* v = find(obj, key);
    if (!v) return std::nullopt;
    if (!v->is_number()) fail(in_quotes(field) + " must be a number");
    const double d = v->get<double>();
    // Out-of-float-range values become inf and fail validation instead of wrapping silently.
    return std::fabs(d) > double(std::numeric_limits<float>::max()) ? std::numeric_limits<float>::infinity() : float(d);
}

std::optional<int> get_int_in(const json& obj, const std::string& key, const std::string& field, int64_t lo,
                              int64_t hi) {
    auto v = get_integer(obj, key, field);
    if (v && (*v < lo || *v > hi)) {
        fail(in_quotes(field) + " must be an integer between " + std::to_string(lo) + " and " + std::to_string(hi));
    }
    return v ? std::optional<int>(int(*v)) : std::nullopt;
}

void require_object(const json& body) {
    if (!body.is_object()) fail("request body must be a JSON object");
}

std::string parse_model(const json& body) {
    auto model = get_string(body, "model", "model");
    if (!model || model->empty()) fail("'model' is required");
    return *model;
}

// This server serves text-only models; an image would be silently lost.
void reject_images(const json& obj, const std::string& field) {
    const json* images = find(obj, "images");
    if (!images) return;
    if (!images->is_array()) fail(in_quotes(field) + " must be an array");
    if (!images->empty()) fail(in_quotes(field) + ": images are not supported, this server serves a text-only model");
}

common_chat_tool_call parse_tool_call(const json& call, const std::string& path) {
    if (!call.is_object()) fail(in_quotes(path) + " must be an object");
    const json* function = find(call, "function");
    if (!function || !function->is_object()) fail(in_quotes(path + ".function") + " must be an object");
    common_chat_tool_call tc;
    auto name = get_string(*function, "name", path + ".function.name");
    if (!name || name->empty()) fail(in_quotes(path + ".function.name") + " must be a non-empty string");
    tc.name = *name;
    const json* arguments = find(*function, "arguments");
    if (arguments && !arguments->is_object()) fail(in_quotes(path + ".function.arguments") + " must be an object");
    if (arguments) bounded_json::require_shape(*arguments, path + ".function.arguments");
    tc.arguments = arguments ? arguments->dump() : "{}";
    tc.id = get_string(call, "id", path + ".id").value_or("");
    return tc;
}

common_chat_msg parse_message(const json& message, size_t i) {
    const std::string path = indexed("messages", i);
    if (!message.is_object()) fail(in_quotes(path) + " must be an object");
    auto role = get_string(message, "role", path + ".role");
    static const std::set<std::string> roles = {"system", "user", "assistant", "tool"};
    if (role) {
        // Ollama lowercases roles.
        std::transform(role->begin(), role->end(), role->begin(), [](unsigned char c) { return std::tolower(c); });
    }
    if (!role || !roles.count(*role)) fail(in_quotes(path + ".role") + " must be one of system, user, assistant, tool");
    common_chat_msg msg;
    msg.role = *role;
    msg.content = get_string(message, "content", path + ".content").value_or("");
    reject_images(message, path + ".images");

    if (const json* calls = find(message, "tool_calls")) {
        if (msg.role != "assistant") fail(in_quotes(path + ".tool_calls") + " is only allowed on assistant messages");
        if (!calls->is_array()) fail(in_quotes(path + ".tool_calls") + " must be an array");
        for (size_t j = 0; j < calls->size(); j++) {
            msg.tool_calls.push_back(parse_tool_call((*calls)[j], indexed(path + ".tool_calls", j)));
        }
    }
    if (msg.role == "assistant") {
        msg.reasoning_content = get_string(message, "thinking", path + ".thinking").value_or("");
    }
    if (msg.role == "tool") {
        msg.tool_name = get_string(message, "tool_name", path + ".tool_name").value_or("");
        msg.tool_call_id = get_string(message, "tool_call_id", path + ".tool_call_id").value_or("");
    }
    return msg;
}

std::vector<common_chat_msg> parse_messages(const json& body) {
    std::vector<common_chat_msg> out;
    const json* messages = find(body, "messages");
    if (!messages) return out;
    if (!messages->is_array()) fail("'messages' must be an array");
    out.reserve(messages->size());
    for (size_t i = 0; i < messages->size(); i++) out.push_back(parse_message((*messages)[i], i));
    return out;
}

// "json" (any JSON object), a JSON schema object, or "" (free text).
std::string parse_format(const json& body) {
    const json* format = find(body, "format");
    if (!format) return "";
    if (format->is_string()) {
        const std::string& s = format->get_ref<const std::string&>();
        if (s.empty()) return "";
        if (s == "json") return R"({"type":"object"})";
    } else if (format->is_object()) {
        bounded_json::require_schema(*format, "format");
        return format->dump();
    }
    fail("'format' must be \"json\" or a JSON schema object");
}

// true/false, or a level ("low", "medium", "high"), which turns thinking on and reaches templates with effort levels
// as reasoning_effort.
void parse_think(const json& body, chat_request& req) {
    const json* think = find(body, "think");
    if (!think) return;
    if (think->is_boolean()) {
        req.enable_thinking = think->get<bool>();
        return;
    }
    if (think->is_string()) {
        const std::string& level = think->get_ref<const std::string&>();
        if (level == "low" || level == "medium" || level == "high") {
            req.enable_thinking = true;
            req.chat_template_kwargs["reasoning_effort"] = json(level).dump();
            return;
        }
    }
    fail("'think' must be true, false, \"low\", \"medium\" or \"high\"");
}

std::vector<std::string> parse_stop(const json& options) {
    std::vector<std::string> stops;
    const json* stop = find(options, "stop");
    if (!stop) return stops;
    if (stop->is_string()) {
        if (!stop->get_ref<const std::string&>().empty()) stops.push_back(stop->get<std::string>());
        return stops;
    }
    if (!stop->is_array()) fail("'options.stop' must be an array of strings");
    for (size_t i = 0; i < stop->size(); i++) {
        if (!(*stop)[i].is_string()) fail(in_quotes(indexed("options.stop", i)) + " must be a string");
        if ((*stop)[i].get_ref<const std::string&>().size() > max_stop_bytes) {
            fail(in_quotes(indexed("options.stop", i)) + " is longer than " + std::to_string(max_stop_bytes) +
                 " bytes");
        }
        if (!(*stop)[i].get_ref<const std::string&>().empty()) stops.push_back((*stop)[i].get<std::string>());
    }
    if (stops.size() > max_stop_strings) {
        fail("'options.stop' has " + std::to_string(stops.size()) + " strings; at most " +
             std::to_string(max_stop_strings) + " are allowed");
    }
    return stops;
}

// Ollama's model options. The ones about loading the model (num_gpu, num_thread, ...) and sampling methods this
// server does not have (mirostat, typical_p, ...) are ignored, as Ollama ignores options it does not know.
void parse_options(const json& body, chat_request& req) {
    const json* options = find(body, "options");
    if (!options) return;
    if (!options->is_object()) fail("'options' must be an object");
    const json& o = *options;
    constexpr int64_t int_max = std::numeric_limits<int32_t>::max();
    req.requested_context = get_int_in(o, "num_ctx", "options.num_ctx", 1, int_max);
    // Ollama: -1 is "no limit", -2 "until the context is full"; both are what no limit means here.
    if (auto n = get_int_in(o, "num_predict", "options.num_predict", -2, int_max); n && *n > 0) req.max_tokens = *n;
    sampling_options& s = req.sampling;
    s.temperature = get_float(o, "temperature", "options.temperature");
    s.top_p = get_float(o, "top_p", "options.top_p");
    s.min_p = get_float(o, "min_p", "options.min_p");
    s.repeat_penalty = get_float(o, "repeat_penalty", "options.repeat_penalty");
    s.presence_penalty = get_float(o, "presence_penalty", "options.presence_penalty");
    s.frequency_penalty = get_float(o, "frequency_penalty", "options.frequency_penalty");
    s.top_k = get_int_in(o, "top_k", "options.top_k", 0, int_max);
    s.repeat_last_n = get_int_in(o, "repeat_last_n", "options.repeat_last_n", -1, int_max);
    if (auto seed = get_integer(o, "seed", "options.seed")) {
        if (*seed > int64_t(std::numeric_limits<uint32_t>::max())) {
            fail("'options.seed' must be an integer between -1 and 4294967295");
        }
        s.seed = *seed < 0 ? LLAMA_DEFAULT_SEED : uint32_t(*seed);  // Ollama: a negative seed is a random one
    }
    try {
        validate_sampling(s);
    } catch (const request_error& e) {
        // validate_sampling names the bare field ("'temperature' must ..."); here it lives under options.
        fail("'options." + std::string(e.what()).substr(1));
    }
    req.stop = parse_stop(o);
    req.draft_max = parse_speculative(o, "options.");  // llama-server's name, among Ollama's options
}

// What /api/chat and /api/generate share.
void parse_common(const json& body, chat_request& req) {
    req.api = "ollama";
    req.model = parse_model(body);
    req.stream = get_bool(body, "stream", "stream").value_or(true);
    parse_options(body, req);
    parse_think(body, req);
    req.json_schema = parse_format(body);
    if (get_bool(body, "logprobs", "logprobs").value_or(false)) fail("'logprobs' is not supported");
    // keep_alive is accepted and ignored: the model stays loaded for the server's lifetime.
}

void add_metrics(json& obj, const metrics& m) {
    obj["total_duration"] = m.total_ns;
    obj["load_duration"] = m.load_ns;
    obj["prompt_eval_count"] = m.prompt_tokens;
    obj["prompt_eval_cached_count"] = m.cached_tokens;
    obj["prompt_eval_duration"] = m.prompt_eval_ns;
    obj["eval_count"] = m.generated_tokens;
    obj["eval_duration"] = m.eval_ns;
    obj["prompt_eval_computed_count"] = m.prompt_tokens - m.cached_tokens;
    obj["prompt_eval_cached_device_count"] = m.cache.device;
    obj["prompt_eval_cached_ram_count"] = m.cache.ram;
    obj["prompt_eval_cached_disk_count"] = m.cache.disk;
    obj["prompt_eval_checkpoint_pos"] = m.cache.checkpoint_pos;
}

json response_base(const std::string& model, const std::string& created_at) {
    return json{{"model", model}, {"created_at", created_at}};
}

json details_json(const model_card& card) {
    return json{{"parent_model", ""},
                {"format", "gguf"},
                {"family", card.architecture},
                {"families", json::array({card.architecture})},
                {"parameter_size", card.parameter_size},
                {"quantization_level", card.quantization_level}};
}

}  // namespace

chat_request parse_chat_request(const json& body) {
    require_object(body);
    check_request_limits(body, "messages");
    chat_request req;
    parse_common(body, req);
    req.messages = parse_messages(body);
    req.tools = parse_function_tools(body);  // Ollama's tool list is OpenAI's
    return req;
}

generate_request parse_generate_request(const json& body) {
    require_object(body);
    check_request_limits(body, "messages");
    generate_request g;
    parse_common(body, g.chat);
    g.prompt = get_string(body, "prompt", "prompt").value_or("");
    g.raw = get_bool(body, "raw", "raw").value_or(false);
    const std::string system = get_string(body, "system", "system").value_or("");
    reject_images(body, "images");
    if (auto suffix = get_string(body, "suffix", "suffix"); suffix && !suffix->empty()) {
        fail("'suffix' is not supported: fill-in-the-middle needs the model's insert template, which is not served");
    }
    if (auto tmpl = get_string(body, "template", "template"); tmpl && !tmpl->empty()) {
        fail("'template' is not supported: prompts are rendered with the model's own chat template");
    }
    if (const json* context = find(body, "context")) {
        if (!context->is_array()) fail("'context' must be an array");
        // Ollama deprecated it; keepwarm never returns one, and its prefix cache already reuses an earlier answer
        // when the conversation is sent again.
        if (!context->empty()) fail("'context' is not supported: send the whole conversation to /api/chat instead");
    }
    if (g.raw && !system.empty()) fail("'system' cannot be used with raw: a raw prompt is not templated");
    if (!g.raw && !g.prompt.empty()) {
        if (!system.empty()) g.chat.messages.push_back(common_chat_msg{.role = "system", .content = system});
        g.chat.messages.push_back(common_chat_msg{.role = "user", .content = g.prompt});
    }
    return g;
}

std::string parse_show_request(const json& body) {
    require_object(body);
    auto model = get_string(body, "model", "model");
    if (!model || model->empty()) model = get_string(body, "name", "name");
    if (!model || model->empty()) fail("'model' is required");
    return *model;
}

metrics metrics_of(const usage_info& usage, const timings_info& timings, std::chrono::nanoseconds total) {
    const auto ns = [](double ms) { return static_cast<int64_t>(std::llround(ms * 1e6)); };
    return {.total_ns = total.count(),
            .load_ns = ns(timings.setup_ms),
            .prompt_eval_ns = ns(timings.prompt_ms),
            .eval_ns = ns(timings.predicted_ms),
            .prompt_tokens = usage.prompt_tokens,
            .cached_tokens = usage.cached_tokens,
            .generated_tokens = usage.completion_tokens,
            .cache = usage.cache};
}

std::string rfc3339(std::chrono::system_clock::time_point t) {
    using namespace std::chrono;
    const auto since_epoch = duration_cast<nanoseconds>(t.time_since_epoch());
    auto secs = duration_cast<seconds>(since_epoch);
    auto nanos = since_epoch - secs;
    if (nanos.count() < 0) {
        secs -= seconds(1);
        nanos += seconds(1);
    }
    const std::time_t tt = secs.count();
    std::tm tm{};
    gmtime_r(&tt, &tm);
    char buf[64];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    std::string out = buf;
    if (nanos.count() > 0) {
        char frac[16];
        std::snprintf(frac, sizeof frac, ".%09lld", static_cast<long long>(nanos.count()));
        std::string f = frac;
        f.erase(f.find_last_not_of('0') + 1);
        out += f;
    }
    return out + "Z";
}

std::string done_reason(bool hit_token_limit) {
    return hit_token_limit ? "length" : "stop";
}

json tool_calls_json(std::span<const common_chat_tool_call> calls, size_t first_index) {
    json out = json::array();
    for (size_t i = 0; i < calls.size(); i++) {
        const auto& tc = calls[i];
        // The parser hands out arguments as JSON text of an object; Ollama sends the object.
        std::optional<json> parsed = bounded_json::try_parse(tc.arguments);
        json arguments = parsed && parsed->is_object() ? std::move(*parsed) : json(tc.arguments);
        json call = json::object();
        if (!tc.id.empty()) call["id"] = tc.id;
        call["function"] = json{{"index", first_index + i}, {"name", tc.name}, {"arguments", std::move(arguments)}};
        out.push_back(std::move(call));
    }
    return out;
}

json assistant_message_json(const common_chat_msg& msg) {
    json m{{"role", "assistant"}, {"content", msg.content}};
    if (!msg.reasoning_content.empty()) m["thinking"] = msg.reasoning_content;
    if (!msg.tool_calls.empty()) m["tool_calls"] = tool_calls_json(msg.tool_calls);
    return m;
}

json chat_response_json(const std::string& model, const std::string& created_at, const common_chat_msg& msg,
                        const std::string& reason, const metrics& m) {
    json res = response_base(model, created_at);
    res["message"] = assistant_message_json(msg);
    res["done"] = true;
    res["done_reason"] = reason;
    add_metrics(res, m);
    return res;
}

json chat_chunk_json(const std::string& model, const std::string& created_at, const std::string& content,
                     const std::string& thinking, std::span<const common_chat_tool_call> tool_calls,
                     size_t first_tool_index) {
    json message{{"role", "assistant"}, {"content", content}};
    if (!thinking.empty()) message["thinking"] = thinking;
    if (!tool_calls.empty()) message["tool_calls"] = tool_calls_json(tool_calls, first_tool_index);
    json res = response_base(model, created_at);
    res["message"] = std::move(message);
    res["done"] = false;
    return res;
}

json chat_final_chunk_json(const std::string& model, const std::string& created_at, const std::string& reason,
                           const metrics& m) {
    json res = response_base(model, created_at);
    res["message"] = json{{"role", "assistant"}, {"content", ""}};
    res["done"] = true;
    res["done_reason"] = reason;
    add_metrics(res, m);
    return res;
}

json generate_response_json(const std::string& model, const std::string& created_at, const std::string& response,
                            const std::string& thinking, const std::string& reason, const metrics& m) {
    json res = response_base(model, created_at);
    res["response"] = response;
    if (!thinking.empty()) res["thinking"] = thinking;
    res["done"] = true;
    res["done_reason"] = reason;
    add_metrics(res, m);
    return res;
}

json generate_chunk_json(const std::string& model, const std::string& created_at, const std::string& response,
                         const std::string& thinking) {
    json res = response_base(model, created_at);
    res["response"] = response;
    if (!thinking.empty()) res["thinking"] = thinking;
    res["done"] = false;
    return res;
}

json generate_final_chunk_json(const std::string& model, const std::string& created_at, const std::string& reason,
                               const metrics& m) {
    return generate_response_json(model, created_at, "", "", reason, m);
}

json chat_load_json(const std::string& model, const std::string& created_at) {
    json res = response_base(model, created_at);
    res["message"] = json{{"role", "assistant"}, {"content", ""}};
    res["done"] = true;
    res["done_reason"] = "load";
    return res;
}

json generate_load_json(const std::string& model, const std::string& created_at) {
    json res = response_base(model, created_at);
    res["response"] = "";
    res["done"] = true;
    res["done_reason"] = "load";
    return res;
}

std::string ndjson_line(const json& object) {
    return object.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

std::string error_body(int /*status*/, const std::string& /*type*/, const std::string& message) {
    return json{{"error", message}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string tagged_name(const std::string& model_id) {
    return model_id.find(':') == std::string::npos ? model_id + ":latest" : model_id;
}

std::string parameter_size(uint64_t n) {
    char buf[32];
    const auto scaled = [&](double unit, const char* suffix, const char* fraction_format) {
        const double v = double(n) / unit;
        std::snprintf(buf, sizeof buf, v == std::floor(v) ? "%.0f%s" : fraction_format, v, suffix);
        return std::string(buf);
    };
    if (n >= 1'000'000'000'000ull) return scaled(1e12, "T", "%.1f%s");
    if (n >= 1'000'000'000ull) return scaled(1e9, "B", "%.1f%s");
    if (n >= 1'000'000ull) return scaled(1e6, "M", "%.2f%s");
    if (n >= 1'000ull) return scaled(1e3, "K", "%.0f%s");
    return std::to_string(n);
}

std::string quantization_level(llama_ftype ftype) {
    // llama.cpp names K-quant mixes "Q4_K - Medium"; Ollama "Q4_K_M".
    switch (static_cast<llama_ftype>(ftype & ~LLAMA_FTYPE_GUESSED)) {
        case LLAMA_FTYPE_ALL_F32:
            return "F32";
        case LLAMA_FTYPE_MOSTLY_Q2_K_S:
            return "Q2_K_S";
        case LLAMA_FTYPE_MOSTLY_Q3_K_S:
            return "Q3_K_S";
        case LLAMA_FTYPE_MOSTLY_Q3_K_M:
            return "Q3_K_M";
        case LLAMA_FTYPE_MOSTLY_Q3_K_L:
            return "Q3_K_L";
        case LLAMA_FTYPE_MOSTLY_Q4_K_S:
            return "Q4_K_S";
        case LLAMA_FTYPE_MOSTLY_Q4_K_M:
            return "Q4_K_M";
        case LLAMA_FTYPE_MOSTLY_Q5_K_S:
            return "Q5_K_S";
        case LLAMA_FTYPE_MOSTLY_Q5_K_M:
            return "Q5_K_M";
        case LLAMA_FTYPE_MOSTLY_IQ3_M:
            return "IQ3_M";
        case LLAMA_FTYPE_MOSTLY_MXFP4_MOE:
            return "MXFP4";
        default:
            break;
    }
    // The rest is llama.cpp's name up to its description: "Q8_0", "Q2_K - Medium" -> "Q2_K", "IQ2_XXS - 2.06 bpw".
    std::string name = llama_ftype_name(static_cast<llama_ftype>(ftype & ~LLAMA_FTYPE_GUESSED));
    name = name.substr(0, name.find(' '));
    return name == "unknown," ? "unknown" : name;
}

json tags_json(const model_card& card) {
    json model{{"name", card.name},       {"model", card.name},    {"modified_at", rfc3339(card.modified_at)},
               {"size", card.file_bytes}, {"digest", card.digest}, {"details", details_json(card)}};
    return json{{"models", json::array({std::move(model)})}};
}

json show_json(const model_card& card) {
    const std::string parameters = "num_ctx " + std::to_string(card.context_length);
    const std::string modelfile =
        "# Modelfile of the model keepwarm serves (its template is Jinja, rendered by "
        "llama.cpp)\nFROM " +
        card.path + "\nTEMPLATE \"\"\"" + card.chat_template + "\"\"\"\nPARAMETER " + parameters + "\n";
    return json{{"modelfile", modelfile},
                {"parameters", parameters},
                {"template", card.chat_template},
                {"details", details_json(card)},
                {"model_info", card.model_info},
                {"capabilities", card.capabilities},
                {"modified_at", rfc3339(card.modified_at)}};
}

json ps_json(const model_card& card, const std::string& expires_at) {
    json model{{"name", card.name},
               {"model", card.name},
               {"size", card.memory_bytes},
               {"digest", card.digest},
               {"details", details_json(card)},
               {"expires_at", expires_at},
               {"size_vram", card.vram_bytes},
               {"context_length", card.context_length}};
    return json{{"models", json::array({std::move(model)})}};
}

json version_json(const std::string& keepwarm_version) {
    return json{{"version", compatible_version}, {"keepwarm_version", keepwarm_version}};
}

}  // namespace keepwarm::api::ollama

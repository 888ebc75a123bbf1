// See llama-server-api.h. Field checks follow llama-server's (server-schema.cpp, server-context.cpp's post_infill),
// with every type checked here so that bad input is a 400 naming the field, never a crash.
#include "api/llama-server-api.h"

#include "api/openai-api.h"
#include "json/json-fields.h"

namespace keepwarm::api {

namespace {

using namespace json_fields;

// A prompt of text and token ids mixed (or only ids) into pieces; a lone string stays `prompt`.
void parse_prompt(const json& body, native_completion_request& req) {
    const json* prompt = find(body, "prompt");
    if (prompt && prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) prompt = &(*prompt)[0];
    if (!prompt) fail("'prompt' is required: a string, or an array of token ids and strings");
    if (prompt->is_string()) {
        if (prompt->get_ref<const std::string&>().empty()) fail("'prompt' must not be empty");
        req.prompt = prompt->get<std::string>();
        return;
    }
    if (!prompt->is_array() || prompt->empty()) fail("'prompt' must be a string, or an array of token ids and strings");
    if (prompt->size() > max_prompt_pieces) {
        fail("'prompt' has " + std::to_string(prompt->size()) + " elements; at most " +
             std::to_string(max_prompt_pieces) + " are accepted");
    }
    bool has_id = false;
    for (const json& p : *prompt) has_id = has_id || p.is_number();
    if (!has_id) fail("'prompt' holds several prompts: keepwarm serves one prompt per request");
    req.pieces.reserve(prompt->size());
    for (size_t i = 0; i < prompt->size(); ++i) {
        const json& p = (*prompt)[i];
        if (p.is_string()) {
            req.pieces.push_back({.text = p.get<std::string>()});
        } else if (p.is_number_integer() && p.get<int64_t>() >= 0 && p.get<int64_t>() <= INT32_MAX) {
            req.pieces.push_back({.token = static_cast<llama_token>(p.get<int64_t>())});
        } else {
            fail(in_quotes(indexed("prompt", i)) + " must be a token id (a non-negative integer) or a string");
        }
    }
}

void parse_switches(const json& body, native_completion_request& req) {
    chat_request& p = req.params;
    p.model = get_string(body, "model", "model").value_or("");
    p.stream = get_bool(body, "stream", "stream").value_or(false);
    p.max_tokens = parse_n_predict(body);
    p.stop = parse_stop(body);
    p.sampling = parse_sampling(body);
    p.return_progress = get_bool(body, "return_progress", "return_progress").value_or(false);
    get_bool(body, "cache_prompt", "cache_prompt");  // checked, and always true here: keepwarm caches every prompt
    req.return_tokens = get_bool(body, "return_tokens", "return_tokens").value_or(false);
    p.draft_max = parse_speculative(body);
    if (auto n_probs = get_integer(body, "n_probs", "n_probs"); n_probs && *n_probs > 0) {
        fail("'n_probs' is not supported: keepwarm does not return token probabilities");
    }
    if (const json* schema = find(body, "json_schema")) {
        if (!schema->is_object()) fail("'json_schema' must be an object");
        p.json_schema = schema->dump();
    }
}

}  // namespace

native_completion_request parse_native_completion_request(const json& body) {
    if (!body.is_object()) fail("request body must be a JSON object");
    native_completion_request req;
    parse_prompt(body, req);
    parse_switches(body, req);
    return req;
}

infill_request parse_infill_request(const json& body) {
    if (!body.is_object()) fail("request body must be a JSON object");
    infill_request req;
    if (const json* prompt = find(body, "prompt"); prompt && !prompt->is_string()) fail("\"prompt\" must be a string");
    req.completion.prompt = get_string(body, "prompt", "prompt").value_or("");
    auto prefix = get_string(body, "input_prefix", "input_prefix");
    if (!prefix) fail("\"input_prefix\" is required");
    auto suffix = get_string(body, "input_suffix", "input_suffix");
    if (!suffix) fail("\"input_suffix\" is required");
    req.parts.prefix = std::move(*prefix);
    req.parts.suffix = std::move(*suffix);
    if (const json* extra = find(body, "input_extra")) {
        if (!extra->is_array() || extra->size() > max_prompt_pieces) {
            fail("\"input_extra\" must be an array of {\"filename\": string, \"text\": string}");
        }
        for (const json& chunk : *extra) {
            if (!chunk.is_object() || !find(chunk, "text") || !chunk.at("text").is_string()) {
                fail("extra_context chunk must contain a \"text\" field with a string value");
            }
            const json* name = find(chunk, "filename");
            if (name && !name->is_string()) fail("extra_context chunk's \"filename\" field must be a string");
            req.parts.extra.push_back(
                {.name = name ? name->get<std::string>() : "tmp", .text = chunk.at("text").get<std::string>()});
        }
    }
    parse_switches(body, req.completion);
    return req;
}

std::string native_stop_type(bool hit_token_limit, const std::string& stopping_word) {
    if (!stopping_word.empty()) return "word";
    return hit_token_limit ? "limit" : "eos";
}

json native_completion_json(const native_completion_result& r, bool has_new_line) {
    return json{
        {"index", 0},
        {"content", r.content},
        {"tokens", r.tokens},
        {"id_slot", r.id_slot},
        {"stop", true},
        {"model", r.model},
        {"tokens_predicted", r.tokens_predicted},
        {"tokens_evaluated", r.tokens_evaluated},
        {"prompt", r.prompt},
        {"has_new_line", has_new_line},
        {"truncated", false},  // keepwarm refuses a prompt that does not fit rather than cutting it
        {"stop_type", r.stop_type},
        {"stopping_word", r.stopping_word},
        {"tokens_cached", r.tokens_cached},
        {"timings", timings_json(r.timings)},
    };
}

json native_chunk_json(const std::string& content, int tokens_predicted, int tokens_evaluated,
                       const std::optional<json>& prompt_progress) {
    json chunk{
        {"index", 0},
        {"content", content},
        {"tokens", json::array()},
        {"stop", false},
        {"id_slot", -1},
        {"tokens_predicted", tokens_predicted},
        {"tokens_evaluated", tokens_evaluated},
    };
    if (prompt_progress) chunk["prompt_progress"] = *prompt_progress;
    return chunk;
}

json prompt_progress_json(int total, int cache, int processed, double time_ms) {
    return json{{"total", total}, {"cache", cache}, {"processed", processed}, {"time_ms", time_ms}};
}

}  // namespace keepwarm::api

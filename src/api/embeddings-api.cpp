// See embeddings-api.h. Every field's type is checked here, so that bad input is a 400 naming the field, never a
// crash; the input shapes follow llama-server's tokenize_input_prompts (a string, token ids, text and ids mixed, or an
// array of those), which take in OpenAI's four.
#include "api/embeddings-api.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>

#include "base/request-error.h"
#include "json/json-fields.h"

namespace keepwarm::api {

namespace {

using namespace json_fields;

bool is_token_id(const json& v) {
    if (v.is_number_unsigned()) return v.get<uint64_t>() <= uint64_t(INT32_MAX);
    return v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX;
}

// One input: a string, or an array of token ids and strings (at least one id: an array of strings alone is several
// inputs, as in llama-server).
std::vector<prompt_piece> parse_input(const json& v, const std::string& field) {
    if (v.is_string()) return {{.text = v.get<std::string>()}};
    if (!v.is_array()) {
        fail(in_quotes(field) + " must be a string, or an array of token ids (integers) and strings");
    }
    if (v.size() > max_prompt_pieces_per_input) {
        fail(in_quotes(field) + " has " + std::to_string(v.size()) + " elements; at most " +
             std::to_string(max_prompt_pieces_per_input) + " are accepted");
    }
    std::vector<prompt_piece> pieces;
    pieces.reserve(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
        const json& p = v[i];
        if (p.is_string()) {
            pieces.push_back({.text = p.get<std::string>()});
        } else if (is_token_id(p)) {
            pieces.push_back({.token = static_cast<llama_token>(p.get<int64_t>())});
        } else {
            fail(in_quotes(indexed(field, i)) + " must be a token id (a non-negative integer) or a string");
        }
    }
    return pieces;
}

bool has_token_id(const json& v) {
    for (const json& e : v) {
        if (e.is_number()) return true;
    }
    return false;
}

// `input` (or llama-server's `content`) as a list of inputs: an array that holds no token id is one input per element.
std::vector<std::vector<prompt_piece>> parse_inputs(const json& v, const std::string& field) {
    std::vector<std::vector<prompt_piece>> inputs;
    if (!v.is_array() || has_token_id(v)) {
        inputs.push_back(parse_input(v, field));
        return inputs;
    }
    if (v.empty()) fail(in_quotes(field) + " must not be an empty array");
    if (v.size() > max_embedding_inputs) {
        fail(in_quotes(field) + " has " + std::to_string(v.size()) + " inputs; at most " +
             std::to_string(max_embedding_inputs) + " are accepted in one request");
    }
    inputs.reserve(v.size());
    for (size_t i = 0; i < v.size(); ++i) inputs.push_back(parse_input(v[i], indexed(field, i)));
    return inputs;
}

std::optional<int64_t> parse_dimensions(const json& body) {
    const auto dimensions = get_integer(body, "dimensions", "dimensions");
    if (dimensions && *dimensions < 1) fail("'dimensions' must be at least 1");
    return dimensions;
}

bool parse_encoding_format(const json& body) {
    const auto format = get_string(body, "encoding_format", "encoding_format");
    if (!format || *format == "float") return false;
    if (*format == "base64") return true;
    fail("'encoding_format' must be float or base64");
}

int parse_normalize(const json& body) {
    const auto n = get_integer(body, "embd_normalize", "embd_normalize");
    if (!n) return 2;
    if (*n < -1 || *n > 64) fail("'embd_normalize' must be -1 (none), 0 (max absolute), 1, 2 (Euclidean) ... 64");
    return int(*n);
}

// What llama-server's answers and requests share: `input`, else `content` (the native answer).
embedding_request parse_input_or_content(const json& body, embedding_answer answer) {
    embedding_request req;
    req.model = get_string(body, "model", "model").value_or("");
    req.answer = answer;
    if (const json* input = find(body, "input")) {
        req.inputs = parse_inputs(*input, "input");
    } else if (const json* content = find(body, "content")) {
        req.inputs = parse_inputs(*content, "content");
        req.answer = embedding_answer::native;
    } else {
        fail(
            "'input' is required: a string, an array of strings, an array of token ids or an array of arrays of "
            "token ids");
    }
    req.base64 = parse_encoding_format(body);
    req.normalize = parse_normalize(body);
    return req;
}

const char base64_alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

}  // namespace

embedding_request parse_openai_embedding_request(const json& body) {
    embedding_request req = parse_input_or_content(body, embedding_answer::openai);
    req.dimensions = parse_dimensions(body);
    get_string(body, "user", "user");  // checked; nothing keepwarm keeps
    return req;
}

embedding_request parse_native_embedding_request(const json& body) {
    return parse_input_or_content(body, embedding_answer::native);
}

embedding_request parse_ollama_embed_request(const json& body) {
    embedding_request req;
    req.answer = embedding_answer::ollama_embed;
    req.model = get_string(body, "model", "model").value_or("");
    req.truncate = get_bool(body, "truncate", "truncate").value_or(true);
    req.dimensions = parse_dimensions(body);
    if (const json* options = find(body, "options"); options && !options->is_object()) {
        fail("'options' must be an object");
    }
    const json* input = find(body, "input");
    if (!input) return req;  // Ollama answers no input with no embeddings
    if (input->is_string()) {
        req.inputs.push_back({{.text = input->get<std::string>()}});
        return req;
    }
    if (!input->is_array()) fail("'input' must be a string or an array of strings");
    if (input->size() > max_embedding_inputs) {
        fail("'input' has " + std::to_string(input->size()) + " inputs; at most " +
             std::to_string(max_embedding_inputs) + " are accepted in one request");
    }
    for (size_t i = 0; i < input->size(); ++i) {
        const json& s = (*input)[i];
        if (!s.is_string()) fail(in_quotes(indexed("input", i)) + " must be a string");
        req.inputs.push_back({{.text = s.get<std::string>()}});
    }
    return req;
}

embedding_request parse_ollama_legacy_embedding_request(const json& body) {
    embedding_request req;
    req.answer = embedding_answer::ollama_legacy;
    req.model = get_string(body, "model", "model").value_or("");
    req.truncate = true;
    req.normalize = -1;  // Ollama's legacy endpoint returns the pooled vector as it is
    if (const json* options = find(body, "options"); options && !options->is_object()) {
        fail("'options' must be an object");
    }
    const auto prompt = get_string(body, "prompt", "prompt").value_or("");
    if (!prompt.empty()) req.inputs.push_back({{.text = prompt}});
    return req;
}

void shorten_embeddings(std::vector<std::vector<float>>& vectors, int64_t dimensions) {
    for (auto& v : vectors) {
        if (dimensions < 1 || uint64_t(dimensions) > v.size()) {
            throw request_error(400, "'dimensions' must be from 1 to " + std::to_string(v.size()) +
                                         ", the model's embedding size; it is " + std::to_string(dimensions));
        }
        v.resize(size_t(dimensions));
        double sum = 0;
        for (const float x : v) sum += double(x) * double(x);
        const double norm = sum > 0 ? 1.0 / std::sqrt(sum) : 0.0;
        for (float& x : v) x = float(double(x) * norm);
    }
}

rerank_request parse_rerank_request(const json& body) {
    rerank_request req;
    req.model = get_string(body, "model", "model").value_or("");
    const json* query = find(body, "query");
    if (!query) fail("'query' is required: a string");
    if (!query->is_string()) fail("'query' must be a string");
    req.query = query->get<std::string>();
    const json* documents = find(body, "documents");
    const char* field = "documents";
    if (!documents && (documents = find(body, "texts"))) {
        field = "texts";
        req.tei = true;
    }
    if (!documents || !documents->is_array() || documents->empty()) {
        fail("'documents' must be a non-empty array of strings");
    }
    if (documents->size() > max_embedding_inputs) {
        fail(in_quotes(field) + " has " + std::to_string(documents->size()) + " documents; at most " +
             std::to_string(max_embedding_inputs) + " are accepted in one request");
    }
    for (size_t i = 0; i < documents->size(); ++i) {
        const json& d = (*documents)[i];
        if (!d.is_string()) fail(in_quotes(indexed(field, i)) + " must be a string");
        req.documents.push_back(d.get<std::string>());
    }
    const auto top_n = get_integer(body, "top_n", "top_n");
    if (top_n && *top_n < 0) fail("'top_n' must be at least 0");
    req.top_n = top_n ? size_t(std::min<int64_t>(*top_n, int64_t(req.documents.size()))) : req.documents.size();
    req.return_text = req.tei && get_bool(body, "return_text", "return_text").value_or(false);
    return req;
}

json rerank_json(const std::string& model, const rerank_request& req, const std::vector<float>& scores,
                 int prompt_tokens) {
    std::vector<size_t> order(scores.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] > scores[b]; });
    order.resize(std::min(order.size(), req.top_n));
    json results = json::array();
    for (const size_t i : order) {
        json item = {{"index", i}, {req.tei ? "score" : "relevance_score", scores[i]}};
        if (req.return_text) item["text"] = req.documents[i];
        results.push_back(std::move(item));
    }
    if (req.tei) return results;
    return {{"model", req.model.empty() ? model : req.model},
            {"object", "list"},
            {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}},
            {"results", std::move(results)}};
}

std::string base64_floats(const std::vector<float>& values) {
    std::string bytes(values.size() * sizeof(float), '\0');
    // Little-endian on every machine keepwarm builds for (x86-64, arm64), as OpenAI's clients read it.
    if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
    std::string out;
    out.reserve((bytes.size() + 2) / 3 * 4);
    size_t i = 0;
    for (; i + 3 <= bytes.size(); i += 3) {
        const uint32_t n = (uint32_t(uint8_t(bytes[i])) << 16) | (uint32_t(uint8_t(bytes[i + 1])) << 8) |
                           uint32_t(uint8_t(bytes[i + 2]));
        out += base64_alphabet[(n >> 18) & 63];
        out += base64_alphabet[(n >> 12) & 63];
        out += base64_alphabet[(n >> 6) & 63];
        out += base64_alphabet[n & 63];
    }
    if (const size_t rest = bytes.size() - i; rest > 0) {
        uint32_t n = uint32_t(uint8_t(bytes[i])) << 16;
        if (rest == 2) n |= uint32_t(uint8_t(bytes[i + 1])) << 8;
        out += base64_alphabet[(n >> 18) & 63];
        out += base64_alphabet[(n >> 12) & 63];
        out += rest == 2 ? base64_alphabet[(n >> 6) & 63] : '=';
        out += '=';
    }
    return out;
}

json openai_embeddings_json(const std::string& model, const embedding_result& r, bool base64) {
    json data = json::array();
    int tokens = 0;
    for (size_t i = 0; i < r.vectors.size(); ++i) {
        json item = {{"object", "embedding"}, {"index", i}};
        if (base64) {
            item["embedding"] = base64_floats(r.vectors[i]);
        } else {
            item["embedding"] = r.vectors[i];
        }
        data.push_back(std::move(item));
    }
    for (const int n : r.input_tokens) tokens += n;
    return {{"object", "list"},
            {"data", std::move(data)},
            {"model", model},
            {"usage", {{"prompt_tokens", tokens}, {"total_tokens", tokens}}}};
}

json native_embeddings_json(const embedding_result& r) {
    json out = json::array();
    for (size_t i = 0; i < r.vectors.size(); ++i) {
        out.push_back({{"index", i}, {"embedding", json::array({r.vectors[i]})}});
    }
    return out;
}

json ollama_embed_json(const std::string& model, const embedding_result& r) {
    int tokens = 0;
    for (const int n : r.input_tokens) tokens += n;
    json embeddings = json::array();
    for (const auto& v : r.vectors) embeddings.push_back(v);
    return {{"model", model},
            {"embeddings", std::move(embeddings)},
            {"total_duration", r.total_ns},
            {"load_duration", 0},
            {"prompt_eval_count", tokens}};
}

json ollama_legacy_embedding_json(const embedding_result& r) {
    return {{"embedding", r.vectors.empty() ? json::array() : json(r.vectors.front())}};
}

}  // namespace keepwarm::api

// See tokenizer-routes.h. Same request and response fields as llama-server.
#include "local/tokenizer-routes.h"

#include <nlohmann/json.hpp>

#include <optional>

#include "base/request-error.h"
#include "common.h"
#include "engine/text-stream.h"
#include "json/bounded-json.h"

namespace keepwarm {

namespace {
using json = nlohmann::ordered_json;

json parse_object(const http::request& req) {
    // Linear in the number of keys, even those of fields nobody reads, and bounded in depth.
    std::optional<json> body = bounded_json::try_parse(req.body);
    if (!body || !body->is_object()) {
        throw request_error(400, "request body must be a JSON object of at most " +
                                     std::to_string(bounded_json::max_depth) + " levels");
    }
    return std::move(*body);
}

bool optional_bool(const json& body, const char* key, bool fallback) {
    const auto it = body.find(key);
    if (it == body.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) throw request_error(400, std::string("'") + key + "' must be a boolean");
    return it->get<bool>();
}
}  // namespace

void register_tokenizer_routes(http::http_server& server, local_model& model) {
    server.add_route("POST", "/tokenize", [&model](const http::request& req, http::response_writer& w) {
        const json body = parse_object(req);
        const auto content = body.find("content");
        if (content == body.end() || !content->is_string()) throw request_error(400, "'content' must be a string");
        const bool add_special = optional_bool(body, "add_special", false);
        const bool parse_special = optional_bool(body, "parse_special", true);
        const bool with_pieces = optional_bool(body, "with_pieces", false);
        const std::string& text = content->get_ref<const std::string&>();
        // No prompt holds more tokens than the whole context; a text that is longer than that whatever it says is
        // refused before the tokenizer spends seconds per MB on it.
        const int context = model.llm->options().context_size;
        if (const size_t at_least = model.llm->min_tokens_for_text(text.size());
            at_least > static_cast<size_t>(context)) {
            throw request_error(400, "'content' has " + std::to_string(text.size()) + " bytes, at least " +
                                         std::to_string(at_least) + " tokens, more than the context's " +
                                         std::to_string(context));
        }
        const auto tokens = common_tokenize(model.llm->vocab(), text, add_special, parse_special);
        json out = json::array();
        for (const llama_token t : tokens) {
            if (!with_pieces) {
                out.push_back(t);
                continue;
            }
            out.push_back({{"id", t}, {"piece", sanitize_utf8(common_token_to_piece(model.llm->vocab(), t, true))}});
        }
        w.send(200, "application/json", json{{"tokens", out}}.dump());
    });

    server.add_route("POST", "/detokenize", [&model](const http::request& req, http::response_writer& w) {
        const json body = parse_object(req);
        const auto tokens = body.find("tokens");
        if (tokens == body.end() || !tokens->is_array()) throw request_error(400, "'tokens' must be an array");
        const int n_vocab = llama_vocab_n_tokens(model.llm->vocab());
        std::vector<llama_token> ids;
        for (const auto& t : *tokens) {
            if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= n_vocab) {
                throw request_error(400, "'tokens' must hold token ids between 0 and " + std::to_string(n_vocab - 1));
            }
            ids.push_back(t.get<llama_token>());
        }
        const std::string text = common_detokenize(model.llm->vocab(), ids, /*special=*/true);
        w.send(200, "application/json", json{{"content", sanitize_utf8(text)}}.dump());
    });
}

}  // namespace keepwarm

// See embedding-routes.h. A request goes: parse (api/embeddings-api), tokenize each input as llama-server does
// (tokenize_mixed: specials on the first text piece), bound it, wait for the embedder, write the API's answer.
#include "local/embedding-routes.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string_view>

#include "api/embeddings-api.h"
#include "api/ollama-api.h"
#include "base/metrics-text.h"
#include "base/request-error.h"
#include "common.h"

namespace keepwarm {

namespace {

using json = nlohmann::ordered_json;
namespace ollama = api::ollama;

std::string dump(const json& body) {
    return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

// A name as an error message quotes it: 'name', at most 200 bytes of it. (Appended piece by piece: GCC 12 warns of
// an overlap, wrongly, in "'" + std::string.)
std::string quoted(const std::string& name) {
    constexpr size_t limit = 200;
    std::string out = "'";
    out.append(name, 0, std::min(name.size(), limit));
    if (name.size() > limit) out += "...";
    out += "'";
    return out;
}

// The request's inputs as token ids, each within the embedder's context (cut to it when the request truncates), all
// of them within the request's token budget.
std::vector<std::vector<llama_token>> tokenize_inputs(const embedder& model, const api::embedding_request& req) {
    const llama_vocab* vocab = model.vocab();
    const size_t context = size_t(model.context_size());
    // Before any tokenizing: text that makes more tokens than an input may have (or than the request may) is refused,
    // or, truncating, cut to what can make the first `context` tokens and a few beyond (tokenized, then cut again).
    size_t least_tokens = 0;
    for (const auto& input : req.inputs) {
        size_t bytes = 0;
        for (const prompt_piece& piece : input) bytes += piece.token != LLAMA_TOKEN_NULL ? 0 : piece.text.size();
        const size_t at_least = model.min_tokens_for_text(bytes);
        if (at_least > context && !req.truncate) {
            throw request_error(400,
                                "an input of " + std::to_string(bytes) + " bytes of text makes more than the " +
                                    std::to_string(context) + " tokens one input may have (no token is longer than " +
                                    std::to_string(model.longest_piece_bytes()) + " bytes)",
                                "exceed_context_size_error");
        }
        least_tokens += std::min(at_least, context);
    }
    if (least_tokens > api::max_embedding_request_tokens) {
        throw request_error(400, "the inputs have more than " + std::to_string(api::max_embedding_request_tokens) +
                                     " tokens together; send them in several requests");
    }
    const size_t cut_bytes = (context + 64) * std::max<size_t>(model.longest_piece_bytes(), 1);
    std::vector<std::vector<llama_token>> inputs;
    inputs.reserve(req.inputs.size());
    size_t total = 0;
    for (size_t i = 0; i < req.inputs.size(); ++i) {
        std::vector<llama_token> tokens;
        bool first = true;
        for (const prompt_piece& piece : req.inputs[i]) {
            if (piece.token != LLAMA_TOKEN_NULL) {
                tokens.push_back(piece.token);
            } else {
                std::string_view text = piece.text;
                if (req.truncate && model.longest_piece_bytes() > 0 && text.size() > cut_bytes) {
                    size_t end = cut_bytes;
                    while (end > 0 && (uint8_t(text[end]) & 0xC0) == 0x80) --end;  // not inside a UTF-8 character
                    text = text.substr(0, end);
                }
                const auto ids = common_tokenize(vocab, std::string(text), /*add_special=*/first,
                                                 /*parse_special=*/true);
                tokens.insert(tokens.end(), ids.begin(), ids.end());
            }
            first = false;
            if (tokens.size() > context + api::max_embedding_request_tokens) break;  // over every bound already
        }
        if (tokens.empty()) throw request_error(400, "input " + std::to_string(i) + " is empty");
        if (tokens.size() > context) {
            if (!req.truncate) {
                throw request_error(400,
                                    "input " + std::to_string(i) + " has " + std::to_string(tokens.size()) +
                                        " tokens, more than the " + std::to_string(context) +
                                        " one input may have (the server's context for one input)",
                                    "exceed_context_size_error");
            }
            tokens.resize(context);
        }
        total += tokens.size();
        if (total > api::max_embedding_request_tokens) {
            throw request_error(400, "the inputs have more than " + std::to_string(api::max_embedding_request_tokens) +
                                         " tokens together; send them in several requests");
        }
        inputs.push_back(std::move(tokens));
    }
    return inputs;
}

// Computes what `req` asks for, or nothing when the client left while it waited (then nothing is written).
std::optional<api::embedding_result> compute(embedder& model, const api::embedding_request& req,
                                             http::response_writer& w, std::chrono::steady_clock::time_point received) {
    api::embedding_result result;
    if (req.dimensions && *req.dimensions > model.n_embd()) {  // refused before any work, as every other bound
        throw request_error(400, "'dimensions' must be from 1 to " + std::to_string(model.n_embd()) +
                                     ", the model's embedding size; it is " + std::to_string(*req.dimensions));
    }
    const auto inputs = tokenize_inputs(model, req);
    for (const auto& tokens : inputs) result.input_tokens.push_back(int(tokens.size()));
    if (!inputs.empty()) {
        result.vectors = model.embed(inputs, req.normalize, [&w] { return w.client_gone(); });
        if (result.vectors.size() != inputs.size()) return std::nullopt;
    }
    if (req.dimensions) api::shorten_embeddings(result.vectors, *req.dimensions);
    result.total_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - received).count();
    return result;
}

using parser = api::embedding_request (*)(const json&);

http::handler embedding_handler(const frontend_context& ctx, embedder& model, parser parse) {
    return [&ctx, &model, parse](const http::request& req, http::response_writer& w) {
        const auto received = std::chrono::steady_clock::now();
        const api::embedding_request request = parse(parse_json_body(req));
        const auto result = compute(model, request, w, received);
        if (!result) return;
        const std::string ollama_name = request.model.empty() ? ollama::tagged_name(ctx.model_id) : request.model;
        json body;
        switch (request.answer) {
            case api::embedding_answer::openai:
                body = api::openai_embeddings_json(ctx.model_id, *result, request.base64);
                break;
            case api::embedding_answer::native:
                body = api::native_embeddings_json(*result);
                break;
            case api::embedding_answer::ollama_embed:
                body = api::ollama_embed_json(ollama_name, *result);
                break;
            case api::embedding_answer::ollama_legacy:
                body = api::ollama_legacy_embedding_json(*result);
                break;
        }
        w.send(200, "application/json", dump(body));
    };
}

void replace_all(std::string& text, const std::string& from, const std::string& to) {
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
        text.replace(at, from.size(), to);
    }
}

// llama-server's format_prompt_rerank: the model's rerank template (tokenizer.chat_template.rerank) with the query and
// the document put in, tokenized with its special tokens; without one, [BOS] query [EOS] [SEP] document [EOS], each
// special token where the vocab adds it.
std::vector<llama_token> rerank_prompt(const embedder& model, const std::string& query, const std::string& document) {
    const llama_vocab* vocab = model.vocab();
    if (const char* rerank_template = llama_model_chat_template(model.model(), "rerank")) {
        std::string prompt = rerank_template;
        replace_all(prompt, "{query}", query);
        replace_all(prompt, "{document}", document);
        return common_tokenize(vocab, prompt, /*add_special=*/false, /*parse_special=*/true);
    }
    llama_token eos = llama_vocab_eos(vocab);
    if (eos == LLAMA_TOKEN_NULL) eos = llama_vocab_sep(vocab);
    std::vector<llama_token> tokens;
    if (llama_vocab_get_add_bos(vocab)) tokens.push_back(llama_vocab_bos(vocab));
    const auto q = common_tokenize(vocab, query, false, false);
    tokens.insert(tokens.end(), q.begin(), q.end());
    if (llama_vocab_get_add_eos(vocab)) tokens.push_back(eos);
    if (llama_vocab_get_add_sep(vocab)) tokens.push_back(llama_vocab_sep(vocab));
    const auto d = common_tokenize(vocab, document, false, false);
    tokens.insert(tokens.end(), d.begin(), d.end());
    if (llama_vocab_get_add_eos(vocab)) tokens.push_back(eos);
    return tokens;
}

// POST /rerank and its aliases on a reranker: each document's prompt within the context and all within the request's
// token budget (text that cannot fit refused before it is tokenized), then one score per document.
http::handler rerank_handler(const frontend_context& ctx, embedder& model) {
    return [&ctx, &model](const http::request& req, http::response_writer& w) {
        const api::rerank_request request = api::parse_rerank_request(parse_json_body(req));
        const char* rerank_template = llama_model_chat_template(model.model(), "rerank");
        const size_t fixed_bytes = rerank_template ? std::strlen(rerank_template) : 0;
        const size_t context = size_t(model.context_size());
        size_t least_tokens = 0;
        for (const std::string& document : request.documents) {
            least_tokens += model.min_tokens_for_text(fixed_bytes + request.query.size() + document.size());
        }
        if (least_tokens > api::max_embedding_request_tokens) {
            throw request_error(400, "the documents make more than " +
                                         std::to_string(api::max_embedding_request_tokens) +
                                         " tokens together; send them in several requests");
        }
        std::vector<std::vector<llama_token>> prompts;
        size_t total = 0;
        for (size_t i = 0; i < request.documents.size(); ++i) {
            const std::string& document = request.documents[i];
            if (model.min_tokens_for_text(fixed_bytes + request.query.size() + document.size()) > context) {
                throw request_error(400,
                                    "document " + std::to_string(i) + " and the query make more than the " +
                                        std::to_string(context) + " tokens one input may have",
                                    "exceed_context_size_error");
            }
            prompts.push_back(rerank_prompt(model, request.query, document));
            if (prompts.back().size() > context) {
                throw request_error(400,
                                    "document " + std::to_string(i) + " and the query make " +
                                        std::to_string(prompts.back().size()) + " tokens, more than the " +
                                        std::to_string(context) + " one input may have",
                                    "exceed_context_size_error");
            }
            total += prompts.back().size();
            if (total > api::max_embedding_request_tokens) {
                throw request_error(400, "the documents make more than " +
                                             std::to_string(api::max_embedding_request_tokens) +
                                             " tokens together; send them in several requests");
            }
        }
        const auto scores = model.embed(prompts, -1, [&w] { return w.client_gone(); });
        if (scores.size() != prompts.size()) return;
        std::vector<float> relevance;
        for (const auto& s : scores) relevance.push_back(s.front());
        w.send(200, "application/json", dump(api::rerank_json(ctx.model_id, request, relevance, int(total))));
    };
}

const std::vector<std::string> embedding_paths = {"/v1/embeddings", "/embeddings", "/embedding"};
const std::vector<std::string> ollama_embedding_paths = {"/api/embed", "/api/embeddings"};
const std::vector<std::string> rerank_paths = {"/rerank", "/reranking", "/v1/rerank", "/v1/reranking"};

// POST on each of `paths` answers 400 with `message`, in Ollama's shape under /api/, else OpenAI's (llama-server's).
void refuse_paths(http::http_server& server, const std::vector<std::string>& paths, const std::string& message) {
    for (const std::string& path : paths) {
        server.add_route("POST", path,
                         [message](const http::request&, http::response_writer&) { throw request_error(400, message); },
                         {.format_error = path.starts_with("/api/") ? http::error_formatter(ollama::error_body)
                                                                    : http::error_formatter(http::openai_error_body)});
    }
}

[[noreturn]] void refuse_chat(const std::string& model_id) {
    throw request_error(400, quoted(model_id) +
                                 " is an embedding model: it makes embeddings (POST /v1/embeddings, /api/embed, "
                                 "/embedding), not chats or completions");
}

}  // namespace

void register_embedding_routes(http::http_server& server, const frontend_context& ctx, embedder& model) {
    const http::route_options ollama_route{.format_error = ollama::error_body};
    server.set_error_format("/api/", ollama::error_body);
    const std::string name = quoted(ctx.model_id);
    if (model.pooling() == LLAMA_POOLING_TYPE_RANK) {
        for (const std::string& path : rerank_paths) server.add_route("POST", path, rerank_handler(ctx, model));
        std::vector<std::string> paths = embedding_paths;
        paths.insert(paths.end(), ollama_embedding_paths.begin(), ollama_embedding_paths.end());
        refuse_paths(server, paths,
                     name +
                         " is a reranker: it scores documents against a query (POST /rerank), it makes no "
                         "embeddings");
    } else {
        server.add_route("POST", "/v1/embeddings", embedding_handler(ctx, model, api::parse_openai_embedding_request));
        // llama-server's own paths answer in its native shape, as its server.cpp routes them.
        server.add_route("POST", "/embeddings", embedding_handler(ctx, model, api::parse_native_embedding_request));
        server.add_route("POST", "/embedding", embedding_handler(ctx, model, api::parse_native_embedding_request));
        server.add_route("POST", "/api/embed", embedding_handler(ctx, model, api::parse_ollama_embed_request),
                         ollama_route);
        server.add_route("POST", "/api/embeddings",
                         embedding_handler(ctx, model, api::parse_ollama_legacy_embedding_request), ollama_route);
        refuse_paths(server, rerank_paths,
                     name +
                         " is an embedding model, not a reranker: /rerank needs a model with rank pooling "
                         "(a reranker's GGUF declares it)");
    }
    server.add_route(
        "GET", "/health",
        [](const http::request&, http::response_writer& w) { w.send(200, "application/json", R"({"status":"ok"})"); },
        {.requires_auth = false});
    server.add_route("GET", "/metrics", [&model](const http::request&, http::response_writer& w) {
        const embedder::counters c = model.stats();
        metrics_text m;
        m.counter("keepwarm_embedding_requests_total", "Embedding requests queued for the embedder",
                  double(c.requests));
        m.counter("keepwarm_embedding_inputs_total", "Inputs embedded", double(c.inputs));
        m.counter("keepwarm_embedding_tokens_total", "Tokens of the inputs embedded", double(c.tokens));
        m.counter("keepwarm_embedding_decodes_total", "llama_decode calls, each several inputs", double(c.decodes));
        w.send(200, "text/plain; version=0.0.4; charset=utf-8", m.str());
    });
}

void register_embedding_refusals(http::http_server& server, const std::string& model_id) {
    std::vector<std::string> paths = embedding_paths;
    paths.insert(paths.end(), ollama_embedding_paths.begin(), ollama_embedding_paths.end());
    paths.insert(paths.end(), rerank_paths.begin(), rerank_paths.end());
    refuse_paths(server, paths,
                 quoted(model_id) +
                     " is a chat model: it makes no embeddings and ranks no documents. Serve an embedding model or a "
                     "reranker for them (keepwarm serve -m MODEL.gguf: docs/embeddings.md)");
}

generation_opener chat_refused(const std::string& model_id) {
    return [model_id](const http::request&, chat_request, const request_clock&, http::response_writer&,
                      std::string) -> generation_source_ptr { refuse_chat(model_id); };
}

raw_generation_opener raw_completion_refused(const std::string& model_id) {
    return [model_id](const http::request&, raw_completion, const request_clock&, http::response_writer&,
                      std::string) -> generation_source_ptr { refuse_chat(model_id); };
}

token_counter token_count_refused(const std::string& model_id) {
    return [model_id](const http::request&, const chat_request&) -> int { refuse_chat(model_id); };
}

}  // namespace keepwarm

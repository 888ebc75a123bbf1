// See generation-relay.h.
#include "routes/generation-relay.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "base/logger.h"
#include "json/bounded-json.h"

namespace keepwarm {

using json = nlohmann::ordered_json;
using namespace std::chrono_literals;

namespace {
constexpr auto check_interval = 50ms;
constexpr auto drain_limit = 2s;  // the engine answers a cancel at its next step; this only matters if it is stuck
}  // namespace

json parse_json_body(const http::request& req) {
    if (req.body.empty()) throw request_error(400, "request body is empty; expected a JSON object");
    json body;
    try {
        // Linear in the number of keys, and bounded in depth before anything recurses over the tree.
        body = bounded_json::parse(req.body);
    } catch (const bounded_json::depth_error& e) {
        throw request_error(400, std::string("request body ") + e.what());
    } catch (const bounded_json::limit_error& e) {
        throw request_error(400, std::string("request body is not valid JSON: ") + e.what());
    }
    if (!body.is_object()) throw request_error(400, "request body must be a JSON object");
    return body;
}

void set_prompt(const server_context& ctx, generation_request& gen, std::string text) {
    gen.prompt = tokenize_prompt(ctx, text, gen.tenant);
    gen.prompt_text = std::move(text);
}

namespace {
// request_error 400 when `bytes` of text (`what`: " bytes" or " bytes of message text") already make more tokens than one
// slot holds, whatever they say: tokenizing takes about 2 s per MB, rendering a chat seconds for tens of MB.
void refuse_text_that_cannot_fit(const server_context& ctx, size_t bytes, const char* what) {
    const int limit = ctx.llm->slot_context_size();
    if (const size_t at_least = ctx.llm->min_tokens_for_text(bytes); at_least >= static_cast<size_t>(limit)) {
        // Token counts first: the Anthropic API reads the first two numbers as "N tokens > M maximum".
        throw request_error(
            400,
            "the prompt has at least " + std::to_string(at_least) + " tokens but the context holds " +
                std::to_string(limit) + " tokens per request (it has " + std::to_string(bytes) + what +
                ", and no token stands for more than " + std::to_string(ctx.llm->longest_piece_bytes()) + ")",
            "exceed_context_size_error");
    }
}
}  // namespace

std::vector<llama_token> tokenize_prompt(const server_context& ctx, const std::string& prompt,
                                         const std::string& tenant) {
    refuse_text_that_cannot_fit(ctx, prompt.size(), " bytes");
    auto tokens = ctx.tokenizer_for(tenant).tokenize(prompt);
    if (tokens.empty()) throw request_error(400, "the prompt is empty");
    const int limit = ctx.llm->slot_context_size();
    if (static_cast<int>(tokens.size()) >= limit) {
        throw request_error(400,
                               "the prompt has " + std::to_string(tokens.size()) + " tokens but the context holds " +
                                   std::to_string(limit) + " tokens per request",
                               "exceed_context_size_error");
    }
    return tokens;
}

void refuse_chat_that_cannot_fit(const server_context& ctx, const chat_request& chat) {
    // Only message text every chat template writes into the prompt counts (reasoning of earlier turns may be dropped).
    size_t bytes = 0;
    for (const common_chat_msg& m : chat.messages) {
        bytes += m.content.size();
        for (const common_chat_msg_content_part& part : m.content_parts) bytes += part.text.size();
    }
    refuse_text_that_cannot_fit(ctx, bytes, " bytes of message text");
}

void bind_to_vocab(const server_context& ctx, common_params_sampling& sampling) {
    const llama_vocab* vocab = ctx.llm->vocab();
    const int n_vocab = llama_vocab_n_tokens(vocab);
    for (const auto& bias : sampling.logit_bias) {
        if (bias.token >= n_vocab) {
            throw request_error(400, "'logit_bias' names token " + std::to_string(bias.token) +
                                            " but the vocabulary has " + std::to_string(n_vocab) + " tokens");
        }
    }
    if (!sampling.ignore_eos) return;
    for (const llama_token t : ctx.llm->eog_tokens()) sampling.logit_bias.push_back({t, -INFINITY});
}

generation_stats reported_stats(const generation_stats& st) {
    if (!st.reuse_hidden) return st;
    generation_stats shown = st;
    shown.reused_tokens = shown.reused_device = shown.reused_ram = shown.reused_disk = 0;
    shown.checkpoint_pos = -1;
    shown.matched_tokens = 0;
    shown.divergence.clear();
    shown.computed_tokens = shown.prompt_tokens;
    return shown;
}

size_t widest_alternation(const std::string& grammar) {
    size_t widest = 0;
    size_t in_rule = 0;
    bool quoted = false;
    bool bracketed = false;
    for (size_t i = 0; i < grammar.size(); ++i) {
        const char c = grammar[i];
        if ((quoted || bracketed) && c == '\\') {
            ++i;  // an escaped character, e.g. \" or \]
        } else if (quoted) {
            quoted = c != '"';
        } else if (bracketed) {
            bracketed = c != ']';
        } else if (c == '"') {
            quoted = true;
        } else if (c == '[') {
            bracketed = true;
        } else if (c == '|') {
            widest = std::max(widest, ++in_rule);
        } else if (c == '\n') {
            in_rule = 0;
        }
    }
    return widest + 1;
}

void prepare_sampling(const server_context& ctx, generation_request& gen, const std::string& grammar_field) {
    bind_to_vocab(ctx, gen.sampling);
    const engine_options& limits = ctx.llm->options();
    const std::string& grammar = common_grammar_value(gen.sampling.grammar);
    const std::string field = "'" + grammar_field + "'";
    if (grammar.size() > limits.grammar_max_bytes) {
        throw request_error(400, "the grammar made from " + field + " has " + std::to_string(grammar.size()) +
                                        " bytes; the server allows " + std::to_string(limits.grammar_max_bytes) +
                                        " (--max-grammar-bytes)");
    }
    const auto cannot_build = [&](const std::string& why) {
        return request_error(400, "the grammar made from " + field + " cannot be used: " + why);
    };
    if (const size_t widest = widest_alternation(grammar); widest > limits.grammar_max_alternatives) {
        throw cannot_build("one of its rules has " + std::to_string(widest) + " alternatives (e.g. an enum); the " +
                           "server allows " + std::to_string(limits.grammar_max_alternatives) +
                           " (--max-grammar-alternatives)");
    }
    try {
        gen.sampler = make_sampler(ctx.llm->model(), gen.sampling);
    } catch (const std::invalid_argument& e) {
        throw request_error(400, std::string("sampling parameters cannot be used: ") + e.what());
    } catch (const std::exception& e) {
        // llama.cpp's parser says why only in its log; its usual reason for a schema's grammar is a repetition bound.
        throw cannot_build(std::string(e.what()) +
                           " (e.g. a minItems, maxItems, minLength or maxLength over 2000, which llama.cpp refuses)");
    }
    if (!gen.sampler) throw cannot_build("the sampler could not be initialized");
}

std::string grammar_field(const chat_request& chat, const common_params_sampling& sampling) {
    if (sampling.grammar.type == COMMON_GRAMMAR_TYPE_TOOL_CALLS && !chat.tools.empty()) return "tools";
    if (chat.api == "anthropic") return "output_config.format";
    if (chat.api == "ollama") return "format";
    return "response_format";
}

int64_t unix_now() {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

generation_relay::generation_relay(generation_request& gen, http::response_writer& w, server_context& ctx,
                                   std::string id)
    : gen_(gen), w_(w), ctx_(ctx), id_(std::move(id)) {}

generation_relay::~generation_relay() {
    // A destructor is noexcept: anything cancel() throws (recording the tokens) would be std::terminate.
    try {
        cancel();
    } catch (const std::exception& e) {
        log::error("generation", "{} could not finish cancelling: {}", id_, e.what());
    }
}

std::optional<generation_event> generation_relay::cancel() {
    if (finished_) return std::nullopt;
    gen_.cancelled = true;
    const auto deadline = std::chrono::steady_clock::now() + drain_limit;
    while (std::chrono::steady_clock::now() < deadline) {
        if (auto ev = gen_.output.pop(check_interval); ev && ev->done) {
            finish(*ev);
            return ev;
        }
    }
    return std::nullopt;
}

std::optional<generation_event> generation_relay::next() {
    for (;;) {
        const auto now = std::chrono::steady_clock::now();
        if (now - last_check_ >= check_interval) {
            last_check_ = now;
            if (w_.client_gone()) {
                gen_.cancelled = true;
                ctx_.http.disconnects++;
                log::info("generation", "{} client went away, generation cancelled", id_);
                return std::nullopt;
            }
        }
        if (auto ev = gen_.output.pop(check_interval)) {
            if (ev->done) {
                finish(*ev);
                ev->stats.reuse_hidden = !ctx_.reuse_report;
            }
            return ev;
        }
    }
}

void generation_relay::finish(const generation_event& ev) {
    finished_ = true;
    log_request(ev);
    // A failed step leaves the KV in an unknown state; anything else is what the model saw and wrote.
    if (ev.reason != finish_reason::error)
        ctx_.tokenizer_for(gen_.tenant).record(gen_.prompt_text, gen_.prompt, ev.generated);
}

// One line per generation, so an operator sees what each request reused without reading responses.
void generation_relay::log_request(const generation_event& ev) const {
    const generation_stats& st = ev.stats;
    std::string where;  // which tiers the reused tokens came from
    const auto tier = [&](const char* name, int n) {
        if (n > 0) where += (where.empty() ? "" : " + ") + std::to_string(n) + " " + name;
    };
    tier("device", st.reused_device);
    tier("ram", st.reused_ram);
    tier("disk", st.reused_disk);
    if (st.checkpoint_pos >= 0) where += ", checkpoint at " + std::to_string(st.checkpoint_pos);
    if (st.matched_tokens > st.reused_tokens + 1) {
        where += (where.empty() ? "" : ", ") + std::to_string(st.matched_tokens) + " matched";
    }
    log::info(
        "generation",
        "{} slot {}: prompt {} tokens (reused {}{}{}, computed {}) in {} ms (setup {} ms, prepare {}), generated {} "
        "in {} ms, {}{}{}",
        id_, st.slot, st.prompt_tokens, st.reused_tokens, where.empty() ? "" : ": ", where, st.computed_tokens,
        log::fixed(st.prompt_ms, 0), log::fixed(st.setup_ms, 1), log::fixed(st.prepare_ms, 1), st.generated_tokens,
        log::fixed(st.generation_ms, 0), finish_reason_name(ev.reason), ev.error.empty() ? "" : ": ", ev.error);
    // The divergence quotes prompt text (this request's and what the cache holds): only when the operator asked.
    if (!st.divergence.empty() && ctx_.log_prompts) {
        log::info("generation", "{} {}", id_, st.divergence);
    } else if (!st.divergence.empty()) {
        log::info("generation", "{} {}", id_, st.divergence.substr(0, st.divergence.find(':')));
    }
}

http::handler generation_route(server_context& ctx, generation_handler h) {
    return [&ctx, h = std::move(h)](const http::request& req, http::response_writer& w) {
        auto gen = std::make_shared<generation_request>();
        gen->received = std::chrono::steady_clock::now();
        gen->tenant = req.tenant;
        try {
            h(ctx, req, w, gen);
        } catch (const request_error& e) {
            if (e.status >= 400 && e.status < 500) ctx.http.client_errors++;
            throw;
        }
    };
}

}  // namespace keepwarm

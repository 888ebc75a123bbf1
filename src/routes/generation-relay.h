// What every generation route shares, whatever API it speaks: parsing the JSON body, tokenizing the prompt against
// the slot's context, checking sampling against the vocab, and relaying a running generation's events to the
// handler while watching for a client that went away.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "engine/generation.h"
#include "http/http-server.h"
#include "routes/server-context.h"

namespace keepwarm {

// The body as a JSON object, parsed by bounded_json (linear time, at most bounded_json::max_depth levels); request_error
// 400 when it is empty, not JSON, too deep, or not an object.
nlohmann::ordered_json parse_json_body(const http::request& req);

// Tokenizes a rendered prompt (through the prompt tokenizer, which reuses the token ids of what the model saw and
// wrote). request_error 400 when it is empty or does not fit one slot's context ("exceed_context_size_error"); a prompt
// whose length in bytes already says it cannot fit is refused before it is tokenized. `tenant`: whose prompt index
// to use.
std::vector<llama_token> tokenize_prompt(const server_context& ctx, const std::string& prompt,
                                         const std::string& tenant = {});
// request_error 400 (as tokenize_prompt's) when the chat's message text alone is too long for one slot, whatever the
// template adds: checked before rendering, which takes seconds for tens of megabytes.
void refuse_chat_that_cannot_fit(const server_context& ctx, const chat_request& chat);
// tokenize_prompt() into gen.prompt, keeping the text in gen.prompt_text.
void set_prompt(const server_context& ctx, generation_request& gen, std::string text);

// Checks the request's token ids against the vocab, and turns ignore_eos into bans on end-of-generation tokens.
void bind_to_vocab(const server_context& ctx, common_params_sampling& sampling);

// bind_to_vocab(), then builds the request's sampler here, on the request's thread, into gen.sampler: a grammar that
// cannot be built, is larger than the server allows, or would cost more per token than the engine allows is this
// request's request_error 400 naming `grammar_field` (the request field the grammar came from), never the engine's.
void prepare_sampling(const server_context& ctx, generation_request& gen, const std::string& grammar_field);

// The most alternatives one rule of a GBNF grammar offers (its '|'s outside literals and character classes, plus one).
// What a grammar costs per token grows with the alternatives alive at once, each checked against every token of the
// vocab, and faster than linearly: on a 151K vocab, one token took 1.3-2.6 s under a 500-string enum and 8.5 s under
// 2,000 (one CPU thread). Claude Code's 25 tools, the widest real request seen, have one rule of 266.
size_t widest_alternation(const std::string& grammar);

// The request field a chat request's grammar came from, in its API's words: "tools" for a tool-call grammar, else
// the response format ("response_format", "output_config.format" or "format").
std::string grammar_field(const chat_request& chat, const common_params_sampling& sampling);

int64_t unix_now();

// Waits for the next event of a submitted generation. Returns nullopt once the client is gone, after telling the
// generation to stop. The socket is checked every 50 ms whether or not tokens are flowing: a non-streamed answer
// writes nothing until the end, so only this check notices a client that left.
// When the generation ends, its prompt and generated tokens are recorded in the prompt tokenizer and one log line
// says what it reused. A relay destroyed early (client gone, failed write, exception) cancels the generation and
// waits briefly for its final event so that what was generated still counts: the engine keeps that KV too.
class generation_relay {
public:
    generation_relay(generation_request& gen, http::response_writer& w, server_context& ctx, std::string id);
    generation_relay(const generation_relay&) = delete;
    generation_relay& operator=(const generation_relay&) = delete;
    ~generation_relay();

    std::optional<generation_event> next();
    // Stops a generation that has not ended: tells the engine, waits (at most 2 s) for its final event, records it as
    // next() would, and returns it. nullopt when the generation had ended already, or no final event came in time.
    std::optional<generation_event> cancel();

private:
    void finish(const generation_event& ev);
    void log_request(const generation_event& ev) const;

    generation_request& gen_;
    http::response_writer& w_;
    server_context& ctx_;
    std::string id_;
    std::chrono::steady_clock::time_point last_check_ = std::chrono::steady_clock::now();
    bool finished_ = false;  // the final event was seen
};

using generation_handler = std::function<void(server_context&, const http::request&, http::response_writer&,
                                              const std::shared_ptr<generation_request>&)>;

// Wraps a generation route: its generation_request is created, and its clock started, before the body is parsed, so
// the engine's setup_ms covers parsing, rendering and tokenizing. 4xx answers are counted for /metrics; the HTTP
// layer formats the error in the route's API shape.
http::handler generation_route(server_context& ctx, generation_handler h);

}  // namespace keepwarm

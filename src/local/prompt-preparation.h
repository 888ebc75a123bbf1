// Preparing a generation_request for the local engine on the request's own thread: tokenizing the prompt against one
// slot's context (through the prompt tokenizer, which reuses the ids of what the model saw and wrote), and checking
// sampling against the vocab and the engine's limits before anything is submitted.
// Threading: called by request threads; the local model's parts are thread-safe.
#pragma once

#include <string>
#include <vector>

#include "chat/chat-request.h"
#include "common.h"
#include "engine/generation.h"
#include "local/local-model.h"

namespace keepwarm {

// Tokenizes a rendered prompt (through the prompt tokenizer, which reuses the token ids of what the model saw and
// wrote). request_error 400 when it is empty or does not fit one slot's context ("exceed_context_size_error"); a
// prompt whose length in bytes already says it cannot fit is refused before it is tokenized. `tenant`: whose prompt
// index to use.
std::vector<llama_token> tokenize_prompt(const local_model& model, const std::string& prompt,
                                         const std::string& tenant = {});
// request_error 400 (as tokenize_prompt's) when the chat's message text alone is too long for one slot, whatever the
// template adds: checked before rendering, which takes seconds for tens of megabytes.
void refuse_chat_that_cannot_fit(const local_model& model, const chat_request& chat);
// tokenize_prompt() into gen.prompt (with gen.tenant's index), keeping the text in gen.prompt_text.
void set_prompt(const local_model& model, generation_request& gen, std::string text);

// How many of gen.prompt's tokens the chat's cache hint covers (see chat_request::hint) into gen.hinted_tokens and
// gen.hint_ttl: up to where the text of the first message it leaves out starts in the rendered prompt (so that
// message's header too), the whole prompt when it covers every message or that text cannot be found.
void set_cache_hint(const local_model& model, const chat_request& chat, generation_request& gen);

// Checks the request's token ids against the vocab, and turns ignore_eos into bans on end-of-generation tokens.
void bind_to_vocab(const local_model& model, common_params_sampling& sampling);

// bind_to_vocab(), then builds the request's sampler here, on the request's thread, into gen.sampler: a grammar that
// cannot be built, is larger than the server allows, or would cost more per token than the engine allows is this
// request's request_error 400 naming `grammar_field` (the request field the grammar came from), never the engine's.
void prepare_sampling(const local_model& model, generation_request& gen, const std::string& grammar_field);

// The most alternatives one rule of a GBNF grammar offers (its '|'s outside literals and character classes, plus one).
// What a grammar costs per token grows with the alternatives alive at once, each checked against every token of the
// vocab, and faster than linearly: on a 151K vocab, one token took 1.3-2.6 s under a 500-string enum and 8.5 s under
// 2,000 (one CPU thread). Claude Code's 25 tools, the widest real request seen, have one rule of 266.
size_t widest_alternation(const std::string& grammar);

// The request field a chat request's grammar came from, in its API's words: "tools" for a tool-call grammar, else
// the response format ("response_format", "output_config.format" or "format").
std::string grammar_field(const chat_request& chat, const common_params_sampling& sampling);

}  // namespace keepwarm

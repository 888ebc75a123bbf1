// Renders a chat that extends a recently rendered one by running the Jinja template over its newest messages only,
// with exactly the result common_chat_templates_apply gives for the whole chat (a 40K-token agent turn: ~1-2 ms
// instead of ~150-220 ms).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "chat.h"

namespace keepwarm {

// Why: common_chat_templates_apply(M) renders the whole chat with Jinja three times (the prompt, then M without and
// with the generation prompt, to diff out the generation prompt) and, for templates on its generic path, analyzes
// the template again; at 800 messages that is ~150 ms, ~60 us per message per render (the engine's per-statement
// cost: blanking every content saves only a quarter, so content placeholders would not help). Everything else it
// returns (parser, grammar, triggers, stops, ...) depends on the template, the request's options and that generation
// prompt only, not on the messages.
//
// What is kept, per request key (everything but the messages, plus the date strings common gives templates):
//   - profiles: full renders' results without the prompt, one per generation prompt;
//   - recent conversations: their messages' hashes, their prompt, and cuts: for some message indices j, the offset
//     in the prompt where message j's rendering starts.
// A chat M sharing its first k messages with a remembered conversation E is spliced at a cut j of E:
//     prompt(M) = E.prompt[0, cut_j) + window
// where window is what the template renders for M[j..n) when it renders R = M[0..h) + M[j..n), minus what it renders
// for the head M[0..h) alone (the head ends with the first user message: system prompt, first-user handling). The
// window rendered without the generation prompt gives M's generation prompt, which picks the profile; no profile, no
// splice. Then the cuts for the next turn (M's last assistant and last user message) are found by rendering the
// windows from them, which must end the new prompt.
//
// This is exact when the template renders message i from the message itself, its neighbours, whether it is last,
// whether it comes after the last user query, and the head. The cut conditions keep all of those equal in E, M and R:
//   - j < k: message j is shared, so message j-1 has the same next message and is not last in E either;
//   - M[j] is a user or assistant message;
//   - the messages before j are on the same side of the last query in E and in M: both have the same last user
//     message, inside the shared part, or there is a plain user message at j-1 or j (plain: not wrapped in tags,
//     which Qwen's templates do not count as a query; the head's user message must be plain too);
//   - templates that check role alternation by index parity get a head whose last role fits the window's first.
// Real templates fit (Qwen3/3.5, Llama 3.x, Gemma 2, Hermes, GLM, granite, ...), but one could count messages or
// carry state across them (DeepSeek R1's marks only its first tool call). So a request key is only spliced after a
// check: its first full render replays two synthetic chats (system prompt, reasoning, think tags in content, quotes,
// JSON, unicode, tool calls and results, new user turns) turn by turn through common and the splicer, with the
// request's own tools and options; one difference, or fewer than two splices, and the key is never spliced. Each
// later full render checks itself too: a cut is kept only if its window is the tail of common's prompt, a
// conversation only if the window's generation prompt is common's, and a profile that contradicts an earlier one with
// the same generation prompt stops the key. A splice whose windows disagree with each other is not used.
// Windows render the head with its system and user text replaced by a stand-in (and the tools by one stand-in tool):
// a render's cost grows with the text it carries. That holds for templates that do not read the head's text again
// when they render later messages; one that does (a "/no_think" in the system prompt) makes the conversation's first
// full render disagree with its windows, and the conversation is not remembered.
// Never spliced: continuations of a trailing assistant message, templates common renders through a handler that
// rewrites messages (gpt-oss, Gemma 4, Ministral/Devstral, DeepSeek V3.2+, Kimi, ...; the generic path and the
// Qwen3-Coder/Qwen3.5 handler are fine), templates that read the clock (strftime_now), templates whose head renders
// differently in front of other messages (Mistral Nemo, Phi 3.5), windows over options::max_window messages.
//
// Threading: every member may be called from any number of threads at once; renders run outside the lock.
class chat_render_cache {
public:
    // The strings common_chat_templates_init gave the templates for bos_token / eos_token, and whether the vocab adds
    // BOS / EOS itself (then common strips them from the prompt).
    struct template_tokens {
        std::string bos;
        std::string eos;
        bool add_bos = false;
        bool add_eos = false;
    };

    struct options {
        size_t max_conversations = 32;        // remembered conversations (least recently used go first)
        size_t max_bytes = size_t{64} << 20;  // their prompts and hashes together
        size_t max_window = 512;              // messages in a window at most (a splice renders ~2 windows)
    };

    struct counters {
        uint64_t spliced = 0;        // render() calls answered from the cache
        uint64_t not_spliced = 0;    // render() calls the caller had to render in full
        uint64_t keys_trusted = 0;   // request keys whose check passed
        uint64_t keys_refused = 0;   // request keys whose check failed or could not run
        uint64_t cuts_rejected = 0;  // self-checks of full renders that did not hold (no cut or profile kept)
        size_t conversations = 0;    // remembered now
    };

    // `templates` must outlive the cache.
    chat_render_cache(const common_chat_templates* templates, template_tokens tokens);
    chat_render_cache(const common_chat_templates* templates, template_tokens tokens, options opts);
    ~chat_render_cache();
    chat_render_cache(const chat_render_cache&) = delete;
    chat_render_cache& operator=(const chat_render_cache&) = delete;

    // common_chat_templates_apply(templates, in) when it can be spliced from a remembered conversation; nullopt
    // otherwise (render in full, then remember()). Never throws: any error means nullopt.
    std::optional<common_chat_params> render(const common_chat_templates_inputs& in);

    // Records common_chat_templates_apply(templates, in) == full so that extensions of this chat can be spliced.
    // The first call for a request key checks the splicer against common on synthetic chats (~0.1 s).
    void remember(const common_chat_templates_inputs& in, const common_chat_params& full);

    counters stats() const;

private:
    struct impl;
    std::unique_ptr<impl> impl_;
};

}  // namespace keepwarm

// The policy layer: what keepwarm does to a chat request before rendering it, whatever API it came through: maps
// the model name a client asks for to the one served model, forces options (globally or per client), answers
// health pings without the engine, and rewrites volatile spans. Every rule that changes something is named in the
// outcome, which the response carries in `x-keepwarm-policy` and the log prints.
// Threading: request_policy::apply is called concurrently by request threads; span rules can be added and removed
// while it runs (the rule set is swapped atomically, copy on write).
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chat/chat-request.h"
#include "policy/moved-notes.h"
#include "policy/span-rules.h"

namespace keepwarm::policy {

// Conditions on a request, as [[client]] and [[ping.match]] tables give them; all that are set must hold.
struct request_matcher {
    std::string client;                     // glob (fnmatch) over the client's name (see backend/client-identity.h)
    std::string api;                        // "openai", "anthropic" or "ollama"
    std::string model;                      // glob over the model name the client asked for
    std::string header;                     // a header (lowercase name) the request must carry
    std::optional<int> max_tokens_at_most;  // the client asked for at most this many tokens
    std::shared_ptr<const re2::RE2> last_user_text;  // found (RE2 search) in the last user message's text
    std::optional<int> prompt_chars_at_most;         // the text of all messages, every role, is at most this many bytes
    std::optional<bool> tools;                       // the request defines tools (true) or none (false)

    bool empty() const;
};

// A bias forced on one token, named by its text (e.g. "<tool_call>"); the token id comes from the model's vocabulary
// when the server binds the policy to it (request_policy::bind_vocab).
struct forced_bias {
    std::string text;
    float bias = 0;  // -100 .. 100; -100 bans the token
    llama_token token = -1;

    // Its entry in policy_outcome::fired: "logit-bias:TEXT=V", or "logit-bias-unbound:TEXT" where no token could be
    // given for the text (a proxy's upstream without a tokenizer to ask, or where it is not one token).
    std::string fired_name(bool bound = true) const;
};

// Options forced on requests; unset ones leave the client's choice alone.
struct forced_options {
    std::optional<int> max_tokens_cap;      // at most this many generated tokens (also when the client gives none)
    std::optional<int> max_tokens_default;  // the limit when the client gives none (then capped)
    std::optional<bool> thinking;           // reasoning on or off (the template's enable_thinking)
    std::optional<common_chat_tool_choice> tool_choice;  // when the request has tools
    sampling_options sampling;  // temperature, top_p, top_k, min_p, seed, repeat/presence/frequency penalties
    // Replaces what the client asked for these tokens. With tool_choice "required", a bias on the template's
    // tool-call opening token makes even a random-weight model start a call: common's grammar admits free text
    // before the first call.
    std::vector<forced_bias> logit_bias;

    // Takes every option `other` sets (a bias on the same text replaces the earlier one).
    void override_with(const forced_options& other);
};

struct client_rule {
    request_matcher match;
    forced_options options;
};

struct ping_policy {
    bool enabled = false;
    std::string reply = "ok";               // the assistant's text in a ping's answer
    std::vector<request_matcher> matchers;  // a request matching any of them is a ping
};

// What a ping is when a policy does not say: a health check asks for at most one token, with a few words and no
// tools (Claude Code's {"max_tokens":1,"messages":[{"role":"user","content":"quota"}]}, an Ollama client's
// num_predict 1). A one-token request that means it (a classification, a score) carries a longer prompt, and is
// generated.
inline constexpr int default_ping_max_tokens = 1;
inline constexpr int default_ping_prompt_chars = 32;
request_matcher default_ping_matcher();

enum class model_mode {
    any,     // every name is served by the loaded model
    strict,  // only the served model's name and the aliases; other names get a 404
};

struct model_alias {
    std::string pattern;  // a name or a glob
    std::string target;   // the served model's name
};

struct model_policy {
    model_mode mode = model_mode::any;
    std::vector<model_alias> aliases;
};

// What the cache-buster detector (policy/busters.h) does with what it finds.
enum class detect_mode {
    off,        // compare nothing
    report,     // report in GET /v1/cache/busters and the log
    automatic,  // report, and put a confirmed random id's suggested rule in force ("auto" in the file)
};
const char* detect_mode_name(detect_mode mode);  // "off", "report", "auto"

struct detect_policy {
    detect_mode mode = detect_mode::report;
    size_t max_auto_rules = 16;  // rules auto mode may add while the server runs; then it only reports
};

struct policy_config {
    std::string source;  // the file it was read from; empty: no policy file
    model_policy model;
    forced_options options;            // for every request
    std::vector<client_rule> clients;  // then every matching [[client]], in file order
    ping_policy ping;
    std::vector<span_rule> spans;  // enabled built-ins, then the file's rules
    detect_policy detect;
};

// What the policy sees of a request besides its body.
struct request_origin {
    std::string client;                                           // client_name(req)
    const std::map<std::string, std::string>* headers = nullptr;  // lowercase names; null: none
    std::string tenant;  // its API key's tenant: moved-span notes are remembered per tenant
};

// What the policy did to one request.
struct policy_outcome {
    // Rules that changed something, in the order they applied: "model-alias:claude-sonnet-4->qwen3",
    // "num-ctx-ignored:65536", "ping-absorbed", "max-tokens-cap:4096", "thinking:off", "tool-choice:required",
    // "temperature:0.6", "span:claude-code-billing(replace)", ...
    std::vector<std::string> fired;
    bool ping = false;       // answer with ping_reply and touch nothing else
    std::string ping_reply;  // valid when ping
    // Forced biases that apply to this request but are not bound to a vocabulary (a policy without a model: the
    // proxy, which binds them to each upstream's tokens); not in `fired` yet.
    std::vector<forced_bias> unbound_biases;

    // `fired` joined by "; " for the x-keepwarm-policy header (only printable ASCII; client-given names shortened).
    std::string header_value() const;
};

// A request is rendered for generation, or only counted (count_tokens endpoints: never a ping).
enum class policy_use { generation, counting };

class request_policy {
public:
    // `served_model` is the name the server reports for its one model (aliases map to it). The default config (no
    // policy file): any model name is served, a client's context size is reported as ignored, nothing else changes.
    explicit request_policy(policy_config config = {}, std::string served_model = "");

    // Resolves the texts of forced logit biases to token ids: `token_of` returns the single token a text is, or
    // nullopt. Throws std::runtime_error naming a text that is not exactly one token. Call once, before serving.
    void bind_vocab(const std::function<std::optional<llama_token>(const std::string&)>& token_of);
    // Every token text a forced logit bias names, globally or per client (each once).
    std::vector<std::string> bias_texts() const;

    // Rewrites `chat` in place and says what it did. Text a `move` span rule takes out goes to the end of the last
    // message that is not an assistant's; a message of an earlier request that got such a note gets the same note
    // again when a later request of the conversation holds it as history (so the history renders as it was cached).
    // Throws request_error 404 ("model_not_found") in strict mode for a
    // model name that is neither the served one nor an alias; nothing has been changed then.
    policy_outcome apply(chat_request& chat, const request_origin& origin,
                         policy_use use = policy_use::generation) const;

    // Adds a span rule while the server runs (the cache-buster detector's auto rules), after the others, replacing a
    // rule of the same name. Requests already being prepared keep the rules they started with.
    void add_span_rule(span_rule rule);
    // Removes the rule named `name`; false when there is none.
    bool remove_span_rule(std::string_view name);
    // The span rules in force now.
    std::shared_ptr<const span_rule_set> span_rules() const { return spans_.load(); }

    // The notes `move` rules appended to messages (see moved-notes.h): serve saves them beside the disk tier at
    // shutdown and loads them at start-up.
    moved_notes& moved_span_notes() const { return *notes_; }

    const policy_config& config() const { return config_; }
    const std::string& served_model() const { return served_model_; }
    // The effective policy (GET /v1/policy): every section with its values, and the live span rules.
    nlohmann::ordered_json to_json() const;

private:
    // Appends this request's moved-span note (spans.note) to its message, and the remembered notes of earlier turns
    // to the history messages they were appended to; `remember` keeps this request's note for the next turns.
    void place_moved_notes(std::vector<common_chat_msg>& messages, const span_report& spans, const std::string& tenant,
                           bool remember) const;

    policy_config config_;  // as loaded; its spans are the initial rule set
    std::string served_model_;
    std::atomic<std::shared_ptr<const span_rule_set>> spans_;
    std::mutex spans_write_mu_;  // serializes add/remove (read, copy, swap)
    // The notes `move` rules appended to earlier requests' last messages, given back to those messages when a later
    // turn sends them as history (see moved-notes.h). Internally synchronized.
    std::unique_ptr<moved_notes> notes_ = std::make_unique<moved_notes>();
};

// fnmatch(3) without flags: '*', '?', '[...]'.
bool glob_match(const std::string& pattern, const std::string& text);

}  // namespace keepwarm::policy

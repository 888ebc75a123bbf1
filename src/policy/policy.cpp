// See policy.h.
#include "policy/policy.h"

#include <fnmatch.h>
#include <re2/re2.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "base/request-error.h"

namespace keepwarm::policy {

namespace {

using json = nlohmann::ordered_json;

constexpr size_t max_reported_name = 64;  // a client-given name in the header is cut to this many characters

std::string number(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

// A client-given name as the header may carry it: printable ASCII, bounded.
std::string reportable(const std::string& name) {
    std::string out;
    for (const char c : name.substr(0, max_reported_name)) out += (c >= 0x20 && c < 0x7f && c != ';') ? c : '?';
    if (name.size() > max_reported_name) out += "...";
    return out;
}

// The text of the last user message (content, or its text parts joined); empty when there is none.
std::string last_user_text(const chat_request& chat) {
    for (auto it = chat.messages.rbegin(); it != chat.messages.rend(); ++it) {
        if (it->role != "user") continue;
        if (it->content_parts.empty()) return it->content;
        std::string text;
        for (const auto& part : it->content_parts) text += part.text;
        return text;
    }
    return "";
}

// The text of every message, every role (content, or its text parts), in bytes.
size_t prompt_chars(const chat_request& chat) {
    size_t n = 0;
    for (const common_chat_msg& msg : chat.messages) {
        n += msg.content.size() + msg.reasoning_content.size();
        for (const auto& part : msg.content_parts) n += part.text.size();
        for (const auto& call : msg.tool_calls) n += call.name.size() + call.arguments.size();
    }
    return n;
}

bool matches(const request_matcher& m, const chat_request& chat, const std::string& asked_model,
             const request_origin& origin) {
    if (!m.client.empty() && !glob_match(m.client, origin.client)) return false;
    if (!m.api.empty() && m.api != chat.api) return false;
    if (!m.model.empty() && !glob_match(m.model, asked_model)) return false;
    if (!m.header.empty() && !(origin.headers && origin.headers->contains(m.header))) return false;
    if (m.max_tokens_at_most && !(chat.max_tokens && *chat.max_tokens <= *m.max_tokens_at_most)) return false;
    if (m.last_user_text && !re2::RE2::PartialMatch(last_user_text(chat), *m.last_user_text)) return false;
    if (m.prompt_chars_at_most && prompt_chars(chat) > static_cast<size_t>(*m.prompt_chars_at_most)) return false;
    if (m.tools && *m.tools == chat.tools.empty()) return false;
    return true;
}

const char* tool_choice_name(common_chat_tool_choice choice) {
    switch (choice) {
        case COMMON_CHAT_TOOL_CHOICE_AUTO:
            return "auto";
        case COMMON_CHAT_TOOL_CHOICE_REQUIRED:
            return "required";
        case COMMON_CHAT_TOOL_CHOICE_NONE:
            return "none";
    }
    return "?";
}

// Sets `field` to the forced value and reports it when the client asked for something else.
template <typename T>
void force(std::optional<T>& field, const std::optional<T>& forced, const char* name, std::vector<std::string>& fired) {
    if (!forced || field == forced) return;
    field = forced;
    if constexpr (std::is_integral_v<T>) {
        fired.push_back(std::string(name) + ":" + std::to_string(*forced));
    } else {
        fired.push_back(std::string(name) + ":" + number(*forced));
    }
}

void apply_options(const forced_options& o, chat_request& chat, std::vector<std::string>& fired,
                   std::vector<forced_bias>& unbound_biases) {
    if (o.max_tokens_default && !chat.max_tokens) {
        chat.max_tokens = o.max_tokens_default;
        fired.push_back("max-tokens-default:" + std::to_string(*o.max_tokens_default));
    }
    if (o.max_tokens_cap && (!chat.max_tokens || *chat.max_tokens > *o.max_tokens_cap)) {
        chat.max_tokens = o.max_tokens_cap;
        fired.push_back("max-tokens-cap:" + std::to_string(*o.max_tokens_cap));
    }
    if (o.thinking && chat.enable_thinking != o.thinking) {
        chat.enable_thinking = o.thinking;
        fired.push_back(std::string("thinking:") + (*o.thinking ? "on" : "off"));
    }
    if (o.tool_choice && !chat.tools.empty() && chat.tool_choice != *o.tool_choice) {
        chat.tool_choice = *o.tool_choice;
        fired.push_back(std::string("tool-choice:") + tool_choice_name(*o.tool_choice));
    }
    const sampling_options& f = o.sampling;
    sampling_options& s = chat.sampling;
    force(s.temperature, f.temperature, "temperature", fired);
    force(s.top_p, f.top_p, "top-p", fired);
    force(s.min_p, f.min_p, "min-p", fired);
    force(s.top_k, f.top_k, "top-k", fired);
    force(s.seed, f.seed, "seed", fired);
    force(s.repeat_penalty, f.repeat_penalty, "repeat-penalty", fired);
    force(s.repeat_last_n, f.repeat_last_n, "repeat-last-n", fired);
    force(s.presence_penalty, f.presence_penalty, "presence-penalty", fired);
    force(s.frequency_penalty, f.frequency_penalty, "frequency-penalty", fired);
    for (const forced_bias& b : o.logit_bias) {
        if (b.token < 0) {  // not bound to a vocabulary: the proxy binds it per upstream
            unbound_biases.push_back(b);
            continue;
        }
        std::erase_if(s.logit_bias, [&](const auto& entry) { return entry.first == b.token; });
        s.logit_bias.emplace_back(b.token, b.bias <= -100 ? -INFINITY : b.bias);
        fired.push_back(b.fired_name());
    }
}

json matcher_json(const request_matcher& m) {
    json j = json::object();
    if (!m.client.empty()) j["client"] = m.client;
    if (!m.api.empty()) j["api"] = m.api;
    if (!m.model.empty()) j["model"] = m.model;
    if (!m.header.empty()) j["header"] = m.header;
    if (m.max_tokens_at_most) j["max_tokens_at_most"] = *m.max_tokens_at_most;
    if (m.last_user_text) j["last_user_text"] = m.last_user_text->pattern();
    if (m.prompt_chars_at_most) j["prompt_chars_at_most"] = *m.prompt_chars_at_most;
    if (m.tools) j["tools"] = *m.tools;
    return j;
}

// A float option as the file wrote it (0.6, not 0.6000000238418579).
double shown(float v) {
    return std::stod(number(v));
}

json options_json(const forced_options& o) {
    json j = json::object();
    if (o.max_tokens_cap) j["max_tokens_cap"] = *o.max_tokens_cap;
    if (o.max_tokens_default) j["max_tokens_default"] = *o.max_tokens_default;
    if (o.thinking) j["thinking"] = *o.thinking;
    if (o.tool_choice) j["tool_choice"] = tool_choice_name(*o.tool_choice);
    const sampling_options& s = o.sampling;
    if (s.temperature) j["temperature"] = shown(*s.temperature);
    if (s.top_p) j["top_p"] = shown(*s.top_p);
    if (s.min_p) j["min_p"] = shown(*s.min_p);
    if (s.top_k) j["top_k"] = *s.top_k;
    if (s.seed) j["seed"] = *s.seed;
    if (s.repeat_penalty) j["repeat_penalty"] = shown(*s.repeat_penalty);
    if (s.repeat_last_n) j["repeat_last_n"] = *s.repeat_last_n;
    if (s.presence_penalty) j["presence_penalty"] = shown(*s.presence_penalty);
    if (s.frequency_penalty) j["frequency_penalty"] = shown(*s.frequency_penalty);
    if (!o.logit_bias.empty()) {
        json biases = json::object();
        for (const forced_bias& b : o.logit_bias) biases[b.text] = shown(b.bias);
        j["logit_bias"] = std::move(biases);
    }
    return j;
}

}  // namespace

bool glob_match(const std::string& pattern, const std::string& text) {
    return fnmatch(pattern.c_str(), text.c_str(), 0) == 0;
}

bool request_matcher::empty() const {
    return client.empty() && api.empty() && model.empty() && header.empty() && !max_tokens_at_most && !last_user_text &&
           !prompt_chars_at_most && !tools;
}

request_matcher default_ping_matcher() {
    return {.max_tokens_at_most = default_ping_max_tokens,
            .prompt_chars_at_most = default_ping_prompt_chars,
            .tools = false};
}

void forced_options::override_with(const forced_options& o) {
    const auto take = [](auto& into, const auto& from) {
        if (from) into = from;
    };
    take(max_tokens_cap, o.max_tokens_cap);
    take(max_tokens_default, o.max_tokens_default);
    take(thinking, o.thinking);
    take(tool_choice, o.tool_choice);
    take(sampling.temperature, o.sampling.temperature);
    take(sampling.top_p, o.sampling.top_p);
    take(sampling.min_p, o.sampling.min_p);
    take(sampling.top_k, o.sampling.top_k);
    take(sampling.seed, o.sampling.seed);
    take(sampling.repeat_penalty, o.sampling.repeat_penalty);
    take(sampling.repeat_last_n, o.sampling.repeat_last_n);
    take(sampling.presence_penalty, o.sampling.presence_penalty);
    take(sampling.frequency_penalty, o.sampling.frequency_penalty);
    for (const forced_bias& b : o.logit_bias) {
        std::erase_if(logit_bias, [&](const forced_bias& mine) { return mine.text == b.text; });
        logit_bias.push_back(b);
    }
}

std::string forced_bias::fired_name(bool bound) const {
    return bound ? "logit-bias:" + reportable(text) + "=" + number(bias) : "logit-bias-unbound:" + reportable(text);
}

std::string policy_outcome::header_value() const {
    std::string value;
    for (const std::string& rule : fired) value += (value.empty() ? "" : "; ") + rule;
    return value;
}

request_policy::request_policy(policy_config config, std::string served_model)
    : config_(std::move(config)),
      served_model_(std::move(served_model)),
      spans_(std::make_shared<const span_rule_set>(config_.spans)) {}

std::vector<std::string> request_policy::bias_texts() const {
    std::vector<std::string> texts;
    const auto add = [&](const forced_options& o) {
        for (const forced_bias& b : o.logit_bias) {
            if (std::find(texts.begin(), texts.end(), b.text) == texts.end()) texts.push_back(b.text);
        }
    };
    add(config_.options);
    for (const client_rule& rule : config_.clients) add(rule.options);
    return texts;
}

void request_policy::bind_vocab(const std::function<std::optional<llama_token>(const std::string&)>& token_of) {
    const auto bind = [&](forced_options& o) {
        for (forced_bias& b : o.logit_bias) {
            const auto token = token_of(b.text);
            if (!token) {
                throw std::runtime_error(config_.source + ": logit_bias names '" + b.text +
                                         "', which is not a single token of this model");
            }
            b.token = *token;
        }
    };
    bind(config_.options);
    for (client_rule& rule : config_.clients) bind(rule.options);
}

policy_outcome request_policy::apply(chat_request& chat, const request_origin& origin, policy_use use) const {
    policy_outcome out;
    const std::string asked = chat.model;
    if (!asked.empty() && !served_model_.empty() && asked != served_model_) {
        const bool aliased = std::any_of(config_.model.aliases.begin(), config_.model.aliases.end(),
                                         [&](const model_alias& a) { return glob_match(a.pattern, asked); });
        if (!aliased && config_.model.mode == model_mode::strict) {
            throw request_error(404,
                                "model '" + reportable(asked) + "' is not served here; this server serves '" +
                                    served_model_ + "'" +
                                    (config_.model.aliases.empty() ? "" : " (and the aliases of its policy)"),
                                "model_not_found");
        }
        // Responses name the served model for an alias; in `any` mode they keep the name the client asked for.
        if (aliased) chat.model = served_model_;
        out.fired.push_back("model-alias:" + reportable(asked) + "->" + served_model_);
    }
    if (chat.requested_context) out.fired.push_back("num-ctx-ignored:" + std::to_string(*chat.requested_context));

    if (use == policy_use::generation && config_.ping.enabled) {
        for (const request_matcher& m : config_.ping.matchers) {
            if (!matches(m, chat, asked, origin)) continue;
            out.ping = true;
            out.ping_reply = config_.ping.reply;
            out.fired.push_back("ping-absorbed");
            return out;
        }
    }

    forced_options options = config_.options;
    for (const client_rule& rule : config_.clients) {
        if (matches(rule.match, chat, asked, origin)) options.override_with(rule.options);
    }
    apply_options(options, chat, out.fired, out.unbound_biases);

    const span_report spans = spans_.load()->apply(chat.messages, false);
    for (const auto& hit : spans.fired) {
        out.fired.push_back("span:" + hit.rule + "(" + span_action_name(hit.action) + ")");
    }
    place_moved_notes(chat.messages, spans, origin.tenant, use == policy_use::generation);
    return out;
}

void request_policy::place_moved_notes(std::vector<common_chat_msg>& messages, const span_report& spans,
                                       const std::string& tenant, bool remember) const {
    const bool any_move = spans.note_message >= 0 || notes_->size() > 0;
    if (!any_move || messages.empty()) return;
    // The keys are of the messages as the rules left them, before any note: the same in every turn.
    const std::vector<XXH128_hash_t> keys = conversation_keys(tenant, messages);
    bool target_known = false;
    for (size_t i = 0; i < messages.size(); ++i) {
        if (auto note = notes_->find(keys[i])) {
            append_note(messages[i], *note);
            // The message this request's note would go to already had one: the request repeats or continues an
            // earlier one (a retry, a cut answer continued). It keeps the note it was computed with, so it reads
            // the same as then.
            target_known = target_known || static_cast<int>(i) == spans.note_message;
        }
    }
    if (spans.note_message < 0 || target_known) return;
    append_note(messages[spans.note_message], spans.note);
    if (remember) notes_->remember(keys[spans.note_message], spans.note);
}

void request_policy::add_span_rule(span_rule rule) {
    std::lock_guard lock(spans_write_mu_);
    std::vector<span_rule> rules;
    for (const span_rule& r : spans_.load()->rules()) {
        if (r.name() != rule.name()) rules.push_back(r);
    }
    rules.push_back(std::move(rule));
    spans_.store(std::make_shared<const span_rule_set>(std::move(rules)));
}

bool request_policy::remove_span_rule(std::string_view name) {
    std::lock_guard lock(spans_write_mu_);
    const auto current = spans_.load();
    std::vector<span_rule> rules;
    for (const span_rule& r : current->rules()) {
        if (r.name() != name) rules.push_back(r);
    }
    if (rules.size() == current->rules().size()) return false;
    spans_.store(std::make_shared<const span_rule_set>(std::move(rules)));
    return true;
}

json request_policy::to_json() const {
    json aliases = json::object();
    for (const model_alias& a : config_.model.aliases) aliases[a.pattern] = a.target;
    json clients = json::array();
    for (const client_rule& c : config_.clients) {
        clients.push_back({{"match", matcher_json(c.match)}, {"options", options_json(c.options)}});
    }
    json ping_matchers = json::array();
    for (const request_matcher& m : config_.ping.matchers) ping_matchers.push_back(matcher_json(m));
    json spans = json::array();
    for (const span_rule& r : span_rules()->rules()) {
        spans.push_back({{"name", r.name()},
                         {"origin", span_origin_name(r.origin())},
                         {"pattern", r.pattern()},
                         {"action", span_action_name(r.action())},
                         {"replacement", r.replacement()},
                         {"roles", role_names(r.roles())}});
    }
    return {{"source", config_.source.empty() ? json(nullptr) : json(config_.source)},
            {"served_model", served_model_},
            {"model", {{"mode", config_.model.mode == model_mode::strict ? "strict" : "any"}, {"aliases", aliases}}},
            {"options", options_json(config_.options)},
            {"clients", clients},
            {"ping",
             {{"enabled", config_.ping.enabled}, {"reply", config_.ping.reply}, {"match", std::move(ping_matchers)}}},
            {"spans", spans},
            {"detect",
             {{"mode", detect_mode_name(config_.detect.mode)}, {"max_auto_rules", config_.detect.max_auto_rules}}}};
}

const char* detect_mode_name(detect_mode mode) {
    switch (mode) {
        case detect_mode::off:
            return "off";
        case detect_mode::report:
            return "report";
        case detect_mode::automatic:
            return "auto";
    }
    return "report";
}

}  // namespace keepwarm::policy

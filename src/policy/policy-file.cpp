// See policy-file.h. toml++ parses the text and keeps each key's and value's position; this file walks the tables,
// checks every key against what that table may hold, and builds the typed config.
#include "policy/policy-file.h"

#include <re2/re2.h>

#include <cctype>
#include <cstdint>
#include <limits>
#include <set>

#include "base/request-error.h"
#include "config/toml-reader.h"

namespace keepwarm::policy {

namespace {

constexpr std::string_view matcher_keys[] = {
    "client", "api", "model", "header", "max_tokens_at_most", "last_user_text", "prompt_chars_at_most", "tools"};
constexpr std::string_view option_keys[] = {"max_tokens_cap",
                                            "max_tokens_default",
                                            "thinking",
                                            "tool_choice",
                                            "temperature",
                                            "top_p",
                                            "min_p",
                                            "top_k",
                                            "seed",
                                            "repeat_penalty",
                                            "repeat_last_n",
                                            "presence_penalty",
                                            "frequency_penalty",
                                            "logit_bias"};

bool contains(const auto& list, std::string_view key) {
    for (const auto& k : list) {
        if (k == key) return true;
    }
    return false;
}

// Walks the parsed document; every error names the file, line and column.
class policy_reader : config::toml_reader {
public:
    policy_reader(std::string source, std::string served_model)
        : toml_reader(std::move(source)), served_model_(std::move(served_model)) {}

    policy_config read(const toml::table& root) {
        policy_config config;
        config.source = source();
        config.ping.enabled = true;  // with a policy file, pings are absorbed unless it says otherwise
        for (auto&& [key, node] : root) {
            const std::string_view k = key.str();
            if (k == "model") {
                read_model(table(node, "model"), config.model);
            } else if (k == "options") {
                const toml::table& t = table(node, "options");
                for (auto&& [option, value] : t) {
                    if (!contains(option_keys, option.str())) unknown(option, "[options]", option_keys);
                    read_option(option.str(), value, config.options);
                }
            } else if (k == "client") {
                for (const toml::node& entry : array_of_tables(node, "client"))
                    config.clients.push_back(read_client(entry));
            } else if (k == "ping") {
                read_ping(table(node, "ping"), config.ping);
            } else if (k == "spans") {
                read_spans(table(node, "spans"), config.spans);
            } else if (k == "detect") {
                read_detect(table(node, "detect"), config.detect);
            } else {
                fail(key.source(),
                     "unknown section '" + std::string(k) + "' (known: model, options, client, ping, spans, detect)");
            }
        }
        if (config.ping.matchers.empty()) config.ping.matchers.push_back(default_ping_matcher());
        if (!root.contains("spans")) read_spans(toml::table{}, config.spans);
        // As without a file: a file that leaves the detector out gets the protection, not only the report.
        if (!root.contains("detect")) config.detect.mode = detect_mode::automatic;
        return config;
    }

private:
    std::shared_ptr<const re2::RE2> regex(const toml::node& n, const std::string& what) const {
        re2::RE2::Options options;
        options.set_log_errors(false);
        auto re = std::make_shared<const re2::RE2>(string(n, what), options);
        if (!re->ok()) fail(n.source(), "'" + what + "' is not a pattern RE2 accepts: " + re->error());
        return re;
    }

    void read_model(const toml::table& t, model_policy& model) const {
        for (auto&& [key, node] : t) {
            if (key.str() == "mode") {
                const std::string mode = string(node, "model.mode");
                if (mode == "any") {
                    model.mode = model_mode::any;
                } else if (mode == "strict") {
                    model.mode = model_mode::strict;
                } else {
                    fail(node.source(), "'model.mode' must be \"any\" or \"strict\", not \"" + mode + "\"");
                }
            } else if (key.str() == "aliases") {
                for (auto&& [name, target] : table(node, "model.aliases")) {
                    model_alias alias{std::string(name.str()), string(target, "model.aliases." + alias.pattern)};
                    if (!served_model_.empty() && alias.target != served_model_) {
                        fail(target.source(), "alias '" + alias.pattern + "' maps to '" + alias.target +
                                                  "', but this server serves '" + served_model_ + "'");
                    }
                    model.aliases.push_back(std::move(alias));
                }
            } else {
                unknown(key, "[model]", std::initializer_list<std::string_view>{"mode", "aliases"});
            }
        }
    }

    void read_option(std::string_view key, const toml::node& n, forced_options& o) const {
        const std::string what(key);
        constexpr int64_t int_max = std::numeric_limits<int32_t>::max();
        sampling_options& s = o.sampling;
        if (key == "max_tokens_cap") {
            o.max_tokens_cap = static_cast<int>(integer(n, what, 1, int_max));
        } else if (key == "max_tokens_default") {
            o.max_tokens_default = static_cast<int>(integer(n, what, 1, int_max));
        } else if (key == "thinking") {
            o.thinking = boolean(n, what);
        } else if (key == "tool_choice") {
            const std::string choice = string(n, what);
            if (choice == "auto") {
                o.tool_choice = COMMON_CHAT_TOOL_CHOICE_AUTO;
            } else if (choice == "required") {
                o.tool_choice = COMMON_CHAT_TOOL_CHOICE_REQUIRED;
            } else if (choice == "none") {
                o.tool_choice = COMMON_CHAT_TOOL_CHOICE_NONE;
            } else {
                fail(n.source(), "'tool_choice' must be \"auto\", \"required\" or \"none\", not \"" + choice + "\"");
            }
        } else if (key == "top_k") {
            s.top_k = static_cast<int>(integer(n, what, 0, int_max));
        } else if (key == "repeat_last_n") {
            s.repeat_last_n = static_cast<int>(integer(n, what, -1, int_max));
        } else if (key == "logit_bias") {
            for (auto&& [text, bias] : table(n, what)) {
                const double b = number(bias, what + "." + std::string(text.str()));
                if (!(b >= -100 && b <= 100)) fail(bias.source(), "'" + what + "' values must be between -100 and 100");
                std::erase_if(o.logit_bias, [&, name = text.str()](const forced_bias& f) { return f.text == name; });
                o.logit_bias.push_back({std::string(text.str()), static_cast<float>(b)});
            }
            return;
        } else if (key == "seed") {
            s.seed = static_cast<uint32_t>(integer(n, what, 0, std::numeric_limits<uint32_t>::max()));
        } else {
            const float v = static_cast<float>(number(n, what));
            if (key == "temperature") s.temperature = v;
            if (key == "top_p") s.top_p = v;
            if (key == "min_p") s.min_p = v;
            if (key == "repeat_penalty") s.repeat_penalty = v;
            if (key == "presence_penalty") s.presence_penalty = v;
            if (key == "frequency_penalty") s.frequency_penalty = v;
        }
        try {
            validate_sampling(s);  // the same ranges as a request's own values
        } catch (const request_error& e) {
            fail(n.source(), e.what());
        }
    }

    // Reads a matcher key into `m`; false when `key` is not one.
    bool read_matcher_key(std::string_view key, const toml::node& n, const std::string& where,
                          request_matcher& m) const {
        const std::string what = where + "." + std::string(key);
        if (key == "client") {
            m.client = string(n, what);
        } else if (key == "api") {
            m.api = string(n, what);
            if (m.api != "openai" && m.api != "anthropic" && m.api != "ollama") {
                fail(n.source(), "'" + what + "' must be \"openai\", \"anthropic\" or \"ollama\"");
            }
        } else if (key == "model") {
            m.model = string(n, what);
        } else if (key == "header") {
            m.header = string(n, what);
            for (char& c : m.header) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        } else if (key == "max_tokens_at_most") {
            m.max_tokens_at_most = static_cast<int>(integer(n, what, 0, std::numeric_limits<int32_t>::max()));
        } else if (key == "last_user_text") {
            m.last_user_text = regex(n, what);
        } else if (key == "prompt_chars_at_most") {
            m.prompt_chars_at_most = static_cast<int>(integer(n, what, 0, std::numeric_limits<int32_t>::max()));
        } else if (key == "tools") {
            m.tools = boolean(n, what);
        } else {
            return false;
        }
        return true;
    }

    client_rule read_client(const toml::node& entry) const {
        const toml::table& t = table(entry, "client");
        client_rule rule;
        for (auto&& [key, node] : t) {
            if (read_matcher_key(key.str(), node, "client", rule.match)) continue;
            if (!contains(option_keys, key.str())) {
                std::vector<std::string_view> known(std::begin(matcher_keys), std::end(matcher_keys));
                known.insert(known.end(), std::begin(option_keys), std::end(option_keys));
                unknown(key, "[[client]]", known);
            }
            read_option(key.str(), node, rule.options);
        }
        if (rule.match.empty()) {
            fail(t.source(),
                 "a [[client]] table needs at least one of client, api, model, header, max_tokens_at_most, "
                 "last_user_text, prompt_chars_at_most, tools to say which requests it is for");
        }
        return rule;
    }

    void read_ping(const toml::table& t, ping_policy& ping) const {
        for (auto&& [key, node] : t) {
            if (key.str() == "enabled") {
                ping.enabled = boolean(node, "ping.enabled");
            } else if (key.str() == "reply") {
                ping.reply = string(node, "ping.reply");
            } else if (key.str() == "match") {
                for (const toml::node& entry : array_of_tables(node, "ping.match")) {
                    request_matcher m;
                    for (auto&& [mk, mv] : table(entry, "ping.match")) {
                        if (!read_matcher_key(mk.str(), mv, "ping.match", m))
                            unknown(mk, "[[ping.match]]", matcher_keys);
                    }
                    if (m.empty()) fail(entry.source(), "a [[ping.match]] table needs at least one condition");
                    ping.matchers.push_back(std::move(m));
                }
            } else {
                unknown(key, "[ping]", std::initializer_list<std::string_view>{"enabled", "reply", "match"});
            }
        }
    }

    void read_detect(const toml::table& t, detect_policy& detect) const {
        for (auto&& [key, node] : t) {
            if (key.str() == "mode") {
                const std::string mode = string(node, "detect.mode");
                if (mode == "off") {
                    detect.mode = detect_mode::off;
                } else if (mode == "report") {
                    detect.mode = detect_mode::report;
                } else if (mode == "auto") {
                    detect.mode = detect_mode::automatic;
                } else {
                    fail(node.source(), "'detect.mode' must be \"off\", \"report\" or \"auto\", not \"" + mode + "\"");
                }
            } else if (key.str() == "max_auto_rules") {
                detect.max_auto_rules = static_cast<size_t>(integer(node, "detect.max_auto_rules", 0, 1000));
            } else {
                unknown(key, "[detect]", std::initializer_list<std::string_view>{"mode", "max_auto_rules"});
            }
        }
    }

    unsigned roles(const toml::node& n, const std::string& what) const {
        unsigned bits = 0;
        for (const toml::node& role : array(n, what)) {
            const unsigned bit = role_bit(string(role, what));
            if (bit == 0) fail(role.source(), "'" + what + "' holds system, developer, user, assistant or tool");
            bits |= bit;
        }
        if (bits == 0) fail(n.source(), "'" + what + "' is empty: the rule would read nothing");
        return bits;
    }

    // A rule's settings from a table (action, replacement, roles; name and pattern for [[spans.rule]]).
    span_rule read_rule(const toml::table& t, const std::string& where, const builtin_span* builtin) const {
        std::string name = builtin ? builtin->name : "";
        std::string pattern = builtin ? builtin->pattern : "";
        span_action action = builtin ? builtin->action : span_action::replace;
        std::string replacement = builtin ? builtin->replacement : "";
        unsigned role_set = builtin ? builtin->roles : all_roles;
        const toml::node* pattern_node = nullptr;
        const toml::node* replacement_node = nullptr;
        for (auto&& [key, node] : t) {
            const std::string_view k = key.str();
            const std::string what = where + "." + std::string(k);
            if (k == "action") {
                const std::string a = string(node, what);
                const auto parsed = parse_span_action(a);
                if (!parsed)
                    fail(node.source(), "'" + what + "' must be \"replace\", \"drop\" or \"move\", not \"" + a + "\"");
                action = *parsed;
            } else if (k == "replacement") {
                replacement = string(node, what);
                replacement_node = &node;
            } else if (k == "roles") {
                role_set = roles(node, what);
            } else if (!builtin && k == "name") {
                name = string(node, what);
                if (name.empty() || name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                           "0123456789_.-") != std::string::npos) {
                    fail(node.source(), "'" + what + "' must be letters, digits, '_', '.' or '-'");
                }
            } else if (!builtin && k == "pattern") {
                pattern = string(node, what);
                pattern_node = &node;
            } else {
                unknown(key, "[" + where + "]",
                        builtin ? std::initializer_list<std::string_view>{"action", "replacement", "roles"}
                                : std::initializer_list<std::string_view>{"name", "pattern", "action", "replacement",
                                                                          "roles"});
            }
        }
        if (!builtin && name.empty()) fail(t.source(), "a [[spans.rule]] needs a 'name'");
        if (!builtin && !pattern_node) fail(t.source(), "span rule '" + name + "' needs a 'pattern'");
        try {
            return span_rule(name, pattern, action, replacement, role_set,
                             builtin ? span_origin::builtin : span_origin::file);
        } catch (const std::invalid_argument& e) {
            const bool about_replacement = std::string_view(e.what()).starts_with("invalid replacement");
            const toml::node* blame = about_replacement && replacement_node ? replacement_node : pattern_node;
            fail(blame ? blame->source() : t.source(), "span rule '" + name + "': " + e.what());
        }
    }

    // Built-ins are on unless switched off; [[spans.rule]] tables follow them.
    void read_spans(const toml::table& t, std::vector<span_rule>& rules) const {
        std::vector<span_rule> custom;
        std::set<std::string> names;
        for (const builtin_span& b : builtin_spans()) names.insert(b.name);
        for (auto&& [key, node] : t) {
            if (key.str() == "rule") {
                for (const toml::node& entry : array_of_tables(node, "spans.rule")) {
                    custom.push_back(read_rule(table(entry, "spans.rule"), "spans.rule", nullptr));
                    if (!names.insert(custom.back().name()).second) {
                        fail(entry.source(), "span rule '" + custom.back().name() + "' is defined twice");
                    }
                }
            } else if (!find_builtin_span(key.str())) {
                std::vector<std::string_view> known{"rule"};
                for (const builtin_span& b : builtin_spans()) known.push_back(b.name);
                unknown(key, "[spans]", known);
            }
        }
        for (const builtin_span& b : builtin_spans()) {
            const toml::node* setting = t.get(b.name);
            const std::string what = std::string("spans.") + b.name;
            if (!setting) {
                rules.push_back(read_rule(toml::table{}, what, &b));
            } else if (setting->is_boolean()) {
                if (setting->as_boolean()->get()) rules.push_back(read_rule(toml::table{}, what, &b));
            } else if (setting->is_string()) {
                toml::table action;
                action.insert("action", setting->as_string()->get());
                if (!parse_span_action(setting->as_string()->get())) {
                    fail(setting->source(), "'" + what +
                                                "' must be true, false, \"replace\", \"drop\", \"move\" or "
                                                "a table {action, replacement, roles}");
                }
                rules.push_back(read_rule(action, what, &b));
            } else if (setting->is_table()) {
                rules.push_back(read_rule(*setting->as_table(), what, &b));
            } else {
                wrong_type(*setting, what, "true, false, an action name or a table");
            }
        }
        for (span_rule& r : custom) rules.push_back(std::move(r));
    }

    std::string served_model_;
};

}  // namespace

policy_config parse_policy(std::string_view text, const std::string& source_name, const std::string& served_model) {
    return read_policy_table(config::parse_toml(text, source_name), source_name, served_model);
}

policy_config read_policy_table(const toml::table& root, const std::string& source_name,
                                const std::string& served_model) {
    return policy_reader(source_name, served_model).read(root);
}

const std::string_view builtin_policy_text = R"toml(
[ping]
enabled = true
[[ping.match]]
max_tokens_at_most = 1
prompt_chars_at_most = 32
tools = false

[spans]
claude-code-billing = true
uuid = "move"
timestamp = "move"

[detect]
mode = "auto"
)toml";

policy_config builtin_policy(const std::string& served_model) {
    return parse_policy(builtin_policy_text, builtin_policy_source, served_model);
}

policy_config load_policy_file(const std::string& path, const std::string& served_model) {
    return parse_policy(config::read_text_file(path, "policy file"), path, served_model);
}

}  // namespace keepwarm::policy

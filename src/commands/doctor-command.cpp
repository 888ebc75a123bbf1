// See doctor-command.h. Loads only the model's vocabulary and chat template (no weights), so it runs in a moment on
// any machine, whatever the model's size.
#include "commands/doctor-command.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "api/request-dialect.h"
#include "base/command-exit.h"
#include "base/request-error.h"
#include "chat/chat-renderer.h"
#include "commands/listen-options.h"
#include "common.h"
#include "engine/llama-runtime.h"
#include "llama-cpp.h"
#include "model/demo-model.h"
#include "policy/policy-file.h"
#include "policy/policy.h"
#include "policy/prompt-diff.h"

namespace keepwarm {

namespace {

using json = nlohmann::ordered_json;

constexpr int exit_diverged = 1;
constexpr int exit_bad_input = 2;
constexpr size_t context_chars = 40;  // shared text shown in front of a divergence
constexpr size_t shown_chars = 60;    // of each side's text from the divergence on

struct doctor_options {
    std::string a, b;
    std::string model;  // empty: the demo model
    std::string chat_template_file;
    std::string policy_file;  // empty: the policy `serve` runs without --policy (the built-in defaults)
    bool no_policy = false;   // the bodies as sent
    std::string alias;        // the served model's name, as `serve --alias` (default: the file name)
    bool json = false;
};

std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error(path + ": cannot read the file");
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
}

// One request body as the model reads it.
struct rendered_body {
    std::string file;
    api::dialect_request request;
    std::vector<std::string> policy_fired;  // what the policy did to this body before rendering
    std::string prompt;
    std::vector<llama_token> tokens;
};

rendered_body render_body(const std::string& path, const chat_renderer& renderer, const llama_vocab* vocab,
                          const policy::request_policy* policy) {
    rendered_body r;
    r.file = path;
    json body;
    try {
        body = json::parse(read_text(path));
    } catch (const json::parse_error& e) {
        throw std::runtime_error(path + ": not valid JSON: " + e.what());
    }
    try {
        r.request = api::parse_any_chat_body(body);
        if (policy) {
            // As `serve` would before rendering (counting: a body that looks like a ping is still rendered).
            r.policy_fired = policy->apply(r.request.chat, {}, policy::policy_use::counting).fired;
        }
        r.prompt = renderer.render(r.request.chat).prompt;
    } catch (const request_error& e) {
        throw std::runtime_error(path + ": " + e.what());
    }
    r.tokens = common_tokenize(vocab, r.prompt, true, true);
    return r;
}

// Where A and B part, and what that means for B reusing A's cached prefix.
struct comparison {
    size_t char_offset = 0;   // first char that differs (the shorter length when one extends the other)
    size_t token_offset = 0;  // first token that differs: the cache reuses A's tokens before it
    int message_index = -1;   // B's message holding the divergence
    std::string role;
    int cost_tokens = 0;  // B's tokens from token_offset on
    std::optional<policy::volatile_span> span;
    policy::suggested_rule rule;

    bool diverged(const rendered_body& a, const rendered_body& b) const {
        return char_offset < a.prompt.size() && char_offset < b.prompt.size();
    }
};

comparison compare(const rendered_body& a, const rendered_body& b) {
    comparison c;
    c.char_offset = policy::common_prefix_length(a.prompt, b.prompt);
    const size_t n = std::min(a.tokens.size(), b.tokens.size());
    c.token_offset = static_cast<size_t>(std::mismatch(a.tokens.begin(), a.tokens.begin() + n, b.tokens.begin()).first -
                                         a.tokens.begin());
    c.cost_tokens = static_cast<int>(b.tokens.size() - c.token_offset);
    if (!c.diverged(a, b)) return c;
    c.message_index = policy::message_index_at(b.request.chat.messages, b.prompt, c.char_offset);
    if (c.message_index >= 0) c.role = b.request.chat.messages[c.message_index].role;
    c.span = policy::find_volatile_span(a.prompt, b.prompt);
    if (c.span) c.rule = policy::suggest_rule(a.prompt, b.prompt, *c.span);
    return c;
}

json side_json(const rendered_body& r) {
    return {{"file", r.file},
            {"api", api::dialect_name(r.request.dialect)},
            {"messages", r.request.chat.messages.size()},
            {"chars", r.prompt.size()},
            {"tokens", r.tokens.size()},
            {"policy", r.policy_fired}};
}

// The text where a side departs: the span when there is one, else the next chars from the divergence.
struct departure {
    size_t from = 0;
    std::string_view a, b;
};

departure departure_of(const comparison& c, const rendered_body& a, const rendered_body& b) {
    if (c.span) return {c.span->offset, c.span->in_earlier(a.prompt), c.span->in_later(b.prompt)};
    const std::string_view pa = a.prompt, pb = b.prompt;
    return {c.char_offset, pa.substr(c.char_offset, shown_chars), pb.substr(c.char_offset, shown_chars)};
}

json report_json(const std::string& model, const rendered_body& a, const rendered_body& b, const comparison& c) {
    json out = {{"a", side_json(a)}, {"b", side_json(b)}, {"model", model}};
    if (!c.diverged(a, b)) {
        out["result"] = a.prompt == b.prompt ? "identical" : "extends";
        out["reused_tokens"] = c.token_offset;
        out["new_tokens"] = c.cost_tokens;
        return out;
    }
    const departure d = departure_of(c, a, b);
    const std::string_view shared = std::string_view(b.prompt).substr(0, d.from);
    const std::string_view before = shared.substr(shared.size() - std::min(shared.size(), context_chars));
    const auto side = [&](std::string_view prompt, std::string_view text) {
        return json{{"before", before},
                    {"text", text},
                    {"after", prompt.substr(d.from + text.size(), c.span ? context_chars : 0)}};
    };
    out["result"] = "diverged";
    out["divergence"] = {{"char_offset", c.char_offset},
                         {"token_offset", c.token_offset},
                         {"message_index", c.message_index >= 0 ? json(c.message_index) : json(nullptr)},
                         {"role", c.role.empty() ? json(nullptr) : json(c.role)},
                         {"a", side(a.prompt, d.a)},
                         {"b", side(b.prompt, d.b)},
                         {"cost_tokens", c.cost_tokens}};
    if (!c.span) {
        out["span"] = nullptr;
        out["rule"] = nullptr;
        return out;
    }
    out["span"] = {{"kind", policy::span_kind_name(c.span->kind)},
                   {"random_id", policy::is_random_id(c.span->kind)},
                   {"char_offset", c.span->offset},
                   {"a", d.a},
                   {"b", d.b},
                   {"agreed_chars_after", c.span->agreed_chars}};
    json rule = {{"name", c.rule.name},
                 {"pattern", c.rule.pattern.empty() ? json(nullptr) : json(c.rule.pattern)},
                 {"action", c.rule.action.empty() ? json(nullptr) : json(c.rule.action)}};
    if (c.rule.action == "replace") rule["replacement"] = c.rule.replacement;
    rule["note"] = c.rule.note;
    rule["toml"] = c.rule.toml();
    out["rule"] = std::move(rule);
    return out;
}

void print_report(const std::string& model, const rendered_body& a, const rendered_body& b, const comparison& c) {
    const auto side = [](const char* name, const rendered_body& r) {
        std::cout << name << ": " << r.file << " (" << api::dialect_name(r.request.dialect) << ", "
                  << r.request.chat.messages.size() << " messages): " << r.prompt.size() << " chars, "
                  << r.tokens.size() << " tokens\n";
    };
    side("A", a);
    side("B", b);
    for (const auto& [name, r] : {std::pair{"A", &a}, std::pair{"B", &b}}) {
        if (r->policy_fired.empty()) continue;
        std::cout << "policy on " << name << ":";
        for (const auto& rule : r->policy_fired) std::cout << " " << rule << ";";
        std::cout << "\n";
    }
    std::cout << "model: " << model << "\n\n";
    if (a.prompt == b.prompt) {
        std::cout << "A and B render the same prompt: B reuses all " << a.tokens.size() << " tokens of A's.\n";
        return;
    }
    if (!c.diverged(a, b)) {
        std::cout << (a.prompt.size() < b.prompt.size() ? "B extends A" : "A extends B") << ": B reuses "
                  << c.token_offset << " of A's " << a.tokens.size() << " tokens and computes " << c.cost_tokens
                  << ".\n";
        return;
    }

    std::cout << "first divergence: char " << c.char_offset << ", token " << c.token_offset;
    if (c.message_index >= 0) std::cout << ", message " << c.message_index << " (" << c.role << ")";
    std::cout << "\n";
    const departure d = departure_of(c, a, b);
    const std::string_view shared = std::string_view(b.prompt).substr(0, d.from);
    const std::string before = policy::printable(shared.substr(shared.size() - std::min(shared.size(), context_chars)));
    const auto show = [&](const char* name, std::string_view prompt, std::string_view text) {
        std::cout << "  " << name << ": \"" << (d.from > context_chars ? "..." : "") << before << "\" + \""
                  << policy::printable(text, shown_chars) << "\"";
        if (c.span)
            std::cout << " + \"" << policy::printable(prompt.substr(d.from + text.size()), context_chars) << "\"";
        std::cout << "\n";
    };
    show("A", a.prompt, d.a);
    show("B", b.prompt, d.b);
    std::cout << "cost: " << c.cost_tokens << " tokens (B's prompt tokens from token " << c.token_offset
              << " on cannot come from A's cached prefix)\n";
    if (!c.span) {
        std::cout << "span: none; the prompts do not agree again soon after the divergence for long, so no span rule "
                     "removes it\n";
        return;
    }
    std::cout << "span: " << policy::span_kind_description(c.span->kind) << " at char " << c.span->offset
              << "; the prompts agree again after it for " << c.span->agreed_chars << " chars\n";
    std::cout << (policy::is_random_id(c.span->kind)
                      ? "      a random id: the policy's auto mode replaces it by itself\n"
                      : "      not a random id: the policy's auto mode only reports it\n");
    std::cout << "suggested rule for the policy file:\n";
    std::istringstream rule(c.rule.toml());
    for (std::string line; std::getline(rule, line);) std::cout << "  " << line << "\n";
}

int run_doctor(const doctor_options& o) {
    const std::string model_path = o.model.empty() ? ensure_demo_model() : o.model;
    init_llama_runtime(false);
    llama_model_params params = llama_model_default_params();
    params.vocab_only = true;  // the tokenizer and the chat template are all it needs
    llama_model_ptr model(llama_model_load_from_file(model_path.c_str(), params));
    if (!model) throw std::runtime_error(model_path + ": failed to load the model's vocabulary and chat template");
    const std::string template_override = o.chat_template_file.empty() ? "" : read_text(o.chat_template_file);
    const chat_renderer renderer(model.get(), template_override);
    const llama_vocab* vocab = llama_model_get_vocab(model.get());

    // The policy `serve` would run with the same flags: the file, the built-in defaults without one, or none.
    std::optional<policy::request_policy> policy;
    if (!o.no_policy) {
        const std::string served = o.alias.empty() ? std::filesystem::path(model_path).stem().string() : o.alias;
        policy.emplace(select_policy(o.policy_file, false, served), served);
    }
    const policy::request_policy* applied = policy ? &*policy : nullptr;
    const rendered_body a = render_body(o.a, renderer, vocab, applied);
    const rendered_body b = render_body(o.b, renderer, vocab, applied);
    const comparison c = compare(a, b);
    if (o.json) {
        std::cout << report_json(model_path, a, b, c).dump(2, ' ', false, json::error_handler_t::replace) << "\n";
    } else {
        print_report(model_path, a, b, c);
    }
    return c.diverged(a, b) ? exit_diverged : 0;
}

}  // namespace

void add_doctor_command(CLI::App& app) {
    auto o = std::make_shared<doctor_options>();
    CLI::App* cmd = app.add_subcommand("doctor",
                                       "Compare two captured request bodies as the model reads them: where they part, "
                                       "what that costs the prefix cache, and which policy rule would remove it");
    cmd->add_option("a", o->a, "The earlier request body (JSON: OpenAI, Anthropic or Ollama)")->required();
    cmd->add_option("b", o->b, "The later request body")->required();
    cmd->add_option("-m,--model", o->model,
                    "GGUF model whose tokenizer and chat template render the bodies (only those are loaded; "
                    "default: the demo model)");
    cmd->add_option("--chat-template-file", o->chat_template_file, "Jinja chat template to use instead of the model's");
    CLI::Option* policy_option =
        cmd->add_option("--policy", o->policy_file,
                        "Apply this policy file (as `serve --policy`) to both bodies before rendering: does it remove "
                        "the divergence? Without it, the built-in defaults `serve` runs without --policy apply");
    add_no_policy_flag(*cmd, policy_option, o->no_policy);
    cmd->add_option("--alias", o->alias, "The served model's name for the policy's aliases (default: the file name)");
    cmd->add_flag("--json", o->json, "Print JSON");
    cmd->footer(
        "Exit status: 0 when the prompts are identical or one extends the other, 1 when they diverge, 2 on "
        "bad input.");
    cmd->callback([o] {
        run_command(
            "doctor", [&] { return run_doctor(*o); }, exit_bad_input);
    });
}

}  // namespace keepwarm

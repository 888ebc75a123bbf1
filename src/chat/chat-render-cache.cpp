// See chat-render-cache.h: request keys, message hashes, the window renders, cut selection, and the check of a
// request key against common on synthetic conversations.
#include "chat/chat-render-cache.h"

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <iomanip>
#include <list>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

#include "chat-auto-parser.h"

namespace keepwarm {

namespace {

constexpr size_t npos = static_cast<size_t>(-1);

struct message_hash {
    uint64_t low = 0;
    uint64_t high = 0;
    auto operator<=>(const message_hash&) const = default;
};

void put(std::string& buf, const std::string& s) {
    const uint64_t n = s.size();
    buf.append(reinterpret_cast<const char*>(&n), sizeof n);
    buf.append(s);
}

message_hash hash_message(const common_chat_msg& m, std::string& buf) {
    buf.clear();
    put(buf, m.role);
    put(buf, m.content);
    put(buf, std::to_string(m.content_parts.size()));
    for (const auto& part : m.content_parts) {
        put(buf, part.type);
        put(buf, part.text);
    }
    put(buf, std::to_string(m.tool_calls.size()));
    for (const auto& call : m.tool_calls) {
        put(buf, call.name);
        put(buf, call.arguments);
        put(buf, call.id);
    }
    put(buf, m.reasoning_content);
    put(buf, m.tool_name);
    put(buf, m.tool_call_id);
    const XXH128_hash_t h = XXH3_128bits(buf.data(), buf.size());
    return {h.low64, h.high64};
}

std::vector<message_hash> hash_messages(const std::vector<common_chat_msg>& messages) {
    std::vector<message_hash> out;
    out.reserve(messages.size());
    std::string buf;
    for (const auto& m : messages) {
        out.push_back(hash_message(m, buf));
    }
    return out;
}

bool is_user(const common_chat_msg& m) {
    return m.role == "user";
}

bool is_assistant(const common_chat_msg& m) {
    return m.role == "assistant";
}

// A user message no template can mistake for something else: Qwen's templates, for one, do not count a user message
// wrapped in <tool_response> tags as the last user query. Cut conditions rely on which message is the last query.
bool is_plain_user(const common_chat_msg& m) {
    if (!is_user(m) || !m.content_parts.empty()) {
        return false;
    }
    const size_t b = m.content.find_first_not_of(" \t\r\n");
    if (b == std::string::npos) {
        return false;
    }
    const size_t e = m.content.find_last_not_of(" \t\r\n");
    return !(m.content[b] == '<' && m.content[e] == '>');
}

size_t last_index(const std::vector<common_chat_msg>& messages, bool (*pred)(const common_chat_msg&)) {
    for (size_t i = messages.size(); i-- > 0;) {
        if (pred(messages[i])) {
            return i;
        }
    }
    return npos;
}

// common's format_time (chat.cpp), for the datetime / date_string variables it gives every template.
std::string format_time(std::chrono::system_clock::time_point now, const char* format) {
    const std::time_t t = std::chrono::system_clock::to_time_t(now);
    std::tm local{};
    localtime_r(&t, &local);
    std::ostringstream ss;
    ss << std::put_time(&local, format);
    return ss.str();
}

bool contains(const std::string& s, const char* what) {
    return s.find(what) != std::string::npos;
}

// Whether common_chat_templates_apply renders this template's prompt with common_chat_template_direct_apply on the
// messages as given: the generic (autoparser) path and the Qwen3-Coder handler do; the other handlers of
// common_chat_try_specialized_template (pinned chat.cpp) rewrite messages first, and StepFun's trims them.
bool renders_messages_as_given(const std::string& src) {
    const bool ministral = contains(src, "[SYSTEM_PROMPT]") && contains(src, "[TOOL_CALLS]") &&
                           contains(src, "[ARGS]") && !contains(src, "[CALL_ID]");
    const bool gpt_oss = contains(src, "<|channel|>");
    const bool muse = contains(src, "<atem:function_calls>") && contains(src, "<|eom|>");
    const bool functionary = contains(src, ">>>all") && contains(src, ">>>${recipient}");
    const bool kimi_k2 = contains(src, "<|tool_calls_section_begin|>") && contains(src, "<|tool_call_begin|>");
    const bool kimi_k3 = contains(src, "<|open|>") && contains(src, "<|close|>") && contains(src, "<|end_of_msg|>");
    const bool cohere = contains(src, "<|START_TEXT|>") && contains(src, "<|START_ACTION|>");
    const bool lfm2 = contains(src, "<|tool_list_start|>") && contains(src, "<|tool_list_end|>");
    const bool lfm25 = contains(src, "List of tools: [") && !contains(src, "<|tool_list_start|>");
    const bool gigachat =
        contains(src, "<|role_sep|>") && contains(src, "<|message_sep|>") && !contains(src, "<|function_call|>");
    const bool minimax =
        contains(src, "]<]minimax[>[") && contains(src, "<tool_call>") && contains(src, "<invoke name=");
    const bool deepseek = contains(src, "dsml_token") && contains(src, "DSML") &&
                          (contains(src, "function_calls") || contains(src, "tool_calls"));
    const bool gemma4 = contains(src, "'<|tool_call>call:'");
    const bool minicpm5 = contains(src, "Tool usage guidelines:") && contains(src, "<function name=\"") &&
                          contains(src, "<param name=\"");
    const bool stepfun_trim = contains(src, "You have access to the following functions in JSONSchema format");
    return !(ministral || gpt_oss || muse || functionary || kimi_k2 || kimi_k3 || cohere || lfm2 || lfm25 || gigachat ||
             minimax || deepseek || gemma4 || minicpm5 || stepfun_trim);
}

// One template of the set, as the splicer runs it.
struct jinja_template {
    std::unique_ptr<common_chat_template> tmpl;
    bool spliceable = false;
    bool parity = false;  // tests index parity (role alternation checks)
};

// What a full render left for later splices of one conversation.
struct conversation {
    std::string key;
    std::vector<message_hash> hashes;
    size_t last_user = npos;
    std::string prompt;
    std::map<size_t, size_t> cuts;  // message index -> offset in prompt where that message's rendering starts
    size_t bytes() const { return prompt.size() + hashes.size() * sizeof(message_hash) + cuts.size() * 48 + 256; }
};

bool same_params_except_prompt(const common_chat_params& a, const common_chat_params& b) {
    auto same_triggers = [](const auto& x, const auto& y) {
        if (x.size() != y.size()) return false;
        for (size_t i = 0; i < x.size(); ++i) {
            if (x[i].type != y[i].type || x[i].value != y[i].value || x[i].token != y[i].token) return false;
        }
        return true;
    };
    return a.format == b.format && a.grammar == b.grammar && a.grammar_lazy == b.grammar_lazy &&
           a.generation_prompt == b.generation_prompt && a.supports_thinking == b.supports_thinking &&
           a.thinking_start_tag == b.thinking_start_tag && a.thinking_end_tags == b.thinking_end_tags &&
           same_triggers(a.grammar_triggers, b.grammar_triggers) && a.preserved_tokens == b.preserved_tokens &&
           a.additional_stops == b.additional_stops && a.parser == b.parser &&
           a.message_delimiters.to_json().dump() == b.message_delimiters.to_json().dump();
}

// What the cache knows about one request key.
struct key_store {
    enum class state { unchecked, trusted, refused } status = state::unchecked;
    std::vector<common_chat_params> profiles;  // full-render results without the prompt, by generation prompt
    std::map<std::pair<message_hash, size_t>, std::string> heads;  // (hash of the head's messages, h) -> its text

    const common_chat_params* profile(const std::string& generation_prompt) const {
        for (const auto& p : profiles) {
            if (p.generation_prompt == generation_prompt) return &p;
        }
        return nullptr;
    }
};

// The parts of a request every render of it needs.
struct request_view {
    const common_chat_templates_inputs* in = nullptr;
    const jinja_template* tmpl = nullptr;
    std::string key;
    common_json window_tools;  // what windows get for the request's tools (see view())
    common_json extra_context;
};

}  // namespace

struct chat_render_cache::impl {
    const common_chat_templates* templates;
    template_tokens tokens;
    options opts;

    std::once_flag templates_once;
    jinja_template default_template;
    jinja_template tool_use_template;
    bool has_tool_use_template = false;  // common renders requests with tools through tool_use_template

    mutable std::mutex mu;
    std::map<std::string, std::shared_ptr<key_store>> keys;  // guarded by mu; shared with renders in flight
    std::list<conversation> recent;                          // guarded by mu; most recently used first
    size_t recent_bytes = 0;                                 // guarded by mu
    counters stats;                                          // guarded by mu

    impl(const common_chat_templates* t, template_tokens tok, options o)
        : templates(t), tokens(std::move(tok)), opts(o) {}

    void load_templates() {
        std::call_once(templates_once, [&] {
            auto load = [&](const std::string& src, jinja_template& out) {
                // Parsing runs the template's capability probes (milliseconds): only for templates we splice.
                if (src.empty() || !renders_messages_as_given(src) || contains(src, "strftime_now")) return;
                try {
                    out.tmpl = std::make_unique<common_chat_template>(src, tokens.bos, tokens.eos);
                } catch (const std::exception&) {
                    return;
                }
                out.spliceable = true;
                out.parity = contains(src, "% 2") || contains(src, "%2");
            };
            load(common_chat_templates_source(templates, ""), default_template);
            const std::string tool_use_source = common_chat_templates_source(templates, "tool_use");
            has_tool_use_template = !tool_use_source.empty();
            load(tool_use_source, tool_use_template);
        });
    }

    // Everything common_chat_templates_apply reads besides the messages, and the date strings it gives the template.
    std::optional<request_view> view(const common_chat_templates_inputs& in) {
        if (!in.use_jinja || in.continue_final_message != COMMON_CHAT_CONTINUATION_NONE || in.force_pure_content ||
            !in.grammar.empty() || !in.add_generation_prompt || in.messages.empty()) {
            return std::nullopt;
        }
        load_templates();
        request_view v;
        v.in = &in;
        // common_chat_tools_to_json_oaicompat gives an array exactly when there are tools.
        const bool has_tools = !in.tools.empty();
        v.tmpl = has_tools && has_tool_use_template ? &tool_use_template : &default_template;
        if (!v.tmpl->tmpl || !v.tmpl->spliceable) {
            return std::nullopt;
        }
        const auto now = std::chrono::system_clock::now();
        v.extra_context = common_json::object();
        v.extra_context["datetime"] = format_time(now, "%b %d %Y");
        v.extra_context["date_string"] = format_time(now, "%d %b %Y");
        std::string key;
        for (const auto& [k, val] : in.chat_template_kwargs) {
            v.extra_context[k] = common_json::parse(val);
            put(key, k);
            put(key, val);
        }
        put(key, v.tmpl == &tool_use_template ? "tool_use" : "default");
        put(key, std::to_string(in.tools.size()));
        for (const auto& tool : in.tools) {
            put(key, tool.name);
            put(key, tool.description);
            put(key, tool.parameters);
        }
        // Templates print the tool definitions in the head, which window renders drop (Qwen: 40 tools cost ~3 ms per
        // render in this engine, even as bare names ~0.7 ms). So windows see one stand-in tool instead, named like
        // none of the request's: a template whose messages render differently without the real definitions fails
        // the key check (its tool calls name real tools) and the self-checks against common's renders.
        if (has_tools) {
            common_json parameters = common_json::object();
            parameters["type"] = "object";
            parameters["properties"] = common_json::object();
            common_json function = common_json::object();
            function["name"] = "keepwarm_stand_in";
            function["description"] = "";
            function["parameters"] = parameters;
            common_json stand_in = common_json::object();
            stand_in["type"] = "function";
            stand_in["function"] = function;
            v.window_tools = common_json::array();
            v.window_tools.push_back(stand_in);
        }
        put(key, in.json_schema);
        put(key, std::to_string(in.tool_choice) + "," + std::to_string(in.parallel_tool_calls) + "," +
                     std::to_string(in.reasoning_format) + "," + std::to_string(in.enable_thinking) + "," +
                     std::to_string(in.add_bos) + "," + std::to_string(in.add_eos));
        put(key, v.extra_context.at("datetime").get<std::string>());
        put(key, v.extra_context.at("date_string").get<std::string>());
        v.key = std::move(key);
        return v;
    }

    // The messages as common_chat_templates_apply_jinja hands them to the template (pinned chat.cpp:
    // render_message_to_json, messages_inp_normalizer, then the workarounds for the template's caps).
    static common_json template_messages(const std::vector<const common_chat_msg*>& messages,
                                         const common_chat_template& tmpl) {
        const jinja::caps caps = tmpl.original_caps();
        common_json out = common_json::array();
        const bool only_string = caps.supports_string_content && !caps.supports_typed_content;
        const bool only_typed = !caps.supports_string_content && caps.supports_typed_content;
        for (const common_chat_msg* m : messages) {
            common_json j = m->to_json_oaicompat(false);
            if (j.contains("content")) {
                common_json& content = j.at("content");
                if (only_typed && content.is_string()) {
                    common_json part = common_json::object();
                    part["type"] = "text";
                    part["text"] = content.get<std::string>();
                    common_json parts = common_json::array();
                    parts.push_back(part);
                    content = parts;
                } else if (only_string && content.is_array()) {
                    content = join_parts(content);
                }
            }
            out.push_back(j);
        }
        if (!contains(tmpl.source(), "<|channel|>")) {
            for (size_t i = 0; i < out.size(); ++i) {
                common_json& m = out.at(i);
                if (m.contains("role") && m.at("role") == "developer") {
                    m["role"] = "system";
                }
            }
        }
        if (!caps.supports_system_role && out.size() > 0 && out.front().at("role") == "system") {
            if (out.size() > 1) {
                std::string merged =
                    out.front().at("content").get<std::string>() + "\n" + out.at(1).at("content").get<std::string>();
                out.at(1)["content"] = merged;
            }
            out.erase(size_t{0});
        }
        if (caps.supports_tool_calls) {
            for (size_t i = 0; i < out.size(); ++i) {
                common_json& m = out.at(i);
                if (m.contains("tool_calls") && !m.contains("content")) {
                    m["content"] = "";
                }
            }
        }
        if (caps.supports_object_arguments) {
            for (size_t i = 0; i < out.size(); ++i) {
                common_json& m = out.at(i);
                if (!m.contains("tool_calls")) continue;
                common_json& calls = m.at("tool_calls");
                for (size_t c = 0; c < calls.size(); ++c) {
                    common_json& call = calls.at(c);
                    if (call.contains("function") && call.at("function").contains("arguments")) {
                        common_json& args = call.at("function").at("arguments");
                        if (args.is_string()) {
                            args = common_json::parse(args.get<std::string>());
                        }
                    }
                }
            }
        }
        return out;
    }

    // messages_inp_normalizer::concat_content_parts
    static std::string join_parts(const common_json& parts) {
        std::string text;
        bool last_was_media_marker = false;
        for (size_t i = 0; i < parts.size(); ++i) {
            const common_json& part = parts.at(i);
            const std::string type = part.value("type", std::string());
            bool add_new_line = true;
            if (type == "text") {
                add_new_line = !last_was_media_marker && !text.empty();
                last_was_media_marker = false;
            } else if (type == "media_marker") {
                add_new_line = false;
                last_was_media_marker = true;
            } else {
                continue;
            }
            if (add_new_line) text += '\n';
            text += part.value("text", std::string());
        }
        return text;
    }

    std::string render_messages(const request_view& v, const std::vector<const common_chat_msg*>& messages,
                                bool add_generation_prompt) const {
        const common_chat_templates_inputs& in = *v.in;
        autoparser::generation_params p;
        p.messages = template_messages(messages, *v.tmpl->tmpl);
        p.tools = v.window_tools;
        p.tool_choice = in.tool_choice;
        p.parallel_tool_calls = in.parallel_tool_calls;
        p.reasoning_format = in.reasoning_format;
        p.enable_thinking = in.enable_thinking;
        p.add_generation_prompt = add_generation_prompt;
        p.extra_context = v.extra_context;
        p.add_bos = tokens.add_bos;
        p.add_eos = tokens.add_eos;
        return common_chat_template_direct_apply(*v.tmpl->tmpl, p);
    }

    // Where the head ends for a window starting at `cut`: after the first user message. Templates that check that
    // roles alternate (by index parity) see the head's last role next to the window's first, so a window starting
    // with a user message gets the first user message's plain answer in its head too.
    size_t head_end(const request_view& v, size_t first_user_end, size_t cut) const {
        const auto& messages = v.in->messages;
        if (first_user_end == npos || cut < first_user_end) return npos;
        if (!v.tmpl->parity || !is_user(messages[cut])) return first_user_end;
        const size_t h = first_user_end + 1;
        if (h > cut || !is_assistant(messages[h - 1]) || !messages[h - 1].tool_calls.empty()) return npos;
        return h;
    }

    // What the template renders for M[cut..n) when rendering M[0..h) + M[cut..n); nullopt if the head's own
    // rendering is not where the window's starts.
    // The head's system and user messages render in windows with their text replaced by a stand-in: the engine's
    // cost of a render grows with the text it carries (an agent's 150 KB system prompt: ~0.5 ms per render, three
    // renders per splice), and the head's own text is cut off the window anyway. Like the tools' stand-in, this
    // holds for templates that render the messages after the head without reading the head's text; a template that
    // does (a "/no_think" in the system prompt) makes the windows of the conversation's first, full render disagree
    // with common's prompt, which learn() checks, and its conversation is then not remembered. A later splice has
    // the same head as the conversation it extends. The first user message stays plain (templates look for tags).
    static std::vector<const common_chat_msg*> head_with_stand_ins(const std::vector<common_chat_msg>& messages,
                                                                   size_t h, std::vector<common_chat_msg>& stand_ins) {
        static const std::string stand_in_text = "keepwarm stand-in";
        stand_ins.reserve(h);
        std::vector<const common_chat_msg*> head;
        for (size_t i = 0; i < h; ++i) {
            const common_chat_msg& m = messages[i];
            if ((m.role != "system" && m.role != "user") || !m.content_parts.empty() ||
                m.content.size() <= stand_in_text.size()) {
                head.push_back(&m);
                continue;
            }
            common_chat_msg& s = stand_ins.emplace_back();
            s.role = m.role;
            s.content = stand_in_text;
            s.reasoning_content = m.reasoning_content;
            s.tool_calls = m.tool_calls;
            s.tool_name = m.tool_name;
            s.tool_call_id = m.tool_call_id;
            head.push_back(&s);
        }
        return head;
    }

    std::optional<std::string> render_window(const request_view& v, key_store* store,
                                             const std::vector<message_hash>& hashes, size_t h, size_t cut,
                                             bool add_generation_prompt) const {
        const auto& messages = v.in->messages;
        std::vector<common_chat_msg> stand_ins;
        const std::vector<const common_chat_msg*> head = head_with_stand_ins(messages, h, stand_ins);
        std::vector<const common_chat_msg*> window = head;
        for (size_t i = cut; i < messages.size(); ++i) window.push_back(&messages[i]);

        std::string head_text;
        message_hash head_hash{};
        {
            std::string buf;
            for (size_t i = 0; i < h; ++i) {
                put(buf, std::to_string(hashes[i].low) + ":" + std::to_string(hashes[i].high));
            }
            const XXH128_hash_t hh = XXH3_128bits(buf.data(), buf.size());
            head_hash = {hh.low64, hh.high64};
        }
        bool have_head = false;
        if (store) {
            std::lock_guard lock(mu);
            auto it = store->heads.find({head_hash, h});
            if (it != store->heads.end()) {
                head_text = it->second;
                have_head = true;
            }
        }
        if (!have_head) {
            head_text = render_messages(v, head, false);
            if (store) {
                std::lock_guard lock(mu);
                if (store->heads.size() > 64) store->heads.clear();
                store->heads[{head_hash, h}] = head_text;
            }
        }
        std::string text = render_messages(v, window, add_generation_prompt);
        if (text.compare(0, head_text.size(), head_text) != 0) {
            return std::nullopt;
        }
        return text.substr(head_text.size());
    }

    struct splice_result {
        common_chat_params params;
        conversation remembered;
    };

    // The splice of v.in from `from` (a conversation of the same key), or nullopt.
    std::optional<splice_result> splice(const request_view& v, key_store& store, const conversation& from,
                                        const std::vector<message_hash>& hashes) const {
        const auto& messages = v.in->messages;
        const size_t n = messages.size();
        size_t k = 0;
        while (k < n && k < from.hashes.size() && hashes[k] == from.hashes[k]) ++k;
        const size_t first_user = std::find_if(messages.begin(), messages.end(), is_user) - messages.begin();
        if (first_user == n || !is_plain_user(messages[first_user])) return std::nullopt;
        const size_t first_user_end = first_user + 1;
        const size_t last_user = last_index(messages, is_user);
        const bool same_last_query = last_user != npos && last_user == from.last_user && last_user < k;

        size_t cut = npos, h = npos;
        for (auto it = from.cuts.rbegin(); it != from.cuts.rend(); ++it) {
            const size_t j = it->first;
            if (j >= k || j == 0) continue;
            if (n - j > opts.max_window) break;
            if (!is_user(messages[j]) && !is_assistant(messages[j])) continue;
            const bool after_new_query = is_plain_user(messages[j]) || is_plain_user(messages[j - 1]);
            if (!same_last_query && !after_new_query) continue;
            const size_t hj = head_end(v, first_user_end, j);
            if (hj == npos) continue;
            cut = j;
            h = hj;
            break;
        }
        if (cut == npos) return std::nullopt;

        auto with = render_window(v, &store, hashes, h, cut, true);
        if (!with) return std::nullopt;
        auto without = render_window(v, &store, hashes, h, cut, false);
        if (!without) return std::nullopt;

        const size_t prefix_len = from.cuts.at(cut);
        splice_result out;
        conversation& c = out.remembered;
        c.key = v.key;
        c.hashes = hashes;
        c.last_user = last_user;
        c.prompt.reserve(prefix_len + with->size());
        c.prompt.append(from.prompt, 0, prefix_len);
        c.prompt.append(*with);
        // common: the generation prompt is what the render with it adds after the longest common prefix with the
        // render without it; both start with the same prefix here.
        size_t common_len = 0;
        while (common_len < with->size() && common_len < without->size() &&
               (*with)[common_len] == (*without)[common_len]) {
            ++common_len;
        }
        const std::string generation_prompt = with->substr(common_len);
        {
            std::lock_guard lock(mu);
            const common_chat_params* profile = store.profile(generation_prompt);
            if (!profile) return std::nullopt;
            out.params = *profile;
        }
        out.params.prompt = c.prompt;

        for (const auto& [j, offset] : from.cuts) {
            if (j < cut) c.cuts[j] = offset;
        }
        c.cuts[cut] = prefix_len;
        if (add_cuts(v, &store, c, first_user_end, false) > 0) {
            return std::nullopt;  // the window from the cut and a shorter one disagree: one of them is wrong
        }
        return out;
    }

    // Records where the messages the next turn may cut at start in c.prompt, from window renders whose text must be
    // the prompt's tail; returns how many were not. The candidates are the last assistant message (the next request
    // of a tool loop cuts there) and the last user message (a new user turn cuts there, and so does a tool loop when
    // it is the later of the two). `both`: render both, else only the later one (the other one usually is an
    // inherited cut already).
    int add_cuts(const request_view& v, key_store* store, conversation& c, size_t first_user_end, bool both) const {
        const auto& messages = v.in->messages;
        const size_t n = messages.size();
        const size_t last_assistant = last_index(messages, is_assistant);
        size_t candidates[2] = {last_assistant, c.last_user};
        if (!both) {
            const bool assistant_later =
                last_assistant != npos && (c.last_user == npos || last_assistant > c.last_user);
            candidates[assistant_later ? 1 : 0] = npos;
        }
        int disagreements = 0;
        for (size_t j : candidates) {
            if (j == npos || j == 0 || c.cuts.count(j)) continue;
            if (n - j > opts.max_window || (!c.cuts.empty() && j < c.cuts.rbegin()->first)) continue;
            const size_t h = head_end(v, first_user_end, j);
            if (h == npos) continue;
            auto tail = render_window(v, store, c.hashes, h, j, true);
            if (!tail) continue;
            if (tail->size() > c.prompt.size() ||
                c.prompt.compare(c.prompt.size() - tail->size(), tail->size(), *tail) != 0) {
                disagreements++;
                continue;
            }
            c.cuts[j] = c.prompt.size() - tail->size();
        }
        return disagreements;
    }

    // A conversation for a full render's result, with its cuts checked against common's prompt; nullopt when there
    // is nothing to cut at, or (`disagreed` set) when a window or the generation prompt is not what common rendered.
    std::optional<conversation> learn(const request_view& v, key_store* store, const common_chat_params& full,
                                      bool& disagreed) const {
        disagreed = false;
        const auto& messages = v.in->messages;
        conversation c;
        c.key = v.key;
        c.hashes = hash_messages(messages);
        c.last_user = last_index(messages, is_user);
        c.prompt = full.prompt;
        const size_t first_user = std::find_if(messages.begin(), messages.end(), is_user) - messages.begin();
        if (first_user == messages.size() || !is_plain_user(messages[first_user])) return std::nullopt;
        if (add_cuts(v, store, c, first_user + 1, true) > 0) {
            disagreed = true;
            return std::nullopt;
        }
        if (c.cuts.empty()) return std::nullopt;
        // The generation prompt from the shortest window must be common's.
        const size_t j = c.cuts.rbegin()->first;
        const size_t h = head_end(v, first_user + 1, j);
        auto with = render_window(v, store, c.hashes, h, j, true);
        auto without = render_window(v, store, c.hashes, h, j, false);
        if (!with || !without) return std::nullopt;
        size_t common_len = 0;
        while (common_len < with->size() && common_len < without->size() &&
               (*with)[common_len] == (*without)[common_len]) {
            ++common_len;
        }
        if (with->substr(common_len) != full.generation_prompt) {
            disagreed = true;
            return std::nullopt;
        }
        return c;
    }

    // Adds a full render's non-prompt result as a profile; false if it contradicts one with the same generation prompt.
    static bool add_profile(key_store& store, const common_chat_params& full) {
        if (const common_chat_params* p = store.profile(full.generation_prompt)) {
            return same_params_except_prompt(*p, full);
        }
        common_chat_params p = full;
        p.prompt.clear();
        store.profiles.push_back(std::move(p));
        return true;
    }

    void insert(conversation c) {
        // caller holds mu
        for (auto it = recent.begin(); it != recent.end(); ++it) {
            if (it->key == c.key && it->hashes == c.hashes) {
                recent_bytes -= it->bytes();
                recent.erase(it);
                break;
            }
        }
        recent_bytes += c.bytes();
        recent.push_front(std::move(c));
        while (recent.size() > opts.max_conversations || (recent_bytes > opts.max_bytes && recent.size() > 1)) {
            recent_bytes -= recent.back().bytes();
            recent.pop_back();
        }
    }

    // Replays two synthetic chats turn by turn through common and the splicer; true if every splice was exact and
    // at least two were made.
    bool check_key(const common_chat_templates_inputs& in);
};

namespace {

common_chat_msg make_msg(const std::string& role, const std::string& content, const std::string& reasoning = "") {
    common_chat_msg m;
    m.role = role;
    m.content = content;
    m.reasoning_content = reasoning;
    return m;
}

common_chat_msg make_call(const std::string& name, const std::string& id, const std::string& args,
                          const std::string& content = "", const std::string& reasoning = "") {
    common_chat_msg m = make_msg("assistant", content, reasoning);
    common_chat_tool_call call;
    call.name = name;
    call.id = id;
    call.arguments = args;
    m.tool_calls.push_back(call);
    return m;
}

common_chat_msg make_result(const std::string& id, const std::string& name, const std::string& content) {
    common_chat_msg m = make_msg("tool", content);
    m.tool_call_id = id;
    m.tool_name = name;
    return m;
}

// Turn by turn: each element is what a client appends before its next request.
std::vector<std::vector<common_chat_msg>> synthetic_chats(const std::string& tool) {
    const std::string args = "{\"city\": \"Paris \\\"15e\\\"\", \"days\": 3}";
    std::vector<std::vector<common_chat_msg>> plain = {
        {make_msg("system", "  You are terse.\nAnswer in \"quotes\" \\ when asked.  "),
         make_msg("user", "Hi there.\n\n")},
        {make_msg("assistant", "\nHello! Grüße, 東京 🎉.\n", "The user greets.\n"),
         make_msg("user", "  What is {\"json\": [1, 2]}?")},
        {make_msg("assistant", "<think>\nan inline thought\n</think>\n\nIt is JSON.", ""),
         make_msg("user", "Thanks\tagain")},
        {make_msg("assistant", "You're welcome.  ", "  polite  "), make_msg("user", "Bye.")},
        {make_msg("assistant", "Bye!"), make_msg("user", "One more: 3 < 4 > 2?")},
    };
    std::vector<std::vector<common_chat_msg>> tools = {
        {make_msg("user", "Weather in Paris and Rome?")},
        {make_call(tool, "Ab3dE5gH1", args, "", "I need the weather.\n"),
         make_result("Ab3dE5gH1", tool, "{\"temp\": 21, \"sky\": \"clear\"}")},
        {make_call(tool, "Zx9yW8vU7", args, "Checking two.\n"), make_result("Zx9yW8vU7", tool, "  rainy\n")},
        {make_msg("assistant", "Paris: 21, clear. Rome: rainy.", "Both known."), make_msg("user", "And Oslo?")},
        {make_call(tool, "Qw2eR4tY6", "{\"city\": \"Oslo\"}", "", "One call."),
         make_result("Qw2eR4tY6", tool, "<b>snow</b>")},
        {make_msg("assistant", "<think>x</think>Snow in Oslo."), make_msg("user", "Thanks!")},
    };
    // Both chats, flattened into turn sequences separated by an empty turn.
    std::vector<std::vector<common_chat_msg>> out = plain;
    out.push_back({});
    out.insert(out.end(), tools.begin(), tools.end());
    return out;
}

}  // namespace

bool chat_render_cache::impl::check_key(const common_chat_templates_inputs& in) {
    std::string tool = "get_weather";
    if (!in.tools.empty()) tool = in.tools.front().name;
    key_store store;  // this check's own profiles, heads and conversations
    std::list<conversation> chat_conversations;
    int spliced = 0;
    common_chat_templates_inputs turn = in;
    turn.messages.clear();
    bool chat_broken = false;
    for (const auto& appended : synthetic_chats(tool)) {
        if (appended.empty()) {  // next chat
            turn.messages.clear();
            chat_conversations.clear();
            chat_broken = false;
            continue;
        }
        if (chat_broken) continue;
        turn.messages.insert(turn.messages.end(), appended.begin(), appended.end());
        common_chat_params reference;
        try {
            reference = common_chat_templates_apply(templates, turn);
        } catch (...) {
            chat_broken = true;  // the template does not take this chat (no tools, no system role, ...)
            continue;
        }
        auto v = view(turn);
        if (!v) return false;
        const auto hashes = hash_messages(turn.messages);
        if (!chat_conversations.empty()) {
            std::optional<splice_result> got;
            try {
                got = splice(*v, store, chat_conversations.front(), hashes);
            } catch (...) {
                return false;  // common rendered this chat, a window of it failed
            }
            if (got) {
                if (got->params.prompt != reference.prompt || !same_params_except_prompt(got->params, reference)) {
                    return false;
                }
                ++spliced;
            }
        }
        if (!add_profile(store, reference)) return false;
        try {
            bool disagreed = false;
            if (auto c = learn(*v, &store, reference, disagreed)) {
                chat_conversations.push_front(std::move(*c));
            }
            if (disagreed) return false;
        } catch (...) {
        }
    }
    return spliced >= 2;
}

chat_render_cache::chat_render_cache(const common_chat_templates* templates, template_tokens tokens)
    : chat_render_cache(templates, std::move(tokens), options()) {}

chat_render_cache::chat_render_cache(const common_chat_templates* templates, template_tokens tokens, options opts)
    : impl_(std::make_unique<impl>(templates, std::move(tokens), opts)) {}

chat_render_cache::~chat_render_cache() = default;

std::optional<common_chat_params> chat_render_cache::render(const common_chat_templates_inputs& in) {
    impl& d = *impl_;
    try {
        auto v = d.view(in);
        if (!v) {
            std::lock_guard lock(d.mu);
            d.stats.not_spliced++;
            return std::nullopt;
        }
        const auto hashes = hash_messages(in.messages);
        std::shared_ptr<key_store> store;
        conversation from;
        {
            std::lock_guard lock(d.mu);
            auto ks = d.keys.find(v->key);
            if (ks != d.keys.end() && ks->second->status == key_store::state::trusted) {
                store = ks->second;
                // The remembered conversation sharing the most leading messages.
                size_t best = 0;
                auto best_it = d.recent.end();
                for (auto it = d.recent.begin(); it != d.recent.end(); ++it) {
                    if (it->key != v->key) continue;
                    size_t k = 0;
                    while (k < hashes.size() && k < it->hashes.size() && hashes[k] == it->hashes[k]) ++k;
                    if (k > best) {
                        best = k;
                        best_it = it;
                    }
                }
                if (best_it != d.recent.end()) {
                    d.recent.splice(d.recent.begin(), d.recent, best_it);
                    from = d.recent.front();
                }
            }
        }
        std::optional<impl::splice_result> out;
        if (store && !from.hashes.empty()) {
            out = d.splice(*v, *store, from, hashes);
        }
        std::lock_guard lock(d.mu);
        if (!out) {
            d.stats.not_spliced++;
            return std::nullopt;
        }
        d.stats.spliced++;
        d.insert(std::move(out->remembered));
        return std::move(out->params);
    } catch (...) {
        std::lock_guard lock(d.mu);
        d.stats.not_spliced++;
        return std::nullopt;
    }
}

void chat_render_cache::remember(const common_chat_templates_inputs& in, const common_chat_params& full) {
    impl& d = *impl_;
    try {
        auto v = d.view(in);
        if (!v) return;
        std::shared_ptr<key_store> store;
        {
            std::lock_guard lock(d.mu);
            auto& slot = d.keys[v->key];
            if (!slot) {
                if (d.keys.size() > 64) {
                    // Keys change with tools, options and the date; forget the others rather than grow.
                    auto keep = d.keys.extract(v->key);
                    d.keys.clear();
                    d.keys.insert(std::move(keep));
                }
                d.keys[v->key] = std::make_shared<key_store>();
            }
            store = d.keys[v->key];
        }
        key_store::state status;
        {
            std::lock_guard lock(d.mu);
            status = store->status;
        }
        if (status == key_store::state::unchecked) {
            const bool ok = d.check_key(in);
            std::lock_guard lock(d.mu);
            if (store->status == key_store::state::unchecked) {
                store->status = ok ? key_store::state::trusted : key_store::state::refused;
                (ok ? d.stats.keys_trusted : d.stats.keys_refused)++;
            }
            status = store->status;
        }
        if (status != key_store::state::trusted) return;
        {
            std::lock_guard lock(d.mu);
            if (!impl::add_profile(*store, full)) {
                // common's result depends on more than the generation prompt here: stop splicing this key.
                store->status = key_store::state::refused;
                d.stats.keys_refused++;
                return;
            }
        }
        bool disagreed = false;
        auto c = d.learn(*v, store.get(), full, disagreed);
        std::lock_guard lock(d.mu);
        if (disagreed) d.stats.cuts_rejected++;
        if (c) d.insert(std::move(*c));
    } catch (...) {
    }
}

chat_render_cache::counters chat_render_cache::stats() const {
    std::lock_guard lock(impl_->mu);
    counters c = impl_->stats;
    c.conversations = impl_->recent.size();
    return c;
}

}  // namespace keepwarm

// See gauntlet-workload.h. The generator's texts are made of fixed phrase tables picked by a seeded generator, so a
// seed always gives the same file; each killer is one switch in killer_set.
#include "bench/gauntlet-workload.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>
#include <stdexcept>

namespace keepwarm::bench::gauntlet {

namespace {

[[noreturn]] void fail_line(size_t line_number, const std::string& message) {
    throw std::invalid_argument("line " + std::to_string(line_number) + ": " + message);
}

bool get_bool(const json& object, const char* key, bool fallback, size_t line_number, const std::string& where) {
    const auto it = object.find(key);
    if (it == object.end()) return fallback;
    if (!it->is_boolean()) fail_line(line_number, "'" + where + key + "' must be true or false");
    return it->get<bool>();
}

int64_t get_count(const json& object, const char* key, size_t line_number, const std::string& where) {
    const auto it = object.find(key);
    if (it == object.end()) return 0;
    if (!it->is_number_integer() || it->get<int64_t>() < 0) {
        fail_line(line_number, "'" + where + key + "' must be a non-negative integer");
    }
    return it->get<int64_t>();
}

// A small deterministic source of picks: mt19937_64's sequence is fixed by the standard, the distributions are not.
struct picker {
    std::mt19937_64 rng;
    explicit picker(uint64_t seed) : rng(seed) {}
    size_t below(size_t n) { return static_cast<size_t>(rng() % n); }
    template <size_t N>
    const char* pick(const std::array<const char*, N>& table) {
        return table[below(N)];
    }
    std::string hex(size_t digits) {
        static const char* const digits_of = "0123456789abcdef";
        std::string out;
        for (size_t i = 0; i < digits; ++i) out += digits_of[below(16)];
        return out;
    }
    std::string uuid() { return hex(8) + "-" + hex(4) + "-4" + hex(3) + "-a" + hex(3) + "-" + hex(12); }
};

constexpr std::array<const char*, 12> section_titles = {
    "Tone and style",  "Proactiveness",     "Following conventions", "Code style",
    "Task management", "Doing tasks",       "Tool usage policy",     "Security",
    "Git and commits", "Testing practices", "Working with files",    "Asking for help"};
constexpr std::array<const char*, 16> openers = {"When the user asks you to",
                                                 "Before you",
                                                 "After you",
                                                 "If you are unsure whether to",
                                                 "Never",
                                                 "Always",
                                                 "Prefer to",
                                                 "Do not hesitate to",
                                                 "It is important that you",
                                                 "You should",
                                                 "Avoid trying to",
                                                 "Only when explicitly asked should you",
                                                 "Remember that you must not",
                                                 "Take care to",
                                                 "Whenever possible,",
                                                 "As a rule, you"};
constexpr std::array<const char*, 16> actions = {"edit an existing file",
                                                 "run the project's test suite",
                                                 "create a new module",
                                                 "search the codebase",
                                                 "commit changes to the repository",
                                                 "refactor a function",
                                                 "read the surrounding code",
                                                 "install a dependency",
                                                 "write a shell command",
                                                 "answer a question about the code",
                                                 "summarize what you changed",
                                                 "open a pull request",
                                                 "rename a symbol",
                                                 "delete generated files",
                                                 "update the documentation",
                                                 "check the build output"};
constexpr std::array<const char*, 16> tails = {"so that the user can follow what you did.",
                                               "and keep your answer short and direct.",
                                               "unless the user has asked for a detailed explanation.",
                                               "and verify the result with the available tools.",
                                               "because the user may be reviewing every change.",
                                               "while respecting the conventions already used in the project.",
                                               "and mention the file path and line number when you refer to code.",
                                               "without adding comments that restate what the code does.",
                                               "and check that the libraries you use are already dependencies.",
                                               "then report the outcome in one or two sentences.",
                                               "rather than guessing at the structure of the code.",
                                               "and never expose secrets, keys or credentials in the output.",
                                               "using the dedicated tool instead of a shell command where one exists.",
                                               "and stop to ask the user when the request is ambiguous.",
                                               "and keep the diff as small as the task allows.",
                                               "since the terminal renders Markdown in a monospace font."};

constexpr std::array<const char*, 8> user_tasks = {
    "The integration tests in tests/api fail since yesterday's merge. Find out why and fix it.",
    "Add a --dry-run flag to the deploy command that prints what would change without changing it.",
    "Our request logger drops the status code for streamed responses. Can you look into it?",
    "Refactor the configuration loader so that environment variables override the file values.",
    "Write unit tests for the rate limiter, including the burst and the refill behaviour.",
    "The CLI prints a stack trace when the config file is missing; make it print a clear error instead.",
    "Find every place where we parse dates by hand and switch them to the shared helper.",
    "Explain how the cache invalidation works in the storage layer and whether it can race."};

struct tool_parameter {
    const char* name;
    const char* type;
    const char* description;
};
struct tool_definition {
    const char* name;
    const char* description;
    std::vector<tool_parameter> parameters;
};

const std::vector<tool_definition>& tool_catalogue() {
    static const std::vector<tool_definition> tools = {
        {"Read",
         "Reads a file from the local filesystem. Returns its lines with line numbers.",
         {{"file_path", "string", "Absolute path of the file"},
          {"offset", "integer", "Line to start at"},
          {"limit", "integer", "Number of lines to read"}}},
        {"Write",
         "Writes a file to the local filesystem, replacing it if it exists.",
         {{"file_path", "string", "Absolute path of the file"}, {"content", "string", "The content to write"}}},
        {"Edit",
         "Replaces an exact string in a file with another string.",
         {{"file_path", "string", "Absolute path of the file"},
          {"old_string", "string", "The text to replace"},
          {"new_string", "string", "The text to replace it with"},
          {"replace_all", "boolean", "Replace every occurrence"}}},
        {"MultiEdit",
         "Makes several edits to one file in one operation.",
         {{"file_path", "string", "Absolute path of the file"}, {"edits", "array", "The edits, applied in order"}}},
        {"Bash",
         "Runs a bash command in a persistent shell session with an optional timeout.",
         {{"command", "string", "The command to run"},
          {"timeout", "integer", "Timeout in milliseconds"},
          {"description", "string", "What the command does, in a few words"}}},
        {"BashOutput", "Reads the output of a background shell.", {{"bash_id", "string", "The shell's id"}}},
        {"KillShell", "Stops a background shell.", {{"shell_id", "string", "The shell's id"}}},
        {"Glob",
         "Finds files by name pattern, sorted by modification time.",
         {{"pattern", "string", "The glob pattern"}, {"path", "string", "Folder to search in"}}},
        {"Grep",
         "Searches file contents with a regular expression (ripgrep).",
         {{"pattern", "string", "The regular expression"},
          {"path", "string", "File or folder to search in"},
          {"glob", "string", "Only files matching this glob"},
          {"output_mode", "string", "content, files_with_matches or count"}}},
        {"LS",
         "Lists the files and folders in a folder.",
         {{"path", "string", "Absolute path of the folder"}, {"ignore", "array", "Glob patterns to leave out"}}},
        {"NotebookRead",
         "Reads a Jupyter notebook and returns its cells with their outputs.",
         {{"notebook_path", "string", "Absolute path of the notebook"}}},
        {"NotebookEdit",
         "Replaces, inserts or deletes one cell of a Jupyter notebook.",
         {{"notebook_path", "string", "Absolute path of the notebook"},
          {"cell_id", "string", "The cell's id"},
          {"new_source", "string", "The cell's new source"},
          {"edit_mode", "string", "replace, insert or delete"}}},
        {"WebFetch",
         "Fetches a URL and answers a prompt about its content.",
         {{"url", "string", "The URL to fetch"}, {"prompt", "string", "What to extract from the page"}}},
        {"WebSearch",
         "Searches the web and returns result blocks with titles and URLs.",
         {{"query", "string", "The search query"}, {"allowed_domains", "array", "Only these domains"}}},
        {"TodoWrite",
         "Creates and updates the structured task list of the current session.",
         {{"todos", "array", "The updated task list"}}},
        {"Task",
         "Starts a sub-agent that works on a task on its own and reports back.",
         {{"description", "string", "A short description of the task"},
          {"prompt", "string", "The task for the agent"},
          {"subagent_type", "string", "The kind of agent"}}},
        {"ExitPlanMode",
         "Presents the plan to the user and leaves plan mode.",
         {{"plan", "string", "The plan, in Markdown"}}},
        {"SlashCommand", "Runs a custom slash command.", {{"command", "string", "The command with its arguments"}}},
        {"GitStatus", "Shows the working tree status of the repository.", {{"path", "string", "Repository folder"}}},
        {"GitDiff",
         "Shows the changes between commits, the index and the working tree.",
         {{"path", "string", "Repository folder"}, {"staged", "boolean", "Show staged changes"}}},
        {"GitLog",
         "Shows commit logs.",
         {{"path", "string", "Repository folder"}, {"max_count", "integer", "Number of commits"}}},
        {"RunTests",
         "Runs the project's tests and returns failures with their output.",
         {{"filter", "string", "Only tests matching this pattern"}, {"timeout", "integer", "Seconds"}}},
        {"Diagnostics",
         "Returns compiler and linter diagnostics for a file.",
         {{"file_path", "string", "Absolute path of the file"}}},
        {"FindSymbol",
         "Finds the definition and references of a symbol with the language server.",
         {{"symbol", "string", "The symbol's name"}, {"kind", "string", "function, type or variable"}}},
        {"AskUser",
         "Asks the user a question and waits for the answer.",
         {{"question", "string", "The question"}, {"options", "array", "Answers to choose from"}}},
        {"Memory",
         "Reads or writes the project's long-term notes.",
         {{"action", "string", "read or write"}, {"note", "string", "The note to store"}}},
    };
    return tools;
}

json tool_json(const tool_definition& tool, const std::string& name, wire_api api) {
    json schema = {{"type", "object"}, {"properties", json::object()}, {"required", json::array()}};
    for (const tool_parameter& p : tool.parameters) {
        json property = {{"type", p.type}, {"description", p.description}};
        if (std::string_view(p.type) == "array") property["items"] = {{"type", "string"}};
        schema["properties"][p.name] = property;
    }
    schema["required"].push_back(tool.parameters.front().name);
    schema["additionalProperties"] = false;
    if (api == wire_api::anthropic) {
        return {{"name", name}, {"description", tool.description}, {"input_schema", schema}};
    }
    return {{"type", "function"},
            {"function", {{"name", name}, {"description", tool.description}, {"parameters", schema}}}};
}

json scripted_tool_call(picker& pick, int agent) {
    const std::string project = "/home/user/project-" + std::to_string(agent + 1);
    switch (pick.below(3)) {
        case 0:
            return {{"name", "Read"},
                    {"arguments", {{"file_path", project + "/src/module_" + std::to_string(pick.below(40)) + ".cpp"}}}};
        case 1:
            return {{"name", "Grep"}, {"arguments", {{"pattern", "parse_" + pick.hex(3)}, {"path", project}}}};
        default:
            return {{"name", "Bash"},
                    {"arguments", {{"command", "cd " + project + " && make test"}, {"description", "Run the tests"}}}};
    }
}

// Sentences until the text reaches `tokens` as `count_tokens` counts them (or 4 chars per token).
std::string system_prompt_text(int tokens, picker& pick, const std::function<size_t(const std::string&)>& count) {
    std::string text =
        "You are an interactive command-line agent that helps users with software engineering tasks. Use the "
        "instructions below and the tools available to you to assist the user.\n";
    double chars_per_token = 4;
    bool measured = false;
    while (true) {
        const bool at_target = static_cast<double>(text.size()) >= tokens * chars_per_token;
        if (count && !measured && (text.size() >= 2000 || at_target)) {
            // Measure once, on the first 2000 chars, then aim at the measured ratio.
            const size_t n = count(text);
            if (n > 0) chars_per_token = static_cast<double>(text.size()) / static_cast<double>(n);
            measured = true;
            continue;
        }
        if (at_target) break;
        text += "\n# ";
        text += pick.pick(section_titles);
        text += "\n";
        for (int i = 0; i < 6; ++i) {
            text += "- ";
            text += pick.pick(openers);
            text += " ";
            text += pick.pick(actions);
            text += " ";
            text += pick.pick(tails);
            text += "\n";
        }
    }
    return text;
}

std::string default_model(wire_api api, bool alternate) {
    if (api == wire_api::anthropic) return alternate ? "claude-opus-4-1" : "claude-sonnet-4-5";
    return alternate ? "gpt-4o-mini" : "gpt-4o";
}

}  // namespace

const char* api_name(wire_api api) {
    return api == wire_api::anthropic ? "anthropic" : "openai";
}

wire_api parse_api(const std::string& name) {
    if (name == "openai") return wire_api::openai;
    if (name == "anthropic") return wire_api::anthropic;
    throw std::invalid_argument("unknown API '" + name + "' (openai or anthropic)");
}

workload_line parse_workload_line(std::string_view text, size_t line_number) {
    json j;
    try {
        j = json::parse(text);
    } catch (const json::parse_error& e) {
        fail_line(line_number, std::string("not valid JSON: ") + e.what());
    }
    if (!j.is_object()) fail_line(line_number, "must be a JSON object");
    static const std::array<const char*, 10> known = {
        "at",    "agent", "api", "body", "history", "strip_reasoning", "injected", "tool_call", "tool_result_chars",
        "events"};
    for (const auto& [key, value] : j.items()) {
        if (std::find_if(known.begin(), known.end(), [&](const char* k) { return key == k; }) == known.end()) {
            fail_line(line_number, "unknown field '" + key + "'");
        }
    }
    workload_line line;
    line.line_number = line_number;
    if (const auto at = j.find("at"); at != j.end()) {
        if (!at->is_number() || at->get<double>() < 0) fail_line(line_number, "'at' must be a number >= 0 (seconds)");
        line.send_at_s = at->get<double>();
    }
    const auto agent = j.find("agent");
    if (agent == j.end() || !agent->is_string() || agent->get<std::string>().empty()) {
        fail_line(line_number, "'agent' must be a non-empty string");
    }
    line.agent = agent->get<std::string>();
    const auto api = j.find("api");
    if (api == j.end() || !api->is_string()) fail_line(line_number, "'api' must be \"openai\" or \"anthropic\"");
    try {
        line.api = parse_api(api->get<std::string>());
    } catch (const std::invalid_argument& e) {
        fail_line(line_number, std::string("'api': ") + e.what());
    }
    const auto body = j.find("body");
    if (body == j.end() || !body->is_object()) fail_line(line_number, "'body' must be a JSON object");
    line.body = *body;
    if (const auto messages = line.body.find("messages"); messages != line.body.end() && !messages->is_array()) {
        fail_line(line_number, "'body.messages' must be an array");
    }
    line.with_history = get_bool(j, "history", true, line_number, "");
    line.strip_reasoning = get_bool(j, "strip_reasoning", false, line_number, "");
    if (const auto injected = j.find("injected"); injected != j.end()) {
        if (!injected->is_object()) fail_line(line_number, "'injected' must be an object");
        if (const auto prefix = injected->find("system_prefix"); prefix != injected->end()) {
            if (!prefix->is_string()) fail_line(line_number, "'injected.system_prefix' must be a string");
            line.injected_system_prefix = prefix->get<std::string>();
        }
    }
    if (const auto call = j.find("tool_call"); call != j.end()) {
        if (!call->is_object() || !call->contains("name") || !(*call)["name"].is_string() ||
            (call->contains("arguments") && !(*call)["arguments"].is_object())) {
            fail_line(line_number, "'tool_call' must be {\"name\": string, \"arguments\": object}");
        }
        line.tool_call = *call;
    }
    line.tool_result_chars = static_cast<size_t>(get_count(j, "tool_result_chars", line_number, ""));
    if (const auto events = j.find("events"); events != j.end()) {
        if (!events->is_object()) fail_line(line_number, "'events' must be an object");
        for (const auto& [key, value] : events->items()) {
            if (key != "ping" && key != "cancel_after_chunks" && key != "restart_before") {
                fail_line(line_number, "unknown event '" + key + "' (ping, cancel_after_chunks, restart_before)");
            }
        }
        line.events.ping = get_bool(*events, "ping", false, line_number, "events.");
        line.events.restart_before = get_bool(*events, "restart_before", false, line_number, "events.");
        const int64_t cancel = get_count(*events, "cancel_after_chunks", line_number, "events.");
        if (cancel > 1000000) fail_line(line_number, "'events.cancel_after_chunks' is too large");
        line.events.cancel_after_chunks = static_cast<int>(cancel);
    }
    if (line.events.ping && line.events.cancel_after_chunks > 0) {
        fail_line(line_number, "a ping can not also be cancelled");
    }
    return line;
}

std::string format_workload_line(const workload_line& line) {
    json j;
    j["at"] = line.send_at_s;
    j["agent"] = line.agent;
    j["api"] = api_name(line.api);
    if (!line.with_history) j["history"] = false;
    if (line.strip_reasoning) j["strip_reasoning"] = true;
    if (!line.injected_system_prefix.empty()) j["injected"] = {{"system_prefix", line.injected_system_prefix}};
    if (line.tool_call) j["tool_call"] = *line.tool_call;
    if (line.tool_result_chars > 0) j["tool_result_chars"] = line.tool_result_chars;
    json events = json::object();
    if (line.events.ping) events["ping"] = true;
    if (line.events.cancel_after_chunks > 0) events["cancel_after_chunks"] = line.events.cancel_after_chunks;
    if (line.events.restart_before) events["restart_before"] = true;
    if (!events.empty()) j["events"] = events;
    j["body"] = line.body;  // last: the long part
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::vector<workload_line> parse_workload(std::string_view jsonl) {
    std::vector<workload_line> lines;
    size_t number = 0;
    size_t start = 0;
    while (start < jsonl.size()) {
        size_t end = jsonl.find('\n', start);
        if (end == std::string_view::npos) end = jsonl.size();
        std::string_view text = jsonl.substr(start, end - start);
        ++number;
        start = end + 1;
        if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
        const size_t first = text.find_first_not_of(" \t");
        if (first == std::string_view::npos || text[first] == '#') continue;
        lines.push_back(parse_workload_line(text, number));
    }
    if (lines.empty()) throw std::invalid_argument("the workload has no requests");
    return lines;
}

std::string format_workload(const std::vector<workload_line>& lines) {
    std::string out;
    for (const workload_line& line : lines) out += format_workload_line(line) + "\n";
    return out;
}

killer_set killer_set::parse(const std::string& list, double ping_every_s) {
    killer_set k;
    k.ping_every_s = ping_every_s;
    if (list == "all") return k;
    k = killer_set{false, false, 0, false, false, false, false, false, false};
    if (list == "none") return k;
    std::istringstream in(list);
    for (std::string item; std::getline(in, item, ',');) {
        if (item == "cch") {
            k.cch = true;
        } else if (item == "request-id") {
            k.request_id = true;
        } else if (item == "ping") {
            k.ping_every_s = ping_every_s;
        } else if (item == "model") {
            k.model_change = true;
        } else if (item == "num-ctx") {
            k.num_ctx_change = true;
        } else if (item == "cancel") {
            k.cancel = true;
        } else if (item == "restart") {
            k.restart = true;
        } else if (item == "reasoning") {
            k.strip_reasoning = true;
        } else if (item == "clock") {
            k.clock = true;
        } else {
            throw std::invalid_argument("unknown cache killer '" + item +
                                        "' (all, none, or a list of cch, request-id, ping, model, num-ctx, cancel, "
                                        "restart, reasoning, clock)");
        }
    }
    return k;
}

std::string killer_set::describe() const {
    std::string out;
    const auto add = [&](bool on, const char* name) {
        if (on) out += (out.empty() ? "" : ",") + std::string(name);
    };
    add(cch, "cch");
    add(request_id, "request-id");
    add(ping_every_s > 0, "ping");
    add(model_change, "model");
    add(num_ctx_change, "num-ctx");
    add(cancel, "cancel");
    add(restart, "restart");
    add(strip_reasoning, "reasoning");
    add(clock, "clock");
    return out.empty() ? "none" : out;
}

namespace {
// The clock killer's time for the n-th request: 2026-12-06 11:42:17 and 7 s more per request (within one day).
std::string clock_time(size_t n) {
    const size_t seconds = (11 * 3600 + 42 * 60 + 17 + n * 7) % 86400;
    char out[32];
    std::snprintf(out, sizeof out, "2026-12-06 %02zu:%02zu:%02zu", seconds / 3600, seconds / 60 % 60, seconds % 60);
    return out;
}
}  // namespace

std::string synthetic_tool_result(size_t chars, uint64_t seed) {
    picker pick(seed);
    std::string out;
    while (out.size() < chars) {
        out += "src/module_" + std::to_string(pick.below(40)) + "/" + pick.pick(actions) +
               ".cpp:" + std::to_string(1 + pick.below(900)) + ":    " + pick.pick(openers) + " " + pick.pick(tails) +
               "\n";
    }
    out.resize(chars);
    return out;
}

std::vector<workload_line> generate_workload(const generator_options& o) {
    if (o.agents < 1 || o.turns < 1 || o.tool_rounds < 0 || o.system_tokens < 0 || o.answer_tokens < 1 || o.tools < 0 ||
        o.tool_result_tokens < 1) {
        throw std::invalid_argument("generator: agents, turns and answer tokens must be >= 1, the rest >= 0");
    }
    picker pick(o.seed);
    const std::string base_model = o.model.empty() ? default_model(o.api, false) : o.model;
    const std::string other_model = default_model(o.api, base_model == default_model(o.api, false));
    const std::string shared_prompt = system_prompt_text(o.system_tokens, pick, o.count_tokens);
    json tools = json::array();
    const auto& catalogue = tool_catalogue();
    for (int i = 0; i < o.tools; ++i) {
        const tool_definition& tool = catalogue[static_cast<size_t>(i) % catalogue.size()];
        std::string name = tool.name;
        if (static_cast<size_t>(i) >= catalogue.size()) name += "_" + std::to_string(i / catalogue.size());
        tools.push_back(tool_json(tool, name, o.api));
    }
    const size_t tool_result_chars = static_cast<size_t>(o.tool_result_tokens) * 4;
    const int cancel_turn = o.turns > 1 ? 1 : 0;
    const int restart_turn = o.turns / 2;

    std::vector<workload_line> lines;
    for (int turn = 0; turn < o.turns; ++turn) {
        for (int agent = 0; agent < o.agents; ++agent) {
            const std::string system = shared_prompt + "\n<env>\nWorking directory: /home/user/project-" +
                                       std::to_string(agent + 1) + "\nPlatform: linux\n</env>\n";
            // One request of this turn: `messages` new ones, `tool_result` answering the previous tool call.
            const auto add_request = [&](json messages, bool tool_result, bool scripted_call) {
                workload_line line;
                line.agent = "agent-" + std::to_string(agent + 1);
                line.api = o.api;
                line.strip_reasoning = o.killers.strip_reasoning;
                if (o.killers.cch) {
                    line.injected_system_prefix +=
                        "x-anthropic-billing-header: cc_version=2.1.197.abc; "
                        "cc_entrypoint=sdk-cli; cch=" +
                        pick.hex(5) + ";\n";
                }
                if (o.killers.request_id) line.injected_system_prefix += "request-id: " + pick.uuid() + "\n";
                if (o.killers.clock) {
                    line.injected_system_prefix += "Current time: " + clock_time(lines.size()) + "\n";
                }
                const std::string model = o.killers.model_change && turn % 2 == 1 ? other_model : base_model;
                json body = {{"model", model}, {"max_tokens", o.answer_tokens}, {"stream", true}};
                if (o.api == wire_api::anthropic) {
                    body["system"] = line.injected_system_prefix + system;
                    if (o.killers.strip_reasoning) body["thinking"] = {{"type", "enabled"}, {"budget_tokens", 1024}};
                } else {
                    body["stream_options"] = {{"include_usage", true}};
                    messages.insert(messages.begin(),
                                    json{{"role", "system"}, {"content", line.injected_system_prefix + system}});
                }
                if (o.killers.num_ctx_change) body["num_ctx"] = turn % 2 == 1 ? 65536 : 32768;
                if (!tools.empty()) body["tools"] = tools;
                body["messages"] = std::move(messages);
                line.body = std::move(body);
                if (tool_result) line.tool_result_chars = tool_result_chars;
                if (scripted_call) line.tool_call = scripted_tool_call(pick, agent);
                lines.push_back(std::move(line));
            };
            const std::string task = user_tasks[(static_cast<size_t>(agent) * 3 + turn) % user_tasks.size()];
            const json user = {{"role", "user"}, {"content", task}};
            const bool cancel_here = o.killers.cancel && turn == cancel_turn;
            add_request(json::array({user}), false, o.tool_rounds > 0 && !cancel_here);
            if (o.killers.restart && agent == 0 && turn == restart_turn && turn > 0) {
                lines.back().events.restart_before = true;
            }
            if (cancel_here) {
                // Cut after about a quarter of the answer, then continue it: no new messages.
                lines.back().events.cancel_after_chunks = std::max(1, o.answer_tokens / 4);
                add_request(json::array(), false, o.tool_rounds > 0);
            }
            for (int round = 1; round <= o.tool_rounds; ++round) {
                add_request(json::array(), true, round < o.tool_rounds);
            }
        }
    }
    if (o.killers.ping_every_s > 0) {
        // Pings for up to four hours; the replay stops sending them once every agent is done.
        const int pings = static_cast<int>(std::min(4 * 3600.0 / o.killers.ping_every_s, 2000.0));
        for (int i = 1; i <= pings; ++i) {
            workload_line ping;
            ping.agent = "ping";
            ping.api = o.api;
            ping.send_at_s = i * o.killers.ping_every_s;
            ping.events.ping = true;
            ping.with_history = false;
            ping.body = {{"model", base_model},
                         {"max_tokens", 1},
                         {"stream", true},
                         {"messages", json::array({json{{"role", "user"}, {"content", "quota"}}})}};
            if (o.api == wire_api::openai) ping.body["stream_options"] = {{"include_usage", true}};
            lines.push_back(std::move(ping));
        }
    }
    for (size_t i = 0; i < lines.size(); ++i) lines[i].line_number = i + 1;  // as in the file format_workload writes
    return lines;
}

}  // namespace keepwarm::bench::gauntlet

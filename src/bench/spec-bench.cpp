// See spec-bench.h. llama.cpp's drafters are driven the way llama-server drives them (tools/server/server-context.cpp):
// begin(prompt) once the prompt is in, then per step the draft parameters (n_past, the last sampled token, the tokens
// in the cache before it, the result), common_speculative_draft, and common_speculative_accept with the accepted count.
#include "bench/spec-bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "base/command-exit.h"
#include "bench/report-text.h"
#include "bench/spec-replay.h"
#include "common.h"
#include "engine/llama-runtime.h"
#include "llama-cpp.h"
#include "log.h"
#include "spec/token-history.h"
#include "speculative.h"

namespace keepwarm::bench {

namespace {

constexpr std::string_view command = "bench spec";
constexpr std::size_t max_line_bytes = std::size_t{256} << 20;  // a trajectory is ~85 KB; a hostile file is bounded
constexpr std::size_t max_draft_limit = 1024;                   // common_speculative_accept counts in 16 bits

std::string shell_quoted(const std::string& text) {
    std::string out = "'";
    for (const char c : text) {
        if (c == '\'') {
            out += "'\\''";
        } else {
            out += c;
        }
    }
    return out + "'";
}

bool ends_with(const std::string& text, std::string_view suffix) {
    return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The text of a message's content: a string, or a list of parts whose "text" fields are joined.
std::string content_text(const nlohmann::json& content) {
    if (content.is_string()) return content.get<std::string>();
    if (content.is_null()) return {};
    if (!content.is_array()) throw std::runtime_error("a message's content is neither text nor a list of parts");
    std::string text;
    for (const auto& part : content) {
        if (part.is_object() && part.contains("text") && part["text"].is_string())
            text += part["text"].get<std::string>();
    }
    return text;
}

trajectory_text parse_trajectory(const std::string& line) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!j.is_object() || !j.contains("messages") || !j["messages"].is_array()) {
        throw std::runtime_error("not an object with a \"messages\" list");
    }
    trajectory_text t;
    if (j.contains("id") && j["id"].is_string()) t.id = j["id"].get<std::string>();
    for (const auto& m : j["messages"]) {
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
            throw std::runtime_error("a message without a \"role\"");
        }
        t.messages.push_back({m["role"].get<std::string>(), content_text(m.value("content", nlohmann::json()))});
    }
    return t;
}

// A FILE* from fopen or popen, closed the way it was opened.
struct trace_file {
    FILE* file = nullptr;
    bool piped = false;
    ~trace_file() {
        if (!file) return;
        if (piped) {
            ::pclose(file);
        } else {
            std::fclose(file);
        }
    }
};

// Reads one line (without its newline) into `line`; false at the end of the file.
bool read_line(FILE* file, std::string& line, const std::string& path, std::size_t number) {
    line.clear();
    char buffer[1 << 16];
    while (std::fgets(buffer, sizeof buffer, file)) {
        line += buffer;
        if (!line.empty() && line.back() == '\n') {
            line.pop_back();
            return true;
        }
        if (line.size() > max_line_bytes) {
            throw std::runtime_error(path + ":" + std::to_string(number) + ": a line longer than " +
                                     std::to_string(max_line_bytes >> 20) + " MiB");
        }
    }
    return !line.empty();
}

std::vector<spec::token> tokenize(const llama_vocab* vocab, const std::string& text, bool specials) {
    const std::vector<llama_token> tokens = common_tokenize(vocab, text, false, specials);
    return {tokens.begin(), tokens.end()};
}

// One conversation as ChatML (<|im_start|>role\n...<|im_end|>\n, as qwen-family templates render it), message by
// message so that each turn's prompt is a prefix of the next.
spec_conversation tokenize_conversation(const llama_vocab* vocab, const trajectory_text& trajectory) {
    spec_conversation c;
    c.id = trajectory.id;
    const std::vector<spec::token> end = tokenize(vocab, "<|im_end|>", true);
    const std::vector<spec::token> newline = tokenize(vocab, "\n", false);
    const auto append = [&](const std::vector<spec::token>& tokens) {
        c.tokens.insert(c.tokens.end(), tokens.begin(), tokens.end());
    };
    for (const auto& m : trajectory.messages) {
        append(tokenize(vocab, "<|im_start|>" + m.role + "\n", true));
        const std::size_t body_start = c.tokens.size();
        append(tokenize(vocab, m.content, false));
        append(end);
        if (m.role == "assistant") c.turns.push_back({body_start, c.tokens.size() - body_start});
        append(newline);
    }
    return c;
}

// keepwarm's drafter: a suffix_drafter per turn over the run's earlier conversations, kept under one tenant.
class keepwarm_drafter final : public offline_drafter {
public:
    keepwarm_drafter(const spec::suffix_draft_options& options, std::size_t key_tokens, bool with_history)
        : history_({.token_budget = std::size_t{1} << 24, .key_tokens = key_tokens}),
          options_(options),
          with_history_(with_history) {}

    std::string name() const override { return with_history_ ? "keepwarm" : "keepwarm-no-history"; }
    void begin_turn(std::span<const spec::token> prompt) override {
        turn_ = std::make_unique<spec::suffix_drafter>(history_, "run", options_);
        turn_->append(prompt);
    }
    std::vector<spec::token> draft(std::span<const spec::token> context, std::size_t max_tokens) override {
        turn_->append(context.subspan(turn_->tokens().size()));
        return turn_->propose(max_tokens).tokens;
    }
    void accept(std::size_t /*n_accepted*/) override {}
    void end_conversation(std::span<const spec::token> tokens) override {
        if (with_history_) history_.add_stream("run", tokens);
    }

private:
    spec::token_history history_;
    spec::suffix_draft_options options_;
    bool with_history_;
    std::unique_ptr<spec::suffix_drafter> turn_;
};

// One of llama.cpp's n-gram drafters through common/speculative.h, one sequence (seq 0).
class llama_ngram_drafter final : public offline_drafter {
public:
    llama_ngram_drafter(common_speculative_type type, bool fresh_per_conversation)
        : type_(type), fresh_per_conversation_(fresh_per_conversation) {
        params_.types = {type};
        start();
    }

    std::string name() const override { return common_speculative_type_to_str(type_); }
    void begin_turn(std::span<const spec::token> prompt) override {
        cached_.assign(prompt.begin(), prompt.end());
        common_speculative_begin(spec_.get(), 0, cached_);
    }
    std::vector<spec::token> draft(std::span<const spec::token> context, std::size_t max_tokens) override {
        // The cache holds every token but the last sampled one, which the step decodes with the draft.
        cached_.insert(cached_.end(), context.begin() + static_cast<std::ptrdiff_t>(cached_.size()), context.end() - 1);
        result_.clear();
        common_speculative_get_draft_params(spec_.get(), 0) = {
            /* .drafting = */ true,
            /* .n_max    = */ static_cast<int32_t>(max_tokens),
            /* .n_past   = */ static_cast<llama_pos>(cached_.size()),
            /* .id_last  = */ context.back(),
            /* .prompt   = */ &cached_,
            /* .result   = */ &result_,
        };
        common_speculative_draft(spec_.get());
        return {result_.begin(), result_.end()};
    }
    void accept(std::size_t n_accepted) override {
        common_speculative_accept(spec_.get(), 0, static_cast<uint16_t>(n_accepted));
    }
    void end_conversation(std::span<const spec::token> /*tokens*/) override {
        if (fresh_per_conversation_) start();
    }

private:
    void start() {
        spec_.reset(common_speculative_init(params_, 1));
        if (!spec_) throw std::runtime_error("common_speculative_init made no drafter");
    }

    common_speculative_type type_;
    bool fresh_per_conversation_;
    common_params_speculative params_;  // llama-server's defaults
    common_speculative_ptr spec_;
    llama_tokens cached_;
    llama_tokens result_;
};

}  // namespace

std::vector<trajectory_text> read_trajectories(const std::string& path, std::size_t limit) {
    trace_file in;
    if (ends_with(path, ".xz")) {
        if (std::ifstream probe(path); !probe) throw std::runtime_error(path + ": cannot be read");
        in.file = ::popen(("xz -dc -- " + shell_quoted(path)).c_str(), "r");
        in.piped = true;
    } else {
        in.file = std::fopen(path.c_str(), "rb");
    }
    if (!in.file) throw std::runtime_error(path + ": cannot be read");
    std::vector<trajectory_text> out;
    std::string line;
    for (std::size_t number = 1; out.size() < limit && read_line(in.file, line, path, number); ++number) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        try {
            out.push_back(parse_trajectory(line));
        } catch (const std::exception& e) {
            throw std::runtime_error(path + ":" + std::to_string(number) + ": " + e.what());
        }
    }
    if (out.empty()) throw std::runtime_error(path + ": no trajectories (is it JSON lines, or did xz fail?)");
    return out;
}

double spec_drafter_result::tokens_per_step() const {
    return steps == 0 ? 0.0 : static_cast<double>(answer_tokens) / static_cast<double>(steps);
}
double spec_drafter_result::acceptance() const {
    return draft_tokens == 0 ? 0.0 : static_cast<double>(accepted_tokens) / static_cast<double>(draft_tokens);
}
double spec_drafter_result::mean_draft_length() const {
    return drafts == 0 ? 0.0 : static_cast<double>(draft_tokens) / static_cast<double>(drafts);
}

spec_drafter_result replay_conversations(offline_drafter& drafter, const std::vector<spec_conversation>& conversations,
                                         std::size_t max_draft) {
    spec_drafter_result r;
    r.drafter = drafter.name();
    max_draft = std::min(max_draft, max_draft_limit);
    const auto started = std::chrono::steady_clock::now();
    for (const spec_conversation& c : conversations) {
        const std::span<const spec::token> tokens = c.tokens;
        for (const spec_turn& turn : c.turns) {
            if (turn.answer_tokens == 0 || turn.prompt_tokens + turn.answer_tokens > tokens.size()) continue;
            const std::span<const spec::token> answer = tokens.subspan(turn.prompt_tokens, turn.answer_tokens);
            drafter.begin_turn(tokens.first(turn.prompt_tokens));
            // The first token comes out of the prefill, without a draft (as in llama-server).
            std::size_t i = 1;
            r.steps += 1;
            while (i < answer.size()) {
                std::vector<spec::token> d = drafter.draft(tokens.first(turn.prompt_tokens + i), max_draft);
                if (d.size() > max_draft) d.resize(max_draft);
                const std::size_t remaining = answer.size() - i;
                std::size_t accepted = 0;
                while (accepted < d.size() && accepted < remaining && d[accepted] == answer[i + accepted]) ++accepted;
                drafter.accept(accepted);
                r.steps += 1;
                r.drafts += d.empty() ? 0 : 1;
                r.draft_tokens += d.size();
                r.accepted_tokens += accepted;
                i += std::min(accepted + 1, remaining);  // what was accepted, and the token the model samples itself
            }
            r.answer_tokens += answer.size();
        }
        drafter.end_conversation(tokens);
    }
    r.draft_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    return r;
}

std::unique_ptr<offline_drafter> make_keepwarm_drafter(const spec::suffix_draft_options& options,
                                                       std::size_t key_tokens, bool with_history) {
    return std::make_unique<keepwarm_drafter>(options, key_tokens, with_history);
}

std::unique_ptr<offline_drafter> make_llama_ngram_drafter(const std::string& type_name, bool fresh_per_conversation) {
    static const std::vector<common_speculative_type> ngram_types = {
        COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE, COMMON_SPECULATIVE_TYPE_NGRAM_MAP_K,
        COMMON_SPECULATIVE_TYPE_NGRAM_MAP_K4V, COMMON_SPECULATIVE_TYPE_NGRAM_MOD, COMMON_SPECULATIVE_TYPE_NGRAM_CACHE};
    for (const common_speculative_type type : ngram_types) {
        if (common_speculative_type_to_str(type) == type_name)
            return std::make_unique<llama_ngram_drafter>(type, fresh_per_conversation);
    }
    throw std::invalid_argument(
        "unknown drafter '" + type_name +
        "' (keepwarm, keepwarm-no-history, ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache)");
}

spec_bench_report run_spec_bench(const spec_bench_options& options, std::ostream& progress) {
    spec_bench_report report;
    report.options = options;
    // Every drafter named is checked before minutes of reading and tokenizing.
    std::vector<std::unique_ptr<offline_drafter>> drafters;
    for (const std::string& name : options.drafters) {
        if (name == "keepwarm" || name == "keepwarm-no-history") {
            drafters.push_back(make_keepwarm_drafter(options.keepwarm, options.key_tokens, name == "keepwarm"));
        } else {
            drafters.push_back(make_llama_ngram_drafter(name, options.llama_fresh_per_trajectory));
        }
    }

    const std::vector<trajectory_text> trajectories = read_trajectories(options.traces_path, options.trajectories);
    progress << "bench spec: " << trajectories.size() << " trajectories read from " << options.traces_path << "\n";
    init_llama_runtime(false);
    // common's n-gram maps say at INFO level each time they clean up; the table is what this command reports.
    common_log_set_verbosity_thold(LOG_LEVEL_WARN);
    llama_model_params params = llama_model_default_params();
    params.vocab_only = true;  // the tokenizer is all the replay needs
    const llama_model_ptr model(llama_model_load_from_file(options.model_path.c_str(), params));
    if (!model) throw std::runtime_error(options.model_path + ": failed to load the model's vocabulary");
    const llama_vocab* vocab = llama_model_get_vocab(model.get());

    std::vector<spec_conversation> conversations;
    for (const trajectory_text& t : trajectories) {
        conversations.push_back(tokenize_conversation(vocab, t));
        const spec_conversation& c = conversations.back();
        report.turns += c.turns.size();
        report.conversation_tokens += c.tokens.size();
        for (const spec_turn& turn : c.turns) report.answer_tokens += turn.answer_tokens;
    }
    report.conversations = conversations.size();
    progress << "bench spec: " << report.turns << " answers, " << report.answer_tokens << " answer tokens, "
             << report.conversation_tokens << " conversation tokens\n";

    for (auto& drafter : drafters) {
        progress << "bench spec: replaying with " << drafter->name() << "\n" << std::flush;
        report.results.push_back(replay_conversations(*drafter, conversations, options.max_draft));
    }
    return report;
}

std::string format_spec_table(const spec_bench_report& report) {
    using report_text::fixed;
    std::ostringstream out;
    out << report.conversations << " trajectories, " << report.turns << " answers, " << report.answer_tokens
        << " answer tokens (teacher-forced; recorded outputs), drafts of at most " << report.options.max_draft
        << " tokens; llama.cpp's drafters kept for "
        << (report.options.llama_fresh_per_trajectory ? "one trajectory" : "the run") << "\n\n";
    std::vector<std::vector<std::string>> rows;
    for (const spec_drafter_result& r : report.results) {
        rows.push_back({r.drafter, fixed(r.tokens_per_step(), 3), std::to_string(r.steps), std::to_string(r.drafts),
                        std::to_string(r.draft_tokens), std::to_string(r.accepted_tokens),
                        fixed(100 * r.acceptance(), 1), fixed(r.mean_draft_length(), 2), fixed(r.draft_seconds, 1)});
    }
    out << report_text::markdown_table(
        {"drafter", "tokens/step", "steps", "drafts", "drafted", "accepted", "accepted %", "mean draft", "seconds"},
        rows);
    return out.str();
}

std::string format_spec_json(const spec_bench_report& report) {
    nlohmann::ordered_json j;
    j["traces"] = report.options.traces_path;
    j["model"] = report.options.model_path;
    j["trajectories"] = report.conversations;
    j["answers"] = report.turns;
    j["answer_tokens"] = report.answer_tokens;
    j["conversation_tokens"] = report.conversation_tokens;
    j["max_draft"] = report.options.max_draft;
    j["llama_state"] = report.options.llama_fresh_per_trajectory ? "trajectory" : "run";
    j["keepwarm_options"] = {{"key_tokens", report.options.key_tokens},
                             {"max_match", report.options.keepwarm.max_match},
                             {"max_candidates", report.options.keepwarm.max_candidates},
                             {"min_share", report.options.keepwarm.min_share},
                             {"draft_per_match", report.options.keepwarm.draft_per_match},
                             {"draft_offset", report.options.keepwarm.draft_offset}};
    j["results"] = nlohmann::ordered_json::array();
    for (const spec_drafter_result& r : report.results) {
        j["results"].push_back({{"drafter", r.drafter},
                                {"answer_tokens", r.answer_tokens},
                                {"steps", r.steps},
                                {"tokens_per_step", r.tokens_per_step()},
                                {"drafts", r.drafts},
                                {"draft_tokens", r.draft_tokens},
                                {"accepted_tokens", r.accepted_tokens},
                                {"acceptance", r.acceptance()},
                                {"mean_draft_length", r.mean_draft_length()},
                                {"draft_seconds", r.draft_seconds}});
    }
    return j.dump(2);
}

void add_spec_bench_command(CLI::App& bench) {
    struct cli_options {
        spec_bench_options run;
        spec_replay_options replay;
        bool offline = false;
        std::string drafters;
        std::string json_path;
    };
    auto o = std::make_shared<cli_options>();
    CLI::App* cmd = bench.add_subcommand(
        "spec",
        "Speculative decoding on recorded agent trajectories, teacher-forced: each answer replayed through the engine "
        "with drafting off and on (decode tokens/s, tokens per step), or with --offline, without a model run, tokens "
        "per model step of keepwarm's drafter and llama.cpp's n-gram drafters");
    cmd->add_flag("--offline", o->offline, "Replay the recorded answers through the drafters alone, without a model");
    cmd->add_option("-m,--model", o->run.model_path,
                    "GGUF model file (--offline: only its vocabulary tokenizes the trajectories)")
        ->required();
    cmd->add_option("--traces", o->run.traces_path, "Trajectories, JSON lines (.xz is decompressed with xz)")
        ->capture_default_str();
    CLI::Option* trajectories =
        cmd->add_option("--trajectories", o->run.trajectories,
                        "How many trajectories to replay, from the file's start (default: 20 offline, " +
                            std::to_string(o->replay.trajectories) + " through the engine)")
            ->check(CLI::PositiveNumber);
    cmd->add_option("--max-draft", o->run.max_draft,
                    "The longest draft, in tokens (through the engine: its --draft-max)")
        ->capture_default_str()
        ->check(CLI::Range(std::size_t{1}, max_draft_limit));
    cmd->add_option("--turns", o->replay.turns,
                    "Through the engine: the assistant turns replayed per trajectory, from its start (0: all)")
        ->capture_default_str();
    cmd->add_option("-c,--ctx-size", o->replay.context_size,
                    "Through the engine: its context; turns past it are skipped")
        ->capture_default_str()
        ->check(CLI::Range(256, 1 << 22));
    cmd->add_option("-t,--threads", o->replay.threads, "Through the engine: CPU threads (0: one per physical core)")
        ->capture_default_str()
        ->check(CLI::Range(0, 1024));
    cmd->add_flag("--whole-drafts", o->replay.whole_drafts,
                  "Through the engine: verify every proposal whole (up to --max-draft) instead of sizing drafts by "
                  "the costs measured on this machine, so that what is drafted does not depend on its speed");
    cmd->add_option("--spec-type", o->replay.spec_type,
                    "Through the engine: the drafter of the drafting pass (serve's --spec-type)")
        ->capture_default_str();
    cmd->add_option("--drafters", o->drafters,
                    "--offline: comma-separated drafters (default: keepwarm,ngram-simple,ngram-map-k,ngram-mod,"
                    "ngram-cache; also keepwarm-no-history, ngram-map-k4v)");
    cmd->add_option("--min-share", o->run.keepwarm.min_share,
                    "keepwarm: draft a token while this share of the matched occurrences agree on it")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    cmd->add_option("--draft-per-match", o->run.keepwarm.draft_per_match,
                    "keepwarm: at most this many draft tokens per token of matched suffix")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1024.0));
    cmd->add_option("--max-candidates", o->run.keepwarm.max_candidates,
                    "keepwarm: earlier occurrences examined per source, newest first")
        ->capture_default_str()
        ->check(CLI::Range(std::size_t{1}, std::size_t{4096}));
    cmd->add_option("--key-tokens", o->run.key_tokens, "keepwarm: the k-gram a lookup starts from")
        ->capture_default_str()
        ->check(CLI::Range(std::size_t{1}, std::size_t{64}));
    cmd->add_flag("--llama-fresh-per-trajectory", o->run.llama_fresh_per_trajectory,
                  "llama.cpp's drafters start afresh for each trajectory (default: kept for the run, as one server "
                  "slot keeps them)");
    cmd->add_option("--json", o->json_path, "Also write the results as JSON to this file");
    cmd->callback([o, trajectories] {
        if (!o->offline) {
            if (!o->drafters.empty()) fail_command(command, "--drafters is for --offline");
            if (o->replay.spec_type == "none") {
                fail_command(command, "--spec-type none leaves nothing to compare: name a drafter");
            }
            o->replay.traces_path = o->run.traces_path;
            o->replay.model_path = o->run.model_path;
            if (trajectories->count() > 0) o->replay.trajectories = o->run.trajectories;
            o->replay.draft_max = static_cast<int>(o->run.max_draft);
            spec_replay_report report;
            try {
                report = run_spec_replay(o->replay, std::cerr);
            } catch (const std::exception& e) {
                fail_command(command, e.what());
            }
            std::cout << "\n" << format_spec_replay_table(report);
            if (!o->json_path.empty()) {
                report_text::write_report_file(command, o->json_path, format_spec_replay_json(report) + "\n",
                                               std::cerr);
            }
            if (!report.off.error.empty() || !report.on.error.empty()) {
                fail_command(command,
                             "a turn failed: " + (report.off.error.empty() ? report.on.error : report.off.error));
            }
            return;
        }
        if (!o->drafters.empty()) {
            o->run.drafters = report_text::split_list(o->drafters);
            for (const std::string& name : o->run.drafters) {
                if (name.empty()) fail_command(command, "--drafters has an empty item");
            }
        }
        spec_bench_report report;
        try {
            report = run_spec_bench(o->run, std::cerr);
        } catch (const std::exception& e) {
            fail_command(command, e.what());
        }
        std::cout << "\n" << format_spec_table(report);
        if (!o->json_path.empty()) {
            report_text::write_report_file(command, o->json_path, format_spec_json(report) + "\n", std::cerr);
        }
    });
}

}  // namespace keepwarm::bench

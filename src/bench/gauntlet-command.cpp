// See gauntlet-command.h. Targets run one at a time; with --runs N the order rotates every repetition, so no target
// always runs first (on a warm or a cold machine) and each gets the whole workload on a fresh process.
#include "bench/gauntlet-command.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "base/command-exit.h"
#include "bench/gauntlet-ideal.h"
#include "bench/gauntlet-launcher.h"
#include "bench/gauntlet-replay.h"
#include "bench/gauntlet-report.h"
#include "bench/gauntlet-workload.h"
#include "bench/report-text.h"

namespace keepwarm::bench::gauntlet {

namespace {

namespace fs = std::filesystem;

struct cli_options {
    generator_options generator;
    std::string api = "anthropic";
    std::string killers = "all";
    double ping_every_s = 30;
    std::string generate_path;
    std::string workload_path;
    std::vector<std::string> targets;
    bool launch = false;
    std::string servers = "keepwarm,keepwarm-off,llama-server";
    std::string model;
    int ctx_size = 0;
    int parallel = 2;
    int threads = 0;
    std::string llama_server;
    std::string policy;
    std::string work_dir;
    int runs = 1;
    std::string baseline = "llama-server";
    std::string json_path;
    std::string html_path;
    std::string command_line;
};

constexpr std::string_view command = "bench gauntlet";

[[noreturn]] void fail(const std::string& message) {
    fail_command(command, message);
}

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("cannot read '" + path + "'");
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
}

void write_file(const std::string& path, const std::string& text) {
    report_text::write_report_file(command, path, text, std::cerr);
}

void run(cli_options& o) {
    try {
        o.generator.api = parse_api(o.api);
        o.generator.killers = killer_set::parse(o.killers, o.ping_every_s);
    } catch (const std::invalid_argument& e) {
        fail(e.what());
    }
    // The model's vocab sizes the generated prompts and computes the ideal.
    std::unique_ptr<ideal_prefill> ideal;
    if (!o.model.empty()) {
        try {
            ideal = std::make_unique<ideal_prefill>(o.model);
        } catch (const std::exception& e) {
            fail(e.what());
        }
        o.generator.count_tokens = [&ideal](const std::string& text) { return ideal->count_tokens(text); };
    }

    std::vector<workload_line> lines;
    std::string workload_name;
    try {
        if (!o.workload_path.empty()) {
            lines = parse_workload(read_file(o.workload_path));
            workload_name = o.workload_path;
        } else {
            lines = generate_workload(o.generator);
            const generator_options& g = o.generator;
            workload_name = "generated: seed " + std::to_string(g.seed) + ", system prompt " +
                            std::to_string(g.system_tokens) + " tokens, " + std::to_string(g.tools) + " tools, " +
                            std::to_string(g.agents) + " agents x " + std::to_string(g.turns) + " turns x " +
                            std::to_string(g.tool_rounds) + " tool rounds, answers " + std::to_string(g.answer_tokens) +
                            " tokens, tool results " + std::to_string(g.tool_result_tokens) + " tokens, " +
                            api_name(g.api) + " API";
        }
    } catch (const std::invalid_argument& e) {
        fail((o.workload_path.empty() ? "" : o.workload_path + ": ") + e.what());
    }
    if (!o.generate_path.empty()) {
        write_file(o.generate_path, format_workload(lines));
        if (o.targets.empty() && !o.launch) return;
    }

    std::vector<replay_target> targets;
    std::vector<server_kind> kinds;
    launch_settings settings;
    try {
        for (const std::string& t : o.targets) targets.push_back(parse_target(t));
        if (o.launch) {
            if (o.model.empty() || o.ctx_size <= 0) fail("--launch needs --model and --ctx-size");
            for (const std::string& name : report_text::split_list(o.servers)) {
                if (!name.empty()) kinds.push_back(parse_server_kind(name));
            }
            if (kinds.empty()) fail("--servers names no server");
            settings.model = o.model;
            settings.ctx_size = o.ctx_size;
            settings.parallel = o.parallel;
            settings.threads = o.threads;
            settings.keepwarm_binary = fs::read_symlink("/proc/self/exe").string();
            settings.work_dir =
                o.work_dir.empty()
                    ? (fs::temp_directory_path() / ("keepwarm-gauntlet-" + std::to_string(::getpid()))).string()
                    : o.work_dir;
            for (const server_kind k : kinds) {
                if (k == server_kind::keepwarm) {
                    settings.policy_file = o.policy.empty() ? find_policy_file(settings.keepwarm_binary) : o.policy;
                }
                if (k == server_kind::llama_server) {
                    settings.llama_server_binary = find_llama_server(o.llama_server, settings.keepwarm_binary);
                }
                targets.push_back({server_kind_name(k), "", std::nullopt, nullptr});
            }
        }
    } catch (const CLI::Error&) {
        throw;  // fail() has said it
    } catch (const std::exception& e) {
        fail(e.what());
    }
    if (targets.empty()) fail("give --target NAME=URL, --launch, or --generate FILE");
    for (size_t i = 0; i < targets.size(); ++i) {
        for (size_t j = 0; j < i; ++j) {
            if (targets[i].name == targets[j].name) fail("two targets are named '" + targets[i].name + "'");
        }
    }

    gauntlet_report report;
    report.command_line = o.command_line;
    report.model = o.model.empty() ? "(none: no ideal computed)" : o.model;
    report.workload = workload_name;
    report.killers = o.workload_path.empty() ? o.generator.killers.describe() : "as in the workload file";
    report.lines = static_cast<int>(lines.size());
    {
        std::vector<std::string> agents;
        for (const workload_line& l : lines) {
            if (!l.events.ping && std::find(agents.begin(), agents.end(), l.agent) == agents.end()) {
                agents.push_back(l.agent);
            }
        }
        report.agents = static_cast<int>(agents.size());
    }
    report.baseline = o.baseline;

    const size_t launched_from = o.targets.size();
    bool any_run_failed = false;
    for (int rep = 0; rep < o.runs; ++rep) {
        for (size_t k = 0; k < targets.size(); ++k) {
            const size_t ti = (k + static_cast<size_t>(rep)) % targets.size();
            replay_target target = targets[ti];
            target_run run;
            run.target = target.name;
            run.run = rep;
            run.position = static_cast<int>(k);
            run.launched = ti >= launched_from;
            std::unique_ptr<launched_server> server;
            std::vector<replayed_request> replayed;
            const auto started = std::chrono::steady_clock::now();
            try {
                if (run.launched) {
                    server = std::make_unique<launched_server>(kinds[ti - launched_from], settings);
                    server->start(std::cerr);
                    target.url = server->url();
                    target.server = server.get();
                }
                run.url = target.url;
                std::cerr << "gauntlet: run " << rep + 1 << "/" << o.runs << ": " << target.name << " at " << target.url
                          << "\n";
                replayed = replay_workload(lines, target, o.generator.seed, std::cerr);
                if (std::none_of(replayed.begin(), replayed.end(), [](const auto& r) { return r.record.ok; })) {
                    run.error = "every request failed";
                    any_run_failed = true;
                }
            } catch (const std::exception& e) {
                run.error = e.what();
                any_run_failed = true;
                std::cerr << "gauntlet: " << target.name << ": " << e.what() << "\n";
            }
            run.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
            server.reset();  // stopped before the ideal is computed, so that work never competes with a target
            if (ideal) {
                ideal->reset();
                for (replayed_request& r : replayed) {
                    if (r.record.ping) {
                        r.record.ideal_prompt_tokens = 0;  // a perfect client sends no pings
                        r.record.ideal_new_tokens = 0;
                        continue;
                    }
                    const ideal_count c = ideal->add(r.normalized, r.api, r.answer);
                    if (!c.error.empty()) {
                        std::cerr << "gauntlet: line " << r.record.line_number << ": no ideal: " << c.error << "\n";
                        continue;
                    }
                    r.record.ideal_prompt_tokens = static_cast<int>(c.prompt_tokens);
                    r.record.ideal_new_tokens = static_cast<int>(c.new_tokens);
                }
            }
            for (replayed_request& r : replayed) run.requests.push_back(std::move(r.record));
            report.runs.push_back(std::move(run));
        }
    }
    for (const replay_target& t : targets) report.summaries.push_back(summarize(t.name, report.runs));
    report.ratios = compare_to(report.summaries, o.baseline);

    std::cout << "\n" << format_gauntlet_table(report);
    if (!o.json_path.empty()) write_file(o.json_path, format_gauntlet_json(report) + "\n");
    if (!o.html_path.empty()) write_file(o.html_path, format_gauntlet_html(report));
    if (any_run_failed) throw CLI::RuntimeError(1);
}

}  // namespace

void add_gauntlet_command(CLI::App& bench) {
    auto o = std::make_shared<cli_options>();
    CLI::App* cmd = bench.add_subcommand(
        "gauntlet",
        "Replays an agentic workload with cache killers against servers and reports prefill against the ideal");
    // A later value wins, so that a script's defaults can be overridden by options appended to its command line.
    cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    generator_options& g = o->generator;
    cmd->add_option("--generate", o->generate_path, "Write the generated workload (JSONL) to this file");
    cmd->add_option("--workload", o->workload_path, "Replay this workload file (default: generate one)");
    cmd->add_option("--seed", g.seed, "Generator seed")->capture_default_str();
    cmd->add_option("--system-tokens", g.system_tokens, "System prompt size in tokens (without the tools)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--tools", g.tools, "Tool definitions")->capture_default_str()->check(CLI::NonNegativeNumber);
    cmd->add_option("--agents", g.agents, "Concurrent conversations")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    cmd->add_option("--turns", g.turns, "User messages per agent")->capture_default_str()->check(CLI::PositiveNumber);
    cmd->add_option("--tool-rounds", g.tool_rounds, "Tool call + result rounds after each user message")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--answer-tokens", g.answer_tokens, "max_tokens of each answer")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    cmd->add_option("--tool-result-tokens", g.tool_result_tokens, "Size of each synthetic tool result")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    cmd->add_option("--api", o->api, "API of the generated requests: openai or anthropic")->capture_default_str();
    cmd->add_option("--request-model", g.model, "Model name in the generated requests (default: by API)");
    cmd->add_option("--killers", o->killers,
                    "Cache killers: all, none, or a list of cch,request-id,ping,model,num-ctx,cancel,restart,reasoning")
        ->capture_default_str();
    cmd->add_option("--ping-every", o->ping_every_s, "Seconds between health pings (the ping killer)")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    cmd->add_option("--target", o->targets, "NAME=URL[,api=openai|anthropic] of a running server (repeatable)")
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    cmd->add_flag("--launch", o->launch, "Start the --servers one at a time on the same model and settings");
    cmd->add_option("--servers", o->servers, "What --launch starts: keepwarm, keepwarm-off, llama-server")
        ->capture_default_str();
    cmd->add_option("-m,--model", o->model,
                    "GGUF model: launched servers run it; its vocab sizes the prompts and computes the ideal");
    cmd->add_option("-c,--ctx-size", o->ctx_size, "Context of launched servers, shared by the slots");
    cmd->add_option("--parallel", o->parallel, "Slots of launched servers")->capture_default_str();
    cmd->add_option("-t,--threads", o->threads, "Threads of launched servers (default: theirs)");
    cmd->add_option("--llama-server", o->llama_server, "llama-server binary (default: bench/build-llama-server.sh)");
    cmd->add_option("--policy", o->policy, "Policy file of the launched keepwarm (default: etc/keepwarm-policy.toml)");
    cmd->add_option("--work-dir", o->work_dir, "Folder for launched servers' logs and caches (default: a temp dir)");
    cmd->add_option("--runs", o->runs, "Repetitions; the target order rotates each time")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    cmd->add_option("--baseline", o->baseline, "Target the others are compared with")->capture_default_str();
    cmd->add_option("--json", o->json_path, "Write the results as JSON to this file");
    cmd->add_option("--html", o->html_path, "Write an HTML report with SVG charts to this file");
    cmd->callback([o, cmd] {
        // The options as given, for the report (CLI11 keeps no copy of argv).
        std::string line = "keepwarm bench gauntlet";
        for (const CLI::Option* option : cmd->get_options()) {
            if (option->count() == 0 || option->get_name() == "--help") continue;
            if (option->get_type_size_max() == 0) {  // a flag
                line += " " + option->get_name();
                continue;
            }
            for (const std::string& value : option->reduced_results()) line += " " + option->get_name() + " " + value;
        }
        o->command_line = line;
        run(*o);
    });
}

}  // namespace keepwarm::bench::gauntlet

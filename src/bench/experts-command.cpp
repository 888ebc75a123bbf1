// See experts-command.h. The options are checked before a model is loaded (recording takes minutes on a real one);
// every error is one line in the log (base/command-exit.h) and exit status 1.
#include "bench/experts-command.h"

#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/command-exit.h"
#include "bench/experts-recording.h"
#include "bench/experts-report.h"
#include "bench/experts-simulation.h"
#include "bench/experts-trace.h"
#include "bench/report-text.h"
#include "model/model-inspect.h"

namespace keepwarm::bench {

namespace {
constexpr std::string_view command = "bench experts";
}  // namespace

void add_experts_bench_command(CLI::App& bench) {
    struct cli_options {
        expert_record_options record;
        std::string prompt_file;
        std::string trace_in;
        std::string trace_out;
        std::string slots;
        expert_cache_policy admission{2, 32};
        std::string json_path;
        std::string svg_path;
    };
    auto o = std::make_shared<cli_options>();
    CLI::App* cmd = bench.add_subcommand(
        "experts",
        "Which experts each MoE layer routes to over a workload, and the hit rate of a per-layer expert cache of S "
        "slots (LRU and admission-gated)");
    CLI::Option* model = cmd->add_option("-m,--model", o->record.model_path, "GGUF model file (MoE)");
    CLI::Option* prompt =
        cmd->add_option("--prompt-file", o->prompt_file, "Text file to prefill (default: a built-in mixed workload)");
    CLI::Option* gen = cmd->add_option("-n,--gen", o->record.n_gen, "Tokens decoded greedily after the prompt")
                           ->capture_default_str()
                           ->check(CLI::NonNegativeNumber);
    CLI::Option* threads =
        cmd->add_option("-t,--threads", o->record.threads, "CPU threads (default: the number of math cores)");
    cmd->add_option("--trace-in", o->trace_in, "Simulate a trace recorded earlier with --trace-out instead of a model")
        ->excludes(model)
        ->excludes(prompt)
        ->excludes(gen)
        ->excludes(threads);
    cmd->add_option("--trace-out", o->trace_out,
                    "Also write the routing trace to this file (JSON if it ends in .json, else binary)");
    cmd->add_option("--slots", o->slots,
                    "Comma-separated expert slots per layer (default: powers of two up to the "
                    "expert count)");
    cmd->add_option("--admit-k", o->admission.admit_k, "Gated policy: uses needed before an expert takes a slot")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    cmd->add_option("--admit-window", o->admission.admit_window, "Gated policy: the window of tokens uses count in")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    cmd->add_option("--json", o->json_path, "Also write the results as JSON to this file");
    cmd->add_option("--svg", o->svg_path, "Also write a hit rate vs slots chart as SVG to this file");
    cmd->callback([o] {
        const auto fail = [](const std::string& message) { fail_command(command, message); };
        const auto write_file = [](const std::string& path, const std::string& text) {
            report_text::write_report_file(command, path, text, std::cerr);
        };
        if (o->trace_in.empty() && o->record.model_path.empty()) fail("give a model (-m) or a trace (--trace-in)");
        if (o->admission.admit_k > o->admission.admit_window) {
            fail("--admit-k " + std::to_string(o->admission.admit_k) + " can never be reached within --admit-window " +
                 std::to_string(o->admission.admit_window));
        }
        experts_bench_report report;
        try {
            std::vector<uint32_t> slots;
            if (!o->slots.empty()) slots = parse_slot_list(o->slots);
            const auto check_slots = [&](uint32_t n_expert) {
                for (const uint32_t s : slots) {
                    if (s > n_expert) {
                        fail("--slots " + std::to_string(s) + " is more than the model's " + std::to_string(n_expert) +
                             " experts per layer");
                    }
                }
            };
            expert_trace trace;
            if (!o->trace_in.empty()) {
                trace = read_expert_trace(o->trace_in);
            } else {
                // Before recording, which takes minutes on a real model; a dense model's 0 experts is reported later.
                if (const uint32_t n_expert = inspect_model(o->record.model_path).n_expert) check_slots(n_expert);
                if (!o->prompt_file.empty()) {
                    std::ifstream in(o->prompt_file, std::ios::binary);
                    if (!in) fail("cannot read prompt file '" + o->prompt_file + "'");
                    std::ostringstream text;
                    text << in.rdbuf();
                    o->record.prompt_text = text.str();
                    if (o->record.prompt_text.empty()) fail("prompt file '" + o->prompt_file + "' is empty");
                }
                trace = record_expert_trace(o->record, std::cerr);
            }
            if (!o->trace_out.empty()) {
                write_expert_trace(trace, o->trace_out);
                std::cerr << "wrote " << o->trace_out << "\n";
            }
            check_slots(trace.n_expert);
            if (slots.empty()) slots = default_slot_list(trace.n_expert, trace.n_expert_used);
            report = simulate_expert_caches(trace, slots, o->admission);
        } catch (const CLI::RuntimeError&) {
            throw;
        } catch (const std::exception& e) {
            fail(e.what());
        }
        std::cout << "\n" << format_experts_table(report);
        if (!o->json_path.empty()) write_file(o->json_path, format_experts_json(report) + "\n");
        if (!o->svg_path.empty()) write_file(o->svg_path, format_experts_svg(report));
    });
}

}  // namespace keepwarm::bench

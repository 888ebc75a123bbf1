// `keepwarm bench experts`' command line on a trace file (no model): the table on stdout, the JSON, SVG and trace
// files it writes, its defaults, and each mistake reported as one line on stderr with exit status 1.
#include <gtest/gtest.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <utility>

#include "base/logger.h"
#include "bench/experts-command.h"
#include "bench/experts-report.h"
#include "bench/experts-simulation.h"
#include "bench/experts-trace.h"

using namespace keepwarm;
using namespace keepwarm::bench;

namespace {

// Three tokens of a one-layer model with 8 experts, 2 per token.
expert_trace small_trace() {
    expert_trace trace;
    trace.model_path = "/models/tiny-moe.gguf";
    trace.n_expert = 8;
    trace.n_expert_used = 2;
    trace.n_prompt_tokens = 2;
    trace.n_generated_tokens = 1;
    trace.layers = {{0, 512, {0, 1, 0, 7, 6, 7}}};
    return trace;
}

// Per process: ctest runs this fixture's tests in parallel, and one's TearDown must not remove another's trace.
std::string temp_path(const std::string& name) {
    return (std::filesystem::temp_directory_path() /
            ("keepwarm-test-experts-command-" + std::to_string(::getpid()) + "-" + name))
        .string();
}

std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
}

// What one `keepwarm bench experts ...` printed, and how it ended.
struct command_result {
    int exit_code = 0;  // CLI11's: 0, or that of the error thrown
    std::string out;
    std::string err;
};

command_result run_experts(const std::string& args) {
    CLI::App app;
    CLI::App* bench = app.add_subcommand("bench");
    add_experts_bench_command(*bench);
    std::ostringstream out, err;
    std::streambuf* const saved_out = std::cout.rdbuf(out.rdbuf());
    std::streambuf* const saved_err = std::cerr.rdbuf(err.rdbuf());
    std::string log_lines;  // an error ends the command through the log (base/command-exit.h)
    log::set_sink([&](std::string_view line) { log_lines += line; });
    command_result result;
    try {
        app.parse("bench experts " + args);
    } catch (const CLI::Error& e) {  // what keepwarm's main hands to app.exit
        result.exit_code = e.get_exit_code();
    }
    std::cout.rdbuf(saved_out);
    std::cerr.rdbuf(saved_err);
    log::set_sink({});
    result.out = out.str();
    result.err = err.str() + log_lines;
    return result;
}

class experts_command : public testing::Test {
protected:
    void SetUp() override { write_expert_trace(small_trace(), trace_path); }
    void TearDown() override {
        for (const auto& path : {trace_path, json_path, svg_path, trace_out}) std::filesystem::remove(path);
    }

    const std::string trace_path = temp_path("trace.bin");
    const std::string json_path = temp_path("report.json");
    const std::string svg_path = temp_path("report.svg");
    const std::string trace_out = temp_path("copy.json");
};

}  // namespace

TEST_F(experts_command, simulates_a_trace_file_into_table_json_and_svg) {
    const command_result r = run_experts("--trace-in " + trace_path + " --slots 1,2,8 --admit-k 2 --admit-window 3" +
                                         " --json " + json_path + " --svg " + svg_path);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const experts_bench_report expected = simulate_expert_caches(small_trace(), {1, 2, 8}, {2, 3});
    EXPECT_EQ(r.out, "\n" + format_experts_table(expected));
    EXPECT_EQ(read_text(json_path), format_experts_json(expected) + "\n");
    EXPECT_EQ(read_text(svg_path), format_experts_svg(expected));
    EXPECT_EQ(r.err, "wrote " + json_path + "\nwrote " + svg_path + "\n");
}

TEST_F(experts_command, defaults_to_every_power_of_two_and_a_gate_of_2_uses_in_32_tokens) {
    const command_result r = run_experts("--trace-in " + trace_path);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "\n" + format_experts_table(simulate_expert_caches(small_trace(), {1, 2, 4, 8}, {2, 32})));
    EXPECT_EQ(r.err, "");
}

TEST_F(experts_command, writes_the_trace_it_read_in_the_form_the_name_asks_for) {
    const command_result r = run_experts("--trace-in " + trace_path + " --trace-out " + trace_out);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.err, "wrote " + trace_out + "\n");
    EXPECT_EQ(read_text(trace_out).front(), '{');
    EXPECT_EQ(read_expert_trace(trace_out).layers[0].ids, small_trace().layers[0].ids);
}

TEST_F(experts_command, reports_each_mistake_on_one_line_with_status_1) {
    const std::string prefix = " ERROR bench experts: ";
    const std::pair<std::string, std::string> cases[] = {
        {"", "give a model (-m) or a trace (--trace-in)"},
        {"--trace-in " + trace_path + " --admit-k 5 --admit-window 2",
         "--admit-k 5 can never be reached within --admit-window 2"},
        {"--trace-in " + trace_path + " --slots 4,9", "--slots 9 is more than the model's 8 experts per layer"},
        {"--trace-in " + trace_path + " --slots 4,,x", "bad slot count ''"},
        {"--trace-in " + temp_path("missing.bin"), "cannot open trace '" + temp_path("missing.bin") + "'"},
        {"--trace-in " + trace_path + " --json " + temp_path("no-such-dir/report.json"),
         "cannot write '" + temp_path("no-such-dir/report.json") + "'"},
    };
    for (const auto& [args, message] : cases) {
        const command_result r = run_experts(args);
        EXPECT_EQ(r.exit_code, 1) << args;
        EXPECT_NE(r.err.find(prefix + message), std::string::npos) << args << ": " << r.err;
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    }
    // A model and a trace at once is refused by the command line parser itself.
    EXPECT_NE(run_experts("--trace-in " + trace_path + " -m model.gguf").exit_code, 0);
}

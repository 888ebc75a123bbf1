// `keepwarm bench depth`: prefill and decode tokens/s at several context depths and KV cache types, run directly
// through libllama as `llama-bench -d` does, with a terminal table, JSON and a hand-written SVG chart.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "model/model-inspect.h"

namespace keepwarm::bench {

struct depth_bench_options {
    std::string model_path;
    std::vector<uint32_t> depths = {0, 4096, 16384, 32768};
    std::vector<kv_cache_type> kv_types = {kv_cache_type::f16, kv_cache_type::q8_0, kv_cache_type::q4_0};
    int n_prompt = 512;  // tokens of the timed prompt decode
    int n_gen = 128;     // timed single-token decodes
    int threads = 0;     // 0: common_cpu_get_num_math()
    int reps = 1;
    uint32_t seed = 1234;  // of the random tokens, so runs are comparable
};

// One cell: one KV type at one depth. Rates are the mean over the repetitions; error is set when the cell failed.
struct depth_result {
    kv_cache_type kv = kv_cache_type::f16;
    uint32_t depth = 0;
    int pp_tokens = 0;
    int tg_tokens = 0;
    double pp_tps = 0;
    double tg_tps = 0;
    std::string error;
};

struct depth_bench_report {
    std::string model_path;
    std::string model_desc;  // llama_model_desc(), e.g. "qwen3 0.6B Q8_0"
    int threads = 0;
    int n_prompt = 0;
    int n_gen = 0;
    int reps = 0;
    std::vector<kv_cache_type> kv_types;
    std::vector<uint32_t> depths;
    std::vector<std::pair<kv_cache_type, uint64_t>> kv_bytes_per_token;  // empty when the GGUF can't be inspected
    std::vector<depth_result> results;  // kv-major, in the order of kv_types then depths
};

// "0,4096,16384" -> depths; throws std::invalid_argument naming the bad entry (e.g. "4k", "-1", "").
std::vector<uint32_t> parse_depth_list(const std::string& text);
// "f16,q8_0" -> types; throws std::invalid_argument naming the bad entry and the accepted ones.
std::vector<kv_cache_type> parse_kv_list(const std::string& text);

// Context size for one cell: depth + prompt + generation, rounded up to a multiple of 256.
uint32_t depth_bench_context_size(uint32_t depth, int n_prompt, int n_gen);

// Loads the model, runs every (kv, depth) cell and reports progress lines on `progress`. Throws
// std::runtime_error if the model can't be loaded; a cell whose context can't be created or whose decode fails
// gets its error recorded instead.
depth_bench_report run_depth_bench(const depth_bench_options& options, std::ostream& progress);

// Renderers over a finished (or synthetic) report.
std::string format_depth_table(const depth_bench_report& report);
std::string format_depth_json(const depth_bench_report& report);
std::string format_depth_svg(const depth_bench_report& report);

// Registers `bench` with its subcommands: depth, experts, gauntlet, spec.
void add_bench_command(CLI::App& app);

}  // namespace keepwarm::bench

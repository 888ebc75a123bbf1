// See depth-bench.h. Times prompt processing and generation at a given KV depth: fill the depth with random tokens,
// then time a p-token prompt decode and n single-token decodes, trimming back to the depth between measurements.
#include "bench/depth-bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <stdexcept>

#include "base/command-exit.h"
#include "bench/experts-command.h"
#include "bench/gauntlet-command.h"
#include "bench/report-text.h"
#include "bench/spec-bench.h"
#include "common.h"
#include "engine/cpu-threadpool.h"
#include "engine/llama-runtime.h"
#include "llama-cpp.h"

namespace keepwarm::bench {

namespace {

constexpr std::string_view command = "bench depth";

using report_text::fixed;
using report_text::xml_escape;

std::string human_bytes(uint64_t bytes) {
    if (bytes < 1024) return std::to_string(bytes) + " B";
    if (bytes < 1024 * 1024) return fixed(bytes / 1024.0, 1) + " KiB";
    return fixed(bytes / (1024.0 * 1024.0), 2) + " MiB";
}

using clock = std::chrono::steady_clock;

// Runs the cells of one context: owns the random token stream and the depth bookkeeping.
class cell_runner {
public:
    cell_runner(llama_context* ctx, int n_batch, uint32_t seed)
        : ctx_(ctx), vocab_(llama_model_get_vocab(llama_get_model(ctx))), n_batch_(n_batch), rng_(seed) {
        const int32_t n_vocab = llama_vocab_n_tokens(vocab_);
        pick_ = std::uniform_int_distribution<llama_token>(0, n_vocab - 1);
        const llama_model* model = llama_get_model(ctx);
        can_trim_ = !llama_model_is_recurrent(model) && !llama_model_is_hybrid(model);
    }

    // Decodes n random tokens after what the sequence holds, in batches of n_batch (llama_decode's limit).
    void decode_random(int n, bool starts_sequence) {
        std::vector<llama_token> tokens(n_batch_);
        for (int done = 0; done < n;) {
            const int count = std::min(n - done, n_batch_);
            for (int i = 0; i < count; ++i) tokens[i] = pick_(rng_);
            if (starts_sequence && done == 0 && llama_vocab_get_add_bos(vocab_)) tokens[0] = llama_vocab_bos(vocab_);
            check(llama_decode(ctx_, llama_batch_get_one(tokens.data(), count)), "prompt");
            done += count;
        }
        llama_synchronize(ctx_);
    }

    // One token at a time, synchronising after each, as a generating server does.
    void decode_single(int n) {
        for (int i = 0; i < n; ++i) {
            llama_token token = pick_(rng_);
            check(llama_decode(ctx_, llama_batch_get_one(&token, 1)), "generation");
            llama_synchronize(ctx_);
        }
    }

    void fill_depth(uint32_t depth) {
        llama_memory_clear(llama_get_memory(ctx_), false);
        depth_ = depth;
        if (depth == 0) return;
        decode_random(static_cast<int>(depth), true);
        // Recurrent state can't be trimmed back to a position, so such models restore a saved copy instead.
        if (!can_trim_) {
            state_.resize(llama_state_seq_get_size(ctx_, 0));
            llama_state_seq_get_data(ctx_, state_.data(), state_.size(), 0);
        }
    }

    // Back to exactly the filled depth, so every measurement starts from the same cache.
    void reset_to_depth() {
        llama_memory_t mem = llama_get_memory(ctx_);
        if (depth_ == 0) {
            llama_memory_clear(mem, false);
        } else if (can_trim_) {
            if (!llama_memory_seq_rm(mem, 0, static_cast<llama_pos>(depth_), -1)) fill_depth(depth_);
        } else {
            llama_memory_clear(mem, false);
            if (llama_state_seq_set_data(ctx_, state_.data(), state_.size(), 0) == 0) fill_depth(depth_);
        }
    }

private:
    static void check(int32_t rc, const char* what) {
        if (rc != 0)
            throw std::runtime_error(std::string("llama_decode failed during ") + what + " (" + std::to_string(rc) +
                                     ")");
    }

    llama_context* ctx_;
    const llama_vocab* vocab_;
    int n_batch_;
    std::mt19937 rng_;
    std::uniform_int_distribution<llama_token> pick_;
    bool can_trim_ = true;
    uint32_t depth_ = 0;
    std::vector<uint8_t> state_;
};

double seconds_since(clock::time_point start) {
    return std::chrono::duration<double>(clock::now() - start).count();
}

const depth_result* find_result(const depth_bench_report& report, kv_cache_type kv, uint32_t depth) {
    for (const auto& r : report.results) {
        if (r.kv == kv && r.depth == depth) return &r;
    }
    return nullptr;
}

// A round step (1, 2 or 5 times a power of ten) close to range / 5, for axis ticks.
double nice_step(double range) {
    if (range <= 0) return 1;
    const double raw = range / 5;
    const double power = std::pow(10.0, std::floor(std::log10(raw)));
    for (const double m : {1.0, 2.0, 5.0, 10.0}) {
        if (m * power >= raw) return m * power;
    }
    return 10 * power;
}

std::string axis_number(double v) {
    if (v >= 1000 && std::fmod(v, 1000) == 0) return fixed(v / 1000, 0) + "k";
    if (v >= 1000 && std::fmod(v, 100) == 0) return fixed(v / 1000, 1) + "k";
    if (v == std::floor(v)) return fixed(v, 0);
    return fixed(v, 1);
}

const char* kv_color(kv_cache_type type) {
    switch (type) {
        case kv_cache_type::f16:
            return "#1f77b4";
        case kv_cache_type::q8_0:
            return "#ff7f0e";
        case kv_cache_type::q4_0:
            return "#2ca02c";
    }
    return "#000000";
}

}  // namespace

std::vector<uint32_t> parse_depth_list(const std::string& text) {
    std::vector<uint32_t> depths;
    for (const std::string& item : report_text::split_list(text)) {
        const bool digits = !item.empty() && item.size() <= 10 &&
                            std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; });
        const unsigned long long value = digits ? std::stoull(item) : 0;
        if (!digits || value > std::numeric_limits<int32_t>::max()) {
            throw std::invalid_argument("bad depth '" + item +
                                        "': expected a comma-separated list of token counts, e.g. 0,4096,16384");
        }
        depths.push_back(static_cast<uint32_t>(value));
    }
    if (depths.empty()) throw std::invalid_argument("no depths given: expected e.g. 0,4096,16384");
    return depths;
}

std::vector<kv_cache_type> parse_kv_list(const std::string& text) {
    std::vector<kv_cache_type> types;
    for (const std::string& item : report_text::split_list(text)) {
        bool found = false;
        for (const kv_cache_type t : {kv_cache_type::f16, kv_cache_type::q8_0, kv_cache_type::q4_0}) {
            if (item == to_string(t)) {
                types.push_back(t);
                found = true;
            }
        }
        if (!found) throw std::invalid_argument("bad KV cache type '" + item + "': expected f16, q8_0 or q4_0");
    }
    if (types.empty()) throw std::invalid_argument("no KV cache types given: expected e.g. f16,q8_0,q4_0");
    return types;
}

uint32_t depth_bench_context_size(uint32_t depth, int n_prompt, int n_gen) {
    const uint64_t needed =
        uint64_t{depth} + static_cast<uint64_t>(std::max(n_prompt, 0)) + static_cast<uint64_t>(std::max(n_gen, 0));
    return static_cast<uint32_t>(std::max<uint64_t>(256, (needed + 255) / 256 * 256));
}

depth_bench_report run_depth_bench(const depth_bench_options& options, std::ostream& progress) {
    if (options.n_prompt < 1 || options.n_gen < 1 || options.reps < 1) {
        throw std::invalid_argument("prompt tokens, generated tokens and repetitions must be at least 1");
    }
    init_llama_runtime();

    depth_bench_report report;
    report.model_path = options.model_path;
    report.threads = options.threads > 0 ? options.threads : common_cpu_get_num_math();
    report.n_prompt = options.n_prompt;
    report.n_gen = options.n_gen;
    report.reps = options.reps;
    report.kv_types = options.kv_types;
    report.depths = options.depths;
    try {
        const model_report shape = inspect_model(options.model_path);
        for (const kv_cache_type t : options.kv_types)
            report.kv_bytes_per_token.push_back({t, shape.kv_bytes_per_token(t)});
    } catch (const std::exception&) {
        // The benchmark itself only needs libllama; the KV sizes are a bonus when the GGUF's layout is known.
    }

    llama_model_ptr model(llama_model_load_from_file(options.model_path.c_str(), llama_model_default_params()));
    if (!model) throw std::runtime_error("failed to load model from '" + options.model_path + "'");
    char desc[256];
    llama_model_desc(model.get(), desc, sizeof(desc));
    report.model_desc = desc;

    cpu_threadpool pool(report.threads);
    for (const kv_cache_type kv : options.kv_types) {
        for (const uint32_t depth : options.depths) {
            depth_result cell;
            cell.kv = kv;
            cell.depth = depth;
            cell.pp_tokens = options.n_prompt;
            cell.tg_tokens = options.n_gen;
            progress << "[" << to_string(kv) << " depth " << depth << "] " << std::flush;

            llama_context_params cparams = llama_context_default_params();
            cparams.n_ctx = depth_bench_context_size(depth, options.n_prompt, options.n_gen);
            cparams.n_threads = report.threads;
            cparams.n_threads_batch = report.threads;
            cparams.type_k = to_ggml_type(kv);
            cparams.type_v = to_ggml_type(kv);
            cparams.no_perf = true;
            llama_context_ptr ctx(llama_init_from_model(model.get(), cparams));
            if (!ctx) {
                cell.error = "failed to create a context of " + std::to_string(cparams.n_ctx) + " tokens with " +
                             to_string(kv) + " KV cache";
                progress << "error: " << cell.error << "\n";
                report.results.push_back(cell);
                continue;
            }
            if (pool.get()) llama_attach_threadpool(ctx.get(), pool.get(), nullptr);

            try {
                const int n_batch = static_cast<int>(llama_n_batch(ctx.get()));
                cell_runner runner(ctx.get(), n_batch, options.seed);
                // Warm-up, as llama-bench does: the first decodes allocate buffers and page in weights.
                runner.decode_random(std::min(options.n_prompt, n_batch), true);
                runner.decode_single(1);
                if (depth > 0) progress << "filling... " << std::flush;
                runner.fill_depth(depth);

                double pp_sum = 0, tg_sum = 0;
                for (int rep = 0; rep < options.reps; ++rep) {
                    runner.reset_to_depth();
                    auto start = clock::now();
                    runner.decode_random(options.n_prompt, depth == 0);
                    pp_sum += options.n_prompt / seconds_since(start);

                    runner.reset_to_depth();
                    start = clock::now();
                    runner.decode_single(options.n_gen);
                    tg_sum += options.n_gen / seconds_since(start);
                }
                cell.pp_tps = pp_sum / options.reps;
                cell.tg_tps = tg_sum / options.reps;
                progress << "pp " << fixed(cell.pp_tps, 1) << " t/s, tg " << fixed(cell.tg_tps, 1) << " t/s\n";
            } catch (const std::exception& e) {
                cell.error = e.what();
                progress << "error: " << cell.error << "\n";
            }
            ctx.reset();  // before the next context attaches the same pool
            report.results.push_back(cell);
        }
    }
    return report;
}

std::string format_depth_table(const depth_bench_report& report) {
    std::ostringstream out;
    out << "model: "
        << (report.model_desc.empty() ? report.model_path : report.model_desc + " (" + report.model_path + ")")
        << "\nthreads: " << report.threads << ", repetitions: " << report.reps << "\n";
    if (!report.kv_bytes_per_token.empty()) {
        out << "KV cache per token:";
        for (const auto& [type, bytes] : report.kv_bytes_per_token) {
            out << " " << to_string(type) << " " << human_bytes(bytes)
                << (&type == &report.kv_bytes_per_token.back().first ? "" : ",");
        }
        out << "\n";
    }
    out << "\n";

    std::vector<std::string> header = {"depth"};
    for (const kv_cache_type kv : report.kv_types) {
        header.push_back(std::string(to_string(kv)) + " pp" + std::to_string(report.n_prompt) + " t/s");
        header.push_back(std::string(to_string(kv)) + " tg" + std::to_string(report.n_gen) + " t/s");
    }
    std::vector<std::vector<std::string>> rows;
    for (const uint32_t depth : report.depths) {
        std::vector<std::string> row = {std::to_string(depth)};
        for (const kv_cache_type kv : report.kv_types) {
            const depth_result* r = find_result(report, kv, depth);
            if (!r) {
                row.push_back("-");
                row.push_back("-");
            } else if (!r->error.empty()) {
                row.push_back("error");
                row.push_back("error");
            } else {
                row.push_back(fixed(r->pp_tps, 2));
                row.push_back(fixed(r->tg_tps, 2));
            }
        }
        rows.push_back(row);
    }
    out << report_text::markdown_table(header, rows);

    for (const auto& r : report.results) {
        if (!r.error.empty()) out << "error: " << to_string(r.kv) << " at depth " << r.depth << ": " << r.error << "\n";
    }
    return out.str();
}

std::string format_depth_json(const depth_bench_report& report) {
    nlohmann::ordered_json j;
    j["model"] = {{"path", report.model_path}, {"desc", report.model_desc}};
    nlohmann::ordered_json kv_bytes = nlohmann::ordered_json::object();
    for (const auto& [type, bytes] : report.kv_bytes_per_token) kv_bytes[to_string(type)] = bytes;
    j["model"]["kv_bytes_per_token"] = kv_bytes;
    j["threads"] = report.threads;
    j["reps"] = report.reps;
    j["results"] = nlohmann::ordered_json::array();
    for (const auto& r : report.results) {
        nlohmann::ordered_json row = {{"kv", to_string(r.kv)}, {"depth", r.depth},         {"pp_tps", r.pp_tps},
                                      {"tg_tps", r.tg_tps},    {"pp_tokens", r.pp_tokens}, {"tg_tokens", r.tg_tokens}};
        if (!r.error.empty()) row["error"] = r.error;
        j["results"].push_back(row);
    }
    return j.dump(2);
}

std::string format_depth_svg(const depth_bench_report& report) {
    // Two panels side by side (prompt processing, generation), x = depth, y = tokens/s, one line per KV type.
    const int width = 960, height = 420;
    const double panel_w = 370, panel_h = 270, top = 80;
    const double panel_x[2] = {80, 560};
    const std::string titles[2] = {"prompt processing (pp" + std::to_string(report.n_prompt) + ")",
                                   "generation (tg" + std::to_string(report.n_gen) + ")"};

    double max_depth = 0;
    for (const uint32_t d : report.depths) max_depth = std::max<double>(max_depth, d);
    const double x_step = nice_step(max_depth);
    const double x_max = max_depth > 0 ? std::ceil(max_depth / x_step) * x_step : 1;

    std::ostringstream svg;
    svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
        << "\" viewBox=\"0 0 " << width << " " << height << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
    svg << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
    svg << "<text x=\"" << width / 2 << "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">"
        << xml_escape("keepwarm bench depth: " + (report.model_desc.empty() ? report.model_path : report.model_desc) +
                      ", " + std::to_string(report.threads) + " threads")
        << "</text>\n";

    // Legend: one swatch per KV type, centred under the title.
    const double legend_x = width / 2.0 - 55.0 * report.kv_types.size();
    for (size_t i = 0; i < report.kv_types.size(); ++i) {
        const double x = legend_x + 110.0 * i;
        const kv_cache_type kv = report.kv_types[i];
        svg << "<g class=\"legend\"><line x1=\"" << x << "\" y1=\"44\" x2=\"" << x + 24 << "\" y2=\"44\" stroke=\""
            << kv_color(kv) << "\" stroke-width=\"2.5\"/><text x=\"" << x + 30 << "\" y=\"48\">KV " << to_string(kv)
            << "</text></g>\n";
    }

    for (int panel = 0; panel < 2; ++panel) {
        const double x0 = panel_x[panel], y0 = top + panel_h;
        double max_tps = 0;
        for (const auto& r : report.results) {
            if (r.error.empty()) max_tps = std::max(max_tps, panel == 0 ? r.pp_tps : r.tg_tps);
        }
        const double y_step = nice_step(max_tps > 0 ? max_tps : 1);
        const double y_max = std::max(1.0, std::ceil(max_tps / y_step)) * y_step;
        const auto px = [&](double depth) { return x0 + depth / x_max * panel_w; };
        const auto py = [&](double tps) { return y0 - tps / y_max * panel_h; };

        svg << "<g class=\"panel\">\n";
        svg << "<text x=\"" << x0 + panel_w / 2 << "\" y=\"" << top - 10
            << "\" text-anchor=\"middle\" font-size=\"13\">" << titles[panel] << "</text>\n";
        for (double v = 0; v <= y_max + y_step / 2; v += y_step) {
            svg << "<line x1=\"" << x0 << "\" y1=\"" << py(v) << "\" x2=\"" << x0 + panel_w << "\" y2=\"" << py(v)
                << "\" stroke=\"#e0e0e0\"/><text x=\"" << x0 - 6 << "\" y=\"" << py(v) + 4 << "\" text-anchor=\"end\">"
                << axis_number(v) << "</text>\n";
        }
        for (double d = 0; d <= x_max + x_step / 2; d += x_step) {
            svg << "<line x1=\"" << px(d) << "\" y1=\"" << y0 << "\" x2=\"" << px(d) << "\" y2=\"" << y0 + 5
                << "\" stroke=\"black\"/><text x=\"" << px(d) << "\" y=\"" << y0 + 18 << "\" text-anchor=\"middle\">"
                << axis_number(d) << "</text>\n";
        }
        svg << "<line x1=\"" << x0 << "\" y1=\"" << y0 << "\" x2=\"" << x0 + panel_w << "\" y2=\"" << y0
            << "\" stroke=\"black\"/><line x1=\"" << x0 << "\" y1=\"" << top << "\" x2=\"" << x0 << "\" y2=\"" << y0
            << "\" stroke=\"black\"/>\n";
        svg << "<text x=\"" << x0 + panel_w / 2 << "\" y=\"" << y0 + 40
            << "\" text-anchor=\"middle\">context depth (tokens)</text>\n";
        svg << "<text transform=\"translate(" << x0 - 50 << " " << top + panel_h / 2
            << ") rotate(-90)\" text-anchor=\"middle\">tokens/s</text>\n";

        for (const kv_cache_type kv : report.kv_types) {
            std::ostringstream points;
            std::ostringstream dots;
            for (const uint32_t depth : report.depths) {
                const depth_result* r = find_result(report, kv, depth);
                if (!r || !r->error.empty()) continue;
                const double tps = panel == 0 ? r->pp_tps : r->tg_tps;
                points << (points.tellp() > 0 ? " " : "") << fixed(px(depth), 1) << "," << fixed(py(tps), 1);
                dots << "<circle cx=\"" << fixed(px(depth), 1) << "\" cy=\"" << fixed(py(tps), 1)
                     << "\" r=\"3\" fill=\"" << kv_color(kv) << "\"><title>" << to_string(kv) << " at depth " << depth
                     << ": " << fixed(tps, 2) << " t/s</title></circle>\n";
            }
            svg << "<polyline class=\"kv-" << to_string(kv) << "\" fill=\"none\" stroke=\"" << kv_color(kv)
                << "\" stroke-width=\"2\" points=\"" << points.str() << "\"/>\n"
                << dots.str();
        }
        svg << "</g>\n";
    }
    svg << "</svg>\n";
    return svg.str();
}

void add_bench_command(CLI::App& app) {
    CLI::App* bench = app.add_subcommand("bench", "Benchmarks run directly through libllama");
    bench->require_subcommand(1);

    struct cli_options {
        depth_bench_options run;
        std::string depths = "0,4096,16384,32768";
        std::string kv = "f16,q8_0,q4_0";
        std::string json_path;
        std::string svg_path;
    };
    auto o = std::make_shared<cli_options>();
    CLI::App* cmd = bench->add_subcommand("depth",
                                          "Prefill and decode tokens/s at several context depths and KV cache types "
                                          "(like llama-bench -d)");
    cmd->add_option("-m,--model", o->run.model_path, "GGUF model file")->required();
    cmd->add_option("--depths", o->depths, "Comma-separated KV depths in tokens")->capture_default_str();
    cmd->add_option("--kv", o->kv, "Comma-separated KV cache types (f16, q8_0, q4_0)")->capture_default_str();
    cmd->add_option("-p,--prompt", o->run.n_prompt, "Prompt tokens per prefill measurement")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    cmd->add_option("-n,--gen", o->run.n_gen, "Generated tokens per decode measurement")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    cmd->add_option("-t,--threads", o->run.threads, "CPU threads (default: the number of math cores)");
    cmd->add_option("-r,--reps", o->run.reps, "Repetitions per cell (rates are averaged)")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    cmd->add_option("--json", o->json_path, "Also write the results as JSON to this file");
    cmd->add_option("--svg", o->svg_path, "Also write a tokens/s vs depth chart as SVG to this file");
    cmd->callback([o] {
        const auto write_file = [](const std::string& path, const std::string& text) {
            report_text::write_report_file(command, path, text, std::cerr);
        };
        depth_bench_report report;
        try {
            o->run.depths = parse_depth_list(o->depths);
            o->run.kv_types = parse_kv_list(o->kv);
            report = run_depth_bench(o->run, std::cerr);
        } catch (const std::exception& e) {
            fail_command(command, e.what());
        }
        std::cout << "\n" << format_depth_table(report);
        if (!o->json_path.empty()) write_file(o->json_path, format_depth_json(report) + "\n");
        if (!o->svg_path.empty()) write_file(o->svg_path, format_depth_svg(report));
        for (const auto& r : report.results) {
            if (!r.error.empty()) throw CLI::RuntimeError(1);  // the table already names the failed cells
        }
    });
    add_experts_bench_command(*bench);
    gauntlet::add_gauntlet_command(*bench);
    add_spec_bench_command(*bench);
}

}  // namespace keepwarm::bench

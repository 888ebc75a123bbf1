// Command-line front ends of model-builder and model-inspect: option parsing, preset overrides and printing.
#include "commands/model-commands.h"

#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "base/command-exit.h"
#include "commands/number-checks.h"
#include "model/model-builder.h"
#include "model/model-inspect.h"

namespace keepwarm {

namespace {

struct mkmodel_options {
    std::string preset;
    std::string output;
    model_spec flags;  // holds only the values of options given on the command line
};

std::string arch_default_preset(const std::string& arch) {
    if (arch == "qwen3moe") return "tiny-moe";
    if (arch == "qwen35") return "tiny-hybrid";
    if (arch == "qwen35moe") return "tiny-hybrid-moe";
    if (arch == "gemma3") return "tiny-swa";
    if (arch == "gpt-oss") return "tiny-gpt-oss";
    return "tiny";
}

void run_mkmodel(CLI::App* cmd, const mkmodel_options& o) {
    auto given = [&](const char* name) { return cmd->get_option(name)->count() > 0; };
    try {
        // Without --preset, --arch picks the tiny shape of that architecture as the starting point.
        const std::string base =
            !o.preset.empty() ? o.preset : arch_default_preset(given("--arch") ? o.flags.arch : "qwen3");
        model_spec spec = preset_spec(base);
        bool custom = o.preset.empty();
        auto take = [&](const char* name, auto& field, const auto& value) {
            if (!given(name)) return;
            field = value;
            custom = true;
        };
        const model_spec& f = o.flags;
        take("--arch", spec.arch, f.arch);
        take("--layers", spec.n_layer, f.n_layer);
        take("--width", spec.n_embd, f.n_embd);
        take("--heads", spec.n_head, f.n_head);
        take("--kv-heads", spec.n_head_kv, f.n_head_kv);
        take("--head-dim", spec.head_dim, f.head_dim);
        take("--ff", spec.n_ff, f.n_ff);
        take("--experts", spec.n_expert, f.n_expert);
        take("--experts-used", spec.n_expert_used, f.n_expert_used);
        take("--expert-ff", spec.n_ff_exp, f.n_ff_exp);
        take("--ctx", spec.n_ctx_train, f.n_ctx_train);
        take("--attn-interval", spec.full_attention_interval, f.full_attention_interval);
        take("--ssm-state", spec.ssm_state_size, f.ssm_state_size);
        take("--ssm-k-heads", spec.ssm_group_count, f.ssm_group_count);
        take("--ssm-v-heads", spec.ssm_time_step_rank, f.ssm_time_step_rank);
        take("--ssm-conv", spec.ssm_conv_kernel, f.ssm_conv_kernel);
        take("--mtp-layers", spec.n_mtp_layers, f.n_mtp_layers);
        take("--sliding-window", spec.sliding_window, f.sliding_window);
        take("--swa-pattern", spec.sliding_window_pattern, f.sliding_window_pattern);
        take("--pooling", spec.pooling, f.pooling);
        // Tokenizer, template, type and seed don't change the shape, so the preset name still describes it.
        if (given("--vocab")) spec.vocab = f.vocab;
        if (given("--template")) spec.chat_template = f.chat_template;
        if (given("--type")) spec.type = f.type;
        if (given("--seed")) spec.seed = f.seed;
        if (given("--llama-source")) spec.llama_source_dir = f.llama_source_dir;
        spec.preset = custom ? (o.preset.empty() ? std::string() : o.preset + "-custom") : base;

        const std::string out = !o.output.empty() ? o.output : model_name(spec) + ".gguf";
        const build_result r = build_model(spec, out);

        std::printf("wrote %s\n", r.path.c_str());
        std::printf("  %s, %u layers, width %u, %u heads (%u KV) of %u, ff %u", spec.arch.c_str(), spec.n_layer,
                    spec.n_embd, spec.n_head, spec.n_head_kv, spec.resolved_head_dim(), spec.n_ff);
        if (spec.arch == "qwen3moe" || spec.arch == "qwen35moe" || spec.arch == "gpt-oss") {
            std::printf(", %u experts (%u used) of ff %u", spec.n_expert, spec.n_expert_used, spec.n_ff_exp);
        }
        if (spec.arch == "qwen35moe") std::printf(", shared expert of ff %u", spec.n_ff);
        if (spec.arch == "qwen35" || spec.arch == "qwen35moe") {
            std::printf(", attention every %u layers, delta-net %u k / %u v heads of %u", spec.full_attention_interval,
                        spec.ssm_group_count, spec.ssm_time_step_rank, spec.ssm_state_size);
        }
        if (spec.arch == "gemma3" || spec.arch == "gpt-oss") {
            const uint32_t n = spec.sliding_window_pattern;
            const char* suffix = n % 100 / 10 == 1 ? "th"
                                 : n % 10 == 1     ? "st"
                                 : n % 10 == 2     ? "nd"
                                 : n % 10 == 3     ? "rd"
                                                   : "th";
            std::printf(", sliding window %u (every %u%s layer full)", spec.sliding_window, n, suffix);
        }
        if (!spec.pooling.empty() && spec.pooling != "none") {
            std::printf(", embedding model (%s pooling)", spec.pooling.c_str());
        }
        std::printf(", context %u\n", spec.n_ctx_train);
        std::printf("  %s weights, vocab %s, template %s, seed %llu\n", spec.type.c_str(), spec.vocab.c_str(),
                    spec.chat_template.c_str(), static_cast<unsigned long long>(spec.seed));
        std::printf("  %.1f MiB, %.1f M parameters, %.1f s (random weights: output is noise)\n",
                    double(r.file_size) / (1024.0 * 1024.0), double(r.n_params) / 1e6, r.seconds);
    } catch (const CLI::Error&) {
        throw;
    } catch (const std::exception& e) {
        fail_command("mkmodel", e.what());
    }
}

}  // namespace

void add_mkmodel_command(CLI::App& app) {
    auto o = std::make_shared<mkmodel_options>();
    CLI::App* cmd = app.add_subcommand("mkmodel",
                                       "Generate a GGUF model with random weights, a real tokenizer and a "
                                       "real chat template (for tests and benchmarks)");
    model_spec& f = o->flags;
    std::string presets;
    for (const auto& p : preset_names()) presets += (presets.empty() ? "" : ", ") + p;
    cmd->add_option("--preset", o->preset,
                    "Starting shape: " + presets + " (default: tiny, or the tiny shape of --arch)");
    cmd->add_option("-o,--output", o->output, "Output file (default: ./<model name>.gguf)");
    cmd->add_option("--arch", f.arch,
                    "Architecture: qwen3 (dense), qwen3moe (MoE), qwen35 (hybrid delta-net), qwen35moe (hybrid MoE), "
                    "gemma3 (sliding window), gpt-oss (MoE, sliding window, attention sinks)");
    cmd->add_option("--layers", f.n_layer, "Number of blocks")->check(whole_number_at_least(1, "blocks"));
    cmd->add_option("--width", f.n_embd, "Embedding length")->check(whole_number_at_least(1, ""));
    cmd->add_option("--heads", f.n_head, "Query heads")->check(whole_number_at_least(1, "heads"));
    cmd->add_option("--kv-heads", f.n_head_kv, "KV heads (must divide --heads)")
        ->check(whole_number_at_least(1, "heads"));
    cmd->add_option("--head-dim", f.head_dim, "Head size (default: width / heads)")
        ->check(whole_number_at_least(0, "0: width / heads"));
    cmd->add_option("--ff", f.n_ff, "Feed-forward length (qwen35moe: of the shared expert)")
        ->check(whole_number_at_least(1, ""));
    cmd->add_option("--experts", f.n_expert, "Experts (qwen3moe, qwen35moe, gpt-oss)")
        ->check(whole_number_at_least(0, ""));
    cmd->add_option("--experts-used", f.n_expert_used, "Experts used per token (qwen3moe, qwen35moe, gpt-oss)")
        ->check(whole_number_at_least(0, ""));
    cmd->add_option("--expert-ff", f.n_ff_exp, "Feed-forward length of each expert (qwen3moe, qwen35moe, gpt-oss)")
        ->check(whole_number_at_least(0, ""));
    cmd->add_option("--ctx", f.n_ctx_train, "Trained context length written to the model")
        ->check(whole_number_at_least(1, "tokens"));
    cmd->add_option("--attn-interval", f.full_attention_interval,
                    "Every Nth layer is full attention (qwen35, qwen35moe)")
        ->check(whole_number_at_least(0, "layers"));
    cmd->add_option("--ssm-state", f.ssm_state_size, "Delta-net head size (qwen35, qwen35moe)")
        ->check(whole_number_at_least(0, ""));
    cmd->add_option("--ssm-k-heads", f.ssm_group_count, "Delta-net key heads (qwen35, qwen35moe)")
        ->check(whole_number_at_least(0, "heads"));
    cmd->add_option("--ssm-v-heads", f.ssm_time_step_rank, "Delta-net value heads (qwen35, qwen35moe)")
        ->check(whole_number_at_least(0, "heads"));
    cmd->add_option("--ssm-conv", f.ssm_conv_kernel, "Delta-net convolution kernel (qwen35, qwen35moe)")
        ->check(whole_number_at_least(0, ""));
    cmd->add_option("--mtp-layers", f.n_mtp_layers,
                    "Multi-token prediction heads after the blocks, as Qwen3.5 ships (qwen35, qwen35moe: 0 or 1; "
                    "tiny-hybrid-mtp: 1), for serve --spec-type draft-mtp")
        ->check(whole_number_at_least(0, "heads"));
    cmd->add_option("--sliding-window", f.sliding_window, "Tokens a sliding-window layer attends to (gemma3, gpt-oss)")
        ->check(whole_number_at_least(1, "tokens"));
    cmd->add_option("--swa-pattern", f.sliding_window_pattern,
                    "Every Nth layer attends to everything (gemma3, gpt-oss)")
        ->check(whole_number_at_least(1, ""));
    cmd->add_option("--pooling", f.pooling,
                    "An embedding model, its pooling: mean, cls or last (tiny-embed: last); rank: a reranker "
                    "(tiny-rerank); none: a chat model")
        ->check(CLI::IsMember({"none", "mean", "cls", "last", "rank"}));
    cmd->add_option("--vocab", f.vocab,
                    "Tokenizer: models/ggml-vocab-NAME.gguf of llama.cpp (qwen2, qwen35, gemma-4, llama-bpe)");
    cmd->add_option("--template", f.chat_template,
                    "Chat template: models/templates/NAME.jinja of llama.cpp (e.g. Qwen-Qwen3-0.6B, Qwen3.5-4B)");
    cmd->add_option("--type", f.type, "Weight type: f32, f16, q8_0, q4_0");
    cmd->add_option("--seed", f.seed, "Random seed (same seed and shape: identical file)")
        ->check(whole_number_at_least(0, ""));
    cmd->add_option("--llama-source", f.llama_source_dir,
                    "llama.cpp source tree holding the vocab and template files (default: the one keepwarm was "
                    "built against, or $KEEPWARM_LLAMA_SOURCE_DIR)");
    cmd->callback([cmd, o] { run_mkmodel(cmd, *o); });
}

void add_inspect_command(CLI::App& app) {
    struct inspect_options {
        std::string path;
        std::vector<uint32_t> contexts;
        bool json = false;
    };
    auto o = std::make_shared<inspect_options>();
    CLI::App* cmd = app.add_subcommand("inspect",
                                       "Show a GGUF model's layout and what its KV cache and recurrent "
                                       "state cost per token and per sequence");
    cmd->add_option("model", o->path, "GGUF model file")->required();
    cmd->add_option("--ctx", o->contexts, "Context length(s) to show memory for (default: the model's and 32768)")
        ->delimiter(',')
        ->check(whole_number_at_least(1, "tokens"));
    cmd->add_flag("--json", o->json, "Print JSON");
    cmd->callback([o] {
        try {
            const model_report report = inspect_model(o->path);
            std::vector<uint32_t> contexts = o->contexts;
            if (contexts.empty()) {
                if (report.n_ctx_train > 0) contexts.push_back(report.n_ctx_train);
                if (report.n_ctx_train != 32768) contexts.push_back(32768);
            }
            std::cout << (o->json ? format_report_json(report, contexts) + "\n" : format_report(report, contexts));
        } catch (const std::exception& e) {
            fail_command("inspect", e.what());
        }
    });
}

}  // namespace keepwarm

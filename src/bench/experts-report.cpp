// See experts-report.h. Rates are per token of the whole trace; byte counts print in binary units (KiB, MiB, GiB).
#include "bench/experts-report.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>
#include <vector>

#include "bench/report-text.h"

namespace keepwarm::bench {

namespace {

using report_text::fixed;
using report_text::xml_escape;

std::string human_bytes(double bytes) {
    if (bytes < 1024) return fixed(bytes, bytes == std::floor(bytes) ? 0 : 1) + " B";
    if (bytes < 1024.0 * 1024) return fixed(bytes / 1024.0, 2) + " KiB";
    if (bytes < 1024.0 * 1024 * 1024) return fixed(bytes / (1024.0 * 1024.0), 2) + " MiB";
    return fixed(bytes / (1024.0 * 1024.0 * 1024.0), 2) + " GiB";
}

double per_token(uint64_t value, uint64_t tokens) {
    return tokens ? double(value) / double(tokens) : 0;
}

std::string percent(double rate) {
    return fixed(100 * rate, 1);
}

const char* k_policy_colors[2] = {"#1f77b4", "#d62728"};

}  // namespace

std::string format_experts_table(const experts_bench_report& report) {
    const uint64_t tokens = report.n_tokens();
    std::ostringstream out;
    out << "model: "
        << (report.model_desc.empty() ? report.model_path : report.model_desc + " (" + report.model_path + ")")
        << "\ntrace: " << tokens << " tokens (" << report.n_prompt_tokens << " prompt + " << report.n_generated_tokens
        << " generated), " << report.n_moe_layers << " MoE layers, " << report.n_expert << " experts, "
        << report.n_expert_used << " used per token\n"
        << "without an expert cache: " << fixed(double(report.n_expert_used) * report.n_moe_layers, 0)
        << " uploads/token, " << human_bytes(double(report.bytes_per_token_uncached)) << "/token\n"
        << "gated: an expert takes a slot after " << report.admission.admit_k << " uses in the last "
        << report.admission.admit_window << " tokens; until then it is streamed\n\n";

    const std::vector<std::string> header = {"slots/layer", "LRU hit %",         "LRU uploads/tok", "LRU bytes/tok",
                                             "gated hit %", "gated uploads/tok", "gated bytes/tok"};
    std::vector<std::vector<std::string>> rows;
    for (size_t i = 0; i < report.slots.size(); ++i) {
        std::vector<std::string> row = {std::to_string(report.slots[i])};
        for (const auto* stats : {&report.lru[i], &report.gated[i]}) {
            row.push_back(percent(stats->hit_rate()));
            row.push_back(fixed(per_token(stats->uploads(), tokens), 2));
            row.push_back(human_bytes(per_token(stats->bytes_moved, tokens)));
        }
        rows.push_back(row);
    }
    out << report_text::markdown_table(header, rows);
    return out.str();
}

std::string format_experts_json(const experts_bench_report& report) {
    const uint64_t tokens = report.n_tokens();
    nlohmann::ordered_json j;
    j["model"] = {{"path", report.model_path}, {"desc", report.model_desc}};
    j["n_expert"] = report.n_expert;
    j["n_expert_used"] = report.n_expert_used;
    j["moe_layers"] = report.n_moe_layers;
    j["tokens"] = {{"prompt", report.n_prompt_tokens}, {"generated", report.n_generated_tokens}};
    j["uncached"] = {{"uploads_per_token", report.n_expert_used * report.n_moe_layers},
                     {"bytes_per_token", report.bytes_per_token_uncached}};
    j["admission"] = {{"k", report.admission.admit_k}, {"window", report.admission.admit_window}};
    j["results"] = nlohmann::ordered_json::array();
    for (size_t i = 0; i < report.slots.size(); ++i) {
        for (const auto& [policy, stats] : {std::pair{"lru", &report.lru[i]}, std::pair{"gated", &report.gated[i]}}) {
            j["results"].push_back({{"policy", policy},
                                    {"slots", stats->slots},
                                    {"hit_rate", stats->hit_rate()},
                                    {"uploads_per_token", per_token(stats->uploads(), tokens)},
                                    {"bytes_per_token", per_token(stats->bytes_moved, tokens)},
                                    {"lookups", stats->lookups},
                                    {"hits", stats->hits},
                                    {"fills", stats->fills},
                                    {"streamed", stats->streamed},
                                    {"evictions", stats->evictions},
                                    {"bytes_moved", stats->bytes_moved}});
        }
    }
    return j.dump(2);
}

std::string format_experts_svg(const experts_bench_report& report) {
    // x = slots per layer on a log2 scale (slot counts are usually powers of two), y = hit rate, one line per policy.
    const int width = 720, height = 460;
    const double left = 80, top = 80, plot_w = 580, plot_h = 300, bottom = top + plot_h;
    double lo = 0, hi = 0;
    if (!report.slots.empty()) {
        lo = std::log2(double(*std::min_element(report.slots.begin(), report.slots.end())));
        hi = std::log2(double(*std::max_element(report.slots.begin(), report.slots.end())));
    }
    const auto px = [&](uint32_t slots) {
        return hi > lo ? left + (std::log2(double(slots)) - lo) / (hi - lo) * plot_w : left + plot_w / 2;
    };
    const auto py = [&](double rate) { return bottom - rate * plot_h; };

    std::ostringstream svg;
    svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
        << "\" viewBox=\"0 0 " << width << " " << height << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
    svg << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
    svg << "<text x=\"" << width / 2 << "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">"
        << xml_escape("keepwarm bench experts: " + (report.model_desc.empty() ? report.model_path : report.model_desc) +
                      ", " + std::to_string(report.n_tokens()) + " tokens")
        << "</text>\n";
    const std::string labels[2] = {"LRU", "gated (k=" + std::to_string(report.admission.admit_k) +
                                              ", w=" + std::to_string(report.admission.admit_window) + ")"};
    for (int p = 0; p < 2; ++p) {
        const double x = width / 2.0 - 140 + 160.0 * p;
        svg << "<g class=\"legend\"><line x1=\"" << x << "\" y1=\"48\" x2=\"" << x + 24 << "\" y2=\"48\" stroke=\""
            << k_policy_colors[p] << "\" stroke-width=\"2.5\"/><text x=\"" << x + 30 << "\" y=\"52\">"
            << xml_escape(labels[p]) << "</text></g>\n";
    }
    for (int pct = 0; pct <= 100; pct += 20) {
        svg << "<line x1=\"" << left << "\" y1=\"" << py(pct / 100.0) << "\" x2=\"" << left + plot_w << "\" y2=\""
            << py(pct / 100.0) << "\" stroke=\"#e0e0e0\"/><text x=\"" << left - 6 << "\" y=\"" << py(pct / 100.0) + 4
            << "\" text-anchor=\"end\">" << pct << "%</text>\n";
    }
    for (const uint32_t s : report.slots) {
        svg << "<line x1=\"" << fixed(px(s), 1) << "\" y1=\"" << bottom << "\" x2=\"" << fixed(px(s), 1) << "\" y2=\""
            << bottom + 5 << "\" stroke=\"black\"/><text x=\"" << fixed(px(s), 1) << "\" y=\"" << bottom + 18
            << "\" text-anchor=\"middle\">" << s << "</text>\n";
    }
    svg << "<line x1=\"" << left << "\" y1=\"" << bottom << "\" x2=\"" << left + plot_w << "\" y2=\"" << bottom
        << "\" stroke=\"black\"/><line x1=\"" << left << "\" y1=\"" << top << "\" x2=\"" << left << "\" y2=\"" << bottom
        << "\" stroke=\"black\"/>\n";
    svg << "<text x=\"" << left + plot_w / 2 << "\" y=\"" << bottom + 40 << "\" text-anchor=\"middle\">expert slots per"
        << " layer (of " << report.n_expert << ")</text>\n";
    svg << "<text transform=\"translate(" << left - 50 << " " << top + plot_h / 2
        << ") rotate(-90)\" text-anchor=\"middle\">hit rate</text>\n";

    const std::vector<expert_cache_stats>* series[2] = {&report.lru, &report.gated};
    const char* classes[2] = {"policy-lru", "policy-gated"};
    for (int p = 0; p < 2; ++p) {
        std::ostringstream points, dots;
        for (const auto& stats : *series[p]) {
            const std::string x = fixed(px(stats.slots), 1), y = fixed(py(stats.hit_rate()), 1);
            points << (points.tellp() > 0 ? " " : "") << x << "," << y;
            dots << "<circle cx=\"" << x << "\" cy=\"" << y << "\" r=\"3\" fill=\"" << k_policy_colors[p]
                 << "\"><title>" << xml_escape(labels[p]) << ", " << stats.slots
                 << " slots: " << percent(stats.hit_rate()) << "% hits</title></circle>\n";
        }
        svg << "<polyline class=\"" << classes[p] << "\" fill=\"none\" stroke=\"" << k_policy_colors[p]
            << "\" stroke-width=\"2\" points=\"" << points.str() << "\"/>\n"
            << dots.str();
    }
    svg << "</svg>\n";
    return svg.str();
}

}  // namespace keepwarm::bench

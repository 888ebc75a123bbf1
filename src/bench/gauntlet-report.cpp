// See gauntlet-report.h.
#include "bench/gauntlet-report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench/report-text.h"

namespace keepwarm::bench::gauntlet {

namespace {

constexpr double nan_value = std::numeric_limits<double>::quiet_NaN();

using report_text::fixed;
using report_text::xml_escape;

const char* series_color(size_t i) {
    static const char* const colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};
    return colors[i % 6];
}

nlohmann::ordered_json number_or_null(double v) {
    return std::isnan(v) ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(v);
}

// A number the server may not report (-1: it did not): null then.
nlohmann::ordered_json reported_or_null(double v) {
    return number_or_null(v >= 0 ? v : NAN);
}

// "p50 / p90 / p99 / max" of the gaps between a stream's tokens, in ms.
std::string token_gaps_text(const target_summary& s) {
    return fixed(s.token_gap_p50_ms, 1) + " / " + fixed(s.token_gap_p90_ms, 1) + " / " + fixed(s.token_gap_p99_ms, 1) +
           " / " + fixed(s.token_gap_max_ms, 1);
}

// TTFT (log scale) against send time, one series per target, every run's requests.
std::string ttft_chart(const gauntlet_report& report) {
    const double width = 900, height = 380, left = 70, right = 170, top = 30, bottom = 50;
    const double plot_w = width - left - right, plot_h = height - top - bottom;
    double max_t = 1, min_ms = std::numeric_limits<double>::infinity(), max_ms = 1;
    for (const target_run& run : report.runs) {
        for (const request_record& r : run.requests) {
            if (r.ping || !r.ok || r.ttft_ms <= 0) continue;
            max_t = std::max(max_t, r.sent_at_s);
            min_ms = std::min(min_ms, r.ttft_ms);
            max_ms = std::max(max_ms, r.ttft_ms);
        }
    }
    if (!std::isfinite(min_ms)) min_ms = 1;
    const double lo = std::floor(std::log10(std::max(min_ms, 0.1))),
                 hi = std::max(lo + 1, std::ceil(std::log10(max_ms)));
    const auto x_of = [&](double t) { return left + plot_w * t / max_t; };
    const auto y_of = [&](double ms) { return top + plot_h * (1 - (std::log10(std::max(ms, 0.1)) - lo) / (hi - lo)); };
    std::ostringstream svg;
    svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
        << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
    svg << "<text x=\"" << left << "\" y=\"18\" font-size=\"14\">TTFT per request over time (log scale)</text>\n";
    for (double e = lo; e <= hi; e += 1) {
        const double y = y_of(std::pow(10, e));
        svg << "<line x1=\"" << left << "\" x2=\"" << left + plot_w << "\" y1=\"" << y << "\" y2=\"" << y
            << "\" stroke=\"#ddd\"/><text x=\"" << left - 6 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\">"
            << fixed(std::pow(10, e), 0) << " ms</text>\n";
    }
    for (int i = 0; i <= 5; ++i) {
        const double t = max_t * i / 5, x = x_of(t);
        svg << "<text x=\"" << x << "\" y=\"" << top + plot_h + 18 << "\" text-anchor=\"middle\">"
            << fixed(t, max_t < 10 ? 1 : 0) << "</text>\n";
    }
    svg << "<text x=\"" << left + plot_w / 2 << "\" y=\"" << height - 10
        << "\" text-anchor=\"middle\">seconds since the replay started</text>\n";
    svg << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << plot_w << "\" height=\"" << plot_h
        << "\" fill=\"none\" stroke=\"#888\"/>\n";
    std::vector<std::string> targets;
    for (const target_summary& s : report.summaries) targets.push_back(s.target);
    for (size_t i = 0; i < targets.size(); ++i) {
        const char* color = series_color(i);
        for (const target_run& run : report.runs) {
            if (run.target != targets[i]) continue;
            std::vector<const request_record*> points;
            for (const request_record& r : run.requests) {
                if (!r.ping && r.ok && r.ttft_ms > 0) points.push_back(&r);
            }
            std::sort(points.begin(), points.end(),
                      [](const auto* a, const auto* b) { return a->sent_at_s < b->sent_at_s; });
            svg << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-opacity=\"0.5\" points=\"";
            for (const request_record* r : points) svg << x_of(r->sent_at_s) << "," << y_of(r->ttft_ms) << " ";
            svg << "\"/>\n";
            for (const request_record* r : points) {
                svg << "<circle cx=\"" << x_of(r->sent_at_s) << "\" cy=\"" << y_of(r->ttft_ms) << "\" r=\"3\" fill=\""
                    << color << "\"><title>" << xml_escape(run.target) << " " << xml_escape(r->agent) << " line "
                    << r->line_number << ": " << fixed(r->ttft_ms, 1) << " ms</title></circle>\n";
            }
        }
        const double ly = top + 10 + 18 * static_cast<double>(i);
        svg << "<rect x=\"" << left + plot_w + 15 << "\" y=\"" << ly - 9 << "\" width=\"12\" height=\"12\" fill=\""
            << color << "\"/><text x=\"" << left + plot_w + 32 << "\" y=\"" << ly + 1 << "\">" << xml_escape(targets[i])
            << "</text>\n";
    }
    svg << "</svg>\n";
    return svg.str();
}

// Prefill tokens computed per target next to the ideal for the same conversations.
std::string prefill_chart(const gauntlet_report& report) {
    const double width = 900, bar_h = 18, gap = 16, left = 130, right = 200, top = 40;
    const double height = top + 30 + report.summaries.size() * (2 * bar_h + gap);
    double max_v = 1;
    for (const target_summary& s : report.summaries) {
        max_v = std::max({max_v, static_cast<double>(s.computed_tokens), static_cast<double>(s.ideal_tokens)});
    }
    const double plot_w = width - left - right;
    std::ostringstream svg;
    svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
        << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
    svg << "<text x=\"" << left << "\" y=\"18\" font-size=\"14\">Prefill tokens computed vs the ideal (all runs)"
        << "</text>\n";
    double y = top;
    for (size_t i = 0; i < report.summaries.size(); ++i) {
        const target_summary& s = report.summaries[i];
        const double computed_w = plot_w * static_cast<double>(s.computed_tokens) / max_v;
        const double ideal_w = plot_w * static_cast<double>(s.ideal_tokens) / max_v;
        svg << "<text x=\"" << left - 8 << "\" y=\"" << y + bar_h + 4 << "\" text-anchor=\"end\">"
            << xml_escape(s.target) << "</text>\n";
        svg << "<rect x=\"" << left << "\" y=\"" << y << "\" width=\"" << computed_w << "\" height=\"" << bar_h
            << "\" fill=\"" << series_color(i) << "\"/><text x=\"" << left + computed_w + 6 << "\" y=\""
            << y + bar_h - 5 << "\">computed " << s.computed_tokens << " (" << fixed(s.computed_over_ideal, 2)
            << "x ideal)</text>\n";
        svg << "<rect x=\"" << left << "\" y=\"" << y + bar_h << "\" width=\"" << ideal_w << "\" height=\"" << bar_h
            << "\" fill=\"#bbb\"/><text x=\"" << left + ideal_w + 6 << "\" y=\"" << y + 2 * bar_h - 5 << "\">ideal "
            << s.ideal_tokens << "</text>\n";
        y += 2 * bar_h + gap;
    }
    svg << "</svg>\n";
    return svg.str();
}

}  // namespace

double percentile(std::vector<double> values, double p) {
    if (values.empty()) return nan_value;
    std::sort(values.begin(), values.end());
    const double rank = std::clamp(p, 0.0, 100.0) / 100 * static_cast<double>(values.size() - 1);
    const size_t below = static_cast<size_t>(std::floor(rank));
    const size_t above = std::min(below + 1, values.size() - 1);
    return values[below] + (values[above] - values[below]) * (rank - static_cast<double>(below));
}

double ratio(double a, double b) {
    if (std::isnan(a) || std::isnan(b) || b == 0) return nan_value;
    return a / b;
}

target_summary summarize(const std::string& target, const std::vector<target_run>& runs) {
    target_summary s;
    s.target = target;
    std::vector<double> cold, warm, gaps;
    for (const target_run& run : runs) {
        if (run.target != target) continue;
        ++s.runs;
        if (!run.error.empty()) ++s.failed_runs;
        const request_record* first = nullptr;
        for (const request_record& r : run.requests) {
            if (!r.ok) ++s.failures;
            if (r.ping) {
                ++s.pings;
                s.ping_computed_tokens += std::max(r.computed_tokens, 0);
                continue;
            }
            ++s.requests;
            if (r.cancelled) ++s.cancelled;
            if (r.ok && (r.computed_tokens < 0 || r.reused_tokens < 0)) ++s.unreported;
            if (r.computed_tokens >= 0 && r.reused_tokens >= 0) {
                s.prompt_tokens += std::max(r.prompt_tokens, 0);
                s.reused_tokens += r.reused_tokens;
                s.computed_tokens += r.computed_tokens;
                s.ideal_tokens += std::max(r.ideal_new_tokens, 0);
            }
            if (r.ok) s.prefill_ms += r.prompt_ms >= 0 ? r.prompt_ms : r.ttft_ms;
            if (!first || r.sent_at_s < first->sent_at_s) first = &r;
            if (r.ok && r.agent_request > 0) warm.push_back(r.ttft_ms);
            gaps.insert(gaps.end(), r.token_gaps_ms.begin(), r.token_gaps_ms.end());
            if (r.sampling_ms >= 0) {
                ++s.sampling_reported;
                s.sampling_ms += r.sampling_ms;
                s.sampling_max_ms = std::max(s.sampling_max_ms, r.sampling_max_ms);
            }
        }
        if (first && first->ok) cold.push_back(first->ttft_ms);
    }
    s.computed_over_ideal = ratio(static_cast<double>(s.computed_tokens), static_cast<double>(s.ideal_tokens));
    s.cold_ttft_ms = percentile(cold, 50);
    s.warm_ttft_p50_ms = percentile(warm, 50);
    s.warm_ttft_p95_ms = percentile(warm, 95);
    s.warm_p95_over_cold = ratio(s.warm_ttft_p95_ms, s.cold_ttft_ms);
    s.token_gaps = static_cast<long long>(gaps.size());
    s.token_gap_p50_ms = percentile(gaps, 50);
    s.token_gap_p90_ms = percentile(gaps, 90);
    s.token_gap_p99_ms = percentile(gaps, 99);
    s.token_gap_max_ms = percentile(gaps, 100);
    if (s.sampling_reported == 0) s.sampling_ms = s.sampling_max_ms = std::numeric_limits<double>::quiet_NaN();
    return s;
}

std::vector<target_ratios> compare_to(const std::vector<target_summary>& summaries, const std::string& baseline) {
    std::vector<target_ratios> out;
    const auto base =
        std::find_if(summaries.begin(), summaries.end(), [&](const target_summary& s) { return s.target == baseline; });
    if (base == summaries.end()) return out;
    for (const target_summary& s : summaries) {
        if (s.target == baseline) continue;
        out.push_back({s.target, baseline, ratio(s.prefill_ms, base->prefill_ms),
                       ratio(static_cast<double>(s.computed_tokens), static_cast<double>(base->computed_tokens)),
                       ratio(s.warm_p95_over_cold, base->warm_p95_over_cold)});
    }
    return out;
}

std::string format_gauntlet_table(const gauntlet_report& report) {
    std::ostringstream out;
    char line[512];
    std::snprintf(line, sizeof line, "%-14s %5s %5s %5s %10s %10s %10s %10s %8s %9s %9s %9s %9s %10s\n", "target",
                  "reqs", "fail", "pings", "prompt", "reused", "computed", "ideal", "comp/id", "cold ms", "warm p50",
                  "warm p95", "p95/cold", "prefill s");
    out << line;
    for (const target_summary& s : report.summaries) {
        std::snprintf(line, sizeof line, "%-14s %5d %5d %5d %10lld %10lld %10lld %10lld %8s %9s %9s %9s %9s %10s\n",
                      s.target.c_str(), s.requests, s.failures, s.pings, s.prompt_tokens, s.reused_tokens,
                      s.computed_tokens, s.ideal_tokens, fixed(s.computed_over_ideal, 3).c_str(),
                      fixed(s.cold_ttft_ms, 0).c_str(), fixed(s.warm_ttft_p50_ms, 0).c_str(),
                      fixed(s.warm_ttft_p95_ms, 0).c_str(), (fixed(100 * s.warm_p95_over_cold, 1) + "%").c_str(),
                      fixed(s.prefill_ms / 1000, 2).c_str());
        out << line;
    }
    for (const target_summary& s : report.summaries) {
        out << s.target << ": gaps between a stream's tokens (" << s.token_gaps << "), p50 / p90 / p99 / max "
            << token_gaps_text(s) << " ms\n";
        if (s.sampling_reported > 0) {
            out << s.target << ": sampling (server-reported, " << s.sampling_reported << " streams), "
                << fixed(s.sampling_ms, 0) << " ms in all, the longest one token " << fixed(s.sampling_max_ms, 1)
                << " ms\n";
        }
    }
    for (const target_summary& s : report.summaries) {
        if (s.unreported > 0) {
            out << s.target << ": " << s.unreported
                << " requests without the server's numbers (a cancelled stream ends before its usage) are left out of "
                   "the token columns and the ideal\n";
        }
    }
    for (const target_ratios& r : report.ratios) {
        out << r.target << " / " << r.baseline << ": total prefill time " << fixed(r.prefill_time, 3)
            << "x, computed tokens " << fixed(r.computed_tokens, 3) << "x, warm p95/cold "
            << fixed(r.warm_p95_over_cold, 3) << "x\n";
    }
    for (const target_run& run : report.runs) {
        if (!run.error.empty()) out << run.target << " run " << run.run + 1 << " failed: " << run.error << "\n";
        for (const request_record& r : run.requests) {
            if (!r.ok) out << run.target << " line " << r.line_number << " (" << r.agent << "): " << r.error << "\n";
        }
    }
    return out.str();
}

std::string format_gauntlet_json(const gauntlet_report& report) {
    using json = nlohmann::ordered_json;
    json j;
    j["command"] = report.command_line;
    j["model"] = report.model;
    j["workload"] = report.workload;
    j["killers"] = report.killers;
    j["lines"] = report.lines;
    j["agents"] = report.agents;
    j["baseline"] = report.baseline;
    j["targets"] = json::array();
    for (const target_summary& s : report.summaries) {
        j["targets"].push_back({{"target", s.target},
                                {"runs", s.runs},
                                {"failed_runs", s.failed_runs},
                                {"requests", s.requests},
                                {"failures", s.failures},
                                {"pings", s.pings},
                                {"cancelled", s.cancelled},
                                {"unreported", s.unreported},
                                {"prompt_tokens", s.prompt_tokens},
                                {"reused_tokens", s.reused_tokens},
                                {"computed_tokens", s.computed_tokens},
                                {"ping_computed_tokens", s.ping_computed_tokens},
                                {"ideal_tokens", s.ideal_tokens},
                                {"computed_over_ideal", number_or_null(s.computed_over_ideal)},
                                {"prefill_ms", s.prefill_ms},
                                {"cold_ttft_ms", number_or_null(s.cold_ttft_ms)},
                                {"warm_ttft_p50_ms", number_or_null(s.warm_ttft_p50_ms)},
                                {"warm_ttft_p95_ms", number_or_null(s.warm_ttft_p95_ms)},
                                {"warm_p95_over_cold", number_or_null(s.warm_p95_over_cold)},
                                {"token_gaps", s.token_gaps},
                                {"token_gap_p50_ms", number_or_null(s.token_gap_p50_ms)},
                                {"token_gap_p90_ms", number_or_null(s.token_gap_p90_ms)},
                                {"token_gap_p99_ms", number_or_null(s.token_gap_p99_ms)},
                                {"token_gap_max_ms", number_or_null(s.token_gap_max_ms)},
                                {"sampling_ms", number_or_null(s.sampling_ms)},
                                {"sampling_max_ms", number_or_null(s.sampling_max_ms)}});
    }
    j["ratios"] = json::array();
    for (const target_ratios& r : report.ratios) {
        j["ratios"].push_back({{"target", r.target},
                               {"baseline", r.baseline},
                               {"prefill_time", number_or_null(r.prefill_time)},
                               {"computed_tokens", number_or_null(r.computed_tokens)},
                               {"warm_p95_over_cold", number_or_null(r.warm_p95_over_cold)}});
    }
    j["runs"] = json::array();
    for (const target_run& run : report.runs) {
        json requests = json::array();
        for (const request_record& r : run.requests) {
            json q = {{"line", r.line_number},
                      {"agent", r.agent},
                      {"agent_request", r.agent_request},
                      {"ping", r.ping},
                      {"restarted_before", r.restarted_before},
                      {"sent_at_s", r.sent_at_s},
                      {"ok", r.ok},
                      {"cancelled", r.cancelled},
                      {"ttft_ms", r.ttft_ms},
                      {"total_ms", r.total_ms},
                      {"prompt_tokens", r.prompt_tokens},
                      {"reused_tokens", r.reused_tokens},
                      {"computed_tokens", r.computed_tokens},
                      {"prompt_ms", r.prompt_ms},
                      {"ideal_prompt_tokens", r.ideal_prompt_tokens},
                      {"ideal_new_tokens", r.ideal_new_tokens},
                      {"token_gap_max_ms", number_or_null(percentile(r.token_gaps_ms, 100))},
                      {"sampling_ms", reported_or_null(r.sampling_ms)},
                      {"sampling_max_ms", reported_or_null(r.sampling_max_ms)}};
            if (!r.error.empty()) q["error"] = r.error;
            requests.push_back(std::move(q));
        }
        json one = {{"target", run.target}, {"url", run.url},           {"launched", run.launched},
                    {"run", run.run},       {"position", run.position}, {"wall_s", run.wall_s}};
        if (!run.error.empty()) one["error"] = run.error;
        one["requests"] = std::move(requests);
        j["runs"].push_back(std::move(one));
    }
    return j.dump(2, ' ', false, json::error_handler_t::replace);
}

std::string format_gauntlet_html(const gauntlet_report& report) {
    std::ostringstream html;
    html << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>keepwarm gauntlet</title>\n"
         << "<style>body{font-family:sans-serif;margin:24px;max-width:1100px}table{border-collapse:collapse}"
         << "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td:first-child,th:first-child"
         << "{text-align:left}code{background:#f4f4f4}</style></head><body>\n";
    html << "<h1>keepwarm bench gauntlet</h1>\n<p><code>" << xml_escape(report.command_line) << "</code></p>\n";
    html << "<p>Model: " << xml_escape(report.model) << "<br>Workload: " << xml_escape(report.workload) << " ("
         << report.lines << " lines, " << report.agents << " agents)<br>Cache killers: " << xml_escape(report.killers)
         << "</p>\n";
    html << "<table><tr><th>target</th><th>requests</th><th>failures</th><th>pings</th><th>prompt</th><th>reused</th>"
         << "<th>computed</th><th>ideal</th><th>computed / ideal</th><th>cold TTFT ms</th><th>warm p50 ms</th>"
         << "<th>warm p95 ms</th><th>warm p95 / cold</th><th>prefill s</th>"
         << "<th>token gap p50 / p90 / p99 / max ms</th></tr>\n";
    for (const target_summary& s : report.summaries) {
        html << "<tr><td>" << xml_escape(s.target) << "</td><td>" << s.requests << "</td><td>" << s.failures
             << "</td><td>" << s.pings << "</td><td>" << s.prompt_tokens << "</td><td>" << s.reused_tokens
             << "</td><td>" << s.computed_tokens << "</td><td>" << s.ideal_tokens << "</td><td>"
             << fixed(s.computed_over_ideal, 3) << "</td><td>" << fixed(s.cold_ttft_ms, 0) << "</td><td>"
             << fixed(s.warm_ttft_p50_ms, 0) << "</td><td>" << fixed(s.warm_ttft_p95_ms, 0) << "</td><td>"
             << fixed(100 * s.warm_p95_over_cold, 1) << "%</td><td>" << fixed(s.prefill_ms / 1000, 2) << "</td><td>"
             << token_gaps_text(s) << "</td></tr>\n";
    }
    html << "</table>\n";
    if (!report.ratios.empty()) {
        html << "<h2>Against " << xml_escape(report.baseline) << "</h2>\n<table><tr><th>target</th>"
             << "<th>total prefill time</th><th>computed tokens</th><th>warm p95 / cold</th></tr>\n";
        for (const target_ratios& r : report.ratios) {
            html << "<tr><td>" << xml_escape(r.target) << "</td><td>" << fixed(r.prefill_time, 3) << "x</td><td>"
                 << fixed(r.computed_tokens, 3) << "x</td><td>" << fixed(r.warm_p95_over_cold, 3) << "x</td></tr>\n";
        }
        html << "</table>\n";
    }
    html << "<h2>Charts</h2>\n" << ttft_chart(report) << prefill_chart(report);
    html << "<h2>Failures</h2>\n<ul>\n";
    for (const target_run& run : report.runs) {
        if (!run.error.empty()) html << "<li>" << xml_escape(run.target) << ": " << xml_escape(run.error) << "</li>\n";
        for (const request_record& r : run.requests) {
            if (!r.ok) {
                html << "<li>" << xml_escape(run.target) << " line " << r.line_number << " (" << xml_escape(r.agent)
                     << "): " << xml_escape(r.error) << "</li>\n";
            }
        }
    }
    html << "</ul>\n</body></html>\n";
    return html.str();
}

}  // namespace keepwarm::bench::gauntlet

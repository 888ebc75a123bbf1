// What the gauntlet measured and how it is shown: per-request records, per-target summaries (prefill computed vs
// the ideal, warm-turn TTFT percentiles against cold TTFT, gaps between a stream's tokens, failures), ratios against
// a baseline target, and the terminal table, JSON and self-contained HTML report (hand-written SVG charts) built
// from them.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace keepwarm::bench::gauntlet {

struct request_record {
    size_t line_number = 0;
    std::string agent;
    int agent_request = 0;  // 0: the agent's first request; -1 for pings
    bool ping = false;
    bool restarted_before = false;
    double sent_at_s = 0;  // since the replay of this target started
    bool ok = false;
    std::string error;
    bool cancelled = false;
    double ttft_ms = -1;
    double total_ms = 0;
    int prompt_tokens = -1;  // as the server reports them; -1: not reported
    int reused_tokens = -1;
    int computed_tokens = -1;
    double prompt_ms = -1;
    double sampling_ms = -1;  // keepwarm's timings (prompt_numbers); -1: not reported
    double sampling_max_ms = -1;
    int ideal_prompt_tokens = -1;  // the bench's own count (normalized request); -1: not computed
    int ideal_new_tokens = -1;
    std::vector<double> token_gaps_ms;  // between the stream's answer chunks (request_result::token_gaps_ms)
};

// One replay of the whole workload against one target.
struct target_run {
    std::string target;
    std::string url;
    bool launched = false;
    int run = 0;       // 0-based repetition
    int position = 0;  // the order in which targets ran in this repetition
    double wall_s = 0;
    std::string error;  // the run could not happen (launch failed, ...)
    std::vector<request_record> requests;
};

struct target_summary {
    std::string target;
    int requests = 0;  // non-ping requests sent
    int failures = 0;  // requests that failed (pings included)
    int pings = 0;
    int cancelled = 0;
    // Requests whose numbers the server did not report (a cancelled stream ends before its usage): left out of the
    // token sums, ideal included, so that computed and ideal cover the same requests.
    int unreported = 0;
    long long prompt_tokens = 0;  // server-reported, non-ping
    long long reused_tokens = 0;
    long long computed_tokens = 0;
    long long ping_computed_tokens = 0;
    long long ideal_tokens = 0;  // sum of ideal_new_tokens, non-ping
    double computed_over_ideal = 0;
    double prefill_ms = 0;        // sum of server prefill times (TTFT where the server reports none), non-ping
    double cold_ttft_ms = 0;      // median over runs of each run's first request
    double warm_ttft_p50_ms = 0;  // every later request of an agent
    double warm_ttft_p95_ms = 0;
    double warm_p95_over_cold = 0;
    // Gaps between consecutive answer chunks of every stream (pings left out): what a user watching a stream waits
    // for its next token while the other agents' prompts are computed.
    long long token_gaps = 0;
    double token_gap_p50_ms = 0, token_gap_p90_ms = 0, token_gap_p99_ms = 0, token_gap_max_ms = 0;
    // The server's time in the sampler (keepwarm reports it), summed over the streams that report it, and the longest
    // one token took: sampling runs on the engine thread, so the other slots' tokens wait behind it too. NaN: none
    // reported.
    int sampling_reported = 0;
    double sampling_ms = 0;
    double sampling_max_ms = 0;
    int runs = 0;
    int failed_runs = 0;
};

// Linear interpolation between the closest ranks (numpy's default), p in [0, 100]; NaN for no values.
double percentile(std::vector<double> values, double p);
// a / b, NaN when b is 0 or either is NaN.
double ratio(double a, double b);

target_summary summarize(const std::string& target, const std::vector<target_run>& runs);

// Each target against the baseline: total prefill time, computed tokens, warm p95/cold.
struct target_ratios {
    std::string target;
    std::string baseline;
    double prefill_time = 0;
    double computed_tokens = 0;
    double warm_p95_over_cold = 0;
};
std::vector<target_ratios> compare_to(const std::vector<target_summary>& summaries, const std::string& baseline);

struct gauntlet_report {
    std::string command_line;
    std::string model;     // the model the ideal was computed with
    std::string workload;  // file or "generated: ..."
    std::string killers;
    int lines = 0;
    int agents = 0;
    std::vector<target_run> runs;
    std::vector<target_summary> summaries;
    std::string baseline;
    std::vector<target_ratios> ratios;
};

std::string format_gauntlet_table(const gauntlet_report& report);
std::string format_gauntlet_json(const gauntlet_report& report);
std::string format_gauntlet_html(const gauntlet_report& report);

}  // namespace keepwarm::bench::gauntlet

// See gauntlet-replay.h.
#include "bench/gauntlet-replay.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <ostream>
#include <shared_mutex>
#include <stdexcept>
#include <thread>

#include "bench/gauntlet-client.h"

namespace keepwarm::bench::gauntlet {

namespace {

using clock_type = std::chrono::steady_clock;

std::string count_text(int n) {
    return n < 0 ? "?" : std::to_string(n);
}

}  // namespace

replay_target parse_target(const std::string& text) {
    replay_target t;
    const size_t eq = text.find('=');
    if (eq == std::string::npos || eq == 0) {
        throw std::invalid_argument("--target '" + text + "' must be NAME=URL[,api=openai|anthropic]");
    }
    t.name = text.substr(0, eq);
    std::string rest = text.substr(eq + 1);
    if (const size_t comma = rest.find(','); comma != std::string::npos) {
        const std::string option = rest.substr(comma + 1);
        rest = rest.substr(0, comma);
        if (!option.starts_with("api=")) {
            throw std::invalid_argument("--target '" + text + "': unknown option '" + option + "' (api=...)");
        }
        try {
            t.api = parse_api(option.substr(4));
        } catch (const std::invalid_argument& e) {
            throw std::invalid_argument("--target '" + text + "': " + e.what());
        }
    }
    try {
        t.url = http::endpoint::parse(rest).url();
    } catch (const std::invalid_argument& e) {
        throw std::invalid_argument("--target '" + text + "': " + e.what());
    }
    return t;
}

std::vector<replayed_request> replay_workload(const std::vector<workload_line>& lines, replay_target& target,
                                              uint64_t seed, std::ostream& progress) {
    std::map<std::string, std::vector<size_t>> agents;  // agent -> line indexes, in file order
    std::vector<size_t> pings;
    for (size_t i = 0; i < lines.size(); ++i) {
        if (target.api && lines[i].api != *target.api) {
            throw std::invalid_argument("line " + std::to_string(lines[i].line_number) + " is for the " +
                                        api_name(lines[i].api) + " API, but target " + target.name + " speaks only " +
                                        api_name(*target.api));
        }
        if (lines[i].events.ping) {
            pings.push_back(i);
        } else {
            agents[lines[i].agent].push_back(i);
        }
    }
    std::stable_sort(pings.begin(), pings.end(),
                     [&](size_t a, size_t b) { return lines[a].send_at_s < lines[b].send_at_s; });

    std::vector<replayed_request> results(lines.size());
    std::vector<bool> sent(lines.size(), false);
    std::mutex results_mu;          // guards results, sent and writes to progress
    std::shared_mutex target_gate;  // requests hold it shared; a restart holds it alone
    std::mutex done_mu;
    std::condition_variable done_cv;
    size_t agents_left = agents.size();  // guarded by done_mu
    const auto start = clock_type::now();
    const auto since_start_s = [&] { return std::chrono::duration<double>(clock_type::now() - start).count(); };

    http::client_options options;
    options.read_timeout = std::chrono::minutes(30);  // a cold prefill of a long prompt on a CPU takes minutes

    const auto send = [&](size_t index, conversation* conv, int agent_request, bool restarted) {
        const workload_line& line = lines[index];
        replayed_request out;
        out.api = line.api;
        conversation::bodies bodies;
        if (conv) {
            bodies = conv->next(line, seed ^ (0x9e3779b97f4a7c15ull * (index + 1)));
        } else {
            bodies.sent = line.body;
        }
        request_result result;
        {
            std::shared_lock gate(target_gate);
            out.record.sent_at_s = since_start_s();
            http::client_connection connection(http::endpoint::parse(target.url), options);
            result = send_request(connection, line.api, bodies.sent, line.events.cancel_after_chunks);
        }
        if (conv) conv->answered(line, result.ok ? result.answer : assistant_answer{});
        request_record& r = out.record;
        r.line_number = line.line_number;
        r.agent = line.agent;
        r.agent_request = conv ? agent_request : -1;
        r.ping = line.events.ping;
        r.restarted_before = restarted;
        r.ok = result.ok;
        r.error = result.error;
        r.cancelled = result.cancelled;
        r.ttft_ms = result.ttft_ms;
        r.total_ms = result.total_ms;
        r.prompt_tokens = result.numbers.prompt_tokens;
        r.reused_tokens = result.numbers.reused_tokens;
        r.computed_tokens = result.numbers.computed_tokens;
        r.prompt_ms = result.numbers.prompt_ms;
        r.sampling_ms = result.numbers.sampling_ms;
        r.sampling_max_ms = result.numbers.sampling_max_ms;
        r.token_gaps_ms = std::move(result.token_gaps_ms);
        out.normalized = conv ? bodies.normalized : json();
        out.answer = result.answer;
        std::lock_guard lock(results_mu);
        char ttft[32];
        std::snprintf(ttft, sizeof ttft, "%.0f", result.ttft_ms);
        progress << "gauntlet: " << target.name << " " << line.agent << " line " << line.line_number << ": "
                 << (result.ok ? std::string("TTFT ") + ttft + " ms, prompt " + count_text(r.prompt_tokens) +
                                     " (reused " + count_text(r.reused_tokens) + ", computed " +
                                     count_text(r.computed_tokens) + ")" + (r.cancelled ? ", cancelled" : "")
                               : "FAILED: " + result.error)
                 << "\n";
        results[index] = std::move(out);
        sent[index] = true;
    };

    std::vector<std::thread> threads;
    for (auto& [name, indexes] : agents) {
        threads.emplace_back([&, indexes = indexes] {
            conversation conv;
            int n = 0;
            for (const size_t index : indexes) {
                const workload_line& line = lines[index];
                std::this_thread::sleep_until(start + std::chrono::duration_cast<clock_type::duration>(
                                                          std::chrono::duration<double>(line.send_at_s)));
                bool restarted = false;
                if (line.events.restart_before) {
                    std::unique_lock gate(target_gate);
                    if (target.server) {
                        try {
                            std::lock_guard lock(results_mu);
                            target.server->restart(progress);
                            restarted = true;
                        } catch (const std::exception& e) {
                            progress << "gauntlet: " << target.name << ": restart failed: " << e.what() << "\n";
                        }
                    } else {
                        std::lock_guard lock(results_mu);
                        progress << "gauntlet: " << target.name << " line " << line.line_number
                                 << ": restart skipped (the bench did not launch this target)\n";
                    }
                }
                send(index, &conv, n++, restarted);
            }
            std::lock_guard lock(done_mu);
            if (--agents_left == 0) done_cv.notify_all();
        });
    }
    threads.emplace_back([&] {
        for (const size_t index : pings) {
            const auto when = start + std::chrono::duration_cast<clock_type::duration>(
                                          std::chrono::duration<double>(lines[index].send_at_s));
            {
                std::unique_lock lock(done_mu);
                if (done_cv.wait_until(lock, when, [&] { return agents_left == 0; })) return;
            }
            send(index, nullptr, -1, false);
        }
    });
    for (std::thread& t : threads) t.join();

    std::vector<replayed_request> out;
    for (size_t i = 0; i < results.size(); ++i) {
        if (sent[i]) out.push_back(std::move(results[i]));
    }
    return out;
}

}  // namespace keepwarm::bench::gauntlet

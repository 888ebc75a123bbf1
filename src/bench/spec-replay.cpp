// See spec-replay.h. The turns of both passes are interleaved (off, then on, turn by turn), so that both see the
// machine in the same state; each pass keeps its own tenant for the whole run, as one agent's server would.
#include "bench/spec-replay.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "bench/report-text.h"
#include "common.h"
#include "engine/engine.h"
#include "engine/llama-runtime.h"

namespace keepwarm::bench {

namespace {

// How long one turn may take before the replay gives up on it: a hang guard, not a speed limit.
constexpr auto turn_limit = std::chrono::minutes(30);

std::vector<llama_token> tokenize_text(const llama_vocab* vocab, const std::string& text, bool add_special) {
    return common_tokenize(vocab, text, add_special, /*parse_special=*/true);
}

llama_token end_of_turn(const llama_vocab* vocab) {
    const llama_token eot = llama_vocab_eot(vocab);
    return eot != LLAMA_TOKEN_NULL ? eot : llama_vocab_eos(vocab);
}

chat_request conversation_until(const trajectory_text& trajectory, std::size_t end) {
    chat_request request;
    for (std::size_t i = 0; i < end; ++i) {
        common_chat_msg m;
        m.role = trajectory.messages[i].role;
        m.content = trajectory.messages[i].content;
        request.messages.push_back(std::move(m));
    }
    return request;
}

double percentile(std::vector<double> values, double p) {
    if (values.empty()) return 0;
    std::sort(values.begin(), values.end());
    const std::size_t rank = static_cast<std::size_t>(std::ceil(p * static_cast<double>(values.size())));
    return values[std::clamp<std::size_t>(rank, 1, values.size()) - 1];
}

double mean(const std::vector<double>& values) {
    if (values.empty()) return 0;
    double sum = 0;
    for (const double v : values) sum += v;
    return sum / static_cast<double>(values.size());
}

// Submits one turn and waits for its final event; adds it to `result`. False if the turn failed (result.error set).
bool replay(engine& llm, const replay_turn& turn, const std::string& tenant, int draft_max, spec_mode_result& result) {
    auto request = std::make_shared<generation_request>();
    request->prompt = turn.prompt;
    request->prompt_text = turn.prompt_text;
    request->tenant = tenant;
    request->sampling.temp = 0;
    request->max_tokens = static_cast<int>(turn.forced_answer.size());
    request->draft_max = draft_max;
    request->forced_answer = turn.forced_answer;
    const auto started = std::chrono::steady_clock::now();
    llm.submit(request);
    for (;;) {
        std::optional<generation_event> ev = request->output.pop(std::chrono::duration_cast<std::chrono::milliseconds>(
            turn_limit - (std::chrono::steady_clock::now() - started)));
        if (!ev) {
            request->cancelled = true;
            result.error = "a turn took longer than " + std::to_string(turn_limit.count()) + " minutes";
            return false;
        }
        if (!ev->done) continue;
        if (ev->reason == finish_reason::error) {
            result.error = ev->error;
            return false;
        }
        result.turn_seconds.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
        const generation_stats& s = ev->stats;
        result.answers += 1;
        // `generated` leaves out a final end-of-generation token, which the forced answer ends with.
        const std::vector<llama_token>& forced = turn.forced_answer;
        const bool ends_with_eog = !forced.empty() && llm.vocab() && llama_vocab_is_eog(llm.vocab(), forced.back());
        const std::size_t body = forced.size() - (ends_with_eog ? 1 : 0);
        if (ev->generated.size() == body && std::equal(forced.begin(), forced.begin() + body, ev->generated.begin())) {
            result.verbatim += 1;
        }
        const std::size_t generated = static_cast<std::size_t>(std::max(s.generated_tokens, 0));
        result.answer_tokens += generated;
        result.decode_tokens += generated > 0 ? generated - 1 : 0;
        result.generation_ms += s.generation_ms;
        result.decode_steps += static_cast<std::size_t>(std::max(s.decode_steps, 0));
        result.draft_tokens += static_cast<std::size_t>(std::max(s.draft_tokens, 0));
        result.draft_accepted += static_cast<std::size_t>(std::max(s.draft_accepted, 0));
        result.draft_steps += static_cast<std::size_t>(std::max(s.draft_steps, 0));
        return true;
    }
}

nlohmann::ordered_json mode_json(const spec_mode_result& r) {
    return {{"mode", r.mode},
            {"answers", r.answers},
            {"verbatim", r.verbatim},
            {"answer_tokens", r.answer_tokens},
            {"decode_tokens", r.decode_tokens},
            {"generation_ms", r.generation_ms},
            {"decode_tokens_per_second", r.decode_tokens_per_second()},
            {"decode_steps", r.decode_steps},
            {"tokens_per_step", r.tokens_per_step()},
            {"draft_tokens", r.draft_tokens},
            {"draft_accepted", r.draft_accepted},
            {"draft_steps", r.draft_steps},
            {"turn_seconds_mean", mean(r.turn_seconds)},
            {"turn_seconds_p50", percentile(r.turn_seconds, 0.5)},
            {"turn_seconds_p90", percentile(r.turn_seconds, 0.9)},
            {"error", r.error}};
}

}  // namespace

std::vector<replay_turn> render_replay_turns(const chat_renderer& renderer, const llama_vocab* vocab,
                                             const trajectory_text& trajectory, std::size_t max_turns,
                                             std::size_t max_tokens, std::size_t& skipped) {
    std::vector<replay_turn> turns;
    const llama_token eot = end_of_turn(vocab);
    std::size_t assistant_turns = 0;
    for (const auto& m : trajectory.messages) assistant_turns += m.role == "assistant" ? 1 : 0;
    std::size_t seen = 0;
    for (std::size_t i = 0; i < trajectory.messages.size(); ++i) {
        if (trajectory.messages[i].role != "assistant") continue;
        if (max_turns != 0 && seen == max_turns) break;
        ++seen;
        if (i == 0 || trajectory.messages[i - 1].role == "assistant") {
            ++skipped;  // a template cannot answer an assistant message
            continue;
        }
        // The prompt as the API renders the chat so far; the answer as the template continues it (the recorded
        // assistant message as a prefill), whose text past the prompt is what the model would have written.
        replay_turn turn;
        std::string continued;
        try {
            turn.prompt_text = renderer.render(conversation_until(trajectory, i)).prompt;
            continued = renderer.render(conversation_until(trajectory, i + 1)).prompt;
        } catch (const std::exception&) {
            ++skipped;  // the template refuses this chat (e.g. roles it does not know): the API would answer 400
            continue;
        }
        if (continued.size() < turn.prompt_text.size() ||
            continued.compare(0, turn.prompt_text.size(), turn.prompt_text) != 0) {
            ++skipped;
            continue;
        }
        turn.prompt = tokenize_text(vocab, turn.prompt_text, true);
        // The answer's tokens as the whole text tokenizes; where the prompt's last token would merge with the
        // answer's first, as the answer alone tokenizes (a prompt that ends with a special token never does).
        const std::vector<llama_token> whole = tokenize_text(vocab, continued, true);
        if (whole.size() >= turn.prompt.size() && std::equal(turn.prompt.begin(), turn.prompt.end(), whole.begin())) {
            turn.forced_answer.assign(whole.begin() + static_cast<std::ptrdiff_t>(turn.prompt.size()), whole.end());
        } else {
            turn.forced_answer = tokenize_text(vocab, continued.substr(turn.prompt_text.size()), false);
        }
        turn.forced_answer.push_back(eot);
        if (turn.prompt.size() + turn.forced_answer.size() >= max_tokens) {
            // This turn and every later one within the limit: the conversation only grows.
            const std::size_t last = max_turns == 0 ? assistant_turns : std::min(assistant_turns, max_turns);
            skipped += last - seen + 1;
            break;
        }
        turns.push_back(std::move(turn));
    }
    return turns;
}

double spec_mode_result::decode_tokens_per_second() const {
    return generation_ms <= 0 ? 0.0 : 1000.0 * static_cast<double>(decode_tokens) / generation_ms;
}

double spec_mode_result::tokens_per_step() const {
    return decode_steps == 0 ? 0.0 : static_cast<double>(decode_tokens) / static_cast<double>(decode_steps);
}

double spec_replay_report::speedup() const {
    const double base = off.decode_tokens_per_second();
    return base <= 0 ? 0.0 : on.decode_tokens_per_second() / base;
}

spec_replay_report run_spec_replay(const spec_replay_options& options, std::ostream& progress) {
    spec_replay_report report;
    report.options = options;
    report.off.mode = "off";
    report.on.mode = "on";
    const std::vector<trajectory_text> trajectories = read_trajectories(options.traces_path, options.trajectories);
    progress << "bench spec: " << trajectories.size() << " trajectories read from " << options.traces_path << "\n";

    init_llama_runtime(false);
    engine_options eo;
    eo.model_path = options.model_path;
    eo.context_size = options.context_size;
    eo.slots = 1;  // one request at a time: each turn's numbers are its own
    eo.threads = options.threads;
    eo.spec_type = options.spec_type;
    eo.draft_max = options.draft_max;
    eo.whole_drafts = options.whole_drafts;
    eo.cache_parked_sequences = 8;  // both tenants' conversations stay on the device between turns
    engine llm(eo);
    llm.start();
    const chat_renderer renderer(llm.model());

    std::vector<std::vector<replay_turn>> conversations;
    for (const trajectory_text& t : trajectories) {
        conversations.push_back(render_replay_turns(renderer, llm.vocab(), t, options.turns,
                                                    static_cast<std::size_t>(llm.slot_context_size()),
                                                    report.skipped_turns));
        report.turns += conversations.back().size();
        for (const replay_turn& turn : conversations.back()) report.prompt_tokens += turn.prompt.size();
    }
    report.conversations = conversations.size();
    progress << "bench spec: " << report.turns << " turns to replay twice (" << report.skipped_turns
             << " skipped: past the context of " << llm.slot_context_size() << " tokens, or not a prefix)\n"
             << std::flush;

    std::size_t done = 0;
    for (const auto& turns : conversations) {
        for (const replay_turn& turn : turns) {
            if (!replay(llm, turn, "bench-spec-off", 0, report.off) ||
                !replay(llm, turn, "bench-spec-on", -1, report.on)) {
                llm.stop();
                return report;
            }
            if (++done % 4 == 0 || done == report.turns) {
                progress << "bench spec: " << done << "/" << report.turns << " turns, decode "
                         << report_text::fixed(report.off.decode_tokens_per_second(), 1) << " tokens/s off, "
                         << report_text::fixed(report.on.decode_tokens_per_second(), 1) << " on\n"
                         << std::flush;
            }
        }
    }
    llm.stop();
    return report;
}

std::string format_spec_replay_table(const spec_replay_report& report) {
    using report_text::fixed;
    std::ostringstream out;
    out << report.conversations << " trajectories, " << report.turns << " answers replayed through the engine twice ("
        << report.skipped_turns << " skipped), teacher-forced on recorded outputs (not this model's); --spec-type "
        << report.options.spec_type << ", --draft-max " << report.options.draft_max
        << (report.options.whole_drafts ? ", whole drafts" : "") << "\n\n";
    std::vector<std::vector<std::string>> rows;
    for (const spec_mode_result* r : {&report.off, &report.on}) {
        rows.push_back({r->mode, std::to_string(r->answer_tokens), fixed(r->decode_tokens_per_second(), 2),
                        fixed(r->tokens_per_step(), 3), std::to_string(r->draft_tokens),
                        std::to_string(r->draft_accepted), fixed(mean(r->turn_seconds), 3),
                        fixed(percentile(r->turn_seconds, 0.5), 3), fixed(percentile(r->turn_seconds, 0.9), 3),
                        std::to_string(r->verbatim) + "/" + std::to_string(r->answers)});
    }
    out << report_text::markdown_table({"drafting", "answer tokens", "decode tokens/s", "tokens/step", "drafted",
                                        "accepted", "turn s mean", "turn s p50", "turn s p90", "verbatim"},
                                       rows);
    out << "\ndecode tokens/s on/off: " << fixed(report.speedup(), 3) << "x\n";
    for (const spec_mode_result* r : {&report.off, &report.on}) {
        if (!r->error.empty()) out << "drafting " << r->mode << ": stopped at a failed turn: " << r->error << "\n";
    }
    return out.str();
}

std::string format_spec_replay_json(const spec_replay_report& report) {
    nlohmann::ordered_json j;
    j["mode"] = "engine";
    j["traces"] = report.options.traces_path;
    j["model"] = report.options.model_path;
    j["trajectories"] = report.conversations;
    j["turns"] = report.turns;
    j["skipped_turns"] = report.skipped_turns;
    j["prompt_tokens"] = report.prompt_tokens;
    j["context_size"] = report.options.context_size;
    j["spec_type"] = report.options.spec_type;
    j["draft_max"] = report.options.draft_max;
    j["whole_drafts"] = report.options.whole_drafts;
    j["off"] = mode_json(report.off);
    j["on"] = mode_json(report.on);
    j["decode_speedup"] = report.speedup();
    return j.dump(2);
}

}  // namespace keepwarm::bench

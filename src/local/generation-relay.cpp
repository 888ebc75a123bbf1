// See generation-relay.h.
#include "local/generation-relay.h"

#include <cstdio>
#include <stdexcept>

#include "base/logger.h"
#include "local/engine-report.h"

namespace keepwarm {

using namespace std::chrono_literals;

namespace {
constexpr auto drain_limit = 2s;  // the engine answers a cancel at its next step; this only matters if it is stuck
}  // namespace

generation_relay::generation_relay(generation_request& gen, http::response_writer& w, frontend_context& front,
                                   const local_model& model, std::string id)
    : gen_(gen), client_(w), front_(front), model_(model), id_(std::move(id)) {}

generation_relay::~generation_relay() {
    // A destructor is noexcept: anything cancel() throws (recording the tokens) would be std::terminate.
    try {
        cancel();
    } catch (const std::exception& e) {
        log::error("generation", "{} could not finish cancelling: {}", id_, e.what());
    }
}

std::optional<generation_event> generation_relay::cancel() {
    if (finished_) return std::nullopt;
    gen_.cancelled = true;
    const auto deadline = std::chrono::steady_clock::now() + drain_limit;
    while (std::chrono::steady_clock::now() < deadline) {
        if (auto ev = gen_.output.pop(client_check_interval); ev && ev->done) {
            finish(*ev);
            return ev;
        }
    }
    return std::nullopt;
}

std::optional<generation_event> generation_relay::next() {
    auto ev = client_.next([this](auto timeout) { return gen_.output.pop(timeout); });
    if (!ev) {
        gen_.cancelled = true;
        front_.http.disconnects++;
        log::info("generation", "{} client went away, generation cancelled", id_);
        return std::nullopt;
    }
    if (ev->done) finish(*ev);
    return ev;
}

generation_report generation_relay::report(const generation_event& ev) const {
    return report_of(ev.stats, !front_.reuse_report);
}

void generation_relay::finish(const generation_event& ev) {
    finished_ = true;
    log_request(ev);
    // A failed step leaves the KV in an unknown state; anything else is what the model saw and wrote.
    if (ev.reason != finish_reason::error)
        model_.tokenizer_for(gen_.tenant).record(gen_.prompt_text, gen_.prompt, ev.generated);
}

// One line per generation, so an operator sees what each request reused without reading responses.
void generation_relay::log_request(const generation_event& ev) const {
    const generation_stats& st = ev.stats;
    std::string where;  // which tiers the reused tokens came from
    const auto tier = [&](const char* name, int n) {
        if (n > 0) where += (where.empty() ? "" : " + ") + std::to_string(n) + " " + name;
    };
    tier("device", st.reused_device);
    tier("ram", st.reused_ram);
    tier("disk", st.reused_disk);
    if (st.checkpoint_pos >= 0) where += ", checkpoint at " + std::to_string(st.checkpoint_pos);
    if (st.matched_tokens > st.reused_tokens + 1) {
        where += (where.empty() ? "" : ", ") + std::to_string(st.matched_tokens) + " matched";
    }
    // Speculative decoding: how many of the draft tokens the model verified it accepted.
    const std::string drafts = st.draft_tokens > 0 ? ", draft " + std::to_string(st.draft_accepted) + "/" +
                                                         std::to_string(st.draft_tokens) + " accepted"
                                                   : "";
    log::info(
        "generation",
        "{} slot {}: prompt {} tokens (reused {}{}{}, computed {}) in {} ms (setup {} ms, prepare {}), generated {} "
        "in {} ms (sampling {} ms, longest {}{}), {}{}{}",
        id_, st.slot, st.prompt_tokens, st.reused_tokens, where.empty() ? "" : ": ", where, st.computed_tokens,
        log::fixed(st.prompt_ms, 0), log::fixed(st.setup_ms, 1), log::fixed(st.prepare_ms, 1), st.generated_tokens,
        log::fixed(st.generation_ms, 0), log::fixed(st.sampling_ms, 0), log::fixed(st.sampling_max_ms, 1), drafts,
        finish_reason_name(ev.reason), ev.error.empty() ? "" : ": ", ev.error);
    // The divergence quotes prompt text (this request's and what the cache holds): only when the operator asked.
    if (!st.divergence.empty() && front_.log_prompts) {
        log::info("generation", "{} {}", id_, st.divergence);
    } else if (!st.divergence.empty()) {
        log::info("generation", "{} {}", id_, st.divergence.substr(0, st.divergence.find(':')));
    }
}

}  // namespace keepwarm

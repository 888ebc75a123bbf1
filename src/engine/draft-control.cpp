// See draft-control.h.
#include "engine/draft-control.h"

#include <algorithm>

namespace keepwarm {

namespace {
// Each draft checked keeps this share of what the ones before it said: about the last 20 drafts count.
constexpr double keep = 0.95;
constexpr double prior_accepted = 1, prior_trials = 2;
}  // namespace

void draft_control::record(std::size_t drafted, std::size_t accepted) {
    if (drafted == 0) return;
    accepted = std::min(accepted, drafted);
    // Every accepted token was a trial that succeeded; a draft cut short by a wrong token adds one that failed.
    accepted_ = accepted_ * keep + static_cast<double>(accepted);
    trials_ = trials_ * keep + static_cast<double>(accepted + (accepted < drafted ? 1 : 0));
}

double draft_control::acceptance() const {
    return (accepted_ + prior_accepted) / (trials_ + prior_trials);
}

std::size_t draft_control::best_length(double acceptance, double step_ms, double row_ms, std::size_t limit,
                                       double margin) {
    if (limit == 0 || step_ms <= 0) return 0;
    row_ms = std::max(row_ms, 0.0);
    const double plain = 1 / step_ms;  // tokens per millisecond without a draft
    double expected = 1;               // tokens a step yields: its own, plus each draft token reached and right
    double reach = 1;
    std::size_t best = 0;
    double best_rate = plain * (1 + margin);
    for (std::size_t length = 1; length <= limit; ++length) {
        reach *= acceptance;
        expected += reach;
        const double rate = expected / (step_ms + row_ms * static_cast<double>(length));
        if (rate > best_rate) {
            best_rate = rate;
            best = length;
        }
        if (reach < 1e-4) break;  // longer drafts add nothing
    }
    return best;
}

}  // namespace keepwarm

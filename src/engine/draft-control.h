// How long a slot's next draft may be: as long as the tokens it is expected to save are worth the rows it adds to the
// step. A draft of L tokens whose tokens are each right with probability a (given the ones before it were) saves
// a + a^2 + ... + a^L steps' tokens on average, and costs L more rows in the step that verifies it. The length that
// gives the most tokens per millisecond is chosen, 0 (no draft) when none beats a plain step.
// The acceptance is learnt from the slot's own drafts, verified ones and those that were not sent but are checked
// against the tokens the model went on to produce (a shadow draft costs the drafter's microseconds, no model work),
// so that a slot that stopped drafting because its drafts were wrong starts again when they would be right.
// Pure; one per slot, engine thread only.
#pragma once

#include <cstddef>

namespace keepwarm {

class draft_control {
public:
    // A draft of `drafted` tokens was checked: its first `accepted` were right.
    void record(std::size_t drafted, std::size_t accepted);

    // Estimated chance that a draft token is right when the ones before it were (a prior of one right in two before
    // any draft is checked; recent drafts weigh most).
    double acceptance() const;

    // The draft length, at most `limit`, that gives the most tokens per millisecond when a step without a draft costs
    // `step_ms` and each draft row adds `row_ms`; 0 when no length beats no draft by at least `margin` (a share).
    static std::size_t best_length(double acceptance, double step_ms, double row_ms, std::size_t limit,
                                   double margin = 0.02);

private:
    double accepted_ = 0;  // decayed sums over the drafts checked
    double trials_ = 0;
};

}  // namespace keepwarm

// See engine-report.h.
#include "local/engine-report.h"

namespace keepwarm {

generation_report report_of(const generation_stats& stats, bool reuse_hidden) {
    return {.prompt_tokens = stats.prompt_tokens,
            .reused_tokens = stats.reused_tokens,
            .reused_device = stats.reused_device,
            .reused_ram = stats.reused_ram,
            .reused_disk = stats.reused_disk,
            .checkpoint_pos = stats.checkpoint_pos,
            .matched_tokens = stats.matched_tokens,
            .divergence = stats.divergence,
            .computed_tokens = stats.computed_tokens,
            .generated_tokens = stats.generated_tokens,
            .queued_ms = stats.queued_ms,
            .setup_ms = stats.setup_ms,
            .prepare_ms = stats.prepare_ms,
            .prompt_ms = stats.prompt_ms,
            .generation_ms = stats.generation_ms,
            .sampling_ms = stats.sampling_ms,
            .sampling_max_ms = stats.sampling_max_ms,
            .slot = stats.slot,
            .stop_sequence = stats.stop_sequence,
            .draft_tokens = stats.draft_tokens,
            .draft_accepted = stats.draft_accepted,
            .reuse_hidden = reuse_hidden};
}

}  // namespace keepwarm

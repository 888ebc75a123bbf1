// See chat/generation-report.h.
#include "chat/generation-report.h"

namespace keepwarm {

namespace {

cache_detail cache_detail_of(const generation_report& st) {
    return {
        .device = st.reused_device, .ram = st.reused_ram, .disk = st.reused_disk, .checkpoint_pos = st.checkpoint_pos};
}

}  // namespace

generation_report shown_report(const generation_report& st) {
    if (!st.reuse_hidden) return st;
    generation_report shown = st;
    shown.reused_tokens = shown.reused_device = shown.reused_ram = shown.reused_disk = 0;
    shown.checkpoint_pos = -1;
    shown.matched_tokens = 0;
    shown.divergence.clear();
    shown.computed_tokens = shown.prompt_tokens;
    return shown;
}

usage_info usage_of(const generation_report& actual) {
    const generation_report st = shown_report(actual);
    return {.prompt_tokens = st.prompt_tokens,
            .completion_tokens = st.generated_tokens,
            .cached_tokens = st.reused_tokens,
            .cache = cache_detail_of(st)};
}

timings_info timings_of(const generation_report& actual) {
    const generation_report st = shown_report(actual);
    return {.prompt_n = st.computed_tokens,
            .cache_n = st.reused_tokens,
            .prompt_ms = st.prompt_ms,
            .predicted_n = st.generated_tokens,
            .predicted_ms = st.generation_ms,
            .cache = cache_detail_of(st),
            .setup_ms = st.setup_ms,
            .queued_ms = st.queued_ms,
            .prepare_ms = st.prepare_ms,
            .sampling_ms = st.sampling_ms,
            .sampling_max_ms = st.sampling_max_ms,
            .draft_n = st.draft_tokens,
            .draft_n_accepted = st.draft_accepted};
}

}  // namespace keepwarm

// Unit tests for what a finished generation reports: the engine's numbers become the neutral report field for field
// (src/local/engine-report.*), which engine number each usage and timings field carries (src/chat/generation-report.*),
// and that reuse hidden by the operator shows nowhere.
#include <gtest/gtest.h>

#include "chat/generation-report.h"
#include "local/engine-report.h"

using namespace keepwarm;

namespace {

// Every field distinct, so a field mapped from the wrong number shows.
generation_stats sample_stats() {
    generation_stats st;
    st.prompt_tokens = 120;
    st.reused_tokens = 100;
    st.reused_device = 60;
    st.reused_ram = 30;
    st.reused_disk = 10;
    st.checkpoint_pos = 96;
    st.matched_tokens = 110;
    st.divergence = "at 110: 'cat' | 'dog'";
    st.computed_tokens = 20;
    st.generated_tokens = 7;
    st.queued_ms = 1.5;
    st.setup_ms = 4.25;
    st.prepare_ms = 2.5;
    st.prompt_ms = 33.0;
    st.generation_ms = 70.0;
    st.sampling_ms = 9.5;
    st.sampling_max_ms = 6.0;
    st.slot = 2;
    st.stop_sequence = "END";
    return st;
}

generation_report sample_report(bool reuse_hidden = false) {
    return report_of(sample_stats(), reuse_hidden);
}

}  // namespace

TEST(GenerationReport, TheEngineNumbersBecomeTheReportFieldForField) {
    const generation_report r = sample_report();
    EXPECT_EQ(r.prompt_tokens, 120);
    EXPECT_EQ(r.reused_tokens, 100);
    EXPECT_EQ(r.reused_device, 60);
    EXPECT_EQ(r.reused_ram, 30);
    EXPECT_EQ(r.reused_disk, 10);
    EXPECT_EQ(r.checkpoint_pos, 96);
    EXPECT_EQ(r.matched_tokens, 110);
    EXPECT_EQ(r.divergence, "at 110: 'cat' | 'dog'");
    EXPECT_EQ(r.computed_tokens, 20);
    EXPECT_EQ(r.generated_tokens, 7);
    EXPECT_DOUBLE_EQ(r.queued_ms, 1.5);
    EXPECT_DOUBLE_EQ(r.setup_ms, 4.25);
    EXPECT_DOUBLE_EQ(r.prepare_ms, 2.5);
    EXPECT_DOUBLE_EQ(r.prompt_ms, 33.0);
    EXPECT_DOUBLE_EQ(r.generation_ms, 70.0);
    EXPECT_DOUBLE_EQ(r.sampling_ms, 9.5);
    EXPECT_DOUBLE_EQ(r.sampling_max_ms, 6.0);
    EXPECT_EQ(r.slot, 2);
    EXPECT_EQ(r.stop_sequence, "END");
    EXPECT_FALSE(r.reuse_hidden);
    EXPECT_TRUE(sample_report(/*reuse_hidden=*/true).reuse_hidden) << "the operator's switch travels with the report";
}

TEST(GenerationReport, UsageCarriesTheTokenCounts) {
    const usage_info u = usage_of(sample_report());
    EXPECT_EQ(u.prompt_tokens, 120) << "the whole prompt, reused tokens included";
    EXPECT_EQ(u.completion_tokens, 7);
    EXPECT_EQ(u.cached_tokens, 100);
    EXPECT_EQ(u.cache.device, 60);
    EXPECT_EQ(u.cache.ram, 30);
    EXPECT_EQ(u.cache.disk, 10);
    EXPECT_EQ(u.cache.checkpoint_pos, 96);
}

TEST(GenerationReport, TimingsCarryLlamaServersNumbers) {
    const timings_info t = timings_of(sample_report());
    EXPECT_EQ(t.prompt_n, 20) << "prompt tokens computed, not the whole prompt";
    EXPECT_EQ(t.cache_n, 100);
    EXPECT_DOUBLE_EQ(t.prompt_ms, 33.0);
    EXPECT_EQ(t.predicted_n, 7);
    EXPECT_DOUBLE_EQ(t.predicted_ms, 70.0);
    EXPECT_DOUBLE_EQ(t.setup_ms, 4.25);
    EXPECT_DOUBLE_EQ(t.queued_ms, 1.5);
    EXPECT_DOUBLE_EQ(t.prepare_ms, 2.5);
    EXPECT_DOUBLE_EQ(t.sampling_ms, 9.5);
    EXPECT_DOUBLE_EQ(t.sampling_max_ms, 6.0);
    EXPECT_EQ(t.cache.device, 60);
    EXPECT_EQ(t.cache.ram, 30);
    EXPECT_EQ(t.cache.disk, 10);
    EXPECT_EQ(t.cache.checkpoint_pos, 96);
}

TEST(GenerationReport, ShownReuseIsTheRealOne) {
    const generation_report st = sample_report();
    const generation_report shown = shown_report(st);
    EXPECT_EQ(shown.reused_tokens, 100);
    EXPECT_EQ(shown.matched_tokens, 110);
    EXPECT_EQ(shown.divergence, st.divergence);
    EXPECT_EQ(shown.computed_tokens, 20);
}

TEST(GenerationReport, HiddenReuseShowsNowhere) {
    const generation_report st = sample_report(/*reuse_hidden=*/true);

    const generation_report shown = shown_report(st);
    EXPECT_EQ(shown.reused_tokens, 0);
    EXPECT_EQ(shown.reused_device + shown.reused_ram + shown.reused_disk, 0);
    EXPECT_EQ(shown.checkpoint_pos, -1);
    EXPECT_EQ(shown.matched_tokens, 0);
    EXPECT_TRUE(shown.divergence.empty());
    EXPECT_EQ(shown.computed_tokens, 120) << "as if the whole prompt was computed";
    // What says nothing about the cache stays.
    EXPECT_EQ(shown.prompt_tokens, 120);
    EXPECT_EQ(shown.generated_tokens, 7);
    EXPECT_EQ(shown.slot, 2);
    EXPECT_EQ(shown.stop_sequence, "END");
    EXPECT_DOUBLE_EQ(shown.prompt_ms, 33.0);

    const usage_info u = usage_of(st);
    EXPECT_EQ(u.prompt_tokens, 120);
    EXPECT_EQ(u.completion_tokens, 7);
    EXPECT_EQ(u.cached_tokens, 0);
    EXPECT_EQ(u.cache.device + u.cache.ram + u.cache.disk, 0);
    EXPECT_EQ(u.cache.checkpoint_pos, -1);

    const timings_info t = timings_of(st);
    EXPECT_EQ(t.prompt_n, 120);
    EXPECT_EQ(t.cache_n, 0);
    EXPECT_EQ(t.cache.device + t.cache.ram + t.cache.disk, 0);
    EXPECT_EQ(t.cache.checkpoint_pos, -1);
    EXPECT_EQ(t.predicted_n, 7);
    EXPECT_DOUBLE_EQ(t.setup_ms, 4.25);

    // The caller's numbers (for the log and the cache-buster detector) are left as they were.
    EXPECT_EQ(st.reused_tokens, 100);
    EXPECT_EQ(st.computed_tokens, 20);
}

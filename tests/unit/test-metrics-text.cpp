// The Prometheus text that /metrics answers: families, labels (escaped), and latency histograms whose buckets a
// scraper can subtract.
#include <gtest/gtest.h>

#include "base/metrics-text.h"

namespace keepwarm {
namespace {

TEST(LatencyHistogram, CountsEachObservationInTheFirstBucketThatHoldsIt) {
    latency_histogram h;
    h.record(0.00005);  // below the first bound
    h.record(0.0005);   // exactly a bound: counted there (le is "less than or equal")
    h.record(0.0006);
    h.record(0.004);
    h.record(3.0);  // beyond the last bound: only +Inf
    const auto c = h.cumulative();
    const auto at = [&](double bound) {
        for (size_t i = 0; i < latency_histogram::fine_bounds_seconds.size(); i++) {
            if (latency_histogram::fine_bounds_seconds[i] == bound) return c[i];
        }
        ADD_FAILURE() << "no bound " << bound;
        return uint64_t{0};
    };
    EXPECT_EQ(at(0.0001), 1u);
    EXPECT_EQ(at(0.00025), 1u);
    EXPECT_EQ(at(0.0005), 2u);
    EXPECT_EQ(at(0.00075), 3u);
    EXPECT_EQ(at(0.003), 3u);
    EXPECT_EQ(at(0.005), 4u);
    EXPECT_EQ(at(1.0), 4u);
    EXPECT_EQ(c.back(), 5u);
    EXPECT_EQ(h.count(), 5u);
    EXPECT_DOUBLE_EQ(h.sum_seconds(), 0.00005 + 0.0005 + 0.0006 + 0.004 + 3.0);
}

TEST(LatencyHistogram, BoundsAscend) {
    for (const latency_histogram& h :
         {latency_histogram(), latency_histogram(latency_histogram::request_bounds_seconds)}) {
        for (size_t i = 1; i < h.bounds().size(); i++) EXPECT_LT(h.bounds()[i - 1], h.bounds()[i]);
    }
}

// Issue 16: a request's queue wait and time to first token run from milliseconds to minutes.
TEST(MetricsText, ARequestScaleHistogramHasBucketsUpToTenMinutes) {
    latency_histogram h(latency_histogram::request_bounds_seconds);
    h.record(0.03);
    h.record(42);
    metrics_text out;
    out.histogram("ttft_seconds", h);
    const std::string text = out.str();
    EXPECT_NE(text.find("ttft_seconds_bucket{le=\"0.025\"} 0\n"), std::string::npos) << text;
    EXPECT_NE(text.find("ttft_seconds_bucket{le=\"0.05\"} 1\n"), std::string::npos) << text;
    EXPECT_NE(text.find("ttft_seconds_bucket{le=\"30\"} 1\n"), std::string::npos) << text;
    EXPECT_NE(text.find("ttft_seconds_bucket{le=\"60\"} 2\n"), std::string::npos) << text;
    EXPECT_NE(text.find("ttft_seconds_bucket{le=\"600\"} 2\n"), std::string::npos) << text;
    EXPECT_NE(text.find("ttft_seconds_count 2\n"), std::string::npos) << text;
}

TEST(MetricsText, WritesFamiliesOnceWithTheirSamples) {
    metrics_text out;
    out.counter("keepwarm_requests_total", "Requests", 3);
    out.family("keepwarm_proxy_in_flight", "gauge", "In flight");
    out.sample("keepwarm_proxy_in_flight", 2, {{"upstream", "http://a:1"}});
    out.sample("keepwarm_proxy_in_flight", 0, {{"upstream", "http://b:2"}});
    EXPECT_EQ(out.str(),
              "# HELP keepwarm_requests_total Requests\n"
              "# TYPE keepwarm_requests_total counter\n"
              "keepwarm_requests_total 3\n"
              "# HELP keepwarm_proxy_in_flight In flight\n"
              "# TYPE keepwarm_proxy_in_flight gauge\n"
              "keepwarm_proxy_in_flight{upstream=\"http://a:1\"} 2\n"
              "keepwarm_proxy_in_flight{upstream=\"http://b:2\"} 0\n");
}

TEST(MetricsText, EscapesLabelValues) {
    metrics_text out;
    out.sample("m", 1, {{"a", "say \"hi\"\\now\nthen"}, {"b", "x"}});
    EXPECT_EQ(out.str(), "m{a=\"say \\\"hi\\\"\\\\now\\nthen\",b=\"x\"} 1\n");
}

TEST(MetricsText, KeepsLargeCountersExact) {
    metrics_text out;
    out.sample("tokens", 123456789012.0);
    EXPECT_EQ(out.str(), "tokens 123456789012\n");
}

TEST(MetricsText, WritesAHistogramAsCumulativeBucketsSumAndCount) {
    latency_histogram h;
    h.record(0.0002);
    h.record(0.002);
    metrics_text out;
    out.histogram("lat_seconds", h, {{"phase", "total"}});
    const std::string text = out.str();
    EXPECT_NE(text.find("lat_seconds_bucket{phase=\"total\",le=\"0.0001\"} 0\n"), std::string::npos) << text;
    EXPECT_NE(text.find("lat_seconds_bucket{phase=\"total\",le=\"0.00025\"} 1\n"), std::string::npos) << text;
    EXPECT_NE(text.find("lat_seconds_bucket{phase=\"total\",le=\"0.0015\"} 1\n"), std::string::npos) << text;
    EXPECT_NE(text.find("lat_seconds_bucket{phase=\"total\",le=\"0.002\"} 2\n"), std::string::npos) << text;
    EXPECT_NE(text.find("lat_seconds_bucket{phase=\"total\",le=\"+Inf\"} 2\n"), std::string::npos) << text;
    EXPECT_NE(text.find("lat_seconds_sum{phase=\"total\"} 0.0022\n"), std::string::npos) << text;
    EXPECT_NE(text.find("lat_seconds_count{phase=\"total\"} 2\n"), std::string::npos) << text;
}

}  // namespace
}  // namespace keepwarm

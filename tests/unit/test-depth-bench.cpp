// `keepwarm bench depth`: list parsing, the table / JSON / SVG renderers on a synthetic report, and one short real
// run on a tiny generated model.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench/depth-bench.h"
#include "generated-models.h"

using namespace keepwarm;
using namespace keepwarm::bench;

namespace {

std::string tiny_model() {
    static const std::string path = test_models::generated_model("unit-depth-bench");
    return path;
}

depth_bench_report synthetic_report() {
    depth_bench_report report;
    report.model_path = "/models/x.gguf";
    report.model_desc = "qwen3 <tiny> & co";
    report.threads = 4;
    report.n_prompt = 512;
    report.n_gen = 128;
    report.reps = 1;
    report.kv_types = {kv_cache_type::f16, kv_cache_type::q8_0, kv_cache_type::q4_0};
    report.depths = {0, 4096, 16384};
    report.kv_bytes_per_token = {{kv_cache_type::f16, 12288}, {kv_cache_type::q8_0, 6528}, {kv_cache_type::q4_0, 3456}};
    double scale = 1;
    for (const kv_cache_type kv : report.kv_types) {
        for (const uint32_t d : report.depths) {
            report.results.push_back(
                {kv, d, 512, 128, 1000.0 * scale / (1 + d / 4096.0), 50.0 * scale / (1 + d / 8192.0)});
        }
        scale *= 0.9;
    }
    report.results.back().error = "failed to create a context";
    return report;
}

}  // namespace

TEST(depth_bench, parses_depth_lists) {
    EXPECT_EQ(parse_depth_list("0,4096,16384,32768"), (std::vector<uint32_t>{0, 4096, 16384, 32768}));
    EXPECT_EQ(parse_depth_list("512"), (std::vector<uint32_t>{512}));
    for (const char* bad : {"4k", "", "0,,512", "-1", "1.5", "512,", "99999999999", " 512"}) {
        try {
            parse_depth_list(bad);
            ADD_FAILURE() << "accepted '" << bad << "'";
        } catch (const std::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find("depth"), std::string::npos) << e.what();
        }
    }
    try {
        parse_depth_list("0,4k");
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("'4k'"), std::string::npos) << e.what();
    }
}

TEST(depth_bench, parses_kv_lists) {
    EXPECT_EQ(parse_kv_list("f16,q8_0,q4_0"),
              (std::vector<kv_cache_type>{kv_cache_type::f16, kv_cache_type::q8_0, kv_cache_type::q4_0}));
    EXPECT_EQ(parse_kv_list("q4_0"), (std::vector<kv_cache_type>{kv_cache_type::q4_0}));
    for (const char* bad : {"q3", "", "f16,", "F16", "f32"}) {
        EXPECT_THROW(parse_kv_list(bad), std::invalid_argument) << bad;
    }
    try {
        parse_kv_list("f16,q3");
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("'q3'"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("q8_0"), std::string::npos) << e.what();
    }
}

TEST(depth_bench, rounds_context_size_up_to_256) {
    EXPECT_EQ(depth_bench_context_size(0, 512, 128), 768u);
    EXPECT_EQ(depth_bench_context_size(4096, 512, 128), 4864u);
    EXPECT_EQ(depth_bench_context_size(0, 32, 8), 256u);
    EXPECT_EQ(depth_bench_context_size(256, 32, 8), 512u);
}

TEST(depth_bench, renders_table) {
    const std::string table = format_depth_table(synthetic_report());
    EXPECT_NE(table.find("f16 pp512 t/s"), std::string::npos) << table;
    EXPECT_NE(table.find("q4_0 tg128 t/s"), std::string::npos) << table;
    EXPECT_NE(table.find("1000.00"), std::string::npos) << table;
    EXPECT_NE(table.find("12.0 KiB"), std::string::npos) << table;
    EXPECT_NE(table.find("error: q4_0 at depth 16384"), std::string::npos) << table;
}

TEST(depth_bench, renders_json) {
    const auto j = nlohmann::json::parse(format_depth_json(synthetic_report()));
    EXPECT_EQ(j["threads"], 4);
    EXPECT_EQ(j["model"]["desc"], "qwen3 <tiny> & co");
    EXPECT_EQ(j["model"]["kv_bytes_per_token"]["q8_0"], 6528);
    ASSERT_EQ(j["results"].size(), 9u);
    const auto& first = j["results"][0];
    for (const char* field : {"kv", "depth", "pp_tps", "tg_tps", "pp_tokens", "tg_tokens"}) {
        EXPECT_TRUE(first.contains(field)) << field;
    }
    EXPECT_EQ(first["kv"], "f16");
    EXPECT_DOUBLE_EQ(first["pp_tps"].get<double>(), 1000.0);
    EXPECT_FALSE(first.contains("error"));
    EXPECT_EQ(j["results"][8]["error"], "failed to create a context");
}

TEST(depth_bench, renders_svg) {
    const std::string svg = format_depth_svg(synthetic_report());
    EXPECT_EQ(svg.rfind("<svg", 0), 0u);
    EXPECT_NE(svg.find("</svg>"), std::string::npos);
    for (const char* kv : {"f16", "q8_0", "q4_0"}) {
        // one line per KV type in each of the two panels
        const std::string tag = std::string("<polyline class=\"kv-") + kv + "\"";
        const size_t first = svg.find(tag);
        ASSERT_NE(first, std::string::npos) << kv;
        EXPECT_NE(svg.find(tag, first + 1), std::string::npos) << kv;
    }
    EXPECT_NE(svg.find("context depth (tokens)"), std::string::npos);
    EXPECT_NE(svg.find("tokens/s"), std::string::npos);
    EXPECT_NE(svg.find("prompt processing (pp512)"), std::string::npos);
    EXPECT_NE(svg.find("generation (tg128)"), std::string::npos);
    EXPECT_NE(svg.find("&lt;tiny&gt; &amp; co"), std::string::npos);  // escaped model name
    EXPECT_EQ(svg.find("<tiny>"), std::string::npos);
}

TEST(depth_bench, runs_on_a_tiny_model) {
    depth_bench_options o;
    o.model_path = tiny_model();
    o.depths = {0, 256};
    o.kv_types = {kv_cache_type::f16};
    o.n_prompt = 32;
    o.n_gen = 8;
    o.threads = 2;
    std::ostringstream progress;
    const depth_bench_report report = run_depth_bench(o, progress);
    ASSERT_EQ(report.results.size(), 2u) << progress.str();
    for (const auto& r : report.results) {
        EXPECT_TRUE(r.error.empty()) << r.error;
        EXPECT_GT(r.pp_tps, 0);
        EXPECT_GT(r.tg_tps, 0);
        EXPECT_EQ(r.pp_tokens, 32);
        EXPECT_EQ(r.tg_tokens, 8);
    }
    EXPECT_EQ(report.results[1].depth, 256u);
    EXPECT_NE(progress.str().find("[f16 depth 256] filling..."), std::string::npos) << progress.str();
    EXPECT_FALSE(report.kv_bytes_per_token.empty());
    EXPECT_FALSE(report.model_desc.empty());
}

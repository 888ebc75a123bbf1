// The GPU side of the runtime set-up, on any machine: a GPU backend library that is there but cannot serve (its
// runtime missing, no device, a damaged file) is named with the reason, and the start-up line says what computes.
#include "engine/llama-runtime.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <regex>
#include <set>

#include "engine/engine.h"
#include "generated-models.h"
#include "gguf.h"
#include "test-temp-dir.h"

using keepwarm::describe_compute;
using keepwarm::gpu_backend_problem;
using keepwarm::gpu_devices;
namespace fs = std::filesystem;

namespace {

struct temp_dir : keepwarm::test_support::temp_dir {
    temp_dir() : keepwarm::test_support::temp_dir("runtime") { fs::create_directories(path); }
};

}  // namespace

TEST(GpuBackendProblem, NoneWithoutAGpuBackendLibrary) {
    temp_dir dir;
    std::ofstream(dir.path / "libggml-cpu-x64.so") << "not looked at";
    EXPECT_EQ(gpu_backend_problem(dir.path), "");
    EXPECT_EQ(gpu_backend_problem(dir.path / "missing"), "");
}

TEST(GpuBackendProblem, NamesTheMissingRuntimeLibrary) {
    temp_dir dir;
    fs::copy_file(STUB_GPU_BACKEND_NEEDS_RUNTIME, dir.path / "libggml-cuda.so");
    const std::string problem = gpu_backend_problem(dir.path);
    EXPECT_NE(problem.find("libggml-cuda.so cannot be loaded"), std::string::npos) << problem;
    EXPECT_NE(problem.find("libstub-gpu-runtime.so"), std::string::npos) << problem;
}

TEST(GpuBackendProblem, SaysWhenTheBackendFindsNoGpu) {
    temp_dir dir;
    fs::copy_file(STUB_GPU_BACKEND_NO_DEVICE, dir.path / "libggml-cuda.so");
    EXPECT_EQ(gpu_backend_problem(dir.path), "libggml-cuda.so: its backend finds no usable GPU on this machine");
}

TEST(GpuBackendProblem, NamesADamagedLibrary) {
    temp_dir dir;
    std::ofstream(dir.path / "libggml-cuda.so") << "truncated download";
    EXPECT_NE(gpu_backend_problem(dir.path).find("libggml-cuda.so cannot be loaded"), std::string::npos);
}

TEST(DescribeCompute, NamesTheGpuAndTheLayersOnItElseTheCpu) {
    keepwarm::init_llama_runtime();
    const std::string line = describe_compute(-1, 36);
    if (gpu_devices().empty()) {
        EXPECT_EQ(line.rfind("CPU, ", 0), 0u) << line;
    } else {
        EXPECT_NE(line.find("37/37 layers on the GPU"), std::string::npos) << line;
        EXPECT_NE(describe_compute(10, 36).find("10/37 layers on the GPU"), std::string::npos);
    }
}

// --n-cpu-moe N keeps exactly the expert weights of the first N blocks in host memory (llama.cpp matches each tensor
// name with std::regex_search, as here); --cpu-moe every block's; nothing else moves. An engine loads with them.
TEST(ExpertTensorPatterns, MatchExactlyTheExpertWeightsOfTheFirstBlocks) {
    const std::string path = keepwarm::test_models::generated_model("unit-llama-runtime", "tiny-moe");
    gguf_init_params params{.no_alloc = true, .ctx = nullptr};
    gguf_context* gguf = gguf_init_from_file(path.c_str(), params);
    ASSERT_NE(gguf, nullptr);
    std::vector<std::string> names;
    for (int64_t i = 0; i < gguf_get_n_tensors(gguf); ++i) names.emplace_back(gguf_get_tensor_name(gguf, i));
    gguf_free(gguf);

    const auto in_host = [&](int layers) {
        std::set<std::string> matched;
        for (const std::string& pattern : keepwarm::expert_tensor_patterns(layers)) {
            const std::regex re(pattern);
            for (const std::string& name : names) {
                if (std::regex_search(name, re)) matched.insert(name);
            }
        }
        return matched;
    };
    EXPECT_TRUE(in_host(0).empty());
    EXPECT_EQ(in_host(1), (std::set<std::string>{"blk.0.ffn_down_exps.weight", "blk.0.ffn_gate_exps.weight",
                                                 "blk.0.ffn_up_exps.weight"}));
    std::set<std::string> every_expert;
    for (const std::string& name : names) {
        if (name.find("_exps.") != std::string::npos) every_expert.insert(name);
    }
    EXPECT_GT(every_expert.size(), 3u);
    EXPECT_EQ(in_host(-1), every_expert);
    EXPECT_EQ(in_host(1000), every_expert);  // more blocks than the model has: all of them

    keepwarm::engine_options options;
    options.model_path = path;
    options.context_size = 256;
    options.slots = 1;
    options.cache_ram_bytes = 0;
    options.cpu_moe_layers = 1;
    keepwarm::engine llm(options);
    EXPECT_GT(llama_model_n_layer(llm.model()), 1);
}

// The GPU side of the runtime set-up, on any machine: a GPU backend library that is there but cannot serve (its
// runtime missing, no device, a damaged file) is named with the reason, and the start-up line says what computes.
#include "engine/llama-runtime.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

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

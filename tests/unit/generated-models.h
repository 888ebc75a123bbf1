// Test models generated on first use by keepwarm's own model builder and shared by the tests of one binary.
#pragma once

#include <filesystem>
#include <string>

#include "model/model-builder.h"

namespace keepwarm::test_models {

// Path of preset `preset` (seed 1) under KEEPWARM_TEST_MODELS_DIR/<folder>, generated if missing.
inline std::string generated_model(const std::string& folder, const std::string& preset = "tiny") {
    const std::filesystem::path dir = std::filesystem::path(KEEPWARM_TEST_MODELS_DIR) / folder;
    std::filesystem::create_directories(dir);
    const auto file = dir / (preset + ".gguf");
    if (!std::filesystem::exists(file)) {
        model_spec spec = preset_spec(preset);
        spec.seed = 1;
        build_model(spec, file.string());
    }
    return file.string();
}

}  // namespace keepwarm::test_models

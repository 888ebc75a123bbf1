// The model `keepwarm serve` runs when no --model is given: a tiny random-weight qwen3, generated once and cached,
// so the server works out of the box with no download.
#pragma once

#include <filesystem>
#include <string>

namespace keepwarm {

// keepwarm's own cache folder: ${KEEPWARM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/keepwarm}. Throws
// std::runtime_error when none of them is set.
std::filesystem::path cache_dir();

// Path of the cached demo model, generating it first if needed (a few seconds, logged to stderr). Safe when several
// processes start at once: one generates, the others wait for it, and nobody sees a partial file.
// The cache is ${KEEPWARM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/keepwarm}/models. Throws std::runtime_error.
std::string ensure_demo_model();

// Whether the GGUF says it was generated with random weights (keepwarm.random_weights); false when the key is
// missing or the file can't be read.
bool model_has_random_weights(const std::string& gguf_path);

}  // namespace keepwarm

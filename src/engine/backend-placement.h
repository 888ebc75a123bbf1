// Where a model's weights go, in llama-server's syntax: a --device list (DEV1,DEV2 or none) and --override-tensor
// patterns (PATTERN=BUFFER_TYPE,...), resolved against the ggml backends loaded, with errors that name the flag and
// what llama.cpp has instead. Used for the draft model's -devd and -otd (serve-command.cpp checks them before the
// model loads; engine/draft-model.cpp resolves them for the load).
// Threading: any thread once the backends are loaded (init_llama_runtime).
#pragma once

#include <list>
#include <string>
#include <vector>

#include "llama.h"

namespace keepwarm {

// The devices of `value` ("CUDA0,CUDA1"; "none": none, the layers stay on the CPU), ending with nullptr as
// llama_model_params::devices wants. Throws std::invalid_argument naming `flag` for an empty list, or for a name that
// is no device of a loaded backend or is the CPU (llama-server's rule: the CPU is not an offload device), listing the
// devices there are.
std::vector<ggml_backend_dev_t> parse_device_list(const std::string& value, const std::string& flag);

// Tensor-placement overrides: each of `values` a comma-separated list of PATTERN=BUFFER_TYPE, the buffer type named
// as ggml names it (CPU, CUDA0, ...). The list ends with the null pattern llama_model_params wants, and is empty when
// `values` is. Owns the patterns' text. Throws std::invalid_argument naming `flag` for an item without '=', an empty
// pattern, or an unknown buffer type (listing those there are).
class tensor_overrides {
public:
    tensor_overrides() = default;
    tensor_overrides(const std::vector<std::string>& values, const std::string& flag);
    tensor_overrides(const tensor_overrides&) = delete;
    tensor_overrides& operator=(const tensor_overrides&) = delete;

    const std::vector<llama_model_tensor_buft_override>& list() const { return list_; }

private:
    std::list<std::string> patterns_;  // a list: its strings stay where they are while it grows
    std::vector<llama_model_tensor_buft_override> list_;
};

}  // namespace keepwarm

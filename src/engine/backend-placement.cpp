// See backend-placement.h. The rules are common/arg.cpp's parse_device_list and parse_tensor_buffer_overrides (static
// there), with messages in place of its bare "invalid value".
#include "engine/backend-placement.h"

#include <map>
#include <regex>
#include <stdexcept>

#include "ggml-backend.h"

namespace keepwarm {

namespace {

std::vector<std::string> split_list(const std::string& value) {
    std::vector<std::string> items;
    size_t start = 0;
    for (;;) {
        const size_t comma = value.find(',', start);
        items.push_back(value.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    return items;
}

std::string offload_devices() {
    std::string names;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) continue;
        names += (names.empty() ? "" : ", ") + std::string(ggml_backend_dev_name(dev));
    }
    return names.empty() ? "none: no GPU backend is loaded" : names;
}

}  // namespace

std::vector<ggml_backend_dev_t> parse_device_list(const std::string& value, const std::string& flag) {
    if (value == "none") return {nullptr};
    std::vector<ggml_backend_dev_t> devices;
    for (const std::string& name : split_list(value)) {
        ggml_backend_dev_t dev = name.empty() ? nullptr : ggml_backend_dev_by_name(name.c_str());
        if (!dev || ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) {
            throw std::invalid_argument(
                flag + " '" + value + "': " +
                (name.empty() ? std::string("an empty device name") : "'" + name + "' is not a device to offload to") +
                " (devices: " + offload_devices() + "; 'none' keeps the layers on the CPU)");
        }
        devices.push_back(dev);
    }
    devices.push_back(nullptr);
    return devices;
}

tensor_overrides::tensor_overrides(const std::vector<std::string>& values, const std::string& flag) {
    std::map<std::string, ggml_backend_buffer_type_t> types;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        if (ggml_backend_buffer_type_t t = ggml_backend_dev_buffer_type(ggml_backend_dev_get(i))) {
            types[ggml_backend_buft_name(t)] = t;
        }
    }
    for (const std::string& value : values) {
        for (const std::string& item : split_list(value)) {
            const size_t eq = item.find('=');
            if (eq == std::string::npos || eq == 0) {
                throw std::invalid_argument(flag + " '" + item + "': give PATTERN=BUFFER_TYPE (e.g. 'ffn_.*=CPU')");
            }
            const std::string type = item.substr(eq + 1);
            const auto it = types.find(type);
            if (it == types.end()) {
                std::string known;
                for (const auto& [name, t] : types) known += (known.empty() ? "" : ", ") + name;
                throw std::invalid_argument(flag + " '" + item + "': '" + type +
                                            "' is not a buffer type (there are: " + known + ")");
            }
            try {
                std::regex check(item.substr(0, eq));  // what llama.cpp's loader makes of it, where it would fail
            } catch (const std::regex_error& e) {
                throw std::invalid_argument(flag + " '" + item + "': the pattern is not a regular expression (" +
                                            e.what() + ")");
            }
            patterns_.push_back(item.substr(0, eq));
            list_.push_back({patterns_.back().c_str(), it->second});
        }
    }
    if (!list_.empty()) list_.push_back({nullptr, nullptr});
}

}  // namespace keepwarm

// See settings-file.h.
#include "config/settings-file.h"

#include <stdexcept>
#include <system_error>

#include "config/toml-reader.h"

namespace keepwarm::config {

settings_file read_settings_file(const std::string& path) {
    std::error_code ec;
    const std::uintmax_t size = std::filesystem::file_size(path, ec);
    if (ec) throw std::runtime_error("cannot read the settings file '" + path + "': " + ec.message());
    if (size > max_settings_file_bytes) {
        throw std::runtime_error("the settings file '" + path + "' is larger than 1 MiB");
    }
    const std::string text = read_text_file(path, "settings file");
    return {.path = path, .base_dir = std::filesystem::absolute(path).parent_path(), .root = parse_toml(text, path)};
}

}  // namespace keepwarm::config

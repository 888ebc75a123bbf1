// The error a settings file (policy file, proxy --config file) is rejected with: its message names the file, line and
// column, which are also kept as numbers.
#pragma once

#include <stdexcept>
#include <string>

namespace keepwarm::config {

struct config_file_error : std::runtime_error {
    int line = 0;
    int column = 0;
    config_file_error(const std::string& message, int line, int column)
        : std::runtime_error(message), line(line), column(column) {}
};

}  // namespace keepwarm::config

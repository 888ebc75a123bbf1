// The wall clock in Unix seconds, as the APIs' "created" fields give it. Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>

namespace keepwarm {

inline int64_t unix_now() {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

}  // namespace keepwarm

// A fresh, absent path per test (named after the test and the process), removed with everything under it at the
// end; the test creates it, or lets the code under test do so. Declare it before whatever writes into it (an engine
// and its disk writer): that is then stopped before the folder goes, not racing its removal.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <system_error>

namespace keepwarm::test_support {

struct temp_dir {
    std::filesystem::path path;
    explicit temp_dir(const std::string& prefix) {
        const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
        std::string name = test->name();  // "name/parameter" for a parameterized test: one folder, not two
        std::replace(name.begin(), name.end(), '/', '_');
        path = std::filesystem::temp_directory_path() /
               ("keepwarm-" + prefix + "-" + std::to_string(::getpid()) + "-" + name);
        std::filesystem::remove_all(path);
    }
    ~temp_dir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    temp_dir(const temp_dir&) = delete;
    temp_dir& operator=(const temp_dir&) = delete;
};

}  // namespace keepwarm::test_support

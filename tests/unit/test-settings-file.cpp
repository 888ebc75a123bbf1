// config::read_settings_file, the one way `serve --config` and `proxy --config` files are read: a file is parsed
// whole with its folder made absolute; a missing file, one over 1 MiB and one that is not TOML are refused, each
// naming the file (and for a syntax error its line).
#include "config/settings-file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "config/config-error.h"

using namespace keepwarm;

namespace {

class settings_file_test : public ::testing::Test {
protected:
    settings_file_test()
        : dir_(std::filesystem::temp_directory_path() /
               ("keepwarm-test-settings-file-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
                "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name())) {
        std::filesystem::create_directories(dir_);
    }
    ~settings_file_test() override { std::filesystem::remove_all(dir_); }

    std::string write(const std::string& name, const std::string& text) {
        const std::filesystem::path p = dir_ / name;
        std::ofstream(p, std::ios::binary) << text;
        return p.string();
    }
    // The message of the std::runtime_error reading `path` throws ("" if none).
    static std::string refusal(const std::string& path) {
        try {
            config::read_settings_file(path);
        } catch (const std::runtime_error& e) {
            return e.what();
        }
        return "";
    }

    std::filesystem::path dir_;
};

}  // namespace

TEST_F(settings_file_test, a_file_is_parsed_whole_with_its_folder) {
    const std::string path = write("s.toml", "port = 8081\n[listen]\nhost = \"0.0.0.0\"\n");
    const config::settings_file f = config::read_settings_file(path);
    EXPECT_EQ(f.path, path);
    EXPECT_TRUE(f.base_dir.is_absolute());
    EXPECT_EQ(f.base_dir, std::filesystem::absolute(dir_));
    EXPECT_EQ(f.root["port"].value<int64_t>(), 8081);
    EXPECT_EQ(f.root["listen"]["host"].value<std::string>(), "0.0.0.0");
}

TEST_F(settings_file_test, a_missing_or_oversized_file_is_refused_naming_it) {
    const std::string missing = (dir_ / "none.toml").string();
    EXPECT_NE(refusal(missing).find("cannot read the settings file '" + missing + "'"), std::string::npos);
    const std::string big = write("big.toml", std::string(config::max_settings_file_bytes + 1, '\n'));
    EXPECT_NE(refusal(big).find("the settings file '" + big + "' is larger than 1 MiB"), std::string::npos);
    const std::string just = write("just.toml", std::string(config::max_settings_file_bytes, '\n'));
    EXPECT_TRUE(config::read_settings_file(just).root.empty());
}

TEST_F(settings_file_test, a_syntax_error_names_the_file_and_line) {
    const std::string path = write("bad.toml", "port = 1\nx = [\n");
    try {
        config::read_settings_file(path);
        FAIL() << "a broken file was read";
    } catch (const config::config_file_error& e) {
        EXPECT_EQ(e.line, 2) << e.what();
        EXPECT_EQ(std::string(e.what()).rfind(path + ":2:", 0), 0u) << e.what();
    }
}

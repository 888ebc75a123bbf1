// readable_by_others_warning: a file holding API keys that its group or others may read is named, with its mode and
// the chmod that fixes it; one only its owner reads, or one that is not there, gives no warning.
#include "config/key-file-mode.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

using keepwarm::config::readable_by_others_warning;

namespace {

std::string temp_file(const std::string& name) {
    const auto path = std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()));
    std::ofstream(path) << "a key-a-0123\n";
    return path.string();
}

}  // namespace

TEST(key_file_mode, a_keys_file_others_can_read_is_named_with_the_fix) {
    const std::string file = temp_file("keepwarm-mode-keys");
    ASSERT_EQ(::chmod(file.c_str(), 0644), 0);
    EXPECT_EQ(readable_by_others_warning(file, "API keys file"),
              "API keys file '" + file + "' is readable by group and others (mode 0644): other users on this host " +
                  "can read its keys; run chmod 600 " + file);
    ASSERT_EQ(::chmod(file.c_str(), 0640), 0);
    EXPECT_NE(readable_by_others_warning(file, "settings file").find("readable by its group (mode 0640)"),
              std::string::npos);
    ASSERT_EQ(::chmod(file.c_str(), 0604), 0);
    EXPECT_NE(readable_by_others_warning(file, "settings file").find("readable by others (mode 0604)"),
              std::string::npos);
    for (const mode_t owner_only : {0600, 0400, 0700}) {
        ASSERT_EQ(::chmod(file.c_str(), owner_only), 0);
        EXPECT_EQ(readable_by_others_warning(file, "API keys file"), "") << owner_only;
    }
    std::filesystem::remove(file);
    EXPECT_EQ(readable_by_others_warning(file, "API keys file"), "");  // not there: reading it says so
}

TEST(key_file_mode, a_path_a_shell_would_split_is_quoted_in_the_fix) {
    const std::string file = temp_file("keepwarm mode keys");
    ASSERT_EQ(::chmod(file.c_str(), 0644), 0);
    const std::string warning = readable_by_others_warning(file, "API keys file");
    EXPECT_NE(warning.find("chmod 600 '" + file + "'"), std::string::npos) << warning;
    std::filesystem::remove(file);
}

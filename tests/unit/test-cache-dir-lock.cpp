// cache_dir_lock: one server per cache directory. A second lock on the directory is refused naming the holder,
// whether it is another open in this process or another process; a holder's death (SIGKILL) frees the directory.
#include "cache/cache-dir-lock.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "test-temp-dir.h"

using keepwarm::cache_dir_busy;
using keepwarm::cache_dir_lock;
namespace fs = std::filesystem;

namespace {

struct temp_dir : keepwarm::test_support::temp_dir {
    temp_dir() : keepwarm::test_support::temp_dir("dir-lock") {}
};

std::string refusal(const fs::path& dir) {
    try {
        cache_dir_lock second(dir, "second");
    } catch (const cache_dir_busy& e) {
        return e.what();
    }
    return "";
}

TEST(CacheDirLock, CreatesTheDirectoryAndSaysWhoHoldsIt) {
    temp_dir dir;
    const fs::path nested = dir.path / "a" / "b";
    cache_dir_lock lock(nested, "keepwarm serve on http://127.0.0.1:0");
    ASSERT_TRUE(fs::exists(nested / cache_dir_lock::file_name));
    lock.describe("keepwarm serve on http://127.0.0.1:8080");
    std::ifstream in(lock.path());
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_EQ(text.str().rfind("pid " + std::to_string(::getpid()) + ", started 20", 0), 0u) << text.str();
    // One line, the new description whole, nothing left of the first (a timestamp may hold ":0", a port not).
    const std::string s = text.str();
    EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 1) << s;
    EXPECT_TRUE(s.ends_with(", keepwarm serve on http://127.0.0.1:8080\n")) << s;
    EXPECT_EQ(s.find("127.0.0.1:0\n"), std::string::npos) << "the first text is left: " << s;
}

TEST(CacheDirLock, ASecondLockInTheSameProcessIsRefusedNamingTheHolder) {
    temp_dir dir;
    {
        cache_dir_lock first(dir.path, "keepwarm serve on http://127.0.0.1:4242");
        const std::string why = refusal(dir.path);
        EXPECT_NE(why.find("pid " + std::to_string(::getpid())), std::string::npos) << why;
        EXPECT_NE(why.find("http://127.0.0.1:4242"), std::string::npos) << why;
        EXPECT_NE(why.find(dir.path.string()), std::string::npos) << why;
        EXPECT_NE(why.find("--cache-dir"), std::string::npos) << why;
    }
    EXPECT_EQ(refusal(dir.path), "") << "released when the first is destroyed";
}

TEST(CacheDirLock, AnotherProcessHoldsItUntilItIsKilled) {
    temp_dir dir;
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        // The child takes the lock, says so, and waits to be killed: it never releases the lock itself.
        ::close(ready[0]);
        try {
            cache_dir_lock lock(dir.path, "child");
            [[maybe_unused]] ssize_t n = ::write(ready[1], "1", 1);
            for (;;) ::pause();
        } catch (...) {
            ::_exit(3);
        }
    }
    ::close(ready[1]);
    char byte = 0;
    ASSERT_EQ(::read(ready[0], &byte, 1), 1);
    ::close(ready[0]);

    const std::string why = refusal(dir.path);
    EXPECT_NE(why.find("pid " + std::to_string(child) + ","), std::string::npos) << why;
    EXPECT_NE(why.find("child"), std::string::npos) << why;

    ::kill(child, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status));
    // The kernel released the dead holder's lock; its text is still in the file, and is simply overwritten.
    cache_dir_lock after(dir.path, "after");
    std::ifstream in(after.path());
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_EQ(text.str().rfind("pid " + std::to_string(::getpid()) + ",", 0), 0u) << text.str();
}

TEST(CacheDirLock, ADirectoryThatCannotBeMadeIsAnErrorNamingIt) {
    temp_dir dir;
    fs::create_directories(dir.path);
    std::ofstream(dir.path / "file") << "x";
    try {
        cache_dir_lock lock(dir.path / "file" / "sub", "x");
        FAIL() << "a directory under a file was made";
    } catch (const cache_dir_busy&) {
        FAIL() << "reported as busy";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find((dir.path / "file" / "sub").string()), std::string::npos) << e.what();
    }
}

}  // namespace

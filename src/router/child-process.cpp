// See child-process.h. The child is spawned with posix_spawn (no code of ours runs between fork and exec): its stdout
// is a pipe the router reads for the "listening on" line, its stdin /dev/null, every other descriptor of the router
// (its listening socket, its clients' connections) closed, its signal mask cleared.
#include "router/child-process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <regex>
#include <stdexcept>
#include <thread>

#include "base/logger.h"

extern char** environ;

namespace keepwarm::router {

namespace {

class spawned_child : public model_child {
public:
    spawned_child(std::string name, int pid, int stdout_fd, child_exit_callback on_exit)
        : name_(std::move(name)), pid_(pid), stdout_fd_(stdout_fd), on_exit_(std::move(on_exit)) {
        reader_ = std::thread([this] { read_stdout(); });
        reaper_ = std::thread([this] { reap(); });
    }

    ~spawned_child() override {
        stop(std::chrono::seconds(30));
        if (reaper_.joinable()) reaper_.join();
        if (reader_.joinable()) reader_.join();
    }

    // Waits until the child listens, exits or `timeout` passes. Throws std::runtime_error for the last two.
    void wait_until_listening(std::chrono::milliseconds timeout) {
        std::unique_lock lk(mu_);
        const bool done = cv_.wait_for(lk, timeout, [this] { return origin_.has_value() || exit_status_.has_value(); });
        if (origin_) return;
        if (exit_status_) {
            throw std::runtime_error("its server " + describe_exit(*exit_status_) + " before it listened");
        }
        if (!done) {
            lk.unlock();
            stop(std::chrono::seconds(5));
            throw std::runtime_error("its server did not listen within " + http::seconds_text(timeout) +
                                     " (--models-load-timeout)");
        }
    }

    const http::endpoint& origin() const override { return *origin_; }
    int pid() const override { return pid_; }

    void stop(std::chrono::milliseconds grace) override {
        std::unique_lock lk(mu_);
        if (exit_status_) return;
        stopping_ = true;
        ::kill(pid_, SIGTERM);
        if (!cv_.wait_for(lk, grace, [this] { return exit_status_.has_value(); })) {
            log::warn("router", "model {}'s server (pid {}) did not exit within {} of SIGTERM; killing it", name_, pid_,
                      http::seconds_text(grace));
            ::kill(pid_, SIGKILL);
            cv_.wait(lk, [this] { return exit_status_.has_value(); });
        }
    }

private:
    void read_stdout() {
        static const std::regex listening(R"(listening on (http://[^\s"]+))");
        std::string pending;
        char buf[4096];
        for (;;) {
            const ssize_t n = ::read(stdout_fd_, buf, sizeof buf);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            bool found = false;
            {
                std::lock_guard lk(mu_);
                found = origin_.has_value();
            }
            if (found) continue;  // the banner's rest and nothing else: not needed
            pending.append(buf, static_cast<size_t>(n));
            std::smatch m;
            if (std::regex_search(pending, m, listening)) {
                std::optional<http::endpoint> at;
                try {
                    at = http::endpoint::parse(m[1].str());
                } catch (const std::invalid_argument&) {
                }
                std::lock_guard lk(mu_);
                origin_ = at;
                pending.clear();
                cv_.notify_all();
            } else if (pending.size() > (1 << 20)) {
                pending.erase(0, pending.size() - 4096);  // a very long banner: keep its tail for the line
            }
        }
        ::close(stdout_fd_);
    }

    void reap() {
        // Waited for without reaping first, so that the pid stays its own until exit_status_ says it is gone:
        // stop() never signals a pid the system may have given to another process.
        siginfo_t info{};
        while (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOWAIT) < 0 && errno == EINTR) {
        }
        int status = 0;
        bool expected = false;
        {
            std::lock_guard lk(mu_);
            while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
            }
            exit_status_ = status;
            expected = stopping_;
            cv_.notify_all();
        }
        if (!expected && on_exit_) on_exit_(describe_exit(status));
    }

    const std::string name_;
    const int pid_;
    const int stdout_fd_;
    child_exit_callback on_exit_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::optional<http::endpoint> origin_;  // guarded by mu_
    std::optional<int> exit_status_;        // guarded by mu_
    bool stopping_ = false;                 // guarded by mu_
    std::thread reader_;
    std::thread reaper_;
};

}  // namespace

std::string describe_exit(int wait_status) {
    if (WIFEXITED(wait_status)) return "exited with status " + std::to_string(WEXITSTATUS(wait_status));
    if (WIFSIGNALED(wait_status)) {
        const int sig = WTERMSIG(wait_status);
        const char* name = ::strsignal(sig);
        return "was killed by signal " + std::to_string(sig) + (name ? std::string(" (") + name + ")" : "");
    }
    return "ended (status " + std::to_string(wait_status) + ")";
}

process_launcher::process_launcher(std::string executable, argument_builder arguments_for,
                                   std::chrono::milliseconds load_timeout)
    : executable_(std::move(executable)), arguments_for_(std::move(arguments_for)), load_timeout_(load_timeout) {}

std::unique_ptr<model_child> process_launcher::launch(const model_entry& model, child_exit_callback on_exit) {
    std::vector<std::string> args = arguments_for_(model);
    args.insert(args.begin(), executable_);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);

    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 1);
    posix_spawn_file_actions_addclosefrom_np(&actions, 3);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t none, defaults;
    sigemptyset(&none);
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGTERM);
    sigaddset(&defaults, SIGINT);
    sigaddset(&defaults, SIGPIPE);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    pid_t pid = 0;
    const int rc = ::posix_spawn(&pid, executable_.c_str(), &actions, &attr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    ::close(pipe_fds[1]);
    if (rc != 0) {
        ::close(pipe_fds[0]);
        throw std::runtime_error("cannot start " + executable_ + ": " + std::strerror(rc));
    }
    log::info("router", "model {}: started its server (pid {})", model.name, static_cast<int>(pid));
    auto child = std::make_unique<spawned_child>(model.name, pid, pipe_fds[0], std::move(on_exit));
    child->wait_until_listening(load_timeout_);
    return child;
}

}  // namespace keepwarm::router

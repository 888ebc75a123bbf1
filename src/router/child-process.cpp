// See child-process.h. The child is forked by the launcher's spawner thread and runs only async-signal-safe calls
// before exec: its stdout is a pipe the router reads for the "listening on" line (its other lines are logged), its
// stderr a pipe the router passes through to its own (keeping the last line, the reason of a failed start), its
// stdin /dev/null, every other descriptor of the router (its listening socket, its clients' connections) closed, its
// signal mask cleared, and SIGTERM set to come to it if the router dies.
#include "router/child-process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <optional>
#include <regex>
#include <stdexcept>
#include <thread>

#include "base/logger.h"

namespace keepwarm::router {

namespace {

// Reads `fd` until its end (or an error), handing each chunk read to `on_chunk`, then closes it.
template <typename OnChunk>
void read_until_closed(int fd, OnChunk&& on_chunk) {
    char buf[4096];
    for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        on_chunk(buf, n);
    }
    ::close(fd);
}

class spawned_child : public model_child {
public:
    spawned_child(std::string name, int pid, int stdout_fd, int stderr_fd, child_exit_callback on_exit)
        : name_(std::move(name)),
          pid_(pid),
          stdout_fd_(stdout_fd),
          stderr_fd_(stderr_fd),
          on_exit_(std::move(on_exit)) {
        reader_ = std::thread([this] { read_stdout(); });
        if (stderr_fd_ >= 0) {
            error_reader_ = std::thread([this] { read_stderr(); });
        } else {
            stderr_done_ = true;
        }
        reaper_ = std::thread([this] { reap(); });
    }

    ~spawned_child() override {
        stop(std::chrono::seconds(30));
        if (reaper_.joinable()) reaper_.join();
        if (reader_.joinable()) reader_.join();
        if (error_reader_.joinable()) error_reader_.join();
    }

    // Waits until the child listens, exits or `timeout` passes. Throws std::runtime_error for the last two.
    void wait_until_listening(std::chrono::milliseconds timeout) {
        std::unique_lock lk(mu_);
        const bool done = cv_.wait_for(lk, timeout, [this] { return origin_.has_value() || exit_status_.has_value(); });
        if (origin_) return;
        if (exit_status_) {
            // Its last line on stderr says why (a draft model that does not fit the model, a bad flag): the client
            // is told, not only the router's log. The pipe ends with the process; a moment is enough.
            cv_.wait_for(lk, std::chrono::seconds(2), [this] { return stderr_done_; });
            throw std::runtime_error("its server " + describe_exit(*exit_status_) + " before it listened" +
                                     (last_error_line_.empty() ? std::string() : ": " + last_error_line_));
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
    // Its standard output: the banner, logged line by line under the model's name, and the "listening on" line,
    // which says where it listens.
    void read_stdout() {
        static const std::regex listening(R"(listening on (http://[^\s"]+))");
        std::string pending;
        read_until_closed(stdout_fd_, [&](const char* buf, ssize_t n) {
            pending.append(buf, static_cast<size_t>(n));
            size_t end;
            while ((end = pending.find('\n')) != std::string::npos) {
                const std::string line = pending.substr(0, end);
                pending.erase(0, end + 1);
                std::smatch m;
                if (std::regex_search(line, m, listening)) {
                    std::optional<http::endpoint> at;
                    try {
                        at = http::endpoint::parse(m[1].str());
                    } catch (const std::invalid_argument&) {
                    }
                    std::lock_guard lk(mu_);
                    if (!origin_) origin_ = at;
                    cv_.notify_all();
                } else if (!line.empty()) {
                    log::info("router", "model {}: {}", name_, line);
                }
            }
            if (pending.size() > (1 << 16)) pending.clear();  // no line this long is worth keeping
        });
    }

    // Its standard error: passed through to the router's as it comes, its last line kept for a failed start.
    void read_stderr() {
        std::string line;
        read_until_closed(stderr_fd_, [&](const char* buf, ssize_t n) {
            for (ssize_t written = 0; written < n;) {
                const ssize_t w = ::write(2, buf + written, static_cast<size_t>(n - written));
                if (w < 0 && errno == EINTR) continue;
                if (w <= 0) break;
                written += w;
            }
            for (ssize_t i = 0; i < n; ++i) {
                if (buf[i] != '\n') {
                    if (line.size() < 2000) line += buf[i];  // a message is one line, bounded here
                    continue;
                }
                if (!line.empty()) {
                    std::lock_guard lk(mu_);
                    last_error_line_ = line;
                }
                line.clear();
            }
        });
        std::lock_guard lk(mu_);
        if (!line.empty()) last_error_line_ = line;
        stderr_done_ = true;
        cv_.notify_all();
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
    const int stderr_fd_;  // -1: its stderr is the router's
    child_exit_callback on_exit_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::optional<http::endpoint> origin_;  // guarded by mu_
    std::optional<int> exit_status_;        // guarded by mu_
    bool stopping_ = false;                 // guarded by mu_
    std::string last_error_line_;           // guarded by mu_
    bool stderr_done_ = false;              // guarded by mu_
    std::thread reader_;
    std::thread error_reader_;
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

process_launcher::~process_launcher() {
    {
        std::lock_guard lk(spawn_mu_);
        closing_ = true;
        spawn_cv_.notify_all();
    }
    if (spawner_.joinable()) spawner_.join();
}

void process_launcher::run_spawner() {
    std::unique_lock lk(spawn_mu_);
    for (;;) {
        spawn_cv_.wait(lk, [this] { return closing_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        std::packaged_task<spawned()> job = std::move(jobs_.front());
        jobs_.pop_front();
        lk.unlock();
        job();
        lk.lock();
    }
}

// Runs on the spawner thread, which lives as long as the launcher: a child's parent-death signal follows the thread
// that forked it, so a child forked by a connection's thread would get SIGTERM when that connection closed.
process_launcher::spawned process_launcher::spawn(const std::vector<std::string>& args) const {
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return {0, -1, -1, std::string("pipe: ") + std::strerror(errno)};
    int error_fds[2] = {-1, -1};
    if (::pipe2(error_fds, O_CLOEXEC) != 0) error_fds[0] = error_fds[1] = -1;  // then its stderr is the router's
    const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
        // The child, until exec: async-signal-safe calls only. It gets SIGTERM (a clean stop, its cache written)
        // if the router dies without stopping it, so no model server outlives its router.
        ::prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (::getppid() != parent) ::_exit(127);
        if (devnull >= 0) ::dup2(devnull, 0);
        ::dup2(pipe_fds[1], 1);
        if (error_fds[1] >= 0) ::dup2(error_fds[1], 2);
        ::close_range(3, ~0U, 0);  // the router's sockets and files
        sigset_t none;
        sigemptyset(&none);
        ::sigprocmask(SIG_SETMASK, &none, nullptr);
        ::execv(argv[0], argv.data());
        ::_exit(127);
    }
    const int fork_errno = errno;
    ::close(pipe_fds[1]);
    if (error_fds[1] >= 0) ::close(error_fds[1]);
    if (devnull >= 0) ::close(devnull);
    if (pid < 0) {
        ::close(pipe_fds[0]);
        if (error_fds[0] >= 0) ::close(error_fds[0]);
        return {0, -1, -1, std::string("fork: ") + std::strerror(fork_errno)};
    }
    return {pid, pipe_fds[0], error_fds[0], {}};
}

std::unique_ptr<model_child> process_launcher::launch(const model_entry& model, child_exit_callback on_exit) {
    std::vector<std::string> args = arguments_for_(model);
    args.insert(args.begin(), executable_);
    std::packaged_task<spawned()> job([this, &args] { return spawn(args); });
    std::future<spawned> result = job.get_future();
    {
        std::lock_guard lk(spawn_mu_);
        if (!spawner_.joinable()) spawner_ = std::thread([this] { run_spawner(); });
        jobs_.push_back(std::move(job));
        spawn_cv_.notify_all();
    }
    const spawned s = result.get();
    if (s.pid <= 0) throw std::runtime_error("cannot start " + executable_ + ": " + s.error);
    log::info("router", "model {}: started its server (pid {})", model.name, static_cast<int>(s.pid));
    auto child = std::make_unique<spawned_child>(model.name, s.pid, s.stdout_fd, s.stderr_fd, std::move(on_exit));
    child->wait_until_listening(load_timeout_);
    return child;
}

}  // namespace keepwarm::router

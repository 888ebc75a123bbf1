// One model's own `keepwarm serve` process, started and stopped by the router: spawned with the arguments the
// router gives it, listening on a loopback port it picks itself (--port 0) and names on its standard output
// ("listening on http://..."), stopped with SIGTERM (it writes its prefix cache to its disk tier, as any serve does)
// and, past a grace time, SIGKILL. Its standard error goes to the router's (its log lines show with the router's); its
// last line is the reason given for a start that failed.
// child_launcher is the seam the router's scheduler is tested through (a fake launcher starts no process).
// Threading: a model_child is owned by one thread at a time; its exit callback runs on its own reaper thread, which
// its destructor joins, so the callback must not wait for whoever destroys the child.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "http/http-client.h"
#include "router/model-set.h"

namespace keepwarm::router {

class model_child {
public:
    virtual ~model_child() = default;
    // Where its server listens.
    virtual const http::endpoint& origin() const = 0;
    // Its process id (0 for a fake).
    virtual int pid() const = 0;
    // SIGTERM, then SIGKILL if it has not exited after `grace`; returns once it has exited. Its exit callback is not
    // called for an exit this caused.
    virtual void stop(std::chrono::milliseconds grace) = 0;
};

// Called once when the child exits on its own (a crash, a kill from outside), with what its exit status says.
using child_exit_callback = std::function<void(const std::string& how)>;

class child_launcher {
public:
    virtual ~child_launcher() = default;
    // Starts `model`'s server and returns once it listens. Throws std::runtime_error (saying why: it exited, it did
    // not listen in time) when it does not.
    virtual std::unique_ptr<model_child> launch(const model_entry& model, child_exit_callback on_exit) = 0;
};

// The real launcher: runs `executable` with the arguments `arguments_for` gives for a model (argv[1] on; argv[0] is
// the executable), and waits up to `load_timeout` for it to listen. A child gets SIGTERM if the router dies.
class process_launcher : public child_launcher {
public:
    using argument_builder = std::function<std::vector<std::string>(const model_entry&)>;
    process_launcher(std::string executable, argument_builder arguments_for, std::chrono::milliseconds load_timeout);
    ~process_launcher() override;  // after every child it started has been stopped
    std::unique_ptr<model_child> launch(const model_entry& model, child_exit_callback on_exit) override;

private:
    struct spawned {
        int pid = 0;  // 0: not started (error says why)
        int stdout_fd = -1;
        int stderr_fd = -1;  // -1: the child writes to the router's stderr
        std::string error;
    };
    spawned spawn(const std::vector<std::string>& args) const;
    void run_spawner();

    std::string executable_;
    argument_builder arguments_for_;
    std::chrono::milliseconds load_timeout_;
    std::mutex spawn_mu_;
    std::condition_variable spawn_cv_;
    std::deque<std::packaged_task<spawned()>> jobs_;  // guarded by spawn_mu_
    bool closing_ = false;                            // guarded by spawn_mu_
    std::thread spawner_;                             // started by the first launch()
};

// "exited with status 1", "killed by signal 9 (Killed)": a waitpid status as the log says it.
std::string describe_exit(int wait_status);

}  // namespace keepwarm::router

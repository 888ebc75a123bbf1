// Server processes the gauntlet starts itself (`--launch`): keepwarm with its policy and prefix cache, keepwarm with
// both switched off, and llama-server, each on the same model, context, slots and threads, on a free local port,
// with its output in a log file. The restart killer stops and starts one of them on the same port.
// Threading: one thread drives a launched_server; the replay holds its requests off while it restarts.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace keepwarm::bench::gauntlet {

enum class server_kind { keepwarm, keepwarm_off, llama_server };
const char* server_kind_name(server_kind kind);  // "keepwarm", "keepwarm-off", "llama-server"
// Throws std::invalid_argument naming the accepted names.
server_kind parse_server_kind(const std::string& name);

struct launch_settings {
    std::string model;
    int ctx_size = 0;
    int parallel = 1;
    int threads = 0;  // 0: each server's default
    std::string keepwarm_binary;
    std::string policy_file;          // for `keepwarm`
    std::string llama_server_binary;  // for `llama-server`
    std::string work_dir;             // logs and keepwarm's disk caches
};

// The command line of one server on `port` (argv[0] first); keepwarm's disk tier lives in `cache_dir`.
std::vector<std::string> server_command(server_kind kind, const launch_settings& settings, uint16_t port,
                                        const std::string& cache_dir);

// A free TCP port on 127.0.0.1 (bound and released: another process could take it first, which start() reports).
uint16_t free_local_port();

// The llama-server binary: `explicit_path` when given, else what bench/build-llama-server.sh (next to the keepwarm
// checkout of `keepwarm_binary`, or under the working directory) builds or finds. Throws std::runtime_error saying
// what to do when there is none.
std::string find_llama_server(const std::string& explicit_path, const std::string& keepwarm_binary);
// etc/keepwarm-policy.toml of the checkout `keepwarm_binary` was built in, else under the working directory.
std::string find_policy_file(const std::string& keepwarm_binary);

class launched_server {
public:
    launched_server(server_kind kind, launch_settings settings);
    ~launched_server();  // stops the process and removes its disk cache
    launched_server(const launched_server&) = delete;
    launched_server& operator=(const launched_server&) = delete;

    // Starts the process and waits until GET /health answers 200. Throws std::runtime_error with the end of its
    // log when it exits or does not get ready in `ready_timeout_s`.
    void start(std::ostream& progress, double ready_timeout_s = 900);
    // SIGTERM (keepwarm then writes what only its device held to disk), SIGKILL after 120 s.
    void stop();
    // stop() and start() on the same port, with the same disk cache.
    void restart(std::ostream& progress);

    std::string url() const;  // http://127.0.0.1:PORT
    server_kind kind() const { return kind_; }
    const std::string& log_path() const { return log_path_; }
    std::string log_tail(size_t bytes = 2000) const;

private:
    server_kind kind_;
    launch_settings settings_;
    uint16_t port_ = 0;
    pid_t pid_ = -1;
    std::string log_path_;
    std::string cache_dir_;
};

}  // namespace keepwarm::bench::gauntlet

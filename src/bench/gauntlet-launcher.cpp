// See gauntlet-launcher.h.
#include "bench/gauntlet-launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "http/http-client.h"

extern char** environ;

namespace keepwarm::bench::gauntlet {

namespace fs = std::filesystem;

namespace {

// Candidates for a file of the keepwarm checkout: next to the build folder the binary is in, then the cwd.
std::vector<fs::path> checkout_candidates(const std::string& keepwarm_binary, const fs::path& relative) {
    std::vector<fs::path> out;
    if (!keepwarm_binary.empty()) {
        std::error_code ec;
        const fs::path binary = fs::weakly_canonical(keepwarm_binary, ec);
        if (!ec) out.push_back(binary.parent_path().parent_path() / relative);
    }
    out.push_back(fs::current_path() / relative);
    return out;
}

}  // namespace

const char* server_kind_name(server_kind kind) {
    switch (kind) {
        case server_kind::keepwarm:
            return "keepwarm";
        case server_kind::keepwarm_off:
            return "keepwarm-off";
        case server_kind::llama_server:
            return "llama-server";
    }
    return "?";
}

server_kind parse_server_kind(const std::string& name) {
    for (server_kind k : {server_kind::keepwarm, server_kind::keepwarm_off, server_kind::llama_server}) {
        if (name == server_kind_name(k)) return k;
    }
    throw std::invalid_argument("unknown server '" + name + "' (keepwarm, keepwarm-off, llama-server)");
}

std::vector<std::string> server_command(server_kind kind, const launch_settings& s, uint16_t port,
                                        const std::string& cache_dir) {
    const std::string port_text = std::to_string(port);
    std::vector<std::string> argv;
    if (kind == server_kind::llama_server) {
        // llama-server as it ships: its own slot prompt cache and --cache-ram default stay on.
        argv = {s.llama_server_binary,
                "-m",
                s.model,
                "-c",
                std::to_string(s.ctx_size),
                "-np",
                std::to_string(s.parallel),
                "--host",
                "127.0.0.1",
                "--port",
                port_text};
    } else {
        argv = {s.keepwarm_binary, "serve", "-m", s.model, "-c", std::to_string(s.ctx_size), "--parallel",
                std::to_string(s.parallel), "--host", "127.0.0.1", "--port", port_text, "--cache-dir", cache_dir,
                // Every agent of the replay connects from 127.0.0.1: many agents would pass the per-address limit.
                "--max-connections-per-address", "0"};
        if (kind == server_kind::keepwarm) {
            argv.insert(argv.end(), {"--policy", s.policy_file});
        } else {
            // No policy, no RAM or disk tier, no parked conversations: what stays is reuse of what the slots hold.
            argv.insert(argv.end(), {"--no-policy", "--cache-ram", "0", "--cache-disk", "0", "--cache-parked", "0"});
        }
    }
    if (s.threads > 0) argv.insert(argv.end(), {"-t", std::to_string(s.threads)});
    return argv;
}

uint16_t free_local_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) throw std::runtime_error("cannot open a socket to find a free port");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
    ::close(fd);
    if (!ok) throw std::runtime_error("cannot find a free local port");
    return ntohs(addr.sin_port);
}

std::string find_llama_server(const std::string& explicit_path, const std::string& keepwarm_binary) {
    if (!explicit_path.empty()) {
        if (::access(explicit_path.c_str(), X_OK) != 0) {
            throw std::runtime_error("--llama-server " + explicit_path + " is not an executable file");
        }
        return explicit_path;
    }
    for (const fs::path& script : checkout_candidates(keepwarm_binary, "bench/build-llama-server.sh")) {
        if (!fs::exists(script)) continue;
        // The script prints the binary's path on stdout; its progress goes to our stderr.
        std::string command = "'";
        command += script.string();
        command += "'";
        FILE* pipe = ::popen(command.c_str(), "r");
        if (!pipe) break;
        std::string out;
        char buffer[512];
        while (size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) out.append(buffer, n);
        const int status = ::pclose(pipe);
        while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
        if (const size_t nl = out.rfind('\n'); nl != std::string::npos) out = out.substr(nl + 1);
        if (status == 0 && !out.empty() && ::access(out.c_str(), X_OK) == 0) return out;
        throw std::runtime_error("llama-server is not built and " + script.string() + " failed (exit status " +
                                 std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) +
                                 "; its messages are above): build it, pass --llama-server PATH, or leave it out "
                                 "of --servers");
    }
    throw std::runtime_error(
        "llama-server is not built and bench/build-llama-server.sh was not found (looked next to the keepwarm build "
        "and under the working directory): pass --llama-server PATH, or leave it out of --servers");
}

std::string find_policy_file(const std::string& keepwarm_binary) {
    for (const fs::path& p : checkout_candidates(keepwarm_binary, "etc/keepwarm-policy.toml")) {
        if (fs::exists(p)) return p.string();
    }
    throw std::runtime_error(
        "etc/keepwarm-policy.toml not found next to the keepwarm build or under the working "
        "directory: pass --policy FILE");
}

launched_server::launched_server(server_kind kind, launch_settings settings)
    : kind_(kind), settings_(std::move(settings)) {
    fs::create_directories(settings_.work_dir);
    log_path_ = (fs::path(settings_.work_dir) / (std::string(server_kind_name(kind_)) + ".log")).string();
    cache_dir_ = (fs::path(settings_.work_dir) / (std::string(server_kind_name(kind_)) + "-cache")).string();
    fs::remove_all(cache_dir_);  // each launch starts from an empty disk tier
    fs::create_directories(cache_dir_);
}

launched_server::~launched_server() {
    stop();
    std::error_code ignored;
    fs::remove_all(cache_dir_, ignored);  // gigabytes at agentic sizes; the log stays
}

std::string launched_server::url() const {
    return "http://127.0.0.1:" + std::to_string(port_);
}

std::string launched_server::log_tail(size_t bytes) const {
    std::ifstream in(log_path_, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    const std::string all = text.str();
    return all.size() > bytes ? all.substr(all.size() - bytes) : all;
}

void launched_server::start(std::ostream& progress, double ready_timeout_s) {
    if (pid_ > 0) return;
    if (port_ == 0) port_ = free_local_port();
    const std::vector<std::string> args = server_command(kind_, settings_, port_, cache_dir_);
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    const int rc = ::posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) {
        pid_ = -1;
        throw std::runtime_error(std::string("cannot start ") + args[0] + ": " + std::strerror(rc));
    }
    progress << "gauntlet: started " << server_kind_name(kind_) << " (pid " << pid_ << ") on " << url() << ", log "
             << log_path_ << "\n";

    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(ready_timeout_s);
    http::client_options quick;
    quick.connect_timeout = std::chrono::seconds(1);
    quick.read_timeout = std::chrono::seconds(5);
    while (true) {
        int status = 0;
        if (::waitpid(pid_, &status, WNOHANG) == pid_) {
            pid_ = -1;
            throw std::runtime_error(std::string(server_kind_name(kind_)) + " exited during start-up; the end of " +
                                     log_path_ + ":\n" + log_tail());
        }
        try {
            if (http::fetch(http::endpoint::parse(url()), "GET", "/health", {}, {}, quick).status == 200) return;
        } catch (const std::exception&) {
            // not listening yet
        }
        if (std::chrono::steady_clock::now() > deadline) {
            stop();
            throw std::runtime_error(std::string(server_kind_name(kind_)) + " did not get ready; the end of " +
                                     log_path_ + ":\n" + log_tail());
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
}

void launched_server::stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > deadline) {
            ::kill(pid_, SIGKILL);
            ::waitpid(pid_, &status, 0);
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    pid_ = -1;
}

void launched_server::restart(std::ostream& progress) {
    progress << "gauntlet: restarting " << server_kind_name(kind_) << "\n";
    stop();
    start(progress);
}

}  // namespace keepwarm::bench::gauntlet

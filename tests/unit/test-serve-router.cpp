// Each model's server's command line under the router: the router's own serve options pass on (llama-server's short
// flags and values of either form included), those the router sets itself do not, a model's table wins over the
// router's option, and every child listens on loopback with its own cache folder and share of the disk budget.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>

#include <algorithm>

#include "commands/llama-server-flags.h"
#include "commands/serve-command.h"
#include "commands/serve-router.h"

using keepwarm::child_command_line;
using keepwarm::router::model_entry;

namespace {
struct serve_app {
    CLI::App app;
    CLI::App* serve;
    serve_app() {
        keepwarm::add_serve_command(app);
        serve = app.get_subcommand("serve");
    }
};

model_entry coder() {
    model_entry m;
    m.name = "coder";
    m.path = "/srv/coder.gguf";
    m.aliases = {"big"};
    return m;
}
}  // namespace

TEST(ServeRouter, TheRoutersOptionsPassOnLessItsOwn) {
    serve_app s;
    const std::vector<std::string> router_args = {"--models-dir",
                                                  "/srv",
                                                  "--models-max=2",
                                                  "--parallel",
                                                  "2",
                                                  "-c",
                                                  "4096",
                                                  "--port",
                                                  "9000",
                                                  "--host",
                                                  "0.0.0.0",
                                                  "-t",
                                                  "1",
                                                  "--api-key",
                                                  "k",
                                                  "--cache-disk",
                                                  "1GiB",
                                                  "-fa",
                                                  "--no-mmap",
                                                  "--cache-dir",
                                                  "/var/c",
                                                  "--max-connections-per-address",
                                                  "8"};
    const std::vector<std::string> args = child_command_line(*s.serve, router_args, coder(), "/var/c/models", "512");
    const std::vector<std::string> expected = {"serve",
                                               "-m",
                                               "/srv/coder.gguf",
                                               "-a",
                                               "coder,big",
                                               "--parallel",
                                               "2",
                                               "-c",
                                               "4096",
                                               "-t",
                                               "1",
                                               "--api-key",
                                               "k",
                                               "-fa",
                                               "--no-mmap",
                                               "--host",
                                               "127.0.0.1",
                                               "--port",
                                               "0",
                                               "--cache-dir",
                                               "/var/c/models/coder",
                                               "--max-connections-per-address",
                                               "0",
                                               "--cache-disk=512"};
    EXPECT_EQ(args, expected);
}

TEST(ServeRouter, AModelsTableWinsOverTheRoutersOption) {
    serve_app s;
    model_entry m = coder();
    m.options = {{"ctx-size", {"65536"}}, {"swa-full", {}}, {"cache-disk", {"8GiB"}}};
    const std::vector<std::string> args =
        child_command_line(*s.serve, {"-c4096", "--parallel=2", "--ctx-size", "1024"}, m, "/c/models", "512");
    const std::vector<std::string> expected = {"serve",
                                               "-m",
                                               "/srv/coder.gguf",
                                               "-a",
                                               "coder,big",
                                               "--parallel=2",
                                               "--ctx-size=65536",
                                               "--swa-full",
                                               "--cache-disk=8GiB",
                                               "--host",
                                               "127.0.0.1",
                                               "--port",
                                               "0",
                                               "--cache-dir",
                                               "/c/models/coder",
                                               "--max-connections-per-address",
                                               "0"};
    EXPECT_EQ(args, expected);
}

// llama-server's router gives its own -md (and the draft model's other flags) to every model's server; a model's table
// names its own draft model (spec-draft-model), or turns drafting off (spec-type = "none").
TEST(ServeRouter, TheRoutersDraftModelGoesToEveryModelUnlessItsTableNamesAnother) {
    serve_app s;
    const std::vector<std::string> router_args = keepwarm::expand_llama_server_flags(
        {"-md", "/srv/draft.gguf", "-td", "1", "-ctkd", "q8_0", "-devd", "none", "-otd", "ffn_.*=CPU"});
    const std::vector<std::string> passed = {"--model-draft",           "/srv/draft.gguf",
                                             "--threads-draft",         "1",
                                             "--cache-type-k-draft",    "q8_0",
                                             "--device-draft",          "none",
                                             "--override-tensor-draft", "ffn_.*=CPU"};
    const std::vector<std::string> args = child_command_line(*s.serve, router_args, coder(), "/c/models", "512");
    EXPECT_EQ(std::vector<std::string>(args.begin() + 5, args.begin() + 5 + passed.size()), passed);

    model_entry m = coder();
    m.options = {{"spec-draft-model", {"/srv/coder-draft.gguf"}}};
    const std::vector<std::string> own = child_command_line(*s.serve, router_args, m, "/c/models", "512");
    EXPECT_EQ(std::count(own.begin(), own.end(), "/srv/draft.gguf"), 0);
    EXPECT_EQ(std::count(own.begin(), own.end(), "--spec-draft-model=/srv/coder-draft.gguf"), 1);
    EXPECT_EQ(std::count(own.begin(), own.end(), "--threads-draft"), 1);  // the router's other draft flags stay
}

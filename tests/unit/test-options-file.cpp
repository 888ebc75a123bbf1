// A command's settings from a TOML file (serve --config): every option by its long name, through the option's own
// checks; the command line wins; relative paths start at the file's folder; each mistake names its line and column.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "commands/options-file.h"
#include "config/config-error.h"

using keepwarm::apply_options_text;
using keepwarm::options_file_rules;
using keepwarm::config::config_file_error;

namespace {

// A command shaped like serve's: a checked integer, a size, a string path, a repeated option with a delimiter, a
// bool flag, a flag callback, an option excluded by a flag.
struct command {
    CLI::App app;
    CLI::App* cmd = app.add_subcommand("serve");
    int parallel = 1;
    int64_t cache_ram = 0;
    std::string model;
    std::vector<std::string> aliases;
    double temp = 0.8;
    bool verbose = false;
    bool no_mmap = false;
    std::string policy;
    bool no_policy = false;
    options_file_rules rules;
    std::string tenants_seen;

    command() {
        cmd->add_option("--parallel", parallel)->check(CLI::Range(1, 256));
        cmd->add_option("--cache-ram", cache_ram)->transform(CLI::AsSizeValue(false));
        cmd->add_option("-m,--model", model);
        cmd->add_option("-a,--alias", aliases)->delimiter(',');
        cmd->add_option("--temp", temp)->check(CLI::Range(0.0, 2.0));
        cmd->add_flag("-v,--verbose", verbose);
        cmd->add_flag_callback("--no-mmap", [this] { no_mmap = true; });
        CLI::Option* p = cmd->add_option("--policy", policy);
        cmd->add_flag("--no-policy", no_policy)->excludes(p);
        cmd->add_option("--config");
        rules.path_options = {"model"};
        rules.not_in_file = {"config", "help"};
        rules.tables["tenants"] = [this](const toml::table& t, const keepwarm::config::toml_reader&) {
            for (auto&& [k, v] : t) tenants_seen += std::string(k.str()) + ";";
        };
    }

    // Parses `argv` as the command line, then applies `text` as the file /etc/keepwarm/serve.toml.
    void run(std::vector<std::string> argv, const std::string& text) {
        argv.insert(argv.begin(), "serve");
        std::reverse(argv.begin(), argv.end());
        app.parse(argv);
        apply_options_text(*cmd, text, "serve.toml", "/etc/keepwarm", rules);
    }
};

// The error `text` gets, with its line and column.
config_file_error error_of(const std::string& text) {
    command c;
    try {
        c.run({}, text);
    } catch (const config_file_error& e) {
        return e;
    }
    ADD_FAILURE() << "no error for:\n" << text;
    return config_file_error("", 0, 0);
}

}  // namespace

TEST(options_file, every_kind_of_option_takes_its_value_from_the_file) {
    command c;
    c.run({}, R"(parallel = 4
cache-ram = "8GiB"
model = "models/qwen.gguf"
alias = ["qwen", "gpt-4o"]
temp = 0.25
verbose = true
no_mmap = true
[tenants]
alice = "k"
)");
    EXPECT_EQ(c.parallel, 4);
    EXPECT_EQ(c.cache_ram, int64_t{8} << 30);
    EXPECT_EQ(c.model, "/etc/keepwarm/models/qwen.gguf");  // relative to the file's folder
    EXPECT_EQ(c.aliases, (std::vector<std::string>{"qwen", "gpt-4o"}));
    EXPECT_DOUBLE_EQ(c.temp, 0.25);
    EXPECT_TRUE(c.verbose);
    EXPECT_TRUE(c.no_mmap);
    EXPECT_EQ(c.tenants_seen, "alice;");
}

TEST(options_file, a_false_flag_stays_off_and_an_absolute_path_stays_as_written) {
    command c;
    c.run({}, "no-mmap = false\nverbose = false\nmodel = \"/srv/m.gguf\"\nalias = \"a,b\"\n");
    EXPECT_FALSE(c.no_mmap);
    EXPECT_FALSE(c.verbose);
    EXPECT_EQ(c.model, "/srv/m.gguf");
    EXPECT_EQ(c.aliases, (std::vector<std::string>{"a", "b"}));
}

TEST(options_file, the_command_line_wins) {
    command c;
    c.run({"--parallel", "2", "--no-policy"}, "parallel = 8\npolicy = \"p.toml\"\ntemp = 1.5\n");
    EXPECT_EQ(c.parallel, 2);
    EXPECT_EQ(c.policy, "");  // --no-policy on the command line shuts out the file's policy
    EXPECT_TRUE(c.no_policy);
    EXPECT_DOUBLE_EQ(c.temp, 1.5);
}

TEST(options_file, mistakes_name_their_line_and_column) {
    config_file_error e = error_of("parallel = 4\n\nctx_size = 8\n");
    EXPECT_EQ(e.line, 3);
    EXPECT_NE(std::string(e.what()).find("serve.toml:3:1: unknown setting 'ctx_size'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("keepwarm serve --help"), std::string::npos) << e.what();

    e = error_of("\nparallel = 300\n");  // the option's own check, with the line
    EXPECT_EQ(e.line, 2);
    EXPECT_NE(std::string(e.what()).find("'parallel'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("256"), std::string::npos) << e.what();

    e = error_of("parallel = \"many\"\n");
    EXPECT_EQ(e.line, 1);
    EXPECT_NE(std::string(e.what()).find("'parallel'"), std::string::npos) << e.what();

    e = error_of("verbose = \"yes\"\n");  // a flag takes true or false
    EXPECT_NE(std::string(e.what()).find("'verbose' must be true or false, not a string"), std::string::npos)
        << e.what();

    e = error_of("parallel = [1, 2]\n");  // one value where the command line takes one
    EXPECT_NE(std::string(e.what()).find("serve.toml:1:"), std::string::npos) << e.what();

    e = error_of("model = { path = \"x\" }\n");
    EXPECT_NE(std::string(e.what()).find("'model' must be a string, a number or a boolean, not a table"),
              std::string::npos)
        << e.what();

    e = error_of("config = \"other.toml\"\n");
    EXPECT_NE(std::string(e.what()).find("'config' cannot be set in this file"), std::string::npos) << e.what();

    e = error_of("parallel = 4\nparallel = 5\n");  // TOML itself: a key twice
    EXPECT_EQ(e.line, 2);

    e = error_of("tenants = 3\n");  // a table key must hold a table
    EXPECT_NE(std::string(e.what()).find("'tenants' must be a table"), std::string::npos) << e.what();
}

// A file that sets a key (an option or a table named in key_settings) says so, so that its mode is checked.
TEST(OptionsFile, AFileThatSetsAKeySettingSaysSo) {
    const auto holds_keys = [](const std::string& text) {
        command c;
        c.cmd->add_option("--api-key");
        c.rules.key_settings = {"api-key", "tenants"};
        c.app.parse(std::vector<std::string>{"serve"});
        return apply_options_text(*c.cmd, text, "serve.toml", "/etc/keepwarm", c.rules);
    };
    EXPECT_FALSE(holds_keys("parallel = 2\n"));
    EXPECT_TRUE(holds_keys("api_key = \"sk-secret-1\"\n"));
    EXPECT_TRUE(holds_keys("[tenants]\nalice = \"key-a-0123\"\n"));
}

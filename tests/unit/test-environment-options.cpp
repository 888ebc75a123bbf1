// Options from environment variables (llama-server's LLAMA_ARG_*): the value goes through the option's own checks,
// the command line wins, a flag follows llama.cpp's true and false words, and a mistake names the variable.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "commands/environment-options.h"

using namespace keepwarm;

namespace {

struct serve_like {
    CLI::App app{"test"};
    int ctx = 8192;
    std::string model;
    bool no_mmap = false;
    std::vector<std::string> aliases;
    serve_like() {
        app.add_option("-c,--ctx-size", ctx)->check(CLI::Range(1, 1 << 20));
        app.add_option("-m,--model", model);
        app.add_flag("--no-mmap", no_mmap);
        app.add_option("-a,--alias", aliases)->delimiter(',');
        // As serve refuses it (llama-server-flags.cpp add_refused): a value, optional, that stops start-up.
        app.add_option_function<std::string>("--hf-repo",
                                             [](const std::string&) { throw CLI::ParseError("--hf-repo: refused", 2); })
            ->expected(0, 1);
    }
    void parse(std::vector<std::string> args) {
        std::reverse(args.begin(), args.end());
        app.parse(args);
    }
};

const std::vector<environment_binding> bindings = {
    {"--model", "LLAMA_ARG_MODEL"},     {"--ctx-size", "LLAMA_ARG_CTX_SIZE"}, {"--no-mmap", "LLAMA_ARG_MMAP", true},
    {"--no-mmap", "LLAMA_ARG_NO_MMAP"}, {"--alias", "LLAMA_ARG_ALIAS"},       {"--hf-repo", "LLAMA_ARG_HF_REPO"},
};

}  // namespace

TEST(environment_options, variables_set_the_options_the_command_line_left_alone) {
    serve_like s;
    s.parse({"-c", "2048"});
    const auto applied = apply_environment(
        s.app, bindings,
        {{"LLAMA_ARG_MODEL", "m.gguf"}, {"LLAMA_ARG_CTX_SIZE", "4096"}, {"LLAMA_ARG_ALIAS", "a,b"}, {"HOME", "/x"}});
    EXPECT_EQ(s.ctx, 2048) << "the command line wins";
    EXPECT_EQ(s.model, "m.gguf");
    EXPECT_EQ(s.aliases, (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ(applied, (std::vector<std::string>{"LLAMA_ARG_MODEL", "LLAMA_ARG_ALIAS"}));
    EXPECT_EQ(s.app.get_option("--model")->count(), 1u) << "counts as given: a settings file does not override it";
}

TEST(environment_options, a_flag_follows_llama_cpp_true_and_false_words) {
    serve_like off;
    off.parse({});
    apply_environment(off.app, bindings, {{"LLAMA_ARG_MMAP", "false"}});
    EXPECT_TRUE(off.no_mmap);
    serve_like on;
    on.parse({});
    apply_environment(on.app, bindings, {{"LLAMA_ARG_MMAP", "1"}});
    EXPECT_FALSE(on.no_mmap);
    serve_like negative;
    negative.parse({});
    apply_environment(negative.app, bindings, {{"LLAMA_ARG_NO_MMAP", "on"}});
    EXPECT_TRUE(negative.no_mmap);
    serve_like bad;
    bad.parse({});
    EXPECT_THROW(apply_environment(bad.app, bindings, {{"LLAMA_ARG_MMAP", "maybe"}}), CLI::ValidationError);
}

TEST(environment_options, a_mistake_or_a_refusal_names_the_variable_and_keeps_its_exit_status) {
    serve_like s;
    s.parse({});
    try {
        apply_environment(s.app, bindings, {{"LLAMA_ARG_CTX_SIZE", "0"}});
        FAIL() << "0 is out of range";
    } catch (const CLI::ParseError& e) {
        EXPECT_EQ(std::string(e.what()).rfind("LLAMA_ARG_CTX_SIZE (environment): ", 0), 0u) << e.what();
    }
    serve_like r;
    r.parse({});
    try {
        apply_environment(r.app, bindings, {{"LLAMA_ARG_HF_REPO", "a/b"}});
        FAIL() << "refused";
    } catch (const CLI::ParseError& e) {
        EXPECT_EQ(e.get_exit_code(), 2);
        EXPECT_EQ(std::string(e.what()), "LLAMA_ARG_HF_REPO (environment): --hf-repo: refused");
    }
    EXPECT_EQ(unread_variables(bindings, {{"LLAMA_ARG_SPLIT_MODE", "row"}, {"LLAMA_ARG_MODEL", "m"}}, "LLAMA_ARG_"),
              (std::vector<std::string>{"LLAMA_ARG_SPLIT_MODE"}));
}

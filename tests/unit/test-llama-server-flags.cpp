// llama-server's command line on `keepwarm serve`: its multi-letter single-dash flags become long options (never a
// cluster of one-letter ones: "-hf" is not "-h -f"), flags true of keepwarm anyway parse, and the ones it cannot
// honour fail with exit status 2 and a message saying what to do instead.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "commands/llama-server-flags.h"

using keepwarm::add_llama_server_flags;
using keepwarm::expand_llama_server_flags;
using keepwarm::refused_flag_exit_code;
using args = std::vector<std::string>;

namespace {

// The ParseError's exit code and message for `argv` parsed by a serve command with the llama-server flags (0, "":
// it parsed).
std::pair<int, std::string> parse(args argv) {
    CLI::App app;
    CLI::App* serve = app.add_subcommand("serve");
    std::string model;
    serve->add_option("-m", model);
    add_llama_server_flags(*serve);
    try {
        argv = expand_llama_server_flags(argv);
        argv.insert(argv.begin(), "serve");
        std::reverse(argv.begin(), argv.end());
        app.parse(argv);
    } catch (const CLI::ParseError& e) {
        return {e.get_exit_code(), e.what()};
    }
    return {0, ""};
}

TEST(llama_server_flags, single_dash_words_become_long_options) {
    EXPECT_EQ(
        expand_llama_server_flags({"serve", "-ngl", "99", "-fa", "on", "-np", "2", "-m", "x.gguf", "-c", "8"}),
        (args{"serve", "--gpu-layers", "99", "--flash-attn", "on", "--parallel", "2", "-m", "x.gguf", "-c", "8"}));
    EXPECT_EQ(expand_llama_server_flags({"-hf", "a/b", "-hfr", "a/b", "-mu", "u", "-to", "5", "-cb", "-nocb"}),
              (args{"--hf-repo", "a/b", "--hf-repo", "a/b", "--model-url", "u", "--timeout", "5", "--cont-batching",
                    "--no-cont-batching"}));
    // Numbers, one-letter flags, long options, paths and what follows "--" are left alone.
    EXPECT_EQ(expand_llama_server_flags({"-n", "-1", "-v", "--alias", "x", "-", "-m./a", "--", "-sm"}),
              (args{"-n", "-1", "-v", "--alias", "x", "-", "-m./a", "--", "-sm"}));
}

TEST(llama_server_flags, an_unknown_single_dash_word_is_refused_not_split_into_letters) {
    for (const std::string flag : {"-sm", "-ot", "-hfx", "-ctxcp", "-kvu"}) {
        try {
            expand_llama_server_flags({"serve", flag, "x"});
            ADD_FAILURE() << flag << " was accepted";
        } catch (const CLI::ParseError& e) {
            EXPECT_EQ(e.get_exit_code(), refused_flag_exit_code);
            EXPECT_NE(std::string(e.what()).find("'" + flag + "' is not an option of keepwarm"), std::string::npos)
                << e.what();
        }
    }
}

TEST(llama_server_flags, downloads_are_refused_with_what_to_do_instead) {
    for (const args& argv :
         {args{"-hf", "Qwen/Qwen3-8B-GGUF"}, args{"-hf"}, args{"--hf-repo", "a/b", "-m", "x"}, args{"-hff", "f.gguf"},
          args{"-hft", "t"}, args{"-mu", "https://x/m.gguf"}, args{"-dr", "ai/x"}}) {
        const auto [code, message] = parse(argv);
        EXPECT_EQ(code, refused_flag_exit_code) << argv[0];
        EXPECT_NE(message.find("keepwarm does not download models"), std::string::npos) << message;
        EXPECT_NE(message.find("pass it with -m FILE"), std::string::npos) << message;
    }
}

TEST(llama_server_flags, flags_without_a_counterpart_are_refused_naming_what_keepwarm_has) {
    EXPECT_EQ(parse({"--timeout", "600"}).first, refused_flag_exit_code);
    EXPECT_NE(parse({"-to", "600"}).second.find("--idle-timeout"), std::string::npos);
    EXPECT_NE(parse({"--threads-http", "4"}).second.find("--max-connections"), std::string::npos);
    EXPECT_EQ(parse({"--no-jinja"}).first, refused_flag_exit_code);
    EXPECT_EQ(parse({"-nocb"}).first, refused_flag_exit_code);
    EXPECT_EQ(parse({"--reasoning-format", "none"}).first, refused_flag_exit_code);
    EXPECT_EQ(parse({"--reasoning-format", "deepseek-legacy"}).first, refused_flag_exit_code);
    EXPECT_NE(parse({"--reasoning-format", "bogus"}).first, 0);
}

TEST(llama_server_flags, flags_true_of_keepwarm_anyway_are_accepted) {
    EXPECT_EQ(parse({"--jinja", "-cb", "--cont-batching", "--no-webui", "--metrics", "--slots", "--no-slots",
                     "--reasoning-format", "deepseek", "-m", "x"}),
              (std::pair<int, std::string>{0, ""}));
    EXPECT_EQ(parse({"--reasoning-format", "auto"}).first, 0);
}

TEST(llama_server_flags, the_help_shows_the_accepted_flags_and_hides_the_refused_ones) {
    CLI::App serve;
    add_llama_server_flags(serve);
    const std::string help = serve.help();
    EXPECT_NE(help.find("--jinja"), std::string::npos);
    EXPECT_NE(help.find("--cont-batching"), std::string::npos);
    EXPECT_EQ(help.find("--hf-repo"), std::string::npos);
    EXPECT_EQ(help.find("--timeout"), std::string::npos);
}

}  // namespace

// The command line's help for people: serve --help in its groups and order, with llama-server's single-dash names,
// and "did you mean" for a mistyped command or option.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "commands/command-line-help.h"

using namespace keepwarm;

TEST(command_line_help, edit_distance_counts_a_swap_of_neighbours_as_one) {
    EXPECT_EQ(edit_distance("serve", "serve"), 0u);
    EXPECT_EQ(edit_distance("sever", "serve"), 2u);
    EXPECT_EQ(edit_distance("serev", "serve"), 1u);
    EXPECT_EQ(edit_distance("", "abc"), 3u);
    EXPECT_EQ(edit_distance("--ctx-sise", "--ctx-size"), 1u);
}

TEST(command_line_help, the_nearest_name_is_offered_only_when_it_could_be_a_typo) {
    const std::vector<std::string> commands = {"serve", "proxy", "mkmodel", "inspect", "bench", "doctor"};
    EXPECT_EQ(nearest_name("sever", commands), "serve");
    EXPECT_EQ(nearest_name("proxi", commands), "proxy");
    EXPECT_EQ(nearest_name("mkmodle", commands), "mkmodel");
    EXPECT_EQ(nearest_name("launch", commands), std::nullopt);
    EXPECT_EQ(nearest_name("x", commands), std::nullopt);
    EXPECT_EQ(nearest_name(std::string(10000, 's'), commands), std::nullopt);
}

namespace {

struct app_with_serve {
    CLI::App app{"test"};
    CLI::App* serve = app.add_subcommand("serve", "Serve");
    int ctx = 0;
    int parallel = 0;
    std::string host;
    app_with_serve() {
        app.name("keepwarm");
        app.add_subcommand("proxy", "Proxy");
        serve->add_option("-c,--ctx-size", ctx, "Context");
        serve->add_option("--parallel", parallel, "Slots");
        serve->add_option("--host", host, "Host");
    }
};

}  // namespace

TEST(command_line_help, an_unknown_command_or_option_is_named_with_the_nearest) {
    app_with_serve a;
    EXPECT_EQ(unknown_word_message(a.app, {"sever", "-c", "5"}),
              "keepwarm: 'sever' is not a command; did you mean 'serve'?");
    EXPECT_EQ(unknown_word_message(a.app, {"launch"}),
              "keepwarm: 'launch' is not a command (`keepwarm --help` lists the commands)");
    EXPECT_EQ(unknown_word_message(a.app, {"serve", "--ctx-sise", "5"}),
              "keepwarm serve: unknown option '--ctx-sise'; did you mean '--ctx-size'?");
    EXPECT_EQ(unknown_word_message(a.app, {"serve", "--paralel=2"}),
              "keepwarm serve: unknown option '--paralel'; did you mean '--parallel'?");
    EXPECT_EQ(unknown_word_message(a.app, {"serve", "--frobnicate"}),
              "keepwarm serve: unknown option '--frobnicate' (`keepwarm serve --help` lists the options)");
    EXPECT_EQ(unknown_word_message(a.app, {"serve", "--host", "sever", "-c", "5"}), std::nullopt);
    EXPECT_EQ(unknown_word_message(a.app, {"serve", "--", "--ctx-sise"}), std::nullopt);
}

TEST(command_line_help, help_lists_the_groups_in_their_order_with_llama_server_names) {
    app_with_serve a;
    group_help(*a.serve, {{"Network", {"--host"}}, {"Context & slots", {"--ctx-size", "--parallel"}}});
    const std::string help = a.serve->help();
    const size_t network = help.find("Network:");
    const size_t context = help.find("Context & slots:");
    ASSERT_NE(network, std::string::npos) << help;
    ASSERT_NE(context, std::string::npos) << help;
    EXPECT_LT(network, context) << "the order given, not the options' order";
    EXPECT_NE(help.find("-np,--parallel"), std::string::npos) << help;
    EXPECT_THROW(group_help(*a.serve, {{"Model", {"--no-such-option"}}}), std::logic_error);
}

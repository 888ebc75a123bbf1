// What the command line says to a person beyond CLI11's own: `serve --help` in named groups in a set order, each
// option shown with llama-server's single-dash name where it has one (-np, -ngl, -fa, ...), and a "did you mean"
// for a mistyped command or long option.
// Threading: used while the command line is parsed, on the main thread.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace keepwarm {

// The help groups of a command, in the order the help lists them, each with its options' long names ("--ctx-size").
using help_groups = std::vector<std::pair<std::string, std::vector<std::string>>>;

// Puts each named option of `cmd` into its group and makes `cmd`'s help list the groups in that order (groups not
// named, such as CLI11's own "Options" with --help, come first). Throws std::logic_error for a name `cmd` lacks.
void group_help(CLI::App& cmd, const help_groups& groups);

// The edit distance (insertions, deletions, substitutions and swaps of two neighbours) between a and b.
size_t edit_distance(std::string_view a, std::string_view b);

// The name of `names` nearest to `typed`, if one is near enough to be a typo of it.
std::optional<std::string> nearest_name(std::string_view typed, const std::vector<std::string>& names);

// For a command line `app` refused: a message naming a command or long option that does not exist, with the nearest
// one if there is ("keepwarm: 'sever' is not a command; did you mean 'serve'?"). nullopt: no such word in `args`
// (the arguments after the program name, as parsed).
std::optional<std::string> unknown_word_message(CLI::App& app, const std::vector<std::string>& args);

}  // namespace keepwarm

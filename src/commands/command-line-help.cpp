// See command-line-help.h.
#include "commands/command-line-help.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "commands/llama-server-flags.h"

namespace keepwarm {

namespace {

// CLI11's formatter, with the groups in a set order and llama-server's single-dash names beside keepwarm's.
class grouped_formatter : public CLI::Formatter {
public:
    explicit grouped_formatter(std::vector<std::string> order) : order_(std::move(order)) {}

    std::string make_help(const CLI::App* app, std::string name, CLI::AppFormatMode mode) const override {
        if (mode == CLI::AppFormatMode::Sub) return make_expanded(app);
        std::stringstream out;
        if (!app->get_display_name().empty() || !app->get_group().empty() || !app->get_description().empty()) {
            out << make_description(app);
        }
        out << make_usage(app, name);
        out << make_positionals(app);
        std::vector<std::string> groups;
        for (const std::string& g : app->get_groups()) {
            if (std::find(order_.begin(), order_.end(), g) == order_.end()) groups.push_back(g);
        }
        groups.insert(groups.end(), order_.begin(), order_.end());
        for (const std::string& group : groups) {
            const std::vector<const CLI::Option*> opts = app->get_options(
                [&group](const CLI::Option* opt) { return opt->get_group() == group && opt->nonpositional(); });
            if (!group.empty() && !opts.empty()) out << make_group(group, false, opts) << "\n";
        }
        out << make_subcommands(app, mode);
        out << '\n' << make_footer(app);
        return out.str();
    }

    std::string make_option_name(const CLI::Option* opt, bool is_positional) const override {
        std::string name = CLI::Formatter::make_option_name(opt, is_positional);
        if (is_positional) return name;
        std::string aliases;
        for (const std::string& lname : opt->get_lnames()) {
            for (const std::string& alias : llama_server_single_dash_names("--" + lname)) aliases += alias + ",";
        }
        return aliases + name;
    }

private:
    std::vector<std::string> order_;
};

}  // namespace

void group_help(CLI::App& cmd, const help_groups& groups) {
    std::vector<std::string> order;
    for (const auto& [group, names] : groups) {
        order.push_back(group);
        for (const std::string& name : names) {
            CLI::Option* opt = nullptr;
            for (CLI::Option* o : cmd.get_options()) {
                if (o->check_lname(name.substr(2))) opt = o;
            }
            if (opt == nullptr) throw std::logic_error("help group " + group + ": no option " + name);
            opt->group(group);
        }
    }
    cmd.formatter(std::make_shared<grouped_formatter>(std::move(order)));
}

size_t edit_distance(std::string_view a, std::string_view b) {
    // Optimal string alignment: Levenshtein with a swap of two neighbours counted as one edit.
    std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
    for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
    for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
        for (size_t j = 1; j <= b.size(); ++j) {
            const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
            d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
                d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
            }
        }
    }
    return d[a.size()][b.size()];
}

std::optional<std::string> nearest_name(std::string_view typed, const std::vector<std::string>& names) {
    if (typed.size() > 256) return std::nullopt;  // hostile input: no quadratic work on it
    std::optional<std::string> best;
    size_t best_distance = 0;
    for (const std::string& name : names) {
        const size_t d = edit_distance(typed, name);
        if (!best || d < best_distance) {
            best = name;
            best_distance = d;
        }
    }
    // A typo: at most 2 edits, or a third of a longer name's letters.
    const size_t allowed = std::max<size_t>(2, typed.size() / 3);
    if (!best || best_distance > allowed || best_distance >= typed.size()) return std::nullopt;
    return best;
}

std::optional<std::string> unknown_word_message(CLI::App& app, const std::vector<std::string>& args) {
    CLI::App* current = &app;
    std::string command = app.get_name().empty() ? "keepwarm" : app.get_name();
    for (const std::string& arg : args) {
        if (arg == "--") break;
        if (arg.starts_with("--")) {
            const std::string name = arg.substr(0, arg.find('='));
            if (current->get_option_no_throw(name) != nullptr || name == "--help" || name == "--version") continue;
            std::vector<std::string> known;
            for (const CLI::Option* opt : current->get_options()) {
                for (const std::string& lname : opt->get_lnames()) {
                    if (!opt->get_group().empty()) known.push_back("--" + lname);  // hidden options are not offered
                }
            }
            const std::optional<std::string> near = nearest_name(name, known);
            return command + ": unknown option '" + name + "'" +
                   (near ? "; did you mean '" + *near + "'?" : " (`" + command + " --help` lists the options)");
        }
        if (arg.starts_with("-")) continue;
        CLI::App* sub = nullptr;
        for (CLI::App* candidate : current->get_subcommands([](CLI::App*) { return true; })) {
            if (candidate->check_name(arg)) sub = candidate;
        }
        if (sub != nullptr) {
            current = sub;
            command += " " + arg;
            continue;
        }
        if (current == &app) {  // the first word must be a command
            std::vector<std::string> commands;
            for (const CLI::App* sub : app.get_subcommands({})) commands.push_back(sub->get_name());
            const std::optional<std::string> near = nearest_name(arg, commands);
            return command + ": '" + arg + "' is not a command" +
                   (near ? "; did you mean '" + *near + "'?" : " (`" + command + " --help` lists the commands)");
        }
    }
    return std::nullopt;
}

}  // namespace keepwarm

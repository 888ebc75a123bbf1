// See options-file.h. Each value is handed to the CLI11 option as the strings the command line would have given, and
// the option's callback runs its checks and transforms, so the file and the command line cannot disagree on meaning.
#include "commands/options-file.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "base/logger.h"
#include "config/config-error.h"
#include "config/key-file-mode.h"
#include "config/settings-file.h"

namespace keepwarm {

namespace {

CLI::Option* find_long_option(CLI::App& cmd, const std::string& name) {
    for (CLI::Option* opt : cmd.get_options()) {
        if (opt->check_lname(name)) return opt;
    }
    return nullptr;
}

// Given on the command line (or in its environment variable), or shut out by an option that was.
bool set_elsewhere(const CLI::Option& opt) {
    if (opt.count() > 0) return true;
    const std::set<CLI::Option*> excluders = opt.get_excludes();
    return std::any_of(excluders.begin(), excluders.end(), [](const CLI::Option* o) { return o->count() > 0; });
}

class options_reader : public config::toml_reader {
public:
    options_reader(std::string source, std::filesystem::path base_dir, const options_file_rules& rules)
        : toml_reader(std::move(source)), base_dir_(std::move(base_dir)), rules_(rules) {}

    // Returns whether the file sets one of rules.key_settings.
    bool apply(CLI::App& cmd, const toml::table& root) const {
        bool holds_keys = false;
        for (auto&& [key, node] : root) {
            std::string name(key.str());
            std::replace(name.begin(), name.end(), '_', '-');
            holds_keys = holds_keys || rules_.key_settings.count(name) > 0;
            if (const auto it = rules_.tables.find(name); it != rules_.tables.end()) {
                it->second(table(node, name), *this);
                continue;
            }
            if (rules_.not_in_file.count(name)) fail(key.source(), "'" + name + "' cannot be set in this file");
            CLI::Option* opt = find_long_option(cmd, name);
            if (opt == nullptr) {
                fail(key.source(), "unknown setting '" + std::string(key.str()) +
                                       "': the settings are the long options of `keepwarm " + cmd.get_name() +
                                       " --help` without their dashes");
            }
            if (set_elsewhere(*opt)) continue;  // the command line wins
            const std::vector<std::string> values = values_of(*opt, name, node);
            try {
                opt->clear();
                opt->add_result(values);
                opt->run_callback();
            } catch (const CLI::Error& e) {
                fail(node.source(), "'" + name + "': " + e.what());
            }
        }
        return holds_keys;
    }

private:
    std::vector<std::string> values_of(const CLI::Option& opt, const std::string& name, const toml::node& node) const {
        const bool is_flag = opt.get_expected_max() == 0;  // takes no value on the command line
        if (is_flag) {
            return {opt.get_flag_value(name, boolean(node, name) ? "true" : "false")};
        }
        if (const toml::array* items = node.as_array()) {
            std::vector<std::string> values;
            for (const toml::node& item : *items) values.push_back(scalar(opt, name, item));
            return values;
        }
        return {scalar(opt, name, node)};
    }

    std::string scalar(const CLI::Option& opt, const std::string& name, const toml::node& node) const {
        if (const auto* s = node.as_string()) {
            std::string value = s->get();
            if (!value.empty() && rules_.path_options.count(name) && std::filesystem::path(value).is_relative()) {
                value = (base_dir_ / value).lexically_normal().string();
            }
            return value;
        }
        return option_text(
            node, name,
            opt.get_expected_max() > 1 ? "a value or an array of values" : "a string, a number or a boolean");
    }

    std::filesystem::path base_dir_;
    const options_file_rules& rules_;
};

}  // namespace

bool apply_options_text(CLI::App& cmd, std::string_view text, const std::string& source_name,
                        const std::string& base_dir, const options_file_rules& rules) {
    return options_reader(source_name, base_dir, rules).apply(cmd, config::parse_toml(text, source_name));
}

void apply_options_file(CLI::App& cmd, const std::string& path, const options_file_rules& rules) {
    const config::settings_file file = config::read_settings_file(path);
    if (!options_reader(file.path, file.base_dir, rules).apply(cmd, file.root)) return;
    if (const std::string warning = config::readable_by_others_warning(path, "settings file"); !warning.empty()) {
        log::warn(cmd.get_name(), "{}", warning);
    }
}

}  // namespace keepwarm

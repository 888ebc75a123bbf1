// See environment-options.h. A value goes to its option as the command line's would: add_result, then the option's
// callback, which runs its checks and transforms.
#include "commands/environment-options.h"

#include <set>

extern char** environ;

namespace keepwarm {

namespace {

bool truthy(const std::string& v) {
    return v == "on" || v == "enabled" || v == "true" || v == "1";
}
bool falsey(const std::string& v) {
    return v == "off" || v == "disabled" || v == "false" || v == "0";
}

CLI::Option* find_long_option(CLI::App& cmd, const std::string& long_name) {
    const std::string name = long_name.substr(long_name.find_first_not_of('-'));
    for (CLI::Option* opt : cmd.get_options()) {
        if (opt->check_lname(name)) return opt;
    }
    return nullptr;
}

}  // namespace

environment process_environment() {
    environment env;
    for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
        const std::string text = *entry;
        const size_t equals = text.find('=');
        if (equals != std::string::npos) env.emplace(text.substr(0, equals), text.substr(equals + 1));
    }
    return env;
}

std::vector<std::string> apply_environment(CLI::App& cmd, const std::vector<environment_binding>& bindings,
                                           const environment& env) {
    std::vector<std::string> applied;
    for (const environment_binding& b : bindings) {
        const auto it = env.find(b.variable);
        if (it == env.end()) continue;
        CLI::Option* opt = find_long_option(cmd, b.option);
        if (opt == nullptr || opt->count() > 0) continue;  // not this command's, or the command line's
        const std::string& value = it->second;
        const std::string where = b.variable + " (environment): ";
        std::vector<std::string> values;
        if (opt->get_expected_max() == 0) {  // a flag
            if (!truthy(value) && !falsey(value)) {
                throw CLI::ValidationError(where + "expected on, enabled, true or 1, or off, disabled, false or 0");
            }
            if (truthy(value) == b.inverted) continue;
            values = {opt->get_flag_value(b.option.substr(2), "true")};
        } else {
            values = {value};
        }
        try {
            opt->clear();
            opt->add_result(values);
            opt->run_callback();
        } catch (const CLI::ParseError& e) {
            throw CLI::ParseError(where + e.what(), e.get_exit_code());
        }
        applied.push_back(b.variable);
    }
    return applied;
}

std::vector<std::string> unread_variables(const std::vector<environment_binding>& bindings, const environment& env,
                                          const std::string& prefix) {
    std::set<std::string> known;
    for (const environment_binding& b : bindings) known.insert(b.variable);
    std::vector<std::string> unread;
    for (const auto& [name, value] : env) {
        if (name.starts_with(prefix) && !known.count(name)) unread.push_back(name);
    }
    return unread;
}

}  // namespace keepwarm

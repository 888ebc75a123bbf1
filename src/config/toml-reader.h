// What the settings files (the policy file, the proxy's --config file) share: parsing TOML into a table, and typed
// reads of its nodes whose every error names the file, line and column ("policy.toml:12:5: 'ping.reply' must be a
// string, not an integer"), thrown as config_file_error.
#pragma once

#include <toml++/toml.h>

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "config/config-error.h"

namespace keepwarm::config {

// Parses `text`; a syntax error becomes a config_file_error naming `source_name`, line and column.
toml::table parse_toml(std::string_view text, const std::string& source_name);
// The whole file, as text. Throws std::runtime_error naming `what` ("policy file") and the path if unreadable.
std::string read_text_file(const std::string& path, const std::string& what);

// A settings file's reader derives from this: `what` in each call names the setting in messages.
class toml_reader {
public:
    explicit toml_reader(std::string source) : source_(std::move(source)) {}

    const std::string& source() const { return source_; }

    [[noreturn]] void fail(const toml::source_region& where, const std::string& message) const;
    // "unknown key 'x' in [where] (known: a, b)".
    template <typename Keys>
    [[noreturn]] void unknown(const toml::key& key, std::string_view where, const Keys& known) const {
        std::string list;
        for (const auto& k : known) list += (list.empty() ? "" : ", ") + std::string(k);
        fail(key.source(),
             "unknown key '" + std::string(key.str()) + "' in " + std::string(where) + " (known: " + list + ")");
    }
    [[noreturn]] void unknown(const toml::key& key, std::string_view where,
                              std::initializer_list<std::string_view> known) const {
        unknown<std::initializer_list<std::string_view>>(key, where, known);
    }
    // "'what' must be <expected>, not <the node's type>".
    [[noreturn]] void wrong_type(const toml::node& n, const std::string& what, const std::string& expected) const;

    const toml::table& table(const toml::node& n, const std::string& what) const;
    const toml::array& array(const toml::node& n, const std::string& what) const;
    const toml::array& array_of_tables(const toml::node& n, const std::string& what) const;  // [[what]]
    std::string string(const toml::node& n, const std::string& what) const;
    bool boolean(const toml::node& n, const std::string& what) const;
    int64_t integer(const toml::node& n, const std::string& what, int64_t lo, int64_t hi) const;
    double number(const toml::node& n, const std::string& what) const;  // an integer or a float
    // A scalar as a command line would give it, for a key that is a command-line option: a string as it is, a number
    // in its shortest form, a boolean as true/false; anything else fails as not `expected`.
    std::string option_text(const toml::node& n, const std::string& what,
                            const std::string& expected = "a string, a number or a boolean") const;
    // A positive number of seconds, at most `max_s`, as milliseconds (at least 1).
    std::chrono::milliseconds seconds(const toml::node& n, const std::string& what, double max_s) const;

private:
    std::string source_;
};

}  // namespace keepwarm::config

// See toml-reader.h.
#include "config/toml-reader.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>

namespace keepwarm::config {

namespace {

const char* type_name(const toml::node& n) {
    switch (n.type()) {
        case toml::node_type::table:
            return "a table";
        case toml::node_type::array:
            return "an array";
        case toml::node_type::string:
            return "a string";
        case toml::node_type::integer:
            return "an integer";
        case toml::node_type::floating_point:
            return "a number";
        case toml::node_type::boolean:
            return "a boolean";
        default:
            return "a date or time";
    }
}

[[noreturn]] void throw_at(const std::string& source, const toml::source_position& where, const std::string& message) {
    const int line = static_cast<int>(where.line), column = static_cast<int>(where.column);
    throw config_file_error(source + ":" + std::to_string(line) + ":" + std::to_string(column) + ": " + message, line,
                            column);
}

}  // namespace

toml::table parse_toml(std::string_view text, const std::string& source_name) {
    try {
        return toml::parse(text, source_name);
    } catch (const toml::parse_error& e) {
        throw_at(source_name, e.source().begin, std::string(e.description()));
    }
}

std::string read_text_file(const std::string& path, const std::string& what) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read the " + what + " '" + path + "'");
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
}

void toml_reader::fail(const toml::source_region& where, const std::string& message) const {
    throw_at(source_, where.begin, message);
}

void toml_reader::wrong_type(const toml::node& n, const std::string& what, const std::string& expected) const {
    fail(n.source(), "'" + what + "' must be " + expected + ", not " + type_name(n));
}

const toml::table& toml_reader::table(const toml::node& n, const std::string& what) const {
    if (!n.is_table()) wrong_type(n, what, "a table");
    return *n.as_table();
}

const toml::array& toml_reader::array(const toml::node& n, const std::string& what) const {
    if (!n.is_array()) wrong_type(n, what, "an array");
    return *n.as_array();
}

const toml::array& toml_reader::array_of_tables(const toml::node& n, const std::string& what) const {
    if (!n.is_array()) wrong_type(n, what, "an array of tables ([[" + what + "]])");
    return *n.as_array();
}

std::string toml_reader::string(const toml::node& n, const std::string& what) const {
    if (!n.is_string()) wrong_type(n, what, "a string");
    return n.as_string()->get();
}

bool toml_reader::boolean(const toml::node& n, const std::string& what) const {
    if (!n.is_boolean()) wrong_type(n, what, "true or false");
    return n.as_boolean()->get();
}

int64_t toml_reader::integer(const toml::node& n, const std::string& what, int64_t lo, int64_t hi) const {
    if (!n.is_integer()) wrong_type(n, what, "an integer");
    const int64_t v = n.as_integer()->get();
    if (v < lo || v > hi) {
        fail(n.source(), "'" + what + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi));
    }
    return v;
}

double toml_reader::number(const toml::node& n, const std::string& what) const {
    if (n.is_integer()) return static_cast<double>(n.as_integer()->get());
    if (!n.is_floating_point()) wrong_type(n, what, "a number");
    return n.as_floating_point()->get();
}

std::chrono::milliseconds toml_reader::seconds(const toml::node& n, const std::string& what, double max_s) const {
    if (!n.is_integer() && !n.is_floating_point()) wrong_type(n, what, "a number of seconds");
    const double v = number(n, what);
    if (!std::isfinite(v) || v <= 0 || v > max_s) {
        fail(n.source(), "'" + what + "' must be between 0 and " + std::to_string(static_cast<int>(max_s)) + " s");
    }
    return std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(v * 1000)));
}

std::string toml_reader::option_text(const toml::node& n, const std::string& what, const std::string& expected) const {
    if (const auto* s = n.as_string()) return s->get();
    if (const auto* i = n.as_integer()) return std::to_string(i->get());
    if (const auto* f = n.as_floating_point()) {
        char buf[64];
        const auto end = std::to_chars(buf, buf + sizeof buf, f->get()).ptr;
        return std::string(buf, end);
    }
    if (const auto* b = n.as_boolean()) return b->get() ? "true" : "false";
    wrong_type(n, what, expected);
}

}  // namespace keepwarm::config

// See json-fields.h.
#include "json/json-fields.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/request-error.h"

namespace keepwarm::json_fields {

void fail(const std::string& message) {
    throw request_error(400, message);
}

std::string in_quotes(const std::string& field) {
    return "'" + field + "'";
}

std::string indexed(const std::string& field, size_t i) {
    return field + "[" + std::to_string(i) + "]";
}

const json* find(const json& obj, const std::string& key) {
    auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
}

std::optional<bool> get_bool(const json& obj, const std::string& key, const std::string& field) {
    const json* v = find(obj, key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) fail(in_quotes(field) + " must be a boolean");
    return v->get<bool>();
}

std::optional<std::string> get_string(const json& obj, const std::string& key, const std::string& field) {
    const json* v = find(obj, key);
    if (!v) return std::nullopt;
    if (!v->is_string()) fail(in_quotes(field) + " must be a string");
    return v->get<std::string>();
}

std::optional<int64_t> get_integer(const json& obj, const std::string& key, const std::string& field) {
    const json* v = find(obj, key);
    if (!v) return std::nullopt;
    if (v->is_number_unsigned()) {
        return static_cast<int64_t>(
            std::min<uint64_t>(v->get<uint64_t>(), static_cast<uint64_t>(std::numeric_limits<int64_t>::max())));
    }
    if (v->is_number_integer()) return v->get<int64_t>();
    if (v->is_number_float()) {
        const double d = v->get<double>();
        if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e18) return static_cast<int64_t>(d);
    }
    fail(in_quotes(field) + " must be an integer");
}

}  // namespace keepwarm::json_fields

// Reading typed fields out of a client's JSON body, for the three APIs' parsers: a missing or null field is "not
// given", a field of the wrong type is a 400 that names it ("'messages[2].content' must be a string").
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace keepwarm::json_fields {

using json = nlohmann::ordered_json;

// Throws request_error 400 with `message`.
[[noreturn]] void fail(const std::string& message);
std::string in_quotes(const std::string& field);          // 'field'
std::string indexed(const std::string& field, size_t i);  // field[i]

// The value under `key`, or null when it is missing or JSON null (clients send null to ask for the default).
const json* find(const json& obj, const std::string& key);
// `field` names the value in the error ("'stream' must be a boolean").
std::optional<bool> get_bool(const json& obj, const std::string& key, const std::string& field);
std::optional<std::string> get_string(const json& obj, const std::string& key, const std::string& field);
// JSON integers, and floats with an integral value (some clients write 256 as 256.0; Go clients every number as a
// float64). Unsigned values above int64's range are clamped to its maximum.
std::optional<int64_t> get_integer(const json& obj, const std::string& key, const std::string& field);

}  // namespace keepwarm::json_fields

// Parsing and checking JSON that a client (or an upstream) sent, with its cost bounded before anything expensive
// runs: nesting depth is capped at parse time (dump(), copies and template rendering recurse once per level), objects
// parse in linear time whatever their key count, and JSON schemas are checked before they become grammars.
// Thread-safe: no state outside the call.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace keepwarm::bounded_json {

using json = nlohmann::ordered_json;

// Deepest nesting accepted anywhere: Claude Code's real requests (tests/fixtures/claude-code) nest 12 levels and
// serde_json's default is 128; a thread's stack holds thousands of dump() frames, so 128 is far from the edge.
inline constexpr int max_depth = 128;

// Keys per object in JSON that llama.cpp parses again (tool schemas and arguments, chat_template_kwargs, response
// schemas): its parser looks every key up in the object built so far, so n keys cost n^2/2 comparisons. Claude
// Code's largest object has 20 keys.
inline constexpr size_t max_forwarded_object_keys = 1024;

// A JSON text too deep, malformed, or beyond one of the limits below. what() says which, without a field name: the
// caller names the field ("'tools[0].input_schema' nests deeper than 64 levels").
struct limit_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};
// The text is JSON but nests deeper than the limit ("nests deeper than 128 levels").
struct depth_error : limit_error {
    using limit_error::limit_error;
};

// Parses `text` into ordered_json in time linear in its size: simdjson parses, and anything it refuses (not JSON, a
// number beyond 64 bits) goes through nlohmann's parser, so the value and the error are nlohmann's (the one
// difference: "-0" is an unsigned 0, as "0"). Keys keep the order they came in; a key given twice
// keeps its first position and its last value (what nlohmann's own parser does). Throws limit_error when the text
// is not JSON (nlohmann's message: "parse error at line 1, column 12: ..."), depth_error when it nests deeper than
// `depth_limit` containers.
json parse(std::string_view text, int depth_limit = max_depth);
// The same, nullopt instead of throwing.
std::optional<json> try_parse(std::string_view text, int depth_limit = max_depth);

struct shape_limits {
    int depth = max_depth;                           // containers inside each other
    size_t object_keys = max_forwarded_object_keys;  // keys in any one object
    size_t values = static_cast<size_t>(-1);         // values of any kind, containers included
};

// Checks a value already parsed, without recursion, and returns how many values it holds (containers included).
// Throws limit_error naming the limit it broke.
size_t check_shape(const json& value, const shape_limits& limits = {});

// What a JSON schema may be before it is converted to a grammar, dumped or rendered into a prompt. Claude Code's
// schemas have a few hundred values and nest under 10 levels.
inline constexpr shape_limits schema_shape{64, max_forwarded_object_keys, 50'000};
// How deep a schema may nest once its "$ref"s are followed (the grammar converter recurses through them), and how
// many values following them may visit in all (a ref used in many places is expanded once per use).
inline constexpr int max_schema_expanded_depth = 128;
inline constexpr size_t max_schema_expanded_values = 250'000;
inline constexpr size_t max_schema_refs = 256;
// The converter copies the whole schema once per distinct "$ref" (then keeps the part it names): distinct refs times
// the schema's values is bounded too, so a big schema may use fewer refs.
inline constexpr size_t max_schema_ref_copies = 2'000'000;

// check_shape(schema_shape), then follows every local "$ref" ("#/$defs/x") the way llama.cpp's grammar converter
// does, a ref inside its own expansion counting as a cycle that is not followed again, and bounds the depth and work
// that takes. Throws limit_error.
void check_schema(const json& schema);

// The checks above for a field of a client's request: request_error 400 naming the field ("'tools[0].input_schema'
// nests deeper than 64 levels").
void require_schema(const json& schema, const std::string& field);
void require_shape(const json& value, const std::string& field, const shape_limits& limits = {});
// A JSON text inside a string field (tool call arguments), parsed and held to check_shape.
json require_json_text(std::string_view text, const std::string& field);

}  // namespace keepwarm::bounded_json

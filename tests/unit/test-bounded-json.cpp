// The bounded JSON parser: depth capped at parse time, linear time in the number of keys, nlohmann's semantics for
// key order and duplicate keys; and the shape and $ref checks on schemas.
#include "json/bounded-json.h"

#include <gtest/gtest.h>

#include "api/anthropic-api.h"
#include "api/ollama-api.h"
#include "api/openai-api.h"
#include "http/http-server.h"

#include <string>

namespace bj = keepwarm::bounded_json;
using json = bj::json;

namespace {

std::string nested_arrays(int depth) {
    return std::string(depth, '[') + std::string(depth, ']');
}

std::string nested_schema(int depth) {
    std::string s;
    for (int i = 0; i < depth; ++i) s += R"({"type":"object","properties":{"a":)";
    s += R"({"type":"string"})";
    for (int i = 0; i < depth; ++i) s += "}}";
    return s;
}

// prefix + i, built without operator+(const char*, std::string&&), on which GCC 12 warns (-Wrestrict) wrongly.
std::string numbered(const char* prefix, int i) {
    std::string s(prefix);
    s += std::to_string(i);
    return s;
}

std::string object_with_keys(int n) {
    std::string s = "{";
    for (int i = 0; i < n; ++i) {
        if (i > 0) s += ',';
        s += "\"k";
        s += std::to_string(i);
        s += "\":";
        s += std::to_string(i);
    }
    return s + "}";
}

}  // namespace

TEST(BoundedJson, ParsesLikeNlohmann) {
    const std::string text =
        R"({"z":1,"a":[true,null,-3,18446744073709551615,2.5,"s",{}],"m":{"y":{"x":[]},"b":"\u00e9"}})";
    const json ours = bj::parse(text);
    EXPECT_EQ(ours, json::parse(text));
    EXPECT_EQ(ours.dump(), json::parse(text).dump());  // same key order, byte for byte
    EXPECT_EQ(bj::parse("7"), json(7));
    EXPECT_EQ(bj::parse(" \"x\" "), json("x"));
}

// simdjson parses; whatever it refuses goes through nlohmann's parser. Either way the tree, its number types and its
// dump are what nlohmann's parser gives, and what nlohmann refuses is refused.
TEST(BoundedJson, EdgeCasesParseAsNlohmannDoes) {
    for (const char* text : {"0",
                             "-0",
                             "-0.0",
                             "0.0",
                             "1E2",
                             "1e-7",
                             "-12",
                             "9223372036854775807",
                             "9223372036854775808",
                             "18446744073709551615",
                             "18446744073709551616",
                             "-9223372036854775808",
                             "-9223372036854775809",
                             "123456789012345678901234567890",
                             "2.2250738585072014e-308",
                             "0.1",
                             "1.7976931348623157e308",
                             "\"\\u0000a\"",
                             "\"\\ud83d\\ude00\"",
                             "\"\\u00e9\\/\\b\\f\\n\\r\\t\"",
                             "\"\xf0\x9f\x98\x80\"",
                             "\xef\xbb\xbf{}",
                             " [ ] ",
                             "{\"\":\"\"}",
                             "[1,[2,[3,{\"a\":[-1.5e3]}]]]",
                             "true",
                             "null"}) {
        SCOPED_TRACE(text);
        const json ours = bj::parse(text);
        const json theirs = json::parse(text);
        EXPECT_EQ(ours, theirs);
        EXPECT_EQ(ours.dump(), theirs.dump());
        // "-0" is the one difference: simdjson reads it as the integer 0, which comes out unsigned like "0".
        if (std::string_view(text) != "-0") {
            EXPECT_EQ(ours.type(), theirs.type());
        }
    }
    for (const char* bad : {"\"a\nb\"", "\"\\ud800\"", "\"\\udc00x\"", "01", "1.", ".5", "+1", "-", "1e", "[1 2]",
                            "{\"a\":1,}", "\"\xc3\"", "\"\xed\xa0\x80\"", "[]]", "\t", "NaN", "Infinity", "/*c*/1"}) {
        SCOPED_TRACE(bad);
        EXPECT_THROW(bj::parse(bad), bj::limit_error);
        EXPECT_FALSE(json::accept(bad));
    }
}

TEST(BoundedJson, KeepsKeyOrderAndLastDuplicateWins) {
    // nlohmann keeps a repeated key at its first position with its last value.
    const std::string text = R"({"b":1,"a":2,"b":{"deep":[1]},"c":3,"a":4})";
    const json ours = bj::parse(text);
    EXPECT_EQ(ours.dump(), R"({"b":{"deep":[1]},"a":4,"c":3})");
    EXPECT_EQ(ours.dump(), json::parse(text).dump());
}

TEST(BoundedJson, DuplicatesInLargeObjectsUseTheIndex) {
    std::string text = object_with_keys(100);
    text.back() = ',';
    text += R"("k5":"five","k99":"last","new":0})";
    const json ours = bj::parse(text);
    EXPECT_EQ(ours.size(), 101u);
    EXPECT_EQ(ours["k5"], "five");
    EXPECT_EQ(ours["k99"], "last");
    EXPECT_EQ(ours.dump(), json::parse(text).dump());
    EXPECT_EQ(std::next(ours.begin(), 5).key(), "k5");
    EXPECT_EQ(std::prev(ours.end()).key(), "new");
}

TEST(BoundedJson, TwoHundredThousandKeysInOrder) {
    // nlohmann's own parser takes minutes on this (each key is looked up among all before it).
    const int n = 200'000;
    const json ours = bj::parse(object_with_keys(n));
    ASSERT_EQ(ours.size(), static_cast<size_t>(n));
    int i = 0;
    for (const auto& [key, value] : ours.items()) {
        ASSERT_EQ(key, numbered("k", i));
        ASSERT_EQ(value, i);
        ++i;
    }
}

TEST(BoundedJson, ManyKeysWithDuplicatesNested) {
    std::string text = R"({"outer":)" + object_with_keys(50'000);
    text.back() = ',';
    text += R"("k0":"again"},"tail":[)" + object_with_keys(20) + "]}";
    const json ours = bj::parse(text);
    EXPECT_EQ(ours["outer"].size(), 50'000u);
    EXPECT_EQ(ours["outer"]["k0"], "again");
    EXPECT_EQ(ours["outer"].begin().key(), "k0");
    EXPECT_EQ(ours["tail"][0].size(), 20u);
}

TEST(BoundedJson, DepthLimit) {
    EXPECT_EQ(bj::parse(nested_arrays(bj::max_depth)).dump(), nested_arrays(bj::max_depth));
    try {
        bj::parse(nested_arrays(bj::max_depth + 1));
        FAIL() << "no error";
    } catch (const bj::limit_error& e) {
        EXPECT_STREQ(e.what(), "nests deeper than 128 levels");
    }
    // The reproduction: 20,000 levels would overflow the stack in dump(); it is refused before a tree exists.
    EXPECT_THROW(bj::parse(nested_schema(20'000)), bj::limit_error);
    EXPECT_THROW(bj::parse(R"({"a":[{"b":[[[]]]}]})", 5), bj::limit_error);
    EXPECT_NO_THROW(bj::parse(R"({"a":[{"b":[[]]}]})", 5));
    EXPECT_FALSE(bj::try_parse(nested_arrays(200'000)).has_value());
}

TEST(BoundedJson, Errors) {
    for (const char* bad : {"", "{", "{\"a\":}", "[1,]", "{} {}", "nul", "\"\\x\"", "1e999", "{\"a\" 1}", "\"\xff\""}) {
        EXPECT_THROW(bj::parse(bad), bj::limit_error) << bad;
        EXPECT_FALSE(bj::try_parse(bad).has_value()) << bad;
    }
    try {
        bj::parse("{\"a\": [1, 2,");
        FAIL() << "no error";
    } catch (const bj::limit_error& e) {
        EXPECT_NE(std::string(e.what()).find("parse error"), std::string::npos) << e.what();
    }
}

TEST(BoundedJson, CheckShape) {
    EXPECT_NO_THROW(bj::check_shape(json::parse(R"({"a":[1,{"b":2}]})")));
    EXPECT_THROW(bj::check_shape(json::parse(nested_arrays(10)), {9, 10, 100}), bj::limit_error);
    EXPECT_NO_THROW(bj::check_shape(json::parse(nested_arrays(10)), {10, 10, 100}));
    EXPECT_THROW(bj::check_shape(bj::parse(object_with_keys(1025))), bj::limit_error);
    EXPECT_NO_THROW(bj::check_shape(bj::parse(object_with_keys(1024))));
    EXPECT_THROW(bj::check_shape(json::parse("[1,2,3]"), {10, 10, 3}), bj::limit_error);
    EXPECT_NO_THROW(bj::check_shape(json::parse("[1,2]"), {10, 10, 3}));
}

TEST(BoundedJson, SchemaShape) {
    EXPECT_NO_THROW(bj::check_schema(bj::parse(nested_schema(20))));  // 41 levels
    EXPECT_THROW(bj::check_schema(bj::parse(nested_schema(40))), bj::limit_error);
    EXPECT_THROW(bj::check_schema(bj::parse(R"({"$ref":5})")), bj::limit_error);
}

TEST(BoundedJson, SchemaRefCyclesEndAndChainsAreBounded) {
    // A self-reference and a two-ref cycle: followed once each, like the converter does.
    EXPECT_NO_THROW(bj::check_schema(bj::parse(
        R"({"$defs":{"node":{"type":"object","properties":{"next":{"$ref":"#/$defs/node"}}}},"$ref":"#/$defs/node"})")));
    EXPECT_NO_THROW(bj::check_schema(
        bj::parse(R"({"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})")));
    EXPECT_NO_THROW(bj::check_schema(bj::parse(R"({"items":{"$ref":"#/"}, "x":{"$ref":"#/items/0/nope"}})")));

    // A chain of refs, each one level deep on its own, nests as deep as the chain once followed.
    const auto chain = [](int n) {
        json defs = json::object();
        for (int i = 0; i < n; ++i) {
            defs[numbered("d", i)] = {{"type", "array"}, {"items", {{"$ref", numbered("#/$defs/d", i + 1)}}}};
        }
        defs[numbered("d", n)] = {{"type", "string"}};
        return json{{"$defs", defs}, {"$ref", "#/$defs/d0"}};
    };
    EXPECT_NO_THROW(bj::check_schema(chain(20)));
    try {
        bj::check_schema(chain(200));
        FAIL() << "no error";
    } catch (const bj::limit_error& e) {
        EXPECT_NE(std::string(e.what()).find("$refs are followed"), std::string::npos) << e.what();
    }

    // Many distinct refs: each one costs the converter a copy of the whole schema.
    const auto flat_refs = [](int refs, int filler) {
        json defs = json::object();
        json any_of = json::array();
        for (int i = 0; i < refs; ++i) {
            defs[numbered("d", i)] = {{"type", "string"}};
            any_of.push_back({{"$ref", numbered("#/$defs/d", i)}});
        }
        json big = json::array();
        for (int i = 0; i < filler; ++i) big.push_back(i);
        return json{{"$defs", defs}, {"anyOf", any_of}, {"examples", big}};
    };
    EXPECT_NO_THROW(bj::check_schema(flat_refs(200, 100)));
    EXPECT_THROW(bj::check_schema(flat_refs(257, 100)), bj::limit_error);
    EXPECT_THROW(bj::check_schema(flat_refs(100, 30'000)), bj::limit_error);
    EXPECT_NO_THROW(bj::check_schema(flat_refs(50, 30'000)));

    // Each def refers to the next one twice: the expansions double at every level.
    json defs = json::object();
    for (int i = 0; i < 40; ++i) {
        const json next = {{"$ref", numbered("#/$defs/d", i + 1)}};
        defs[numbered("d", i)] = {{"anyOf", json::array({next, next})}};
    }
    defs["d40"] = {{"type", "string"}};
    EXPECT_THROW(bj::check_schema(json{{"$defs", defs}, {"$ref", "#/$defs/d0"}}), bj::limit_error);
}

namespace {

// The message of the 400 that `parse` throws; fails the test when it throws nothing or something else.
template <typename Parse>
std::string bad_request(Parse parse) {
    try {
        parse();
    } catch (const keepwarm::request_error& e) {
        EXPECT_EQ(e.status, 400);
        return e.what();
    }
    ADD_FAILURE() << "no request_error";
    return "";
}

json with_raw(const std::string& text_with_placeholder, const std::string& raw) {
    std::string text = text_with_placeholder;
    text.replace(text.find("@RAW@"), 5, raw);
    return bj::parse(text);
}

}  // namespace

TEST(BoundedJsonFields, RequireNamesTheField) {
    EXPECT_EQ(bad_request([] { bj::require_json_text(nested_arrays(200), "args"); }),
              "'args' nests deeper than 128 levels");
    EXPECT_NE(bad_request([] {
                  bj::require_json_text("{\"a\":", "args");
              }).find("'args' must be a JSON-encoded string: [json.exception.parse_error"),
              std::string::npos);
    EXPECT_EQ(bj::require_json_text(R"({"b":1,"a":2})", "args").dump(), R"({"b":1,"a":2})");
    EXPECT_EQ(bad_request([] { bj::require_schema(bj::parse(nested_schema(40)), "tools[3].input_schema"); }),
              "'tools[3].input_schema' nests deeper than 64 levels");
}

TEST(BoundedJsonFields, EachApiBoundsWhatItForwards) {
    namespace api = keepwarm::api;
    const std::string deep_schema = nested_schema(40);  // fits a body (81 levels), not a schema
    EXPECT_EQ(bad_request([&] {
                  api::parse_chat_request(with_raw(
                      R"({"messages":[{"role":"user","content":"hi"}],
                          "tools":[{"type":"function","function":{"name":"f","parameters":@RAW@}}]})",
                      deep_schema));
              }),
              "'tools[0].function.parameters' nests deeper than 64 levels");
    EXPECT_EQ(bad_request([&] {
                  api::parse_chat_request(with_raw(
                      R"({"messages":[{"role":"user","content":"hi"}],
                          "response_format":{"type":"json_schema","json_schema":{"name":"s","schema":@RAW@}}})",
                      deep_schema));
              }),
              "'response_format.json_schema.schema' nests deeper than 64 levels");
    const json arguments_text = nested_arrays(129);
    EXPECT_EQ(bad_request([&] {
                  api::parse_chat_request(with_raw(
                      R"({"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null,
                          "tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":@RAW@}}]},
                          {"role":"tool","tool_call_id":"c","content":"ok"}]})",
                      arguments_text.dump()));
              }),
              "'messages[1].tool_calls[0].function.arguments' nests deeper than 128 levels");
    EXPECT_EQ(bad_request([&] {
                  api::parse_chat_request(
                      with_raw(R"({"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"x":@RAW@}})",
                               object_with_keys(1025)));
              }),
              "'chat_template_kwargs' has an object with 1025 keys; at most 1024 are accepted");
    EXPECT_EQ(bad_request([&] {
                  api::anthropic::parse_messages_request(with_raw(
                      R"({"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"},
                          {"role":"assistant","content":[{"type":"tool_use","id":"c","name":"f","input":@RAW@}]},
                          {"role":"user","content":[{"type":"tool_result","tool_use_id":"c","content":"ok"}]}]})",
                      object_with_keys(2000)));
              }),
              "'messages[1].content[0].input' has an object with 2000 keys; at most 1024 are accepted");
    EXPECT_EQ(bad_request([&] {
                  api::ollama::parse_chat_request(with_raw(
                      R"({"model":"m","messages":[{"role":"user","content":"hi"}],"format":@RAW@})", deep_schema));
              }),
              "'format' nests deeper than 64 levels");
}

TEST(BoundedJsonFields, LogitBiasIsCappedBeforeItsKeysAreRead) {
    std::string bias = "{";
    for (int i = 0; i < 262'145; ++i) {
        if (i > 0) bias += ',';
        bias += '"';
        bias += std::to_string(i);
        bias += "\":1";
    }
    bias += '}';
    const std::string message = bad_request([&] {
        keepwarm::api::parse_chat_request(
            with_raw(R"({"messages":[{"role":"user","content":"hi"}],"logit_bias":@RAW@})", bias));
    });
    EXPECT_EQ(message, "'logit_bias' has 262145 entries; at most 262144 are accepted");
}

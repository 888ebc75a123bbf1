// text_stream: what a client sees while tokens arrive one piece at a time.
#include <gtest/gtest.h>

#include "engine/text-stream.h"

using keepwarm::sanitize_utf8;
using keepwarm::text_stream;

namespace {
std::string feed_bytewise(text_stream& ts, std::string_view text, std::vector<std::string>* emitted = nullptr) {
    std::string out;
    for (char c : text) {
        std::string piece = ts.push(std::string_view(&c, 1));
        if (emitted && !piece.empty()) emitted->push_back(piece);
        out += piece;
    }
    return out;
}
}  // namespace

TEST(text_stream, never_splits_a_utf8_character) {
    text_stream ts;
    std::vector<std::string> emitted;
    const std::string text = "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80!";  // café € 😀!
    std::string out = feed_bytewise(ts, text, &emitted);
    out += ts.finish();
    EXPECT_EQ(out, text);
    for (const auto& piece : emitted) EXPECT_EQ(sanitize_utf8(piece), piece) << "emitted a partial character";
}

TEST(text_stream, stop_string_is_cut_and_never_shown) {
    text_stream ts({"</stop>"});
    std::vector<std::string> emitted;
    std::string out = feed_bytewise(ts, "hello </sto", &emitted);
    EXPECT_EQ(out, "hello ");  // "</sto" is held back: it may become the stop string
    out += ts.push("p> tail");
    EXPECT_TRUE(ts.stopped());
    EXPECT_EQ(ts.matched_stop(), "</stop>");
    EXPECT_EQ(out, "hello ");
    EXPECT_EQ(ts.push("more"), "");
    EXPECT_EQ(ts.finish(), "");
}

TEST(text_stream, partial_stop_that_does_not_complete_is_released) {
    text_stream ts({"STOP"});
    std::string out = ts.push("abc ST");
    EXPECT_EQ(out, "abc ");
    out += ts.push("OP");
    EXPECT_TRUE(ts.stopped());
    EXPECT_EQ(out, "abc ");

    text_stream ts2({"STOP"});
    std::string out2 = ts2.push("abc ST");
    out2 += ts2.push("ART");
    EXPECT_FALSE(ts2.stopped());
    EXPECT_EQ(out2, "abc START");
    text_stream ts3({"STOP"});
    std::string out3 = ts3.push("end ST");
    out3 += ts3.finish();
    EXPECT_EQ(out3, "end ST");
}

TEST(text_stream, earliest_of_several_stop_strings_wins) {
    text_stream ts({"world", "lo w"});
    std::string out = ts.push("hello world");
    EXPECT_TRUE(ts.stopped());
    EXPECT_EQ(out, "hel");
    EXPECT_EQ(ts.matched_stop(), "lo w");
}

TEST(text_stream, stop_string_split_across_a_multibyte_character) {
    text_stream ts({"\xE2\x82\xAC"});  // "€"
    std::string out = feed_bytewise(ts, "price: 5\xE2\x82\xAC more");
    EXPECT_TRUE(ts.stopped());
    EXPECT_EQ(out, "price: 5");
}

TEST(text_stream, invalid_bytes_become_replacement_characters) {
    text_stream ts;
    std::string out = ts.push(
        "a\xFF"
        "b\xC3");
    out += ts.push("(");  // 0xC3 followed by a non-continuation byte
    out += ts.finish();
    EXPECT_EQ(out,
              "a\xEF\xBF\xBD"
              "b\xEF\xBF\xBD(");
}

TEST(text_stream, incomplete_character_at_the_end_is_replaced) {
    text_stream ts;
    std::string out = ts.push("x\xE2\x82");
    EXPECT_EQ(out, "x");
    EXPECT_EQ(ts.finish(), "\xEF\xBF\xBD");
}

TEST(sanitize_utf8, rejects_overlongs_and_surrogates) {
    EXPECT_EQ(sanitize_utf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");
    EXPECT_EQ(sanitize_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
    EXPECT_EQ(sanitize_utf8("ok \xF0\x9F\x98\x80"), "ok \xF0\x9F\x98\x80");
}

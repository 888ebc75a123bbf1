// The proxy's stream decoders against upstreams that lie: indices out of range or of the wrong type, fields of the
// wrong type, JSON nested deep enough to overflow a recursion, events and answers without end. Each must end the
// answer with an error (never a crash, an exception or an allocation the upstream chose), and a stream cut at any
// byte must still give deltas that add up to the message.
#include <gtest/gtest.h>

#include <chrono>
#include <climits>
#include <string>

#include "proxy/upstream-dialects.h"

using namespace keepwarm::proxy;
using namespace std::chrono_literals;

namespace {

std::string sse(const std::string& data, const std::string& event = "") {
    return (event.empty() ? "" : "event: " + event + "\n") + "data: " + data + "\n\n";
}

std::string tool_delta(const std::string& index) {
    return sse(R"({"choices":[{"index":0,"delta":{"tool_calls":[{"index":)" + index +
               R"(,"id":"c1","function":{"name":"f","arguments":"{}"}}]}}]})");
}

// The message the deltas describe, built as a client of the proxy would.
common_chat_msg replay(const std::vector<common_chat_msg_diff>& diffs) {
    common_chat_msg m;
    for (const common_chat_msg_diff& d : diffs) {
        m.reasoning_content += d.reasoning_content_delta;
        m.content += d.content_delta;
        if (d.tool_call_index == std::string::npos) continue;
        if (d.tool_call_index >= m.tool_calls.size()) m.tool_calls.resize(d.tool_call_index + 1);
        common_chat_tool_call& call = m.tool_calls[d.tool_call_index];
        if (!d.tool_call_delta.name.empty()) call.name = d.tool_call_delta.name;
        if (!d.tool_call_delta.id.empty()) call.id = d.tool_call_delta.id;
        call.arguments += d.tool_call_delta.arguments;
    }
    return m;
}

std::vector<common_chat_msg_diff> feed(stream_decoder& decoder, const std::string& body, size_t piece) {
    std::vector<common_chat_msg_diff> all;
    for (size_t at = 0; at < body.size(); at += piece) {
        auto diffs = decoder.push(std::string_view(body).substr(at, piece));
        all.insert(all.end(), diffs.begin(), diffs.end());
    }
    return all;
}

void expect_failed(const stream_decoder& decoder, const std::string& says) {
    EXPECT_TRUE(decoder.done());
    EXPECT_NE(decoder.error().find(says), std::string::npos) << decoder.error();
}

}  // namespace

TEST(UpstreamHostileStreams, OpenAIToolCallIndexMinusOneIsAnErrorNotACrash) {
    stream_decoder decoder(upstream_dialect::openai);
    decoder.push(tool_delta("-1"));
    expect_failed(decoder, "tool call index -1");
    EXPECT_TRUE(decoder.message().tool_calls.empty());
}

TEST(UpstreamHostileStreams, OpenAIToolCallIndexTwoToTheSixtyFourMinusOne) {
    stream_decoder decoder(upstream_dialect::openai);
    decoder.push(tool_delta("18446744073709551615"));
    expect_failed(decoder, "tool call index 18446744073709551615");
}

TEST(UpstreamHostileStreams, OpenAIToolCallIndexOfAHundredMillionAllocatesNothing) {
    stream_decoder decoder(upstream_dialect::openai);
    const auto start = std::chrono::steady_clock::now();
    decoder.push(tool_delta("99999999"));
    expect_failed(decoder, "tool call index 99999999");
    EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);  // a hang guard; 100M tool calls would exhaust memory
    EXPECT_TRUE(decoder.message().tool_calls.empty());
}

TEST(UpstreamHostileStreams, OpenAIToolCallIndexOfAnotherTypeOrOutOfOrder) {
    for (const std::string index : {R"("0")", "1.5", "null", "[0]", "2"}) {
        SCOPED_TRACE(index);
        stream_decoder decoder(upstream_dialect::openai);
        decoder.push(tool_delta(index));
        expect_failed(decoder, "tool call index");
    }
    // After call 0 and 1, a delta for 0 again would be lost from the deltas: out of order.
    stream_decoder decoder(upstream_dialect::openai);
    decoder.push(tool_delta("0") + tool_delta("1") + tool_delta("0"));
    expect_failed(decoder, "tool call index 0 with 2 call(s)");
    EXPECT_EQ(decoder.message().tool_calls.size(), 2u);
}

TEST(UpstreamHostileStreams, OpenAIFieldsOfTheWrongTypeAreIgnoredOrAnError) {
    stream_decoder decoder(upstream_dialect::openai);
    decoder.push(sse(R"({"choices":[1,2]})") + sse(R"({"choices":[{"delta":{"content":5,"tool_calls":{}}}]})") +
                 sse(R"({"choices":[{"delta":{"content":"ok"}}],"usage":{"prompt_tokens":"x",)"
                     R"("completion_tokens":1e300,"prompt_tokens_details":{"cached_tokens":-5}}})"));
    EXPECT_FALSE(decoder.done());
    EXPECT_EQ(decoder.message().content, "ok");
    EXPECT_EQ(decoder.usage().prompt_tokens, 0);
    EXPECT_EQ(decoder.usage().completion_tokens, INT_MAX);
    EXPECT_EQ(decoder.usage().cached_tokens, 0);

    stream_decoder entry(upstream_dialect::openai);
    entry.push(sse(R"({"choices":[{"delta":{"tool_calls":[7]}}]})"));
    expect_failed(entry, "not an object");

    stream_decoder array(upstream_dialect::openai);
    array.push(sse("[1,2,3]"));
    expect_failed(array, "not a JSON object");
}

TEST(UpstreamHostileStreams, AnthropicContentBlockIndexMinusOne) {
    stream_decoder decoder(upstream_dialect::anthropic);
    decoder.push(sse(R"({"type":"content_block_start","index":-1,"content_block":{"type":"tool_use","id":"t",)"
                     R"("name":"f","input":{}}})",
                     "content_block_start"));
    expect_failed(decoder, "content block -1");
    EXPECT_TRUE(decoder.message().tool_calls.empty());
}

TEST(UpstreamHostileStreams, AnthropicIndicesOutOfOrderOrOfAnotherType) {
    for (const std::string index : {"18446744073709551615", "99999999", R"("0")", "1"}) {
        SCOPED_TRACE(index);
        stream_decoder decoder(upstream_dialect::anthropic);
        decoder.push(sse(R"({"type":"content_block_start","index":)" + index + R"(,"content_block":{"type":"text"}})"));
        expect_failed(decoder, "content block " + index);
    }
    for (const std::string index : {"-1", "18446744073709551615", R"("x")", "5"}) {
        SCOPED_TRACE(index);
        stream_decoder decoder(upstream_dialect::anthropic);
        decoder.push(sse(R"({"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t",)"
                         R"("name":"f"}})") +
                     sse(R"({"type":"content_block_delta","index":)" + index +
                         R"(,"delta":{"type":"input_json_delta","partial_json":"{}"}})"));
        expect_failed(decoder, "tool input for content block");
    }
}

TEST(UpstreamHostileStreams, AnthropicFieldsOfTheWrongType) {
    stream_decoder decoder(upstream_dialect::anthropic);
    decoder.push(sse(R"({"type":"message_start","message":5})") +
                 sse(R"({"type":"message_start","message":{"usage":[1]}})") +
                 sse(R"({"type":"content_block_start","index":0,"content_block":"text"})") +
                 sse(R"({"type":"content_block_delta","index":0,"delta":7})") +
                 sse(R"({"type":"message_delta","delta":"x","usage":{"input_tokens":2147483647,)"
                     R"("cache_read_input_tokens":2147483647,"output_tokens":-3}})") +
                 sse(R"({"type":"message_stop"})"));
    EXPECT_TRUE(decoder.done());
    EXPECT_EQ(decoder.error(), "");
    EXPECT_EQ(decoder.usage().prompt_tokens, INT_MAX);
    EXPECT_EQ(decoder.usage().completion_tokens, 0);
}

TEST(UpstreamHostileStreams, OllamaFieldsOfTheWrongType) {
    stream_decoder decoder(upstream_dialect::ollama);
    decoder.push(R"({"message":{"content":"a","tool_calls":[{"function":3}]},"done":"yes"})"
                 "\n"
                 R"({"message":[],"done":1})"
                 "\n");
    EXPECT_FALSE(decoder.done());
    ASSERT_EQ(decoder.message().tool_calls.size(), 1u);
    EXPECT_EQ(decoder.message().tool_calls[0].arguments, "{}");

    stream_decoder entry(upstream_dialect::ollama);
    entry.push(R"({"message":{"tool_calls":["x"]}})"
               "\n");
    expect_failed(entry, "not an object");

    stream_decoder array(upstream_dialect::ollama);
    array.push("[]\n");
    expect_failed(array, "not a JSON object");
}

TEST(UpstreamHostileStreams, DeepJsonIsRefusedBeforeItIsParsedOrDumped) {
    // Ollama's tool arguments are dumped to text: 100,000 levels would overflow the stack.
    const std::string deep = std::string(100000, '[') + std::string(100000, ']');
    stream_decoder ollama(upstream_dialect::ollama);
    ollama.push(R"({"message":{"tool_calls":[{"function":{"name":"f","arguments":{"a":)" + deep + "}}}]}}\n");
    expect_failed(ollama, "nested over");

    stream_decoder openai(upstream_dialect::openai);
    openai.push(sse(R"({"error":)" + deep + "}"));
    expect_failed(openai, "nested over");

    // Brackets inside strings are text, not nesting.
    stream_decoder text(upstream_dialect::openai);
    text.push(sse(R"({"choices":[{"delta":{"content":")" + std::string(1000, '[') + R"(\"{"}}]})"));
    EXPECT_EQ(text.error(), "");
    EXPECT_EQ(text.message().content.size(), 1002u);
}

TEST(UpstreamHostileStreams, AnEventWithoutItsEndIsBounded) {
    const stream_limits limits{.max_event_bytes = 4096};
    stream_decoder sse_decoder(upstream_dialect::openai, limits);
    sse_decoder.push("data: {\"choices\":[{\"delta\":{\"content\":\"" + std::string(3000, 'x'));
    EXPECT_FALSE(sse_decoder.done());
    sse_decoder.push(std::string(3000, 'x'));
    expect_failed(sse_decoder, "without ending an event");

    stream_decoder lines(upstream_dialect::ollama, limits);
    for (int i = 0; i < 10 && !lines.done(); i++) lines.push(std::string(1000, ' '));
    expect_failed(lines, "without ending a line");
}

TEST(UpstreamHostileStreams, TheAnswerAndTheStreamAreBounded) {
    const std::string chunk = sse(R"({"choices":[{"delta":{"content":")" + std::string(1000, 'x') + R"("}}]})");
    stream_decoder answer(upstream_dialect::openai, {.max_answer_bytes = 10000});
    for (int i = 0; i < 20 && !answer.done(); i++) answer.push(chunk);
    expect_failed(answer, "answer is over 10000 bytes");
    EXPECT_LE(answer.message().content.size(), 10000u);

    // Events that add nothing (keep-alive comments, empty deltas) count too: a stream that never ends is cut.
    stream_decoder endless(upstream_dialect::openai, {.max_stream_bytes = 100000});
    for (int i = 0; i < 10000 && !endless.done(); i++) endless.push(": ping\n\n" + sse(R"({"choices":[]})"));
    expect_failed(endless, "over 100000 bytes in one answer");

    stream_decoder calls(upstream_dialect::openai, {.max_tool_calls = 3});
    for (int i = 0; i < 5; i++) calls.push(tool_delta(std::to_string(i)));
    expect_failed(calls, "over 3 tool calls");
    EXPECT_EQ(calls.message().tool_calls.size(), 3u);

    stream_decoder blocks(upstream_dialect::anthropic, {.max_content_blocks = 2});
    for (int i = 0; i < 3; i++) {
        blocks.push(sse(R"({"type":"content_block_start","index":)" + std::to_string(i) +
                        R"(,"content_block":{"type":"text","text":"a"}})"));
    }
    expect_failed(blocks, "over 2 content blocks");

    stream_decoder name(upstream_dialect::openai);
    name.push(sse(R"({"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":")" + std::string(5000, 'n') +
                  R"("}}]}}]})"));
    expect_failed(name, "name or id over");
}

TEST(UpstreamHostileStreams, TheEndOfTheBodyReadsALastLineWithoutItsNewline) {
    stream_decoder ollama(upstream_dialect::ollama);
    ollama.push(R"({"message":{"content":"hi"},"done":false})"
                "\n"
                R"({"message":{"content":"!"},"done":true,"eval_count":2})");
    EXPECT_FALSE(ollama.done());
    const auto last = ollama.end_of_body();
    EXPECT_TRUE(ollama.done());
    EXPECT_EQ(ollama.error(), "");
    EXPECT_EQ(ollama.message().content, "hi!");
    ASSERT_EQ(last.size(), 1u);
    EXPECT_EQ(last[0].content_delta, "!");

    stream_decoder anthropic(upstream_dialect::anthropic);
    anthropic.push(R"(data: {"type":"message_stop"})");
    anthropic.end_of_body();
    EXPECT_TRUE(anthropic.done());
    EXPECT_EQ(anthropic.error(), "");
}

TEST(UpstreamHostileStreams, ABodyThatEndsBeforeItsEndEventIsAnError) {
    for (const upstream_dialect dialect : {upstream_dialect::openai, upstream_dialect::anthropic}) {
        stream_decoder decoder(dialect);
        decoder.push(sse(R"({"type":"content_block_start","index":0,"content_block":{"type":"text","text":"a"}})"));
        decoder.end_of_body();
        expect_failed(decoder, "before its end event");
    }
    stream_decoder ollama(upstream_dialect::ollama);
    ollama.push("{\"message\":{\"content\":\"a\"}}\n");
    ollama.end_of_body();
    expect_failed(ollama, "before its end event");
}

TEST(UpstreamHostileStreams, DeltasAddUpToTheMessageWhereverThePiecesAreCut) {
    const std::string body =
        sse(R"({"choices":[{"delta":{"reasoning_content":"think "}}]})") +
        sse(R"({"choices":[{"delta":{"content":"Hel"}}]})") + sse(R"({"choices":[{"delta":{"content":"lo"}}]})") +
        sse(R"({"choices":[{"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"ge","arguments":"{\"x"}}]}}]})") +
        sse(R"({"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":"t","arguments":"\":1}"}}]}}]})") +
        sse(R"({"choices":[{"delta":{"tool_calls":[{"index":1,"id":"b","function":{"name":"put","arguments":""}}]}}]})") +
        sse(R"({"choices":[{"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{}"}}]}}]})") +
        "data: [DONE]\n\n";
    for (const size_t piece : {size_t{1}, size_t{7}, size_t{64}, body.size()}) {
        SCOPED_TRACE(piece);
        stream_decoder decoder(upstream_dialect::openai);
        const common_chat_msg rebuilt = replay(feed(decoder, body, piece));
        EXPECT_TRUE(decoder.done());
        EXPECT_EQ(decoder.error(), "");
        const common_chat_msg& m = decoder.message();
        EXPECT_EQ(rebuilt.content, "Hello");
        EXPECT_EQ(rebuilt.reasoning_content, "think ");
        ASSERT_EQ(rebuilt.tool_calls.size(), 2u);
        ASSERT_EQ(m.tool_calls.size(), 2u);
        for (size_t i = 0; i < 2; i++) {
            EXPECT_EQ(rebuilt.tool_calls[i].name, m.tool_calls[i].name);
            EXPECT_EQ(rebuilt.tool_calls[i].id, m.tool_calls[i].id);
            EXPECT_EQ(rebuilt.tool_calls[i].arguments, m.tool_calls[i].arguments);
        }
        EXPECT_EQ(m.tool_calls[0].name, "get");
        EXPECT_EQ(m.tool_calls[0].arguments, R"({"x":1})");
    }
}

TEST(UpstreamHostileStreams, AnAnswerInManySmallPiecesTakesLinearTime) {
    // 16 MB of content in 2 KB pieces: copying and comparing the message at every piece (as a full diff does) moves
    // 64 GB, thirty times what it moves in 64 KB pieces; with each byte read once, both cost about the same. Timed
    // against itself so that a slow or sanitized build compares alike.
    const std::string chunk = sse(R"({"choices":[{"delta":{"content":")" + std::string(4000, 'x') + R"("}}]})");
    std::string body;
    while (body.size() < (16u << 20)) body += chunk;
    const auto time_in_pieces_of = [&body](size_t piece) {
        stream_decoder decoder(upstream_dialect::openai);
        const auto start = std::chrono::steady_clock::now();
        size_t delta_bytes = 0;
        for (const auto& d : feed(decoder, body, piece)) delta_bytes += d.content_delta.size();
        EXPECT_EQ(delta_bytes, decoder.message().content.size());
        EXPECT_EQ(decoder.error(), "");
        return std::chrono::steady_clock::now() - start;
    };
    const auto large = time_in_pieces_of(65536);
    const auto pieces = time_in_pieces_of(2048);
    // Measured side by side; a wide margin for a busy machine, still a third of what the copies would take.
    EXPECT_LT(pieces, 10 * large + 1s);
}

TEST(UpstreamHostileStreams, ErrorBodiesAndCountsFromAnUpstreamAreBounded) {
    EXPECT_LE(parse_error_body(R"({"error":")" + std::string(100000, 'e') + R"("})").message.size(), 2003u);
    EXPECT_THROW(parse_count_answer(R"({"input_tokens":-1})"), std::invalid_argument);
    EXPECT_THROW(parse_count_answer(R"({"input_tokens":99999999999})"), std::invalid_argument);
    EXPECT_EQ(parse_count_answer(R"({"input_tokens":12})"), 12);
    const std::string deep = std::string(100000, '[') + std::string(100000, ']');
    EXPECT_EQ(
        parse_listing(upstream_dialect::openai, R"({"data":[{"id":"m","owned_by":"keepwarm","created":)" + deep + "}]}")
            .instance,
        "");
}

TEST(UpstreamHostileStreams, AnEventOfManyKeysParsesInLinearTime) {
    // 100,000 keys in 1 MB: an insertion-ordered object takes a linear search per key (27 s); the same bytes as one
    // string take milliseconds.
    std::string keys, text(1100000, 'x');
    for (int i = 0; i < 100000; i++) {
        if (i > 0) keys += ',';
        keys += "\"k";
        keys += std::to_string(i);
        keys += "\":1";
    }
    const auto time_of = [](const std::string& extra) {
        stream_decoder decoder(upstream_dialect::openai);
        const auto start = std::chrono::steady_clock::now();
        decoder.push(sse(R"({"choices":[{"delta":{"content":"a"}}],"extra":)" + extra + "}"));
        EXPECT_EQ(decoder.message().content, "a");
        return std::chrono::steady_clock::now() - start;
    };
    const auto as_text = time_of("\"" + text + "\"");
    const auto as_keys = time_of("{" + keys + "}");
    // A wide margin for a busy machine or the sanitizers, still a fifth of the linear search's 27 s.
    EXPECT_LT(as_keys, 100 * as_text + 5s);
}

TEST(UpstreamHostileStreams, OllamaToolArgumentsKeepTheOrderTheModelWroteThem) {
    stream_decoder decoder(upstream_dialect::ollama);
    decoder.push(
        R"({"message":{"tool_calls":[{"function":{"name":"f","arguments":{"zeta":1,"alpha":{"y":2,"b":3}}}}]},)"
        R"("done":true})"
        "\n");
    ASSERT_EQ(decoder.message().tool_calls.size(), 1u);
    EXPECT_EQ(decoder.message().tool_calls[0].arguments, R"({"zeta":1,"alpha":{"y":2,"b":3}})");
}

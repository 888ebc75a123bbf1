// Unit tests for chat template rendering and streaming output parsing (src/api/chat-renderer.*,
// src/api/chat-output-parser.*) against real Qwen templates from the pinned llama.cpp tree; no model needed. The
// render cache (src/api/chat-render-cache.*) is checked against common_chat_templates_apply on randomized agent
// sessions for Qwen3, Qwen3.5, Llama 3.1, Mistral Nemo and Gemma 2/4.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <thread>

#include "api/openai-api.h"
#include "chat/chat-output-parser.h"
#include "chat/chat-renderer.h"
#include "http/http-server.h"
#include "llama.h"

using namespace keepwarm;
using namespace keepwarm::api;
using keepwarm::request_error;

namespace {

std::string read_template(const std::string& name) {
    std::ifstream f(std::string(KEEPWARM_LLAMA_SOURCE_DIR) + "/models/templates/" + name);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// Templates are parsed and capability-probed once per test binary; that is the slow part.
const chat_renderer& qwen3() {
    // Qwen3's tokenizer has no BOS token in its template; eos is <|im_end|>.
    static chat_renderer r(read_template("Qwen-Qwen3-0.6B.jinja"), "", "<|im_end|>");
    return r;
}

const chat_renderer& qwen35() {
    static chat_renderer r(read_template("Qwen3.5-4B.jinja"), "", "<|im_end|>");
    return r;
}

const char* weather_tools = R"([{"type":"function","function":{"name":"get_weather","description":"Get the weather",
    "parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}])";

chat_request request(const char* messages, const char* tools = nullptr) {
    json body{{"messages", json::parse(messages)}};
    if (tools) {
        body["tools"] = json::parse(tools);
    }
    return parse_chat_request(body);
}

// common keeps the newline before </think> in reasoning_content; the templates strip it when re-rendering.
std::string trim(const std::string& s) {
    size_t b = s.find_first_not_of(" \n");
    size_t e = s.find_last_not_of(" \n");
    return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

bool starts_with(const std::string& s, const std::string& prefix) {
    return s.rfind(prefix, 0) == 0;
}

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

struct stream_result {
    std::vector<common_chat_msg_diff> diffs;
    common_chat_msg final_msg;
};

// Feeds `text` in pieces of `piece` bytes, then finishes; collects every delta, the final ones included.
stream_result stream(chat_output_parser& parser, const std::string& text, size_t piece) {
    stream_result res;
    for (size_t i = 0; i < text.size(); i += piece) {
        auto d = parser.push(std::string_view(text).substr(i, piece));
        res.diffs.insert(res.diffs.end(), d.begin(), d.end());
    }
    std::vector<common_chat_msg_diff> last;
    res.final_msg = parser.finish(&last);
    res.diffs.insert(res.diffs.end(), last.begin(), last.end());
    return res;
}

// Rebuilds a message from deltas, the way an OpenAI client accumulates a stream.
common_chat_msg accumulate(const std::vector<common_chat_msg_diff>& diffs) {
    common_chat_msg m;
    for (const auto& d : diffs) {
        m.content += d.content_delta;
        m.reasoning_content += d.reasoning_content_delta;
        if (d.tool_call_index != std::string::npos) {
            if (m.tool_calls.size() <= d.tool_call_index) {
                m.tool_calls.resize(d.tool_call_index + 1);
            }
            auto& tc = m.tool_calls[d.tool_call_index];
            if (!d.tool_call_delta.id.empty()) tc.id = d.tool_call_delta.id;
            tc.name += d.tool_call_delta.name;
            tc.arguments += d.tool_call_delta.arguments;
        }
    }
    return m;
}

}  // namespace

TEST(ChatRenderer, Capabilities) {
    EXPECT_TRUE(qwen3().supports_thinking());
    EXPECT_TRUE(qwen35().supports_thinking());
    EXPECT_TRUE(qwen3().caps().at("supports_tools"));
    EXPECT_FALSE(qwen3().source().empty());
    EXPECT_THROW(chat_renderer("{% if %}", "", ""), std::runtime_error);
    EXPECT_THROW(chat_renderer(nullptr), std::invalid_argument);
    chat_renderer chatml("chatml", "", "");
    EXPECT_NE(chatml.render(request(R"([{"role":"user","content":"hi"}])")).prompt.find("<|im_start|>user\nhi"),
              std::string::npos);
}

TEST(ChatRenderer, PlainPromptEndsWithGenerationPrompt) {
    auto r = qwen3().render(request(R"([{"role":"system","content":"be brief"},{"role":"user","content":"hi"}])"));
    EXPECT_TRUE(starts_with(r.prompt, "<|im_start|>system\nbe brief<|im_end|>\n")) << r.prompt;
    EXPECT_TRUE(ends_with(r.prompt, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")) << r.prompt;
    EXPECT_FALSE(r.continuation);
    EXPECT_TRUE(r.grammar.empty());

    // Thinking off: Qwen3 closes an empty think block in the generation prompt.
    auto req = request(R"([{"role":"user","content":"hi"}])");
    req.enable_thinking = false;
    auto off = qwen3().render(req);
    EXPECT_TRUE(ends_with(off.prompt, "<|im_start|>assistant\n<think>\n\n</think>\n\n")) << off.prompt;

    // Developer messages are rendered as system; content parts are joined for string-only templates.
    auto dev = qwen3().render(request(R"([{"role":"developer","content":"rules"},
        {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}])"));
    EXPECT_TRUE(starts_with(dev.prompt, "<|im_start|>system\nrules<|im_end|>\n")) << dev.prompt;
    EXPECT_NE(dev.prompt.find("a\nb"), std::string::npos) << dev.prompt;

    auto r35 = qwen35().render(request(R"([{"role":"user","content":"hi"}])"));
    EXPECT_TRUE(ends_with(r35.prompt, "<|im_start|>assistant\n<think>\n")) << r35.prompt;
}

TEST(ChatRenderer, ToolsInPromptAndLazyGrammar) {
    auto req = request(R"([{"role":"user","content":"Weather in Paris?"}])", weather_tools);
    for (const chat_renderer* renderer : {&qwen3(), &qwen35()}) {
        auto r = renderer->render(req);
        EXPECT_NE(r.prompt.find("# Tools"), std::string::npos) << r.prompt;
        EXPECT_NE(r.prompt.find("\"get_weather\""), std::string::npos) << r.prompt;
        EXPECT_NE(r.prompt.find("Get the weather"), std::string::npos) << r.prompt;
        EXPECT_TRUE(ends_with(r.prompt, r.params.generation_prompt)) << r.prompt;
        EXPECT_TRUE(ends_with(r.prompt, "<|im_start|>assistant\n") ||
                    ends_with(r.prompt, "<|im_start|>assistant\n<think>\n"))
            << r.prompt;
        EXPECT_EQ(r.grammar.type, COMMON_GRAMMAR_TYPE_TOOL_CALLS);
        EXPECT_FALSE(r.grammar.grammar.empty());

        common_params_sampling sampling;
        chat_renderer::apply_to_sampling(r, sampling);
        EXPECT_TRUE(sampling.grammar_lazy);
        ASSERT_FALSE(sampling.grammar_triggers.empty());
        EXPECT_EQ(sampling.grammar_triggers[0].type, COMMON_GRAMMAR_TRIGGER_TYPE_WORD);
        EXPECT_TRUE(starts_with(sampling.grammar_triggers[0].value, "<tool_call>"));
        EXPECT_EQ(sampling.generation_prompt, r.params.generation_prompt);
        EXPECT_FALSE(r.params.preserved_tokens.empty());

        auto p = renderer->parser_params(r, req);
        EXPECT_TRUE(p.parse_tool_calls);
        EXPECT_EQ(p.reasoning_format, COMMON_REASONING_FORMAT_DEEPSEEK);
        EXPECT_FALSE(p.parser.empty());
    }

    // tool_choice required: the grammar applies from the first token.
    req.tool_choice = COMMON_CHAT_TOOL_CHOICE_REQUIRED;
    common_params_sampling sampling;
    chat_renderer::apply_to_sampling(qwen35().render(req), sampling);
    EXPECT_FALSE(sampling.grammar.empty());
    EXPECT_FALSE(sampling.grammar_lazy);
}

// A required call starts the answer with the tool-call marker, so the model cannot write text until its limit. With
// thinking on by default it gives way; thinking the request asked for is a 400 naming the field to turn off.
TEST(ChatRenderer, RequiredToolCallStartsTheAnswerWhateverTheThinkingDefault) {
    for (const chat_renderer* renderer : {&qwen3(), &qwen35()}) {
        ASSERT_FALSE(renderer->tool_call_marker().empty());
        auto req = request(R"([{"role":"user","content":"weather?"}])", weather_tools);
        req.tool_choice = COMMON_CHAT_TOOL_CHOICE_REQUIRED;
        const auto r = renderer->render(req);
        EXPECT_TRUE(r.tool_call_prefilled);
        EXPECT_TRUE(ends_with(r.prompt, renderer->tool_call_marker())) << r.prompt;
        const std::string answer = r.prompt.substr(r.prompt.rfind("<|im_start|>assistant"));
        EXPECT_TRUE(answer.find("<think>") == std::string::npos || answer.find("</think>") != std::string::npos)
            << "no open reasoning block before the call: " << answer;

        req.enable_thinking = true;
        try {
            renderer->render(req);
            ADD_FAILURE() << "thinking asked for with a required call must be a 400";
        } catch (const request_error& e) {
            EXPECT_EQ(e.status, 400);
            EXPECT_NE(std::string(e.what()).find("'chat_template_kwargs.enable_thinking'"), std::string::npos)
                << e.what();
        }
        req.api = "anthropic";
        EXPECT_THROW(renderer->render(req), request_error);
        req.enable_thinking.reset();
        req.tool_choice = COMMON_CHAT_TOOL_CHOICE_AUTO;  // no call required: thinking stays on
        EXPECT_FALSE(renderer->render(req).tool_call_prefilled);
    }
}

TEST(ChatRenderer, ResponseFormatGrammarAndStops) {
    json body{{"messages", json::parse(R"([{"role":"user","content":"json please"}])")},
              {"response_format", json::parse(R"({"type":"json_schema","json_schema":{"name":"x","schema":
                  {"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}}})")},
              {"stop", "END"}};
    auto req = parse_chat_request(body);
    auto r = qwen3().render(req);
    EXPECT_FALSE(r.grammar.empty());
    EXPECT_EQ(r.stop.at(0), "END");
    common_params_sampling sampling;
    chat_renderer::apply_to_sampling(r, sampling);
    EXPECT_FALSE(sampling.grammar_lazy);

    chat_output_parser parser(qwen3().parser_params(r, req));
    auto res = stream(parser, "{\"a\": 5}", 3);
    EXPECT_EQ(json::parse(res.final_msg.content), json::parse(R"({"a":5})"));
}

TEST(ChatRenderer, TemplateErrorsAre400) {
    // Qwen3.5's template raises when there is no user query.
    try {
        qwen35().render(request(R"([{"role":"system","content":"only system"}])"));
        FAIL() << "expected a 400";
    } catch (const request_error& e) {
        EXPECT_EQ(e.status, 400);
        EXPECT_NE(std::string(e.what()).find("No user query found in messages."), std::string::npos) << e.what();
    }
    EXPECT_THROW(qwen3().render(request(R"([{"role":"user","content":"q"},{"role":"assistant","content":"a"},
                                             {"role":"assistant","content":"b"}])")),
                 request_error);
}

TEST(ChatRenderer, MultiTurnPromptIsPrefixExtension) {
    // Turn 1, then the reply carried back plus a new user turn.
    auto turn1 = request(R"([{"role":"system","content":"sys"},{"role":"user","content":"Hi"}])");
    auto turn2 = request(R"([{"role":"system","content":"sys"},{"role":"user","content":"Hi"},
        {"role":"assistant","content":"Hello!","reasoning_content":"greet back"},
        {"role":"user","content":"More"}])");
    for (const chat_renderer* renderer : {&qwen3(), &qwen35()}) {
        auto p1 = renderer->render(turn1).prompt;
        auto p2 = renderer->render(turn2).prompt;
        // Qwen3 ends turn 1 with "<|im_start|>assistant\n": the next turn extends it.
        // Qwen3.5 opens "<think>\n" in the generation prompt but drops reasoning of turns before the last user
        // query, so only up to "<|im_start|>assistant\n" is shared.
        std::string shared = p1.substr(0, p1.rfind("<|im_start|>assistant\n") + 22);
        EXPECT_TRUE(starts_with(p2, shared)) << p1 << "\n----\n" << p2;
        if (renderer == &qwen3()) {
            EXPECT_TRUE(starts_with(p2, p1)) << p1 << "\n----\n" << p2;
        }
        // What the model generated in turn 1 (reasoning included) is NOT reproduced in turn 2 by either template:
        // history reasoning is dropped, so KV reuse stops at the start of the previous assistant reply.
        std::string generated =
            renderer == &qwen3() ? "<think>\ngreet back\n</think>\n\nHello!" : "greet back\n</think>\n\nHello!";
        EXPECT_FALSE(starts_with(p2, renderer->render(turn1).prompt + generated));
    }
}

TEST(ChatRenderer, ToolLoopPromptReproducesGeneratedText) {
    // Within one user query (agentic tool loop) the templates keep the reasoning, so prompt + generated text is
    // exactly re-rendered and the whole KV cache is reusable.
    auto turn1 = request(R"([{"role":"user","content":"Weather in Paris?"}])", weather_tools);
    const std::string qwen3_generated =
        "<think>\nI should call the tool.\n</think>\n\n"
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    const std::string qwen35_generated =
        "I should call the tool.\n</think>\n\n"
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>";
    for (const chat_renderer* renderer : {&qwen3(), &qwen35()}) {
        const std::string& generated = renderer == &qwen3() ? qwen3_generated : qwen35_generated;
        auto r1 = renderer->render(turn1);
        chat_output_parser parser(renderer->parser_params(r1, turn1));
        auto msg = stream(parser, generated, 7).final_msg;
        ASSERT_EQ(msg.tool_calls.size(), 1u) << generated;
        EXPECT_EQ(trim(msg.reasoning_content), "I should call the tool.");

        // Carry the parsed reply back as a client would, plus the tool result.
        json assistant = assistant_message_json(msg);
        json messages = json::parse(R"([{"role":"user","content":"Weather in Paris?"}])");
        messages.push_back(assistant);
        messages.push_back(json{{"role", "tool"}, {"tool_call_id", msg.tool_calls[0].id}, {"content", "sunny"}});
        auto turn2 = parse_chat_request(json{{"messages", messages}, {"tools", json::parse(weather_tools)}});
        auto p2 = renderer->render(turn2).prompt;
        EXPECT_TRUE(starts_with(p2, r1.prompt + generated)) << r1.prompt + generated << "\n----\n" << p2;
    }
}

TEST(ChatRenderer, PrefillContinuesAssistantMessage) {
    auto req = request(R"([{"role":"user","content":"Count"},{"role":"assistant","content":"1, 2,"}])");
    req.enable_thinking = false;
    auto r = qwen3().render(req);
    EXPECT_TRUE(r.continuation);
    EXPECT_TRUE(ends_with(r.prompt, "1, 2,")) << r.prompt;
    chat_output_parser parser(qwen3().parser_params(r, req));
    auto res = stream(parser, " 3", 1);
    // The prefill is not streamed again; only the continuation is.
    EXPECT_EQ(accumulate(res.diffs).content, " 3");
    // The final message, like llama-server's, holds the whole assistant turn, prefill included.
    EXPECT_EQ(res.final_msg.content, "1, 2, 3");
}

// Below always_parse_bytes every piece of text is streamed as it comes.
TEST(ChatOutputParser, ShortAnswersStreamEveryPiece) {
    auto req = request(R"([{"role":"user","content":"hi"}])");
    req.enable_thinking = false;
    auto r = qwen3().render(req);
    chat_output_parser parser(qwen3().parser_params(r, req));
    auto fake_now = chat_output_parser::clock::time_point{};
    parser.set_clock([&] { return fake_now += std::chrono::seconds(1); });  // however slow parsing looks
    for (size_t i = 0; i < chat_output_parser::always_parse_bytes / 5 - 1; ++i) {
        ASSERT_EQ(accumulate(parser.push("word ")).content, "word ") << "piece " << i;
    }
}

// A long answer: the parser re-parses only after idle_per_parse times a parse's cost has passed, and the text pushed
// meanwhile comes with the next parse. The clock here moves 1 ms per reading, so every parse "takes" 1 ms: about
// one push in idle_per_parse parses. Nothing is lost: the deltas add up to the answer.
TEST(ChatOutputParser, LongAnswersParseLessOftenAndLoseNothing) {
    auto req = request(R"([{"role":"user","content":"hi"}])", weather_tools);
    req.enable_thinking = false;
    auto r = qwen3().render(req);
    chat_output_parser parser(qwen3().parser_params(r, req));
    auto fake_now = chat_output_parser::clock::time_point{};
    parser.set_clock([&] { return fake_now += std::chrono::milliseconds(1); });
    std::string text(chat_output_parser::always_parse_bytes, 'x');
    std::vector<common_chat_msg_diff> diffs = parser.push(text);
    int parsed_pushes = 0;
    const int pushes = 600;
    for (int i = 0; i < pushes; ++i) {
        const std::string piece = " token" + std::to_string(i);
        text += piece;
        const auto d = parser.push(piece);
        if (!d.empty()) ++parsed_pushes;
        diffs.insert(diffs.end(), d.begin(), d.end());
    }
    EXPECT_GE(parsed_pushes, pushes / chat_output_parser::idle_per_parse / 2);
    EXPECT_LE(parsed_pushes, pushes / chat_output_parser::idle_per_parse + 2);
    std::vector<common_chat_msg_diff> last;
    const common_chat_msg answer = parser.finish(&last);
    diffs.insert(diffs.end(), last.begin(), last.end());
    EXPECT_EQ(answer.content, text);
    EXPECT_EQ(accumulate(diffs).content, text);
}

// parallel_tool_calls false: the pinned llama.cpp's grammar for Qwen3's calls repeats them whatever the request says,
// so the parser keeps to one. Nothing of a second call is emitted, the final message has the first, and the parser
// says the generation can stop.
TEST(ChatOutputParser, OneCallWhenParallelCallsAreOff) {
    auto req = request(R"([{"role":"user","content":"Weather in Paris and Rome?"}])", weather_tools);
    auto r = qwen3().render(req);
    chat_output_parser parser(qwen3().parser_params(r, req));
    parser.limit_tool_calls(1);
    const std::string text =
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Ro";
    auto res = stream(parser, text, 4);
    EXPECT_TRUE(parser.tool_calls_overflowed());
    ASSERT_EQ(res.final_msg.tool_calls.size(), 1u);
    EXPECT_EQ(json::parse(res.final_msg.tool_calls[0].arguments), json::parse(R"({"city":"Paris"})"));
    const common_chat_msg streamed = accumulate(res.diffs);
    ASSERT_EQ(streamed.tool_calls.size(), 1u);
    EXPECT_EQ(json::parse(streamed.tool_calls[0].arguments), json::parse(R"({"city":"Paris"})"));
    EXPECT_EQ(streamed.tool_calls[0].id, res.final_msg.tool_calls[0].id);

    chat_output_parser unlimited(qwen3().parser_params(r, req));  // the default: as many as the model writes
    EXPECT_EQ(stream(unlimited, text + "me\"}}\n</tool_call>", 4).final_msg.tool_calls.size(), 2u);
    EXPECT_FALSE(unlimited.tool_calls_overflowed());
}

TEST(ChatOutputParser, StreamsToolCallInPieces) {
    auto req = request(R"([{"role":"user","content":"Weather in Paris?"}])", weather_tools);
    auto r = qwen3().render(req);
    chat_output_parser parser(qwen3().parser_params(r, req));
    const std::string text =
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    auto res = stream(parser, text, 3);
    EXPECT_EQ(parser.text(), text);

    ASSERT_EQ(res.final_msg.tool_calls.size(), 1u);
    const auto& call = res.final_msg.tool_calls[0];
    EXPECT_EQ(call.name, "get_weather");
    EXPECT_EQ(json::parse(call.arguments), json::parse(R"({"city":"Paris"})"));
    EXPECT_FALSE(call.id.empty());
    EXPECT_TRUE(res.final_msg.content.empty());

    // Several argument fragments were streamed, and they add up to the final message with the same id.
    size_t tool_diffs = 0;
    for (const auto& d : res.diffs) {
        tool_diffs += d.tool_call_index != std::string::npos;
    }
    EXPECT_GE(tool_diffs, 2u);
    auto acc = accumulate(res.diffs);
    ASSERT_EQ(acc.tool_calls.size(), 1u);
    EXPECT_EQ(acc.tool_calls[0].name, "get_weather");
    EXPECT_EQ(acc.tool_calls[0].id, call.id);
    EXPECT_EQ(acc.tool_calls[0].arguments, call.arguments);
    EXPECT_TRUE(acc.content.empty());

    // The chunk JSON for these deltas: role first, then index/id/name on the first tool-call fragment.
    auto chunks = chat_chunk_json("chatcmpl-x", "m", 1, res.diffs, true);
    EXPECT_EQ(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    const auto& first_call = chunks[1]["choices"][0]["delta"]["tool_calls"][0];
    EXPECT_EQ(first_call["index"], 0);
    EXPECT_EQ(first_call["id"], call.id);
    EXPECT_EQ(first_call["function"]["name"], "get_weather");
    EXPECT_TRUE(parser.has_tool_calls());
    auto fin = chat_final_chunk_json("chatcmpl-x", "m", 1, res.final_msg, chat_finish_reason(res.final_msg, false));
    EXPECT_EQ(fin["choices"][0]["finish_reason"], "tool_calls");
}

// An agent's client shows a call as it is written (the tool's name, then its arguments as they grow): nothing of a call
// waits for the call to end. Fed one byte at a time, the name is streamed before the first argument's value begins,
// and the value's text streams as it comes, in both of Qwen's formats (JSON in <tool_call>, and XML parameters).
TEST(ChatOutputParser, ToolCallNameAndArgumentsStreamAsTheyAreGenerated) {
    auto req = request(R"([{"role":"user","content":"Weather in Paris?"}])", weather_tools);
    const std::string value = "Paris, the capital of France";
    const std::string qwen3_text =
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"" + value + "\"}}\n</tool_call>";
    const std::string qwen35_text =
        "<tool_call>\n<function=get_weather>\n<parameter=city>\n" + value + "\n</parameter>\n</function>\n</tool_call>";
    for (const chat_renderer* renderer : {&qwen3(), &qwen35()}) {
        const std::string& text = renderer == &qwen3() ? qwen3_text : qwen35_text;
        SCOPED_TRACE(text);
        auto r = renderer->render(req);
        chat_output_parser parser(renderer->parser_params(r, req));
        const size_t value_begins = text.find(value);
        size_t name_at = std::string::npos;
        std::vector<common_chat_msg_diff> diffs;
        for (size_t i = 0; i < text.size(); ++i) {
            for (auto& d : parser.push(std::string_view(text).substr(i, 1))) {
                if (!d.tool_call_delta.name.empty() && name_at == std::string::npos) name_at = i + 1;
                diffs.push_back(std::move(d));
            }
            if (i + 1 == value_begins + value.size() / 2) {
                // Half of the value generated: that half is in the client's hands.
                const std::string arguments = accumulate(diffs).tool_calls.at(0).arguments;
                EXPECT_NE(arguments.find(value.substr(0, value.size() / 2 - 1)), std::string::npos) << arguments;
            }
        }
        EXPECT_LE(name_at, value_begins) << "the name waited for the arguments";
        const auto message = accumulate(diffs);
        ASSERT_EQ(message.tool_calls.size(), 1u);
        EXPECT_EQ(message.tool_calls[0].name, "get_weather");
    }
}

TEST(ChatOutputParser, Qwen35XmlToolCall) {
    auto req = request(R"([{"role":"user","content":"Weather in Paris?"}])", weather_tools);
    auto r = qwen35().render(req);
    chat_output_parser parser(qwen35().parser_params(r, req));
    auto res = stream(parser,
                      "Let me check.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                      "</parameter>\n</function>\n</tool_call>",
                      4);
    EXPECT_EQ(trim(res.final_msg.reasoning_content), "Let me check.");
    ASSERT_EQ(res.final_msg.tool_calls.size(), 1u);
    EXPECT_EQ(res.final_msg.tool_calls[0].name, "get_weather");
    EXPECT_EQ(json::parse(res.final_msg.tool_calls[0].arguments), json::parse(R"({"city":"Paris"})"));
    auto acc = accumulate(res.diffs);
    EXPECT_EQ(acc.reasoning_content, res.final_msg.reasoning_content);
    ASSERT_EQ(acc.tool_calls.size(), 1u);
    EXPECT_EQ(acc.tool_calls[0].arguments, res.final_msg.tool_calls[0].arguments);
}

TEST(ChatOutputParser, PlainTextAndReasoning) {
    auto req = request(R"([{"role":"user","content":"hi"}])");
    auto r = qwen3().render(req);
    {
        chat_output_parser parser(qwen3().parser_params(r, req));
        auto res = stream(parser, "Hello there, friend.", 2);
        EXPECT_EQ(res.final_msg.content, "Hello there, friend.");
        EXPECT_TRUE(res.final_msg.reasoning_content.empty());
        EXPECT_EQ(accumulate(res.diffs).content, "Hello there, friend.");
    }
    {
        chat_output_parser parser(qwen3().parser_params(r, req));
        auto res = stream(parser, "<think>abc</think>hello", 2);
        EXPECT_EQ(res.final_msg.reasoning_content, "abc");
        EXPECT_EQ(res.final_msg.content, "hello");
        auto acc = accumulate(res.diffs);
        EXPECT_EQ(acc.reasoning_content, "abc");
        EXPECT_EQ(acc.content, "hello");
    }
    {
        // Qwen3.5 opens <think> in the prompt: the model's text starts inside the reasoning.
        auto r35 = qwen35().render(req);
        chat_output_parser parser(qwen35().parser_params(r35, req));
        auto res = stream(parser, "abc</think>hello", 1);
        EXPECT_EQ(res.final_msg.reasoning_content, "abc");
        EXPECT_EQ(res.final_msg.content, "hello");
    }
}

TEST(ChatOutputParser, TruncatedToolCallFallsBackToRawText) {
    auto req = request(R"([{"role":"user","content":"Weather in Paris?"}])", weather_tools);
    auto r = qwen3().render(req);
    chat_output_parser parser(qwen3().parser_params(r, req));
    const std::string text = "Checking.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"ci";
    for (char c : text) {
        parser.push(std::string(1, c));  // must never throw
    }
    // common's lenient final parse yields a call with arguments "{"; we return the raw text instead.
    auto msg = parser.finish();
    EXPECT_EQ(msg.role, "assistant");
    EXPECT_TRUE(msg.tool_calls.empty());
    EXPECT_EQ(msg.content, text);
    EXPECT_EQ(chat_finish_reason(msg, true), "length");
}

TEST(ChatOutputParser, CallWithoutArguments) {
    auto req = request(R"([{"role":"user","content":"time?"}])",
                       R"([{"type":"function","function":{"name":"now","description":"current time"}}])");
    const std::pair<const chat_renderer*, std::string> cases[] = {
        {&qwen3(), "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"},
        {&qwen35(), "</think>\n\n<tool_call>\n<function=now>\n</function>\n</tool_call>"},
    };
    for (const auto& [renderer, text] : cases) {
        auto r = renderer->render(req);
        chat_output_parser parser(renderer->parser_params(r, req));
        auto res = stream(parser, text, 5);
        ASSERT_EQ(res.final_msg.tool_calls.size(), 1u) << text;
        EXPECT_EQ(res.final_msg.tool_calls[0].name, "now");
        EXPECT_EQ(json::parse(res.final_msg.tool_calls[0].arguments), json::object());
        EXPECT_EQ(accumulate(res.diffs).tool_calls.at(0).arguments, res.final_msg.tool_calls[0].arguments);
    }
}

TEST(ChatOutputParser, GarbageNeverThrows) {
    auto req = request(R"([{"role":"user","content":"Weather in Paris?"}])", weather_tools);
    for (const chat_renderer* renderer : {&qwen3(), &qwen35()}) {
        auto r = renderer->render(req);
        chat_output_parser parser(renderer->parser_params(r, req));
        for (const char* piece : {"</think>", "<tool_call>", "\n<function=", "nope>", "</tool_call>", "{\"", "\xff\xfe",
                                  "</function>", "<think>", "text"}) {
            parser.push(piece);
        }
        auto msg = parser.finish();
        EXPECT_EQ(msg.role, "assistant");
        EXPECT_EQ(parser.text(), "</think><tool_call>\n<function=nope></tool_call>{\"\xff\xfe</function><think>text");
    }
}

namespace {

using model_ptr = std::unique_ptr<llama_model, decltype(&llama_model_free)>;

// llama.cpp ships vocab-only GGUFs for its tokenizer tests: enough for token mapping without weights.
model_ptr load_vocab(const std::string& name) {
    const std::string path = std::string(KEEPWARM_LLAMA_SOURCE_DIR) + "/models/" + name;
    llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    return model_ptr(std::ifstream(path).good() ? llama_model_load_from_file(path.c_str(), mp) : nullptr,
                     llama_model_free);
}

}  // namespace

TEST(ChatRenderer, VocabMapsPreservedTokensAndTriggers) {
    // Gemma 4's vocab has its tool-call markers as single special tokens.
    auto model = load_vocab("ggml-vocab-gemma-4.gguf");
    if (!model) {
        FAIL() << "the pinned llama.cpp tree should hold models/ggml-vocab-gemma-4.gguf";
    }
    const llama_vocab* vocab = llama_model_get_vocab(model.get());
    chat_renderer renderer(model.get(), read_template("google-gemma-4-31B-it.jinja"));
    auto req = request(R"([{"role":"user","content":"Weather in Paris?"}])", weather_tools);
    auto r = renderer.render(req);
    common_params_sampling sampling;
    chat_renderer::apply_to_sampling(r, sampling, vocab);

    ASSERT_FALSE(r.params.preserved_tokens.empty());
    for (const auto& text : r.params.preserved_tokens) {
        auto ids = common_tokenize(vocab, text, false, true);
        EXPECT_EQ(ids.size() == 1 && sampling.preserved_tokens.count(ids[0]) == 1, ids.size() == 1) << text;
    }
    ASSERT_FALSE(sampling.grammar_triggers.empty());
    EXPECT_TRUE(sampling.grammar_lazy);
    size_t token_triggers = 0;
    for (const auto& t : sampling.grammar_triggers) {
        if (t.type == COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN) {
            token_triggers++;
            EXPECT_EQ(common_tokenize(vocab, t.value, false, true), std::vector<llama_token>{t.token}) << t.value;
            EXPECT_TRUE(sampling.preserved_tokens.count(t.token)) << t.value;
        }
    }
    EXPECT_GE(token_triggers, 1u);
    if (!r.params.thinking_start_tag.empty() && !r.params.thinking_end_tags.empty()) {
        EXPECT_EQ(sampling.reasoning_budget_start, common_tokenize(vocab, r.params.thinking_start_tag, false, true));
        ASSERT_FALSE(sampling.reasoning_budget_end.empty());
        EXPECT_EQ(sampling.reasoning_budget_end[0], common_tokenize(vocab, r.params.thinking_end_tags[0], false, true));
        EXPECT_EQ(sampling.reasoning_budget_tokens, -1);  // no budget: the tags only guard the lazy grammar
    }
}

TEST(ChatRenderer, ModelWithoutTemplateFallsBackToChatml) {
    auto model = load_vocab("ggml-vocab-qwen35.gguf");
    if (!model) {
        FAIL() << "the pinned llama.cpp tree should hold models/ggml-vocab-qwen35.gguf";
    }
    // This vocab file carries no chat template, so common falls back to ChatML.
    chat_renderer renderer(model.get());
    auto r = renderer.render(request(R"([{"role":"user","content":"hi"}])"));
    EXPECT_NE(r.prompt.find("<|im_start|>user\nhi<|im_end|>"), std::string::npos) << r.prompt;
    common_params_sampling sampling;
    chat_renderer::apply_to_sampling(r, sampling, llama_model_get_vocab(model.get()));
    EXPECT_TRUE(sampling.grammar.empty());
}

namespace {

// What chat_renderer passes to common_chat_templates_apply for `req` (no trailing assistant message): the reference
// every render must equal, spliced or not.
common_chat_params common_render(const common_chat_templates* templates, const chat_renderer& renderer,
                                 const chat_request& req) {
    common_chat_templates_inputs in;
    in.messages = req.messages;
    in.tools = req.tools;
    in.tool_choice = req.tool_choice;
    in.parallel_tool_calls = req.parallel_tool_calls.value_or(renderer.caps().at("supports_parallel_tool_calls"));
    in.json_schema = req.json_schema;
    in.use_jinja = true;
    in.reasoning_format = COMMON_REASONING_FORMAT_DEEPSEEK;
    in.enable_thinking = req.enable_thinking.value_or(renderer.supports_thinking());
    in.add_generation_prompt = true;
    in.chat_template_kwargs["preserve_reasoning"] = "true";
    for (const auto& [k, v] : req.chat_template_kwargs) in.chat_template_kwargs[k] = v;
    return common_chat_templates_apply(templates, in);
}

// Every field of common's result, compared one by one so a failure names the field.
void expect_same(const common_chat_params& want, const chat_renderer::rendered& rendered, const std::string& where) {
    EXPECT_EQ(want.prompt, rendered.prompt) << where;
    const common_chat_params& got = rendered.params;
    EXPECT_EQ(want.generation_prompt, got.generation_prompt) << where;
    EXPECT_EQ(want.format, got.format) << where;
    EXPECT_EQ(want.grammar, got.grammar) << where;
    EXPECT_EQ(want.grammar_lazy, got.grammar_lazy) << where;
    EXPECT_EQ(want.supports_thinking, got.supports_thinking) << where;
    EXPECT_EQ(want.thinking_start_tag, got.thinking_start_tag) << where;
    EXPECT_EQ(want.thinking_end_tags, got.thinking_end_tags) << where;
    ASSERT_EQ(want.grammar_triggers.size(), got.grammar_triggers.size()) << where;
    for (size_t i = 0; i < want.grammar_triggers.size(); ++i) {
        EXPECT_EQ(want.grammar_triggers[i].type, got.grammar_triggers[i].type) << where;
        EXPECT_EQ(want.grammar_triggers[i].value, got.grammar_triggers[i].value) << where;
        EXPECT_EQ(want.grammar_triggers[i].token, got.grammar_triggers[i].token) << where;
    }
    EXPECT_EQ(want.preserved_tokens, got.preserved_tokens) << where;
    EXPECT_EQ(want.additional_stops, got.additional_stops) << where;
    EXPECT_EQ(want.parser, got.parser) << where;
    EXPECT_EQ(want.message_delimiters.to_json().dump(), got.message_delimiters.to_json().dump()) << where;
}

struct template_case {
    const char* file;
    const char* bos;
    const char* eos;
    bool tools = true;           // the template renders tool calls and results
    size_t calls_per_turn = 3;   // most tool calls in one assistant message
    bool expect_spliced = true;  // the render cache should splice most warm turns
};

// Text with what templates treat specially: surrounding whitespace, think tags, quotes, backslashes, JSON, unicode,
// special-token lookalikes.
const char* const pieces[] = {
    "plain words",
    " leading space",
    "trailing space ",
    "\nleading newline",
    "trailing newline\n",
    "\n\n",
    "quotes \"q\" and 'single'",
    "back\\slash and \\n literal",
    "Grüße 東京 🎉 naïve",
    "<think>inner thought</think>",
    "</think>",
    "<think>",
    "{\"json\": [1, 2, {\"a\": null}]}",
    "tabs\tand\r\nCRLF",
    "<|im_end|> [INST] <end_of_turn>",
    "x",
};

// Random agent sessions, request by request, as a client sends them: tool loops, answers, new user turns, retries
// of the same request, and going back to an earlier request to branch differently.
class session_simulator {
public:
    session_simulator(uint32_t seed, const template_case& tc) : rng_(seed), tc_(tc) {}

    json start() {
        json messages = json::array();
        if (pick(3) > 0) messages.push_back({{"role", "system"}, {"content", text(2)}});
        // A first user message in tags or only whitespace is never spliced (see chat-render-cache.h); real ones aren't.
        messages.push_back({{"role", "user"}, {"content", "Task: " + text(2)}});
        history_.push_back(messages);
        return messages;
    }

    json next() {
        json messages = history_.back();
        const size_t r = pick(10);
        if (r == 0) return messages;  // the same request again
        if (r == 1 && history_.size() > 2) {
            messages = history_[history_.size() - 1 - 1 - pick(history_.size() - 2)];  // branch from an earlier one
        }
        if (tc_.tools && pick(3) > 0) {
            json calls = json::array();
            const size_t n = 1 + pick(tc_.calls_per_turn);
            for (size_t i = 0; i < n; ++i) {
                json args{{"path", text(1)}, {"line", static_cast<int>(pick(500))}};
                calls.push_back({{"id", call_id()},
                                 {"type", "function"},
                                 {"function", {{"name", "read_file"}, {"arguments", args.dump()}}}});
            }
            json assistant{{"role", "assistant"}, {"content", pick(2) ? "" : text(1)}, {"tool_calls", calls}};
            if (pick(2)) assistant["reasoning_content"] = text(2);
            messages.push_back(assistant);
            for (const auto& call : calls) {
                messages.push_back({{"role", "tool"}, {"tool_call_id", call["id"]}, {"content", text(2)}});
            }
        } else {
            json assistant{{"role", "assistant"}, {"content", text(2)}};
            if (pick(2)) assistant["reasoning_content"] = text(1);
            messages.push_back(assistant);
            messages.push_back({{"role", "user"}, {"content", user_text()}});
        }
        history_.push_back(messages);
        return messages;
    }

private:
    size_t pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }

    std::string text(size_t max_pieces) {
        std::string out;
        const size_t n = 1 + pick(max_pieces + 1);
        for (size_t i = 0; i < n; ++i) out += pieces[pick(std::size(pieces))];
        return out;
    }

    std::string user_text() {
        // Qwen's templates do not count a user message wrapped in <tool_response> tags as a new query.
        return pick(8) == 0 ? "<tool_response>\n" + text(1) + "\n</tool_response>" : text(2);
    }

    std::string call_id() {  // Mistral wants 9 alphanumeric characters
        static const char alnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        std::string id;
        for (int i = 0; i < 9; ++i) id += alnum[pick(sizeof alnum - 1)];
        return id;
    }

    std::mt19937 rng_;
    template_case tc_;
    std::vector<json> history_;
};

const char* const session_tools = R"([{"type":"function","function":{"name":"read_file","description":"Read a file",
    "parameters":{"type":"object","properties":{"path":{"type":"string"},"line":{"type":"integer"}},
    "required":["path"]}}}])";

#if defined(__SANITIZE_ADDRESS__)
constexpr int session_scale = 1;  // the template engine allocates a lot: ~10x slower under the sanitizers
#else
constexpr int session_scale = 3;
#endif

struct session_options {
    bool tools = true;             // requests carry tool definitions
    std::optional<bool> thinking;  // enable_thinking; unset: the template's default
    uint32_t seed = 1000;          // first session's seed
    int sessions = 2;              // times session_scale
    int turns = 10;                // requests per session
};

// Sessions (of one request key), every request rendered by the renderer (cache included) and by common; all fields
// must match.
void check_sessions(const template_case& tc, const session_options& o) {
    const std::string source = read_template(tc.file);
    chat_renderer renderer(source, tc.bos, tc.eos);
    auto templates = common_chat_templates_init(nullptr, source, tc.bos, tc.eos);
    size_t renders = 0;
    for (int s = 0; s < o.sessions * session_scale; ++s) {
        session_simulator sim(o.seed + s, tc);
        json messages = sim.start();
        for (int t = 0; t < o.turns; ++t, messages = sim.next()) {
            json body{{"messages", messages}};
            if (o.tools) body["tools"] = json::parse(session_tools);
            chat_request req = parse_chat_request(body);
            req.enable_thinking = o.thinking;
            const std::string where = std::string(tc.file) + " session " + std::to_string(s) + " turn " +
                                      std::to_string(t) + "\n" + messages.dump();
            common_chat_params want;
            try {
                want = common_render(templates.get(), renderer, req);
            } catch (const std::exception& e) {
                EXPECT_THROW(renderer.render(req), request_error) << where;
                continue;
            }
            auto got = renderer.render(req);
            ++renders;
            expect_same(want, got, where);
            if (::testing::Test::HasFailure()) return;
        }
    }
    const auto stats = renderer.render_stats();
    std::printf("%s: %zu renders, %lu spliced, %lu keys trusted, %lu refused, %lu self-checks failed\n", tc.file,
                renders, static_cast<unsigned long>(stats.spliced), static_cast<unsigned long>(stats.keys_trusted),
                static_cast<unsigned long>(stats.keys_refused), static_cast<unsigned long>(stats.cuts_rejected));
    if (tc.expect_spliced) {
        EXPECT_GE(stats.spliced * 2, renders) << "most renders of " << tc.file << " should have been spliced";
    } else {
        EXPECT_EQ(stats.spliced, 0u);
    }
}

const template_case qwen3_case{"Qwen-Qwen3-0.6B.jinja", "", "<|im_end|>"};
const template_case qwen35_case{"Qwen3.5-4B.jinja", "", "<|im_end|>"};

}  // namespace

// Each test checks one request key (tools, thinking): the first full render of a key runs the cache's own check.
TEST(ChatRenderCache, Qwen3ToolSessionsMatchCommon) {
    check_sessions(qwen3_case, {});
}

TEST(ChatRenderCache, Qwen3SessionsWithoutToolsOrThinkingMatchCommon) {
    check_sessions(qwen3_case, {.tools = false, .thinking = false, .seed = 2000});
}

TEST(ChatRenderCache, Qwen35ToolSessionsMatchCommon) {
    check_sessions(qwen35_case, {});
}

TEST(ChatRenderCache, Qwen35SessionsWithoutToolsOrThinkingMatchCommon) {
    check_sessions(qwen35_case, {.tools = false, .thinking = false, .seed = 2000});
}

TEST(ChatRenderCache, Llama31SessionsMatchCommon) {
    check_sessions({"meta-llama-Llama-3.1-8B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>", true, 1}, {});
}

TEST(ChatRenderCache, Gemma2SessionsMatchCommon) {
    check_sessions({"google-gemma-2-2b-it.jinja", "<bos>", "<eos>", false}, {.tools = false});
}

TEST(ChatRenderCache, MistralNemoIsNeverSplicedButMatchesCommon) {
    // Nemo moves the system prompt into the user message that ends the chat, so a head renders differently on its
    // own than in front of a window: no window can be cut out, every render is common's.
    check_sessions({"mistralai-Mistral-Nemo-Instruct-2407.jinja", "<s>", "</s>", true, 3, false},
                   {.sessions = 1, .turns = 8});
}

TEST(ChatRenderCache, Gemma4IsNeverSplicedButMatchesCommon) {
    // common renders Gemma 4 through a handler that merges tool results into assistant messages: not spliceable.
    check_sessions({"google-gemma-4-31B-it.jinja", "<bos>", "<eos>", true, 3, false}, {.sessions = 1, .turns = 6});
}

TEST(ChatRenderCache, TemplateCarryingStateAcrossMessagesIsNeverSpliced) {
    // DeepSeek R1's template opens the tool-call block for the first tool call of the whole chat only: a window
    // cannot know whether it comes first. The cache's check of the request key finds that out and refuses the key.
    check_sessions({"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "", "", true, 3, false},
                   {.sessions = 1, .turns = 8});
}

TEST(ChatRenderCache, TemplateReadingTheSystemPromptLaterMatchesCommon) {
    // Windows render the head (system prompt, first user message) with stand-in text. This template reads the system
    // prompt again further on: a "/no_think" there marks every assistant message and the generation prompt. Its
    // conversations must still match common: the first full render's windows disagree with common's prompt, and
    // such a conversation is not remembered; conversations without the marker are spliced.
    const std::string source =
        "{%- set quiet = messages[0].role == 'system' and '/no_think' in messages[0].content -%}"
        "{%- for m in messages -%}<|im_start|>{{ m.role }}\n"
        "{%- if m.role == 'assistant' and quiet %}[quiet] {% endif %}{{ m.content }}<|im_end|>\n{% endfor -%}"
        "{%- if add_generation_prompt %}<|im_start|>assistant\n{% if quiet %}<think>\n\n</think>\n\n{% endif %}"
        "{%- endif -%}";
    chat_renderer renderer(source, "", "<|im_end|>");
    auto templates = common_chat_templates_init(nullptr, source, "", "<|im_end|>");
    const template_case tc{"inline", "", "<|im_end|>", false};
    for (const char* system : {"Be brief. /no_think Really.", "A long system prompt that says nothing special."}) {
        session_simulator sim(4242, tc);
        json messages = sim.start();
        const auto spliced_before = renderer.render_stats().spliced;
        for (int t = 0; t < 8; ++t, messages = sim.next()) {
            if (messages[0]["role"] != "system") messages.insert(messages.begin(), json{{"role", "system"}});
            messages[0]["content"] = system;
            const chat_request req = parse_chat_request(json{{"messages", messages}});
            const std::string where = std::string(system) + " turn " + std::to_string(t) + "\n" + messages.dump();
            expect_same(common_render(templates.get(), renderer, req), renderer.render(req), where);
            if (::testing::Test::HasFailure()) return;
        }
        const auto spliced = renderer.render_stats().spliced - spliced_before;
        if (std::string_view(system).find("/no_think") != std::string_view::npos) {
            EXPECT_EQ(spliced, 0u) << system;
        } else {
            EXPECT_GT(spliced, 0u) << system;
        }
    }
}

TEST(ChatRenderCache, ConcurrentSessionsMatchCommon) {
    // Three threads extend their own conversations through one renderer at once.
    const template_case& tc = qwen3_case;
    const std::string source = read_template(tc.file);
    chat_renderer renderer(source, tc.bos, tc.eos);
    auto templates = common_chat_templates_init(nullptr, source, tc.bos, tc.eos);
    std::vector<std::vector<std::pair<chat_request, common_chat_params>>> expected(3);
    for (int s = 0; s < 3; ++s) {
        session_simulator sim(7000 + s, tc);
        json messages = sim.start();
        for (int t = 0; t < 6; ++t, messages = sim.next()) {
            chat_request req = parse_chat_request(json{{"messages", messages}, {"tools", json::parse(session_tools)}});
            expected[s].emplace_back(req, common_render(templates.get(), renderer, req));
        }
    }
    std::vector<std::string> failures(3);
    std::vector<std::thread> threads;
    for (int s = 0; s < 3; ++s) {
        threads.emplace_back([&, s] {
            for (const auto& [req, want] : expected[s]) {
                const auto got = renderer.render(req);
                if (got.prompt != want.prompt || got.params.parser != want.parser ||
                    got.params.generation_prompt != want.generation_prompt) {
                    failures[s] = "session " + std::to_string(s) + " differs at " + req.messages.back().content;
                    return;
                }
            }
        });
    }
    for (auto& t : threads) t.join();
    for (const auto& f : failures) EXPECT_TRUE(f.empty()) << f;
    EXPECT_GT(renderer.render_stats().spliced, 0u);
}

namespace {

// The long agent conversation of test-prompt-tokenizer's reports_the_cost_of_a_38k_token_turn: system prompt, one
// tool, tool calls and results every third turn, code, whitespace runs, digits and non-ASCII text.
json agent_conversation(int turns) {
    json messages = json::array();
    messages.push_back({{"role", "system"},
                        {"content",
                         "You are a coding agent. Answer briefly.\n\n  Rules:\n\t1. Never guess.\n\t2. Cite file:line "
                         "numbers like src/main.cpp:42.\n   3. Use tools when needed.  "}});
    const char* snippets[] = {
        "def add(a, b):\n    return a + b\n\n\nprint(add(2, 40))  # 42\n",
        "Grüße aus Köln! 東京の天気は？ naïve café — “quotes” and emoji 🎉🚀 ok",
        "Numbers: 3.14159, 2718281828, 1,000,000 and -0.0001e-10; ids 0x1F600 1234567890123",
        "    indented    with    runs     of      spaces\n\n\n\ttabs\t\tand\r\nCRLF lines   \n",
        "<not a special token> <|im_start without end | >  </think > <tool_call",
    };
    for (int t = 0; t < turns; ++t) {
        messages.push_back({{"role", "user"},
                            {"content", "Turn " + std::to_string(t) + ": " + snippets[t % 5] + "\nPlease check it."}});
        if (t % 3 == 1) {
            const std::string args =
                "{\"path\": \"src/file" + std::to_string(t) + ".cpp\", \"line\": " + std::to_string(100 + t) + "}";
            messages.push_back({{"role", "assistant"},
                                {"content", ""},
                                {"tool_calls",
                                 {{{"id", "call_" + std::to_string(t)},
                                   {"type", "function"},
                                   {"function", {{"name", "read_file"}, {"arguments", args}}}}}}});
            messages.push_back({{"role", "tool"},
                                {"tool_call_id", "call_" + std::to_string(t)},
                                {"content", std::string(snippets[(t + 2) % 5]) + snippets[(t + 3) % 5]}});
        }
        messages.push_back({{"role", "assistant"},
                            {"content", "Answer " + std::to_string(t) + ": " + snippets[(t + 1) % 5] + " Done."}});
    }
    messages.push_back({{"role", "user"}, {"content", "And now?"}});
    return {{"messages", messages}, {"tools", json::parse(session_tools)}};
}

}  // namespace

TEST(ChatRenderCache, ReportsTheCostOfA38kTokenTurn) {
    using clock = std::chrono::steady_clock;
    auto ms = [](clock::time_point a, clock::time_point b) {
        return std::chrono::duration<double, std::milli>(b - a).count();
    };
    for (const char* file : {"Qwen-Qwen3-0.6B.jinja", "Qwen3.5-4B.jinja"}) {
        const std::string source = read_template(file);
        chat_renderer renderer(source, "", "<|im_end|>");
        // 300 turns: ~40K tokens with Qwen's vocab (fewer under the sanitizers, where timings mean nothing). The
        // previous request lacks the last answer and user message.
#if defined(__SANITIZE_ADDRESS__)
        const json body = agent_conversation(30);
#else
        const json body = agent_conversation(300);
#endif
        json previous = body;
        previous["messages"].erase(previous["messages"].size() - 1);
        previous["messages"].erase(previous["messages"].size() - 1);
        const chat_request previous_req = parse_chat_request(previous);
        const chat_request req = parse_chat_request(body);

        const auto t0 = clock::now();
        renderer.render(previous_req);
        const auto t1 = clock::now();
        const auto warm = renderer.render(req);
        const auto t2 = clock::now();
        auto templates = common_chat_templates_init(nullptr, source, "", "<|im_end|>");
        const common_chat_params want = common_render(templates.get(), renderer, req);
        const auto t3 = clock::now();

        expect_same(want, warm, file);
        EXPECT_EQ(renderer.render_stats().spliced, 1u);
        std::printf(
            "38K-token turn, %s (%zu messages, %zu-byte prompt):\n  first render %.1f ms (common + checks), next turn "
            "%.2f ms (spliced); common_chat_templates_apply %.1f ms\n",
            file, req.messages.size(), warm.prompt.size(), ms(t0, t1), ms(t1, t2), ms(t2, t3));
    }
}

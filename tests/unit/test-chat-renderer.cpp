// Unit tests for chat template rendering and streaming output parsing (src/api/chat-renderer.*,
// src/api/chat-output-parser.*) against real Qwen templates from the pinned llama.cpp tree; no model needed.
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <sstream>

#include "api/chat-output-parser.h"
#include "api/chat-renderer.h"
#include "api/openai-api.h"
#include "http/http-server.h"
#include "llama.h"

using namespace keepwarm::api;
using keepwarm::http::http_error;

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
    } catch (const http_error& e) {
        EXPECT_EQ(e.status, 400);
        EXPECT_NE(std::string(e.what()).find("No user query found in messages."), std::string::npos) << e.what();
    }
    EXPECT_THROW(qwen3().render(request(R"([{"role":"user","content":"q"},{"role":"assistant","content":"a"},
                                             {"role":"assistant","content":"b"}])")),
                 http_error);
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

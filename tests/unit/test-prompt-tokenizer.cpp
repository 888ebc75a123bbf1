// Unit tests for the prompt tokenizer (src/api/prompt-tokenizer.*): exactly common_tokenize's result after random
// edits of long rendered chats (Qwen2 and Qwen3.5 vocabs, and every other BPE vocab in the pinned llama.cpp tree),
// the model's own token ids surviving a round trip through text, the token budget, and concurrent use.
#include <gtest/gtest.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "api/openai-api.h"
#include "chat/chat-renderer.h"
#include "chat/prompt-tokenizer.h"
#include "common.h"
#include "engine/llama-runtime.h"
#include "generated-models.h"
#include "llama-cpp.h"

using namespace keepwarm;
using keepwarm::prompt_tokenizer;

namespace {

bool quiet_progress(float, void*) {
    return true;
}

// Vocab-only models, loaded once per test binary.
const llama_model* load_vocab(const std::string& path) {
    static std::map<std::string, llama_model_ptr> loaded;
    static std::mutex mu;
    std::lock_guard lock(mu);
    auto& m = loaded[path];
    if (!m) {
        init_llama_runtime();
        llama_model_params mp = llama_model_default_params();
        mp.vocab_only = true;
        mp.progress_callback = quiet_progress;
        m.reset(llama_model_load_from_file(path.c_str(), mp));
        if (!m) throw std::runtime_error("cannot load " + path);
    }
    return m.get();
}

const llama_model* preset_model(const std::string& preset) {
    return load_vocab(test_models::generated_model("unit-prompt-tokenizer", preset));
}

std::vector<llama_token> full_tokenize(const llama_model* model, const std::string& text) {
    return common_tokenize(llama_model_get_vocab(model), text, /*add_special=*/true, /*parse_special=*/true);
}

// A multi-turn agent conversation with a system prompt, tools, tool calls and results, code with whitespace runs,
// digits and non-ASCII text; `turns` user/assistant rounds.
api::json conversation(int turns) {
    api::json messages = api::json::array();
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
    api::json tools = api::json::parse(R"([{"type":"function","function":{"name":"read_file",
        "description":"Read a file","parameters":{"type":"object","properties":{"path":{"type":"string"},
        "line":{"type":"integer"}},"required":["path"]}}}])");
    return {{"messages", messages}, {"tools", tools}};
}

std::string render(const llama_model* model, const api::json& body) {
    const chat_renderer renderer(model);
    return renderer.render(api::parse_chat_request(body)).prompt;
}

// Random edits that keep the text valid UTF-8, aimed at the places tokenization is most sensitive to: right after
// and before special tokens, inside whitespace runs and numbers, and anywhere.
class text_editor {
public:
    text_editor(uint32_t seed, std::vector<std::string> specials) : rng_(seed), specials_(std::move(specials)) {}

    std::string edit(const std::string& text) {
        std::string out = text;
        const size_t at = position(out);
        switch (pick(3)) {
            case 0:
                out.insert(at, snippet());
                break;
            case 1: {
                const size_t end = boundary(out, std::min(out.size(), at + 1 + pick(12)));
                out.erase(at, end - at);
                break;
            }
            default: {
                const size_t end = boundary(out, std::min(out.size(), at + 1 + pick(6)));
                out.replace(at, end - at, snippet());
                break;
            }
        }
        return out;
    }

private:
    size_t pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }

    // Moves forward to the start of a UTF-8 character.
    static size_t boundary(const std::string& s, size_t i) {
        while (i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) ++i;
        return i;
    }

    size_t position(const std::string& s) {
        if (pick(2) == 0) {  // next to a special token
            const std::string& sp = specials_[pick(specials_.size())];
            std::vector<size_t> hits;
            for (size_t p = s.find(sp); p != std::string::npos; p = s.find(sp, p + 1)) hits.push_back(p);
            if (!hits.empty()) {
                const size_t p = hits[pick(hits.size())];
                return pick(2) == 0 ? p + sp.size() : p;
            }
        }
        return boundary(s, pick(s.size() + 1));
    }

    std::string snippet() {
        static const char* common[] = {" ",     "  ",    "   ",  "\n",   "\n\n",    "\t", " \n",   "123",
                                       "45678", "9",     "3.14", "é",    "東京",    "🎉",  "hello", " world",
                                       "'s",    "'ll",   "ing",  "<|",   "|>",      "<",  ">",     "</",
                                       "_end",  "start", "x",    "\r\n", "    def", "()", "{}",    "\"a\": 1"};
        if (pick(4) == 0) return specials_[pick(specials_.size())];
        return common[pick(std::size(common))];
    }

    std::mt19937 rng_;
    std::vector<std::string> specials_;
};

// The canonical tokens of `text` with its first multi-letter token split into its first letter and the rest: a
// split the model may sample but tokenizing the text never gives.
std::vector<llama_token> split_one_word(const llama_vocab* vocab, const std::string& text) {
    std::vector<llama_token> out;
    bool split = false;
    for (const llama_token t : common_tokenize(vocab, text, false, true)) {
        const std::string p = common_token_to_piece(vocab, t, true);
        if (!split && p.size() >= 4) {
            for (const std::string& part : {p.substr(0, 1), p.substr(1)}) {
                for (const llama_token u : common_tokenize(vocab, part, false, true)) out.push_back(u);
            }
            split = true;
        } else {
            out.push_back(t);
        }
    }
    return out;
}

std::vector<std::string> qwen_specials() {
    return {"<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>", "<|endoftext|>"};
}

// Applies `edits` random edits (each to the original or to the previous edit's result) and checks every result
// against the full tokenization. Most results are recorded back, as the server does, so the index branches.
// `min_reused`: the share of all tokens that must come from the index (edits fall anywhere, so about half the text
// precedes them on average; vocabs whose special tokens overlap each other have fewer resume points).
void expect_exact_after_edits(const llama_model* model, const std::string& base, std::vector<std::string> specials,
                              int edits, uint32_t seed, double min_reused) {
    prompt_tokenizer pt(llama_model_get_vocab(model));
    ASSERT_TRUE(pt.indexed());
    pt.record(base, pt.tokenize(base), {});
    text_editor editor(seed, std::move(specials));
    std::string text = base;
    int failures = 0;
    size_t total = 0;
    for (int i = 0; i < edits && failures < 5; ++i) {
        text = editor.edit(i % 2 == 0 ? base : text);
        const std::vector<llama_token> expected = full_tokenize(model, text);
        const std::vector<llama_token> got = pt.tokenize(text);
        total += expected.size();
        if (got != expected) {
            ++failures;
            size_t d = 0;
            while (d < got.size() && d < expected.size() && got[d] == expected[d]) ++d;
            ADD_FAILURE() << "edit " << i << ": tokens differ at " << d << " of " << expected.size()
                          << "; text around it: '"
                          << common_detokenize(
                                 llama_model_get_vocab(model),
                                 std::vector<llama_token>(
                                     expected.begin() + static_cast<std::ptrdiff_t>(d > 8 ? d - 8 : 0),
                                     expected.begin() + static_cast<std::ptrdiff_t>(std::min(expected.size(), d + 8))),
                                 true)
                          << "'";
        }
        if (i % 4 != 3) pt.record(text, got, {});
    }
    const prompt_tokenizer::counters c = pt.snapshot();
    // The index was used: the test exercises the resume rule, not the fallback.
    EXPECT_GT(static_cast<double>(c.tokens_matched), min_reused * static_cast<double>(total))
        << "matched " << c.tokens_matched << " of " << total;
}

}  // namespace

TEST(prompt_tokenizer, equals_full_tokenization_after_random_edits_qwen2_vocab) {
    const llama_model* model = preset_model("tiny");
    const std::string base = render(model, conversation(16));
    ASSERT_GT(full_tokenize(model, base).size(), 2000u);
    expect_exact_after_edits(model, base, qwen_specials(), 400, 1, 0.35);
}

TEST(prompt_tokenizer, equals_full_tokenization_after_random_edits_qwen35_vocab) {
    const llama_model* model = preset_model("tiny-hybrid");
    const std::string base = render(model, conversation(16));
    ASSERT_GT(full_tokenize(model, base).size(), 2000u);
    expect_exact_after_edits(model, base, qwen_specials(), 400, 2, 0.35);
}

// The resume rule rests on how llama.cpp splits text at special tokens, which every BPE vocab shares: check it on
// all of them with their own special tokens. Other vocab types must fall back and still be exact.
TEST(prompt_tokenizer, equals_full_tokenization_for_every_vocab_in_the_llama_tree) {
    const std::filesystem::path dir = std::filesystem::path(KEEPWARM_LLAMA_SOURCE_DIR) / "models";
    std::vector<std::filesystem::path> files;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        if (entry.path().extension() == ".gguf") files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
    ASSERT_FALSE(files.empty());
    int indexed = 0;
    for (const auto& file : files) {
        SCOPED_TRACE(file.filename().string());
        const llama_model* model = load_vocab(file.string());
        const llama_vocab* vocab = llama_model_get_vocab(model);
        std::vector<std::string> specials;
        for (llama_token id = 0; id < llama_vocab_n_tokens(vocab) && specials.size() < 40; ++id) {
            // BOS is left out where the vocab adds it: llama.cpp warns about every doubled BOS.
            if (id == llama_vocab_bos(vocab) && llama_vocab_get_add_bos(vocab)) continue;
            if (llama_vocab_get_attr(vocab, id) & (LLAMA_TOKEN_ATTR_CONTROL | LLAMA_TOKEN_ATTR_USER_DEFINED)) {
                const std::string text = common_token_to_piece(vocab, id, true);
                if (!text.empty()) specials.push_back(text);
            }
        }
        if (specials.empty()) specials.push_back("\n");
        // A chat-like text made of the vocab's own special tokens around the same varied content.
        std::string base;
        const api::json body = conversation(4);
        size_t k = 0;
        for (const auto& m : body["messages"]) {
            base += specials[k % specials.size()] + m.value("role", "") + "\n" + m.value("content", "");
            base += specials[(k + 1) % specials.size()] + "\n";
            k += 2;
        }
        prompt_tokenizer pt(vocab);
        if (!pt.indexed()) {
            EXPECT_NE(llama_vocab_type(vocab), LLAMA_VOCAB_TYPE_BPE);
            pt.record(base, full_tokenize(model, base), {});
            EXPECT_EQ(pt.tokenize(base), full_tokenize(model, base));
            continue;
        }
        ++indexed;
        expect_exact_after_edits(model, base, specials, 100, 3, 0.05);
    }
    EXPECT_GE(indexed, 10) << "the BPE vocabs (llama-bpe, qwen2, gpt-2, ...) are indexed";
}

// The model split a word differently from how its text tokenizes; when that answer comes back as history, the
// model's split is what the KV cache holds and what tokenize() must return.
TEST(prompt_tokenizer, generated_tokens_come_back_unchanged) {
    const llama_model* model = preset_model("tiny");
    const llama_vocab* vocab = llama_model_get_vocab(model);
    const chat_renderer renderer(model);
    const std::string answer = "The weather in Copenhagen is lovely today.";
    api::json first = {{"messages", {{{"role", "user"}, {"content", "How is the weather?"}}}}};
    const std::string prompt_text = renderer.render(api::parse_chat_request(first)).prompt;

    const std::vector<llama_token> canonical = common_tokenize(vocab, answer, false, true);
    const std::vector<llama_token> generated = split_one_word(vocab, answer);
    ASSERT_NE(generated, canonical);
    ASSERT_EQ(common_detokenize(vocab, generated, true), answer);

    prompt_tokenizer pt(vocab);
    const std::vector<llama_token> prompt = pt.tokenize(prompt_text);
    ASSERT_EQ(prompt, full_tokenize(model, prompt_text));
    pt.record(prompt_text, prompt, generated);

    api::json second = first;
    second["messages"].push_back({{"role", "assistant"}, {"content", answer}});
    second["messages"].push_back({{"role", "user"}, {"content", "And tomorrow?"}});
    const std::string next_text = renderer.render(api::parse_chat_request(second)).prompt;
    ASSERT_EQ(next_text.rfind(prompt_text + answer + "<|im_end|>", 0), 0u) << next_text;

    std::vector<llama_token> expected = prompt;
    expected.insert(expected.end(), generated.begin(), generated.end());
    const std::vector<llama_token> rest =
        common_tokenize(vocab, next_text.substr(prompt_text.size() + answer.size()), false, true);
    expected.insert(expected.end(), rest.begin(), rest.end());
    const std::vector<llama_token> got = pt.tokenize(next_text);
    EXPECT_EQ(got, expected);
    EXPECT_NE(got, full_tokenize(model, next_text));

    // The next turn extends the same path: the first answer's split survives a second round trip too.
    pt.record(next_text, got, {});
    const std::string third_text = next_text + "Probably rain.<|im_end|>\n";
    const std::vector<llama_token> third = pt.tokenize(third_text);
    ASSERT_GE(third.size(), got.size());
    EXPECT_TRUE(std::equal(got.begin(), got.end(), third.begin()));
}

namespace {

// One chat turn: the prompt a server renders for `messages`, and what the next request renders after the answer
// `delivered` (as the client got it) and another user message.
struct turn {
    std::string prompt_text;
    std::string next_text;
};

turn chat_turn(const llama_model* model, api::json messages, const std::string& delivered) {
    const chat_renderer renderer(model);
    turn t;
    t.prompt_text = renderer.render(api::parse_chat_request({{"messages", messages}})).prompt;
    messages.push_back({{"role", "assistant"}, {"content", delivered}});
    messages.push_back({{"role", "user"}, {"content", "And tomorrow?"}});
    t.next_text = renderer.render(api::parse_chat_request({{"messages", messages}})).prompt;
    return t;
}

// prompt + generated + the canonical tokens of what `next_text` has after `covered` bytes.
std::vector<llama_token> continued(const llama_vocab* vocab, std::vector<llama_token> prompt,
                                   const std::vector<llama_token>& generated, const std::string& next_text,
                                   size_t covered) {
    prompt.insert(prompt.end(), generated.begin(), generated.end());
    const auto rest = common_tokenize(vocab, next_text.substr(covered), false, true);
    prompt.insert(prompt.end(), rest.begin(), rest.end());
    return prompt;
}

// An answer recorded as the server does: in `plain` as the model wrote it only, in `pt` also as the client got it
// (`delivered`). Returns the prompt's tokens and what the next turn must tokenize to: prompt + generated + the rest.
std::pair<std::vector<llama_token>, std::vector<llama_token>> record_answer(const llama_vocab* vocab,
                                                                            prompt_tokenizer& plain,
                                                                            prompt_tokenizer& pt, const turn& t,
                                                                            const std::vector<llama_token>& generated,
                                                                            const std::string& delivered) {
    const std::vector<llama_token> prompt = pt.tokenize(t.prompt_text);
    plain.record(t.prompt_text, prompt, generated);
    pt.record(t.prompt_text, prompt, generated);
    EXPECT_TRUE(pt.record_delivered(t.prompt_text, prompt, generated, delivered));
    return {prompt, continued(vocab, prompt, generated, t.next_text, t.prompt_text.size() + delivered.size())};
}

llama_token byte_token(const llama_vocab* vocab, unsigned char byte) {
    for (llama_token t = 0; t < llama_vocab_n_tokens(vocab); ++t) {
        const std::string p = common_token_to_piece(vocab, t, true);
        if (p.size() == 1 && static_cast<unsigned char>(p[0]) == byte) return t;
    }
    return LLAMA_TOKEN_NULL;
}

}  // namespace

// The model wrote "  Sure, ..." with whitespace around it; the client got the content trimmed, and sends that back.
// Re-tokenizing it cannot give the model's tokens (the first one is " Sure" or "  "), so only the delivered text's
// mapping can; and the turn after that still finds both answers' own tokens.
TEST(prompt_tokenizer, an_answer_delivered_trimmed_maps_back_to_the_models_tokens) {
    const llama_model* model = preset_model("tiny");
    const llama_vocab* vocab = llama_model_get_vocab(model);
    const std::string written = "  Sure, it is sunny in Copenhagen. \n";
    const std::string delivered = "Sure, it is sunny in Copenhagen.";
    const api::json messages = {{{"role", "user"}, {"content", "How is the weather?"}}};
    const turn t = chat_turn(model, messages, delivered);
    ASSERT_EQ(t.next_text.rfind(t.prompt_text + delivered + "<|im_end|>", 0), 0u) << t.next_text;
    const std::vector<llama_token> generated = common_tokenize(vocab, written, false, true);

    prompt_tokenizer plain(vocab), pt(vocab);
    const auto [prompt, expected] = record_answer(vocab, plain, pt, t, generated, delivered);
    const std::vector<llama_token> got = pt.tokenize(t.next_text);
    EXPECT_EQ(got, expected);
    EXPECT_NE(plain.tokenize(t.next_text), expected) << "without the delivered text, the answer is re-tokenized";

    // The next turn: its prompt (which went through the delivered path) is recorded with a new answer in the
    // model's own split; the turn after carries both answers back.
    const std::string second = "Rain, I am afraid.";
    const std::vector<llama_token> generated2 = split_one_word(vocab, second);
    ASSERT_NE(generated2, common_tokenize(vocab, second, false, true));
    pt.record(t.next_text, got, generated2);
    api::json longer = messages;
    longer.push_back({{"role", "assistant"}, {"content", delivered}});
    longer.push_back({{"role", "user"}, {"content", "And tomorrow?"}});
    const turn t2 = chat_turn(model, longer, second);
    ASSERT_EQ(t2.prompt_text, t.next_text);
    EXPECT_EQ(pt.tokenize(t2.next_text),
              continued(vocab, got, generated2, t2.next_text, t.next_text.size() + second.size()));
}

// The client went away in the middle of " sunny": it got "Sure, it is sun" and may send that back to have it
// continued. The tokens it got whole map back; the cut one and those after it are the continuation's to tokenize.
TEST(prompt_tokenizer, an_answer_cut_short_maps_back_as_far_as_the_client_got_it) {
    const llama_model* model = preset_model("tiny");
    const llama_vocab* vocab = llama_model_get_vocab(model);
    const std::string prompt_text = "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n";
    const std::vector<llama_token> generated = common_tokenize(vocab, "  Sure, it is sunny in Copenhagen", false, true);
    size_t whole = 0;  // tokens up to the end of " is"
    for (std::string text; whole < generated.size() && text != "  Sure, it is"; ++whole) {
        text += common_token_to_piece(vocab, generated[whole], true);
    }
    ASSERT_LT(whole, generated.size());

    prompt_tokenizer pt(vocab);
    const std::vector<llama_token> prompt = pt.tokenize(prompt_text);
    pt.record(prompt_text, prompt, generated);
    EXPECT_FALSE(pt.record_delivered(prompt_text, prompt, generated, "Sure, it is sun")) << "not the whole answer";
    ASSERT_TRUE(pt.record_delivered(prompt_text, prompt, generated, "Sure, it is sun", /*complete=*/false));
    const std::string continued_text = prompt_text + "Sure, it is sunny and warm";
    EXPECT_EQ(pt.tokenize(continued_text),
              continued(vocab, prompt, {generated.begin(), generated.begin() + static_cast<std::ptrdiff_t>(whole)},
                        continued_text, prompt_text.size() + std::string("Sure, it is").size()));
}

// A random model can write bytes that are not UTF-8; the client got U+FFFD in their place.
TEST(prompt_tokenizer, an_answer_delivered_with_replaced_bytes_maps_back_to_the_models_tokens) {
    const llama_model* model = preset_model("tiny");
    const llama_vocab* vocab = llama_model_get_vocab(model);
    const llama_token lone_lead_byte = byte_token(vocab, 0xE2);  // starts a 3-byte character that never comes
    ASSERT_NE(lone_lead_byte, LLAMA_TOKEN_NULL);
    std::vector<llama_token> generated = common_tokenize(vocab, "Price:", false, true);
    generated.push_back(lone_lead_byte);
    for (const llama_token t : common_tokenize(vocab, " fine", false, true)) generated.push_back(t);
    const std::string delivered = "Price:\xEF\xBF\xBD fine";
    const turn t = chat_turn(model, {{{"role", "user"}, {"content", "Cost?"}}}, delivered);

    prompt_tokenizer plain(vocab), pt(vocab);
    const auto expected = record_answer(vocab, plain, pt, t, generated, delivered).second;
    EXPECT_EQ(pt.tokenize(t.next_text), expected);
    EXPECT_NE(plain.tokenize(t.next_text), expected);
}

TEST(prompt_tokenizer, record_delivered_refuses_what_is_not_the_answer_trimmed) {
    const llama_model* model = preset_model("tiny");
    const llama_vocab* vocab = llama_model_get_vocab(model);
    const std::string prompt_text = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
    prompt_tokenizer pt(vocab);
    const std::vector<llama_token> prompt = pt.tokenize(prompt_text);
    const auto answer = common_tokenize(vocab, " Hello there, friend. ", false, true);
    EXPECT_FALSE(pt.record_delivered(prompt_text, prompt, answer, "Hello friend."));  // text removed inside
    EXPECT_FALSE(pt.record_delivered(prompt_text, prompt, answer, "Hello there"));    // more than whitespace cut
    EXPECT_FALSE(pt.record_delivered(prompt_text, prompt, answer, "Hello there, friend. And"));  // text added
    // Reasoning split off by the parser: the answer holds special tokens the client did not get as content.
    const auto reasoning = common_tokenize(vocab, "<think>\nhmm\n</think>\n\nHello", false, true);
    EXPECT_FALSE(pt.record_delivered(prompt_text, prompt, reasoning, "Hello"));
    EXPECT_EQ(pt.snapshot().tokens_held, 0u);
    EXPECT_TRUE(pt.record_delivered(prompt_text, prompt, answer, "Hello there, friend."));
    EXPECT_GT(pt.snapshot().tokens_held, 0u);
}

// After a restart the index comes back from its file: the model's split of an answer is returned again, which
// re-tokenizing the history would not give.
TEST(prompt_tokenizer, the_index_survives_save_and_load) {
    const llama_model* model = preset_model("tiny");
    const llama_vocab* vocab = llama_model_get_vocab(model);
    const std::string answer = "The weather in Copenhagen is lovely today.";
    const turn t = chat_turn(model, {{{"role", "user"}, {"content", "How is the weather?"}}}, answer);
    const std::vector<llama_token> generated = split_one_word(vocab, answer);

    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("keepwarm-test-prompt-index-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::filesystem::path file = dir / "index.kwpi";
    std::vector<llama_token> prompt;
    size_t held = 0;
    {
        prompt_tokenizer before(vocab);
        prompt = before.tokenize(t.prompt_text);
        before.record(t.prompt_text, prompt, generated);
        held = before.snapshot().tokens_held;
        before.save(file, "vocab-a");
    }
    const auto expected = continued(vocab, prompt, generated, t.next_text, t.prompt_text.size() + answer.size());
    ASSERT_NE(full_tokenize(model, t.next_text), expected);

    prompt_tokenizer after(vocab);
    EXPECT_EQ(after.load(file, "vocab-a"), "");
    EXPECT_EQ(after.snapshot().tokens_held, held);
    EXPECT_EQ(after.tokenize(t.next_text), expected);

    // Another vocab's file, a flipped byte, a cut file: reported, and the index stays as it was.
    prompt_tokenizer other(vocab);
    EXPECT_NE(other.load(file, "vocab-b").find("another model"), std::string::npos);
    std::string bytes;
    {
        std::ifstream in(file, std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    auto write = [&](const std::string& content) {
        std::ofstream out(file, std::ios::binary | std::ios::trunc);
        out << content;
    };
    std::string flipped = bytes;
    flipped[flipped.size() / 2] ^= 0x40;
    write(flipped);
    EXPECT_NE(other.load(file, "vocab-a").find("checksum"), std::string::npos);
    write(bytes.substr(0, bytes.size() - 100));
    EXPECT_NE(other.load(file, "vocab-a"), "");
    write("");
    EXPECT_NE(other.load(file, "vocab-a"), "");
    EXPECT_EQ(other.snapshot().tokens_held, 0u);
    EXPECT_EQ(other.tokenize(t.next_text), full_tokenize(model, t.next_text));
    // A loaded index beyond a smaller budget is cut down to it.
    write(bytes);
    prompt_tokenizer small(vocab, {.token_budget = held / 2});
    EXPECT_EQ(small.load(file, "vocab-a"), "");
    EXPECT_LE(small.snapshot().tokens_held, held / 2);
    std::filesystem::remove_all(dir);
}

// A file whose checksum holds but whose prompt text no longer spells its tokens (written by hand, or by a bug) would
// change what prompts tokenize to: it is refused whole, found by the fuzzer (fuzz/crashes/prompt-index/).
TEST(prompt_tokenizer, refuses_an_index_whose_prompt_text_does_not_spell_its_tokens) {
    const llama_model* model = preset_model("tiny");
    const llama_vocab* vocab = llama_model_get_vocab(model);
    const turn t = chat_turn(model, {{{"role", "user"}, {"content", "How is the weather?"}}}, "Sunny.");
    const std::filesystem::path file =
        std::filesystem::temp_directory_path() / ("keepwarm-test-index-text-" + std::to_string(::getpid()));
    {
        prompt_tokenizer before(vocab);
        before.record(t.prompt_text, before.tokenize(t.prompt_text), split_one_word(vocab, "Sunny."));
        before.save(file, "vocab-a");
    }
    std::string bytes;
    {
        std::ifstream in(file, std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    prompt_tokenizer intact(vocab);
    ASSERT_EQ(intact.load(file, "vocab-a"), "");

    const size_t at = bytes.find("weather");
    ASSERT_NE(at, std::string::npos);
    bytes[at + 1] = 'E';  // same length, same token ends: only the text lies
    const uint64_t sum = XXH3_64bits(bytes.data(), bytes.size() - 8);
    std::memcpy(bytes.data() + bytes.size() - 8, &sum, 8);
    {
        std::ofstream out(file, std::ios::binary | std::ios::trunc);
        out << bytes;
    }
    prompt_tokenizer loaded(vocab);
    EXPECT_NE(loaded.load(file, "vocab-a").find("inconsistent"), std::string::npos);
    EXPECT_EQ(loaded.snapshot().tokens_held, 0u);
    EXPECT_EQ(loaded.tokenize("How is the wEather?"), full_tokenize(model, "How is the wEather?"));
    std::filesystem::remove(file);
}

TEST(prompt_tokenizer, evicts_least_recently_used_paths_beyond_the_budget) {
    const llama_model* model = preset_model("tiny");
    const llama_vocab* vocab = llama_model_get_vocab(model);
    auto text_of = [](const std::string& word) {
        std::string t = "<|im_start|>user\n" + word;
        for (int i = 0; i < 60; ++i) t += " " + word + std::to_string(i);
        return t + "<|im_end|>\n";
    };
    const std::string a = text_of("alpha"), b = text_of("bravo"), c = text_of("charlie");
    const size_t na = full_tokenize(model, a).size(), nb = full_tokenize(model, b).size();
    const size_t nc = full_tokenize(model, c).size();

    // Room for a and b, or a and c, but not all three.
    const size_t budget = std::max(na + nb, na + nc);
    prompt_tokenizer pt(vocab, {.token_budget = budget});
    auto matched_by = [&](const std::string& text) {
        const uint64_t before = pt.snapshot().tokens_matched;
        EXPECT_EQ(pt.tokenize(text), full_tokenize(model, text));
        return pt.snapshot().tokens_matched - before;
    };
    pt.record(a, full_tokenize(model, a), {});
    pt.record(b, full_tokenize(model, b), {});
    EXPECT_EQ(pt.snapshot().tokens_evicted, 0u);
    // Everything up to the last special token, <|im_end|>, comes from the index; a is now more recent than b.
    EXPECT_EQ(matched_by(a), na - 1);

    pt.record(c, full_tokenize(model, c), {});
    const prompt_tokenizer::counters after = pt.snapshot();
    EXPECT_LE(after.tokens_held, budget);
    EXPECT_EQ(after.tokens_evicted, nb - 3) << "b's own tokens go; the shared '<|im_start|>user\\n' stays";
    EXPECT_EQ(matched_by(b), 1u) << "only the shared <|im_start|> is left of b";
    EXPECT_EQ(matched_by(a), na - 1);
    EXPECT_EQ(matched_by(c), nc - 1);
}

TEST(prompt_tokenizer, concurrent_tokenize_and_record_stay_exact) {
    const llama_model* model = preset_model("tiny");
    const std::string base = render(model, conversation(6));
    prompt_tokenizer pt(llama_model_get_vocab(model), {.token_budget = 3 * full_tokenize(model, base).size()});
    std::atomic<int> mismatches{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 6; ++t) {
        threads.emplace_back([&, t] {
            text_editor editor(100 + t, qwen_specials());
            for (int i = 0; i < 60; ++i) {
                const std::string text = editor.edit(base);
                const std::vector<llama_token> got = pt.tokenize(text);
                if (got != full_tokenize(model, text)) mismatches++;
                // Half the threads also record, so inserts, splits and evictions race with the walks.
                if (t % 2 == 0) pt.record(text, got, {});
            }
        });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(mismatches.load(), 0);
    const prompt_tokenizer::counters c = pt.snapshot();
    EXPECT_EQ(c.lookups, 360u);
    EXPECT_GT(c.tokens_evicted, 0u);
    EXPECT_GT(c.tokens_matched, 0u);
}

// Not a timed test: prints what an agent's ~38K-token turn costs on the HTTP thread, for the record.
TEST(prompt_tokenizer, reports_the_cost_of_a_38k_token_turn) {
    using clock = std::chrono::steady_clock;
    auto ms = [](clock::time_point a, clock::time_point b) {
        return std::chrono::duration<double, std::milli>(b - a).count();
    };
    const llama_model* model = preset_model("tiny");
    const chat_renderer renderer(model);
    int turns = 300;
    api::json body = conversation(turns);
    while (full_tokenize(model, renderer.render(api::parse_chat_request(body)).prompt).size() < 38000) {
        turns += 20;
        body = conversation(turns);
    }
    // The previous turn: its prompt is recorded with a generated answer, as the server does.
    api::json previous = body;
    previous["messages"].erase(previous["messages"].size() - 1);
    previous["messages"].erase(previous["messages"].size() - 1);
    const std::string previous_text = renderer.render(api::parse_chat_request(previous)).prompt;
    prompt_tokenizer pt(llama_model_get_vocab(model));
    const std::vector<llama_token> previous_tokens = pt.tokenize(previous_text);
    const std::string last_answer = body["messages"][body["messages"].size() - 2]["content"];
    pt.record(previous_text, previous_tokens, common_tokenize(llama_model_get_vocab(model), last_answer, false, true));

    const std::string raw = body.dump();
    double json_ms = 1e9, typed_ms = 1e9, render_ms = 1e9, full_ms = 1e9, indexed_ms = 1e9;
    std::vector<llama_token> full, indexed;
    for (int rep = 0; rep < 5; ++rep) {
        const auto t00 = clock::now();
        const api::json parsed = api::json::parse(raw);
        const auto t0 = clock::now();
        const chat_request req = api::parse_chat_request(parsed);
        const auto t1 = clock::now();
        const std::string text = renderer.render(req).prompt;
        const auto t2 = clock::now();
        full = full_tokenize(model, text);
        const auto t3 = clock::now();
        indexed = pt.tokenize(text);
        const auto t4 = clock::now();
        json_ms = std::min(json_ms, ms(t00, t0));
        typed_ms = std::min(typed_ms, ms(t0, t1));
        render_ms = std::min(render_ms, ms(t1, t2));
        full_ms = std::min(full_ms, ms(t2, t3));
        indexed_ms = std::min(indexed_ms, ms(t3, t4));
    }
    EXPECT_EQ(indexed, full);
    // After the answer: the prompt (all of it known to the index) is recorded with the generated tokens.
    const std::string text = renderer.render(api::parse_chat_request(body)).prompt;
    const auto answer = common_tokenize(llama_model_get_vocab(model), " Done.", false, true);
    double record_ms = 1e9;
    for (int rep = 0; rep < 5; ++rep) {
        const auto t0 = clock::now();
        pt.record(text, indexed, answer);
        record_ms = std::min(record_ms, ms(t0, clock::now()));
    }
    std::printf(
        "38K-token turn (%zu tokens, %zu bytes of JSON, %d turns), best of 5:\n"
        "  JSON parse %.2f ms, typed request %.2f ms\n  render (Qwen3 template) %.2f ms\n  common_tokenize %.2f ms\n"
        "  prompt_tokenizer::tokenize %.3f ms\n  prompt_tokenizer::record %.3f ms\n",
        full.size(), raw.size(), turns, json_ms, typed_ms, render_ms, full_ms, indexed_ms, record_ms);
}

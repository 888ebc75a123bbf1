// `keepwarm bench spec --offline` (bench/spec-bench.h): the teacher-forced replay's arithmetic with drafters that
// are always right, never right or silent; the command on tests/fixtures/spec/ (two synthetic trajectories, the
// first's answers repeating a command from their prompts) with the tiny test model's vocabulary, plain and xz; and
// each mistake reported as one line with exit status 1. The replay through the engine (bench/spec-replay.h): the
// turns as the chat template renders them, and both passes on the tiny test model.
#include <gtest/gtest.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "base/logger.h"
#include "bench/spec-bench.h"
#include "bench/spec-replay.h"
#include "common.h"
#include "engine/llama-runtime.h"
#include "generated-models.h"
#include "llama-cpp.h"

using namespace keepwarm;
using namespace keepwarm::bench;

namespace {

const std::string fixture =
    (std::filesystem::path(__FILE__).parent_path() / "../fixtures/spec/two-trajectories.jsonl").string();

std::string temp_path(const std::string& name) {
    return (std::filesystem::temp_directory_path() /
            ("keepwarm-test-spec-bench-" + std::to_string(::getpid()) + "-" + name))
        .string();
}

struct command_result {
    int exit_code = 0;
    std::string out;
    std::string err;
};

command_result run_spec(const std::string& args) {
    CLI::App app;
    CLI::App* bench = app.add_subcommand("bench");
    add_spec_bench_command(*bench);
    std::ostringstream out, err;
    std::streambuf* const saved_out = std::cout.rdbuf(out.rdbuf());
    std::streambuf* const saved_err = std::cerr.rdbuf(err.rdbuf());
    std::string log_lines;
    log::set_sink([&](std::string_view line) { log_lines += line; });
    command_result result;
    try {
        app.parse("bench spec " + args);
    } catch (const CLI::Error& e) {
        result.exit_code = e.get_exit_code();
    }
    std::cout.rdbuf(saved_out);
    std::cerr.rdbuf(saved_err);
    log::set_sink({});
    result.out = out.str();
    result.err = err.str() + log_lines;
    return result;
}

nlohmann::json read_json(const std::string& path) {
    std::ifstream in(path);
    return nlohmann::json::parse(in);
}

const nlohmann::json& result_of(const nlohmann::json& report, const std::string& drafter) {
    for (const auto& r : report["results"]) {
        if (r["drafter"] == drafter) return r;
    }
    throw std::runtime_error("no result for " + drafter);
}

// One conversation: a 5-token prompt and a 10-token answer.
std::vector<spec_conversation> one_answer() {
    spec_conversation c;
    for (spec::token t = 0; t < 15; ++t) c.tokens.push_back(100 + t);
    c.turns.push_back({5, 10});
    return {c};
}

// Proposes what `oracle` says comes next (the recorded answer), or a fixed wrong token, or nothing.
class scripted_drafter : public offline_drafter {
public:
    enum class kind { right, wrong, silent };
    scripted_drafter(kind k, std::vector<spec::token> conversation)
        : kind_(k), conversation_(std::move(conversation)) {}
    std::string name() const override { return "scripted"; }
    void begin_turn(std::span<const spec::token>) override {}
    std::vector<spec::token> draft(std::span<const spec::token> context, std::size_t max_tokens) override {
        if (kind_ == kind::silent) return {};
        if (kind_ == kind::wrong) return std::vector<spec::token>(max_tokens, -7);
        std::vector<spec::token> d;
        for (std::size_t i = context.size(); i < conversation_.size() + 3 && d.size() < max_tokens; ++i) {
            d.push_back(i < conversation_.size() ? conversation_[i] : 0);  // runs on past the answer's end
        }
        return d;
    }
    void accept(std::size_t n) override { accepted.push_back(n); }
    std::vector<std::size_t> accepted;

private:
    kind kind_;
    std::vector<spec::token> conversation_;
};

}  // namespace

TEST(SpecBenchReplay, ARightDrafterAdvancesItsDraftPlusOneTokenPerStep) {
    const auto conversations = one_answer();
    scripted_drafter right(scripted_drafter::kind::right, conversations[0].tokens);
    const spec_drafter_result r = replay_conversations(right, conversations, 4);
    // The prefill gives token 1; then steps of 4 accepted + 1 sampled: tokens 2-6, 7-10 (the last 4 all accepted).
    EXPECT_EQ(r.answer_tokens, 10u);
    EXPECT_EQ(r.steps, 3u);
    EXPECT_EQ(r.accepted_tokens, 8u);
    EXPECT_EQ(r.drafts, 2u);
    EXPECT_EQ(right.accepted, (std::vector<std::size_t>{4, 4}));
    EXPECT_DOUBLE_EQ(r.tokens_per_step(), 10.0 / 3.0);
}

TEST(SpecBenchReplay, AWrongOrSilentDrafterTakesOneStepPerToken) {
    const auto conversations = one_answer();
    scripted_drafter wrong(scripted_drafter::kind::wrong, conversations[0].tokens);
    const spec_drafter_result w = replay_conversations(wrong, conversations, 4);
    EXPECT_EQ(w.steps, 10u);
    EXPECT_EQ(w.accepted_tokens, 0u);
    EXPECT_EQ(w.draft_tokens, 36u);
    EXPECT_DOUBLE_EQ(w.acceptance(), 0.0);
    scripted_drafter silent(scripted_drafter::kind::silent, conversations[0].tokens);
    const spec_drafter_result s = replay_conversations(silent, conversations, 4);
    EXPECT_EQ(s.steps, 10u);
    EXPECT_EQ(s.drafts, 0u);
    EXPECT_DOUBLE_EQ(s.tokens_per_step(), 1.0);
}

TEST(SpecBenchReplay, TrajectoriesAreReadFromJsonLines) {
    const auto trajectories = read_trajectories(fixture, 10);
    ASSERT_EQ(trajectories.size(), 2u);
    EXPECT_EQ(trajectories[0].id, "fixture__repeats-its-prompt-1");
    ASSERT_EQ(trajectories[0].messages.size(), 5u);
    EXPECT_EQ(trajectories[0].messages[2].role, "assistant");
    EXPECT_EQ(read_trajectories(fixture, 1).size(), 1u);

    const std::string bad = temp_path("bad.jsonl");
    std::ofstream(bad) << "{\"messages\": []}\n{\"messages\": [{\"content\": \"no role\"}]}\n";
    try {
        read_trajectories(bad, 10);
        ADD_FAILURE() << "a message without a role was read";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find(bad + ":2:"), std::string::npos) << e.what();
    }
    std::filesystem::remove(bad);
    EXPECT_THROW(read_trajectories(temp_path("missing.jsonl"), 10), std::runtime_error);
    EXPECT_THROW(read_trajectories(temp_path("missing.jsonl.xz"), 10), std::runtime_error);
}

class spec_command : public testing::Test {
protected:
    void TearDown() override {
        std::filesystem::remove(json_path);
        std::filesystem::remove(xz_path);
    }
    const std::string model = test_models::generated_model("unit-spec-bench");
    const std::string json_path = temp_path("report.json");
    const std::string xz_path = temp_path("traces.jsonl.xz");
};

TEST_F(spec_command, KeepwarmsDrafterIsAcceptedWhereTheAnswerRepeatsItsPrompt) {
    const command_result r =
        run_spec("--offline -m " + model + " --traces " + fixture + " --trajectories 1 --json " + json_path);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find(" keepwarm |"), std::string::npos) << r.out;
    const nlohmann::json report = read_json(json_path);
    EXPECT_EQ(report["trajectories"], 1);
    EXPECT_EQ(report["answers"], 2);
    const auto& keepwarm = result_of(report, "keepwarm");
    EXPECT_GT(keepwarm["accepted_tokens"].get<std::size_t>(), 0u);
    EXPECT_GT(keepwarm["tokens_per_step"].get<double>(), 1.0);
    for (const std::string name : {"ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache"}) {
        const auto& llama = result_of(report, name);
        EXPECT_EQ(llama["answer_tokens"], keepwarm["answer_tokens"]) << name << ": the same streams";
        EXPECT_GE(llama["tokens_per_step"].get<double>(), 1.0) << name;
    }
}

TEST_F(spec_command, ReadsTracesCompressedWithXz) {
    ASSERT_EQ(std::system(("xz -c " + fixture + " > " + xz_path).c_str()), 0);
    const command_result r =
        run_spec("--offline -m " + model + " --traces " + xz_path +
                 " --drafters keepwarm,keepwarm-no-history,ngram-mod --llama-fresh-per-trajectory --json " + json_path);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json report = read_json(json_path);
    EXPECT_EQ(report["trajectories"], 2);
    EXPECT_EQ(report["answers"], 4);
    EXPECT_EQ(report["results"].size(), 3u);
    // The first trajectory's answers repeat its prompt: drafted from the request alone too.
    EXPECT_GT(result_of(report, "keepwarm-no-history")["accepted_tokens"].get<std::size_t>(), 0u);
    EXPECT_EQ(report["llama_state"], "trajectory");
}

TEST_F(spec_command, MistakesEndWithOneLineAndStatusOne) {
    const command_result drafters = run_spec("-m " + model + " --traces " + fixture + " --drafters keepwarm");
    EXPECT_EQ(drafters.exit_code, 1);
    EXPECT_NE(drafters.err.find("--offline"), std::string::npos) << drafters.err;
    const command_result none = run_spec("-m " + model + " --traces " + fixture + " --spec-type none");
    EXPECT_EQ(none.exit_code, 1);
    EXPECT_NE(none.err.find("nothing to compare"), std::string::npos) << none.err;
    const command_result unknown = run_spec("--offline -m " + model + " --traces " + fixture + " --drafters eagle");
    EXPECT_EQ(unknown.exit_code, 1);
    EXPECT_NE(unknown.err.find("unknown drafter 'eagle'"), std::string::npos) << unknown.err;
    const command_result missing = run_spec("--offline -m " + model + " --traces " + temp_path("none.jsonl"));
    EXPECT_EQ(missing.exit_code, 1);
    EXPECT_NE(missing.err.find("cannot be read"), std::string::npos) << missing.err;
    const command_result no_model = run_spec("--offline -m " + temp_path("none.gguf") + " --traces " + fixture);
    EXPECT_EQ(no_model.exit_code, 1);
    EXPECT_NE(no_model.err.find("vocabulary"), std::string::npos) << no_model.err;
    EXPECT_NE(run_spec("--offline -m " + model + " --max-draft 0").exit_code, 0);
    EXPECT_NE(run_spec("--offline -m " + model + " --min-share 2").exit_code, 0);
}

// The engine replay (bench/spec-replay.h): each assistant turn of the fixture's first trajectory becomes the chat so
// far as the API renders it for the tiny model's template (Qwen3's), and the recorded answer as that template
// continues it, ending with the end-of-turn token.
TEST_F(spec_command, ReplayTurnsAreTheRenderedChatAndTheRecordedAnswer) {
    init_llama_runtime(false);
    llama_model_params params = llama_model_default_params();
    params.vocab_only = true;
    const llama_model_ptr vocab_model(llama_model_load_from_file(model.c_str(), params));
    ASSERT_TRUE(vocab_model);
    const llama_vocab* vocab = llama_model_get_vocab(vocab_model.get());
    const chat_renderer renderer(vocab_model.get());
    const trajectory_text trajectory = read_trajectories(fixture, 1)[0];

    std::size_t skipped = 0;
    const std::vector<replay_turn> turns = render_replay_turns(renderer, vocab, trajectory, 0, 1 << 20, skipped);
    ASSERT_EQ(turns.size(), 2u);
    EXPECT_EQ(skipped, 0u);
    const std::vector<std::size_t> assistant_at = {2, 4};
    for (std::size_t t = 0; t < turns.size(); ++t) {
        const replay_turn& turn = turns[t];
        EXPECT_EQ(turn.prompt, common_tokenize(vocab, turn.prompt_text, true, true));
        const std::string generation_prompt = "<|im_start|>assistant\n";
        ASSERT_GE(turn.prompt_text.size(), generation_prompt.size());
        EXPECT_EQ(turn.prompt_text.substr(turn.prompt_text.size() - generation_prompt.size()), generation_prompt);
        // The prompt holds every message before the answer, not the answer itself.
        EXPECT_NE(turn.prompt_text.find(trajectory.messages[assistant_at[t] - 1].content), std::string::npos);
        EXPECT_EQ(turn.prompt_text.find(trajectory.messages[assistant_at[t]].content), std::string::npos);
        ASSERT_FALSE(turn.forced_answer.empty());
        EXPECT_EQ(turn.forced_answer.back(), llama_vocab_eot(vocab));
        const std::string answer = common_detokenize(vocab, turn.forced_answer, true);
        EXPECT_NE(answer.find(trajectory.messages[assistant_at[t]].content), std::string::npos) << answer;
        EXPECT_EQ(answer.substr(answer.size() - 10), "<|im_end|>");
    }
    // The second prompt extends the first by its answer.
    EXPECT_NE(turns[1].prompt_text.find(trajectory.messages[2].content), std::string::npos);

    // One turn per trajectory at most; and a context too small for the first answer skips both.
    skipped = 0;
    EXPECT_EQ(render_replay_turns(renderer, vocab, trajectory, 1, 1 << 20, skipped).size(), 1u);
    EXPECT_EQ(skipped, 0u);
    EXPECT_TRUE(render_replay_turns(renderer, vocab, trajectory, 0, turns[0].prompt.size() + 1, skipped).empty());
    EXPECT_EQ(skipped, 2u);
}

TEST(SpecBenchReplay, EngineNumbersLeaveEachAnswersFirstTokenOut) {
    spec_mode_result r;
    // Two answers of 11 and 21 tokens: 10 + 20 decode tokens in 15 steps and 600 ms.
    r.answer_tokens = 32;
    r.decode_tokens = 30;
    r.decode_steps = 15;
    r.generation_ms = 600;
    EXPECT_DOUBLE_EQ(r.decode_tokens_per_second(), 50.0);
    EXPECT_DOUBLE_EQ(r.tokens_per_step(), 2.0);
    spec_replay_report report;
    report.on = r;
    report.off = r;
    report.off.generation_ms = 1200;
    EXPECT_DOUBLE_EQ(report.speedup(), 2.0);
    EXPECT_DOUBLE_EQ(spec_mode_result{}.decode_tokens_per_second(), 0.0);
    EXPECT_DOUBLE_EQ(spec_mode_result{}.tokens_per_step(), 0.0);
    EXPECT_DOUBLE_EQ(spec_replay_report{}.speedup(), 0.0);
}

// Both passes replay the turn with the same forced answer on their own tenants; only the drafting pass drafts, and on
// the fixture's first answer, which repeats a command from its prompt, its drafts are accepted.
TEST_F(spec_command, TheEngineReplaysEachTurnWithDraftingOffAndOn) {
    // Whole drafts: sized by measured costs, a loaded machine (two tests at once) had the engine draft nothing.
    const command_result r = run_spec("-m " + model + " --traces " + fixture +
                                      " --trajectories 1 --turns 1 -c 4096 -t 2 --whole-drafts --json " + json_path);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("decode tokens/s on/off"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(" off |"), std::string::npos) << r.out;
    const nlohmann::json report = read_json(json_path);
    EXPECT_EQ(report["mode"], "engine");
    EXPECT_EQ(report["whole_drafts"], true);
    EXPECT_EQ(report["trajectories"], 1);
    EXPECT_EQ(report["turns"], 1);
    EXPECT_EQ(report["skipped_turns"], 0);
    const nlohmann::json& off = report["off"];
    const nlohmann::json& on = report["on"];
    for (const nlohmann::json* m : {&off, &on}) {
        EXPECT_EQ((*m)["answers"], 1) << (*m)["mode"];
        EXPECT_EQ((*m)["error"], "") << (*m)["mode"];
        // The recorded answer came back token for token.
        EXPECT_EQ((*m)["verbatim"], 1) << (*m)["mode"];
        EXPECT_GT((*m)["answer_tokens"].get<std::size_t>(), 10u) << (*m)["mode"];
        // The first token of the answer comes from the prefill and is not a decode token.
        EXPECT_EQ((*m)["decode_tokens"].get<std::size_t>() + 1, (*m)["answer_tokens"].get<std::size_t>());
        EXPECT_TRUE((*m)["turn_seconds_mean"].is_number());
    }
    EXPECT_EQ(off["answer_tokens"], on["answer_tokens"]) << "the same forced answer, drafting or not";
    EXPECT_EQ(off["draft_tokens"], 0) << "draft_max 0 drafts nothing";
    EXPECT_EQ(off["draft_steps"], 0);
    // Without drafts every decode token takes a step; the drafting pass takes fewer.
    EXPECT_EQ(off["decode_steps"], off["decode_tokens"]);
    EXPECT_GT(on["draft_accepted"].get<std::size_t>(), 0u);
    EXPECT_LT(on["decode_steps"].get<std::size_t>(), off["decode_steps"].get<std::size_t>());
    EXPECT_GT(on["tokens_per_step"].get<double>(), 1.0);
    EXPECT_DOUBLE_EQ(off["tokens_per_step"].get<double>(), 1.0);
}

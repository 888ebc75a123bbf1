// Writes the seed corpora of the two binary formats with keepwarm's own writers, so the seeds stay valid when a
// format changes: fuzz/corpus/disk-entry (disk_store::put) and fuzz/corpus/prompt-index (prompt_tokenizer::save).
// Usage: fuzz-make-seeds CORPUS_DIR (the repo's fuzz/corpus). Each seed starts with the target's control byte.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "api/anthropic-api.h"
#include "api/ollama-api.h"
#include "api/openai-api.h"
#include "cache/disk-store.h"
#include "chat/prompt-tokenizer.h"
#include "common.h"
#include "fuzz-support.h"
#include "llama-cpp.h"

using namespace keepwarm;
namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void write_seed(const fs::path& dir, const std::string& name, const std::string& bytes) {
    fs::create_directories(dir);
    std::ofstream(dir / name, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void disk_entry_seeds(const fs::path& out) {
    const fs::path scratch = fs::temp_directory_path() / "keepwarm-fuzz-make-seeds";
    fs::remove_all(scratch);
    struct shape {
        int32_t start, end;
        uint32_t kind;
        size_t payload;
    };
    const shape shapes[] = {{0, 1, 0, 0}, {0, 16, 0, 64}, {16, 32, 0, 300}, {32, 96, 0, 1000}, {96, 97, 1, 17}};
    {
        disk_store store(scratch, uint64_t{1} << 30, fuzz::disk_fingerprint);
        store.open();
        block_key parent = root_block_key(fuzz::disk_fingerprint);
        int i = 0;
        for (const shape& s : shapes) {
            disk_entry_info info;
            std::vector<llama_token> tokens;
            for (int32_t t = s.start; t < s.end; ++t) tokens.push_back(t * 7 + 3);
            info.key = chain_block_key(parent, tokens);
            info.parent = parent;
            info.start = s.start;
            info.end = s.end;
            info.kind = s.kind;
            info.tokens = tokens;
            auto payload = std::make_shared<std::vector<uint8_t>>(s.payload);
            for (size_t b = 0; b < s.payload; ++b) (*payload)[b] = static_cast<uint8_t>(b * 31 + i);
            store.put(info, payload);
            parent = info.key;
            ++i;
        }
        store.flush();
    }
    // By size, so that a rerun names the same entry the same way.
    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(scratch)) {
        if (entry.path().extension() == ".kwkv") files.push_back(read_file(entry.path()));
    }
    std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) { return a.size() < b.size(); });
    int n = 0;
    for (const std::string& file : files) {
        // Checksums and name repaired (the usual way in), and the file as it is with a fixed name.
        write_seed(out, "entry-" + std::to_string(n) + "-repaired", std::string(1, '\x07') + file);
        write_seed(out, "entry-" + std::to_string(n) + "-lazy", std::string(1, '\x0f') + file);
        write_seed(out, "entry-" + std::to_string(n) + "-as-is", std::string(1, '\x00') + file);
        ++n;
    }
    fs::remove_all(scratch);
}

std::string with_text(uint8_t control, const std::string& text, const std::string& file) {
    std::string seed(1, static_cast<char>(control));
    seed += static_cast<char>(text.size() & 0xff);
    seed += static_cast<char>((text.size() >> 8) & 0xff);
    return seed + text + file;
}

void prompt_index_seeds(const fs::path& out) {
    llama_log_set([](ggml_log_level, const char*, void*) {}, nullptr);
    llama_backend_init();
    llama_model_params params = llama_model_default_params();
    params.vocab_only = true;
    const std::string path = std::string(KEEPWARM_LLAMA_SOURCE_DIR) + "/models/ggml-vocab-qwen2.gguf";
    llama_model_ptr model(llama_model_load_from_file(path.c_str(), params));
    if (!model) throw std::runtime_error("cannot load " + path);
    const llama_vocab* vocab = llama_model_get_vocab(model.get());
    const fs::path file = fs::temp_directory_path() / "keepwarm-fuzz-make-seeds.idx";

    const std::string system = "<|im_start|>system\nYou are a coding agent.<|im_end|>\n";
    const std::string turn1 = system + "<|im_start|>user\nfix src/main.cpp:42<|im_end|>\n<|im_start|>assistant\n";
    const std::string turn2 = system + "<|im_start|>user\nGrüße 東京 🎉 1234567<|im_end|>\n<|im_start|>assistant\n";
    const std::string answer = "Sure, here is the fix.";

    prompt_tokenizer tokenizer(vocab);
    tokenizer.save(file, fuzz::prompt_index_fingerprint);
    write_seed(out, "empty", with_text(1, turn1, read_file(file)));

    const auto prompt1 = tokenizer.tokenize(turn1);
    tokenizer.record(turn1, prompt1, {});
    tokenizer.save(file, fuzz::prompt_index_fingerprint);
    write_seed(out, "one-prompt", with_text(1, turn1 + "and more", read_file(file)));

    const auto prompt2 = tokenizer.tokenize(turn2);
    tokenizer.record(turn2, prompt2, {});
    tokenizer.save(file, fuzz::prompt_index_fingerprint);
    write_seed(out, "branched", with_text(1, turn2, read_file(file)));
    write_seed(out, "branched-small-budget", with_text(3, turn1, read_file(file)));

    const auto generated = common_tokenize(vocab, answer, false, false);
    tokenizer.record(turn1, prompt1, generated);
    tokenizer.record_delivered(turn1, prompt1, generated, answer);
    tokenizer.save(file, fuzz::prompt_index_fingerprint);
    write_seed(out, "generated", with_text(1, turn1 + answer + "<|im_end|>\n", read_file(file)));
    write_seed(out, "generated-as-is", with_text(0, turn1, read_file(file)));
    fs::remove(file);
}

// Streams as keepwarm's own routes write them (the upstream a proxy most often has), one per answer shape, in the
// three dialects; hand-written variants of other engines are in the corpus beside them.
void stream_seeds(const fs::path& corpus) {
    std::vector<common_chat_msg> answers(3);
    answers[0].content = "Hello, world.";
    answers[1].reasoning_content = "The user greets; answer briefly.";
    answers[1].content = "Hi! Grüße 東京 🎉";
    answers[2].content = "Checking.";
    answers[2].tool_calls = {{"ls", R"({"path":"src"})", "call_1"},
                             {"read", R"({"file":"a.txt","lines":[1,20]})", "call_2"}};
    const usage_info usage{.prompt_tokens = 40, .completion_tokens = 9, .cached_tokens = 32};
    namespace ollama = api::ollama;
    for (size_t i = 0; i < answers.size(); ++i) {
        common_chat_msg empty;
        empty.role = "assistant";
        const auto diffs = common_chat_msg_diff::compute_diffs(empty, answers[i]);
        const std::string name = "keepwarm-" + std::to_string(i);

        std::string openai;
        for (const auto& chunk : api::chat_chunk_json("id", "m", 0, diffs, true))
            openai += "data: " + chunk.dump() + "\n\n";
        openai += "data: " + api::chat_final_chunk_json("id", "m", 0, answers[i], "stop").dump() + "\n\n";
        openai += "data: " + api::chat_usage_chunk_json("id", "m", 0, usage).dump() + "\n\ndata: [DONE]\n\n";
        write_seed(corpus / "openai-stream", name, openai);

        api::anthropic::message_stream stream("msg_1", "m");
        std::string anthropic =
            api::anthropic::to_sse(stream.start(40)) + api::anthropic::to_sse(api::anthropic::ping_event());
        for (const auto& e : stream.push(diffs)) anthropic += api::anthropic::to_sse(e);
        for (const auto& e : stream.finish(i == 2 ? "tool_use" : "end_turn", usage))
            anthropic += api::anthropic::to_sse(e);
        write_seed(corpus / "anthropic-stream", name, anthropic);

        std::string lines = ollama::ndjson_line(ollama::chat_chunk_json("m", "t", "", answers[i].reasoning_content)) +
                            ollama::ndjson_line(ollama::chat_chunk_json("m", "t", answers[i].content, "")) +
                            ollama::ndjson_line(ollama::chat_chunk_json("m", "t", "", "", answers[i].tool_calls)) +
                            ollama::ndjson_line(ollama::chat_final_chunk_json(
                                "m", "t", "stop", {.prompt_tokens = 40, .cached_tokens = 32, .generated_tokens = 9}));
        write_seed(corpus / "ollama-stream", name, lines);
    }
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: fuzz-make-seeds CORPUS_DIR\n");
        return 2;
    }
    const fs::path corpus = argv[1];
    disk_entry_seeds(corpus / "disk-entry");
    prompt_index_seeds(corpus / "prompt-index");
    stream_seeds(corpus);
    return 0;
}

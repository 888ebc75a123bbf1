// Fuzz target: the saved prompt index (prompt_tokenizer::save's file, read back by load() at start-up), then a
// tokenization over whatever was loaded. Whatever the file holds, load() must return why it ignored it or load it,
// and a loaded index must not crash or throw in tokenize() and record(); an index without generated tokens must
// tokenize exactly as the vocab does (the header's guarantee).
//
// Input: one control byte, a u16 length and that much text to tokenize after loading, then the file.
//   bit 0: rewrite the file's checksum (its last 8 bytes) to match, so the fuzzer reaches the nodes behind it
//   bit 1: a token budget of 64, so loading and recording evict
// The vocab is Qwen2's (BPE, indexed), vocab-only from the pinned llama.cpp source's models/ folder.
#include <unistd.h>
#include <xxhash.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "chat/prompt-tokenizer.h"
#include "common.h"
#include "fuzz-support.h"
#include "llama-cpp.h"

using namespace keepwarm;
namespace fs = std::filesystem;

namespace {

llama_model_ptr vocab_model;
const llama_vocab* vocab = nullptr;
fs::path index_file, empty_index_file;
// Built once: the constructor scans the whole vocab (151K tokens) for special tokens. Each input starts from an empty
// index (load() replaces the whole tree), so runs stay reproducible.
std::unique_ptr<prompt_tokenizer> default_budget, small_budget;

// Whether any node of a well-formed file marks a token as generated (then the tokens may differ from the vocab's).
bool has_generated(std::string_view file) {
    size_t at = 8 + 4;
    auto get = [&](auto& v) {
        if (file.size() < 8 || at + sizeof v > file.size() - 8) return false;
        std::memcpy(&v, file.data() + at, sizeof v);
        at += sizeof v;
        return true;
    };
    uint32_t fp_size = 0;
    uint64_t count = 0;
    if (!get(fp_size)) return true;
    at += fp_size;
    if (!get(count)) return true;
    for (uint64_t i = 0; i < count; ++i) {
        uint32_t parent = 0, n = 0, text = 0;
        if (!get(parent) || !get(n)) return true;
        at += size_t{n} * 8;
        for (uint32_t t = 0; t < n; ++t) {
            uint8_t g = 0;
            if (!get(g)) return true;
            if (g) return true;
        }
        if (!get(text)) return true;
        at += text;
    }
    return false;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    llama_log_set([](ggml_log_level, const char*, void*) {}, nullptr);
    llama_backend_init();
    llama_model_params params = llama_model_default_params();
    params.vocab_only = true;
    const std::string path = std::string(KEEPWARM_LLAMA_SOURCE_DIR) + "/models/ggml-vocab-qwen2.gguf";
    vocab_model.reset(llama_model_load_from_file(path.c_str(), params));
    if (!vocab_model) {
        std::fprintf(stderr, "fuzz-prompt-index: cannot load %s\n", path.c_str());
        std::exit(1);
    }
    vocab = llama_model_get_vocab(vocab_model.get());
    const char* tmp = std::getenv("TMPDIR");
    const fs::path base = fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::path(tmp ? tmp : "/tmp");
    index_file = base / ("keepwarm-fuzz-prompt-index." + std::to_string(::getpid()));
    empty_index_file = base / ("keepwarm-fuzz-prompt-index-empty." + std::to_string(::getpid()));
    std::atexit([] {
        std::error_code ec;
        fs::remove(index_file, ec);
        fs::remove(empty_index_file, ec);
    });
    default_budget = std::make_unique<prompt_tokenizer>(vocab);
    small_budget = std::make_unique<prompt_tokenizer>(vocab, prompt_tokenizer::options{.token_budget = 64});
    default_budget->save(empty_index_file, fuzz::prompt_index_fingerprint);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 3) return 0;
    const uint8_t control = data[0];
    const size_t text_size = std::min<size_t>(data[1] | (size_t{data[2]} << 8), size - 3);
    std::string text(reinterpret_cast<const char*>(data) + 3, text_size);
    // Prompt text reaches the tokenizer through a JSON parser, which admits only valid UTF-8 (llama's own tokenizer
    // throws "invalid codepoint" past U+10FFFF): other bytes leave only the index file to fuzz.
    try {
        (void)nlohmann::json(text).dump();
    } catch (const nlohmann::json::type_error&) {
        text.clear();
    }
    std::string file(reinterpret_cast<const char*>(data) + 3 + text_size, size - 3 - text_size);
    if ((control & 1) && file.size() >= 16) {
        const uint64_t sum = XXH3_64bits(file.data(), file.size() - 8);
        std::memcpy(file.data() + file.size() - 8, &sum, 8);
    }
    std::ofstream(index_file, std::ios::binary | std::ios::trunc)
        .write(file.data(), static_cast<std::streamsize>(file.size()));

    prompt_tokenizer& tokenizer = (control & 2) ? *small_budget : *default_budget;
    try {
        if (const std::string why = tokenizer.load(empty_index_file, fuzz::prompt_index_fingerprint); !why.empty())
            fuzz::finding("prompt_tokenizer: cannot load an empty index it saved: " + why);
        if (!tokenizer.load(index_file, fuzz::prompt_index_fingerprint).empty()) return 0;
        const std::vector<llama_token> tokens = tokenizer.tokenize(text);
        if (!has_generated(file) && tokens != common_tokenize(vocab, text, true, true))
            fuzz::finding("prompt_tokenizer: a loaded index without generated tokens changed the tokenization");
        tokenizer.record(text, tokens, {});
        tokenizer.tokenize(text + text);
    } catch (const std::exception& e) {
        fuzz::finding(std::string("prompt_tokenizer threw on a loaded index: ") + e.what());
    }
    return 0;
}

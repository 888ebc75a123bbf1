// Keeps the prompt tokenizer's index on disk beside the KV cache, so that after a restart the history a client sends
// back still maps to the token ids the disk tier holds (the model's own split of its answers, which re-tokenizing
// the text does not give back). Loads the saved index at start-up; saves it on a background thread at most every
// `interval` (or 20 times as long as the last save took, for a big index) while it changes, and once more when
// destroyed (a clean shutdown loses nothing; a kill -9 at most the last interval's records, whose answers are then
// recomputed once).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>

#include "chat/prompt-tokenizer.h"

namespace keepwarm {

class prompt_index_keeper {
public:
    // `fingerprint` names the vocab: a file saved under another one is reported and ignored.
    prompt_index_keeper(prompt_tokenizer& tokenizer, std::filesystem::path file, std::string fingerprint,
                        std::chrono::milliseconds interval = std::chrono::seconds(2));
    ~prompt_index_keeper();
    prompt_index_keeper(const prompt_index_keeper&) = delete;
    prompt_index_keeper& operator=(const prompt_index_keeper&) = delete;

    // The index file for a model's vocab in a cache directory.
    static std::filesystem::path file_in(const std::filesystem::path& cache_dir, const std::string& fingerprint);

private:
    void save_if_changed();
    void run();

    prompt_tokenizer& tokenizer_;
    const std::filesystem::path file_;
    const std::string fingerprint_;
    const std::chrono::milliseconds interval_;
    // Used by the saving thread only (and the constructor, before it starts):
    uint64_t saved_changes_ = 0;              // tokenizer_.changes() when last saved or loaded
    bool failing_ = false;                    // the last save failed
    std::chrono::milliseconds last_save_{0};  // how long the last save took

    std::mutex mu_;
    std::condition_variable wake_;
    bool stopping_ = false;  // guarded by mu_
    std::thread saver_;      // last: starts after everything above is set
};

}  // namespace keepwarm

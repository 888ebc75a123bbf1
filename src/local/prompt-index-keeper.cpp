// See prompt-index-keeper.h.
#include "local/prompt-index-keeper.h"

#include <algorithm>
#include <exception>

#include "base/file-io.h"
#include "base/logger.h"

namespace keepwarm {

std::filesystem::path prompt_index_keeper::file_in(const std::filesystem::path& cache_dir,
                                                   const std::string& fingerprint) {
    return cache_dir / ("prompt-index-" + fingerprint + ".kwpi");
}

prompt_index_keeper::prompt_index_keeper(prompt_tokenizer& tokenizer, std::filesystem::path file,
                                         std::string fingerprint, std::chrono::milliseconds interval)
    : tokenizer_(tokenizer), file_(std::move(file)), fingerprint_(std::move(fingerprint)), interval_(interval) {
    std::error_code ec;
    // A save cut short by a kill leaves its temporary file behind.
    const std::string temp_prefix = file_.filename().string() + ".tmp.";
    for (const auto& entry : std::filesystem::directory_iterator(file_.parent_path(), ec)) {
        if (entry.path().filename().string().rfind(temp_prefix, 0) == 0) remove_abandoned_temp(entry.path());
    }
    if (std::filesystem::exists(file_, ec)) {
        if (const std::string why = tokenizer_.load(file_, fingerprint_); why.empty()) {
            const auto held = tokenizer_.snapshot().tokens_held;
            log::info("prompt index", "{} tokens loaded from {}", held, file_.string());
        } else {
            log::warn("prompt index", "ignored {}: {}", file_.string(), why);
        }
    }
    saved_changes_ = tokenizer_.changes();
    saver_ = std::thread([this] { run(); });
}

prompt_index_keeper::~prompt_index_keeper() {
    {
        std::lock_guard lock(mu_);
        stopping_ = true;
    }
    wake_.notify_all();
    saver_.join();
}

void prompt_index_keeper::save_if_changed() {
    const uint64_t changes = tokenizer_.changes();
    if (changes == saved_changes_) return;
    try {
        const auto started = std::chrono::steady_clock::now();
        tokenizer_.save(file_, fingerprint_);
        last_save_ = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
        saved_changes_ = changes;
        failing_ = false;
    } catch (const std::exception& e) {
        // Tried again at the next interval; the index in memory is unaffected. Said once per run of failures.
        if (!failing_) log::warn("prompt index", "cannot save: {}", e.what());
        failing_ = true;
    }
}

void prompt_index_keeper::run() {
    std::unique_lock lock(mu_);
    while (!stopping_) {
        // A big index takes a while to write: at most 5% of the time goes to saving it.
        wake_.wait_for(lock, std::max(interval_, 20 * last_save_), [this] { return stopping_; });
        lock.unlock();
        save_if_changed();
        lock.lock();
    }
}

}  // namespace keepwarm

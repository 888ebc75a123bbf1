// Remembers the note a `move` span rule appended to a message ("[moved from the system prompt: 11:42:17]"), keyed by
// the conversation up to that message, so that the next turn, which sends that message again as history without the
// note, gets the same note back: the history renders as the previous prompt did, and the cache reuses all of it
// (the previous answer included) instead of recomputing from that message on. Bounded in entries and bytes.
// save()/load() carry the notes across a restart, as the disk tier carries the KV they were cached with: without
// them, the first turn after a restart renders its history without the notes and leaves the cached path at the end
// of the first message that had one (a whole conversation's turns recomputed).
// Threading: every member may be called from any number of threads at once (one mutex).
#pragma once

#include <xxhash.h>

#include <cstddef>
#include <deque>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "chat.h"

namespace keepwarm::policy {

// The identity of a conversation up to and including each of its messages (role, text, reasoning, tool calls), for
// one tenant: a message of another conversation, or of the same one edited before it, has another key.
std::vector<XXH128_hash_t> conversation_keys(std::string_view tenant, const std::vector<common_chat_msg>& messages);

class moved_notes {
public:
    static constexpr size_t default_max_entries = 8192;
    static constexpr size_t default_max_bytes = size_t{8} << 20;

    explicit moved_notes(size_t max_entries = default_max_entries, size_t max_bytes = default_max_bytes);

    // The note appended to the message whose conversation key is `key`; nullopt when none is remembered.
    std::optional<std::string> find(const XXH128_hash_t& key) const;
    // Remembers `note` for `key` (replacing an earlier one); the oldest entries go first past the bounds.
    void remember(const XXH128_hash_t& key, std::string note);
    size_t size() const;

    // Writes the notes, oldest first, to `file` atomically, with a checksum. Throws std::runtime_error when it cannot.
    void save(const std::filesystem::path& file) const;
    // Remembers the notes saved in `file`, oldest first (within this object's bounds). Returns an empty string on
    // success, otherwise why the file was ignored (missing, truncated, checksum, another format): nothing is added.
    std::string load(const std::filesystem::path& file);

private:
    struct hash_of_hash {
        size_t operator()(const XXH128_hash_t& h) const { return static_cast<size_t>(h.low64); }
    };
    struct same_hash {
        bool operator()(const XXH128_hash_t& a, const XXH128_hash_t& b) const { return XXH128_isEqual(a, b); }
    };

    const size_t max_entries_, max_bytes_;
    mutable std::mutex mu_;
    std::unordered_map<XXH128_hash_t, std::string, hash_of_hash, same_hash> notes_;  // guarded by mu_
    std::deque<XXH128_hash_t> order_;  // guarded by mu_: keys in the order they were remembered (oldest first)
    size_t bytes_ = 0;                 // guarded by mu_: of the notes
};

}  // namespace keepwarm::policy

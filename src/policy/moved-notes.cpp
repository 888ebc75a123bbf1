// See moved-notes.h.
#include "policy/moved-notes.h"

namespace keepwarm::policy {

namespace {
void add(XXH3_state_t* state, std::string_view text) {
    XXH3_128bits_update(state, text.data(), text.size());
    XXH3_128bits_update(state, "\0", 1);  // a separator: "ab"+"c" and "a"+"bc" differ
}
}  // namespace

std::vector<XXH128_hash_t> conversation_keys(std::string_view tenant, const std::vector<common_chat_msg>& messages) {
    std::vector<XXH128_hash_t> keys;
    keys.reserve(messages.size());
    XXH3_state_t* state = XXH3_createState();
    if (!state) throw std::bad_alloc();
    XXH3_128bits_reset(state);
    add(state, tenant);
    for (const common_chat_msg& msg : messages) {
        add(state, msg.role);
        add(state, msg.content);
        for (const auto& part : msg.content_parts) add(state, part.text);
        add(state, msg.reasoning_content);
        for (const auto& call : msg.tool_calls) {
            add(state, call.name);
            add(state, call.arguments);
        }
        add(state, msg.tool_call_id);
        keys.push_back(XXH3_128bits_digest(state));
    }
    XXH3_freeState(state);
    return keys;
}

moved_notes::moved_notes(size_t max_entries, size_t max_bytes) : max_entries_(max_entries), max_bytes_(max_bytes) {}

std::optional<std::string> moved_notes::find(const XXH128_hash_t& key) const {
    std::lock_guard lock(mu_);
    const auto it = notes_.find(key);
    if (it == notes_.end()) return std::nullopt;
    return it->second;
}

void moved_notes::remember(const XXH128_hash_t& key, std::string note) {
    if (note.size() > max_bytes_) return;
    std::lock_guard lock(mu_);
    if (auto it = notes_.find(key); it != notes_.end()) {
        bytes_ -= it->second.size();
        bytes_ += note.size();
        it->second = std::move(note);
    } else {
        bytes_ += note.size();
        notes_.emplace(key, std::move(note));
        order_.push_back(key);
    }
    while (!order_.empty() && (notes_.size() > max_entries_ || bytes_ > max_bytes_)) {
        if (auto it = notes_.find(order_.front()); it != notes_.end()) {
            bytes_ -= it->second.size();
            notes_.erase(it);
        }
        order_.pop_front();
    }
}

size_t moved_notes::size() const {
    std::lock_guard lock(mu_);
    return notes_.size();
}

}  // namespace keepwarm::policy

// See moved-notes.h.
#include "policy/moved-notes.h"

#include <cstring>
#include <fstream>
#include <iterator>
#include <span>
#include <stdexcept>

#include "base/file-io.h"

namespace keepwarm::policy {

namespace {
// The notes file: magic, format version, entry count, then per entry its key (low, high) and its note (length,
// bytes), then an XXH3-64 of everything before it. Integers in the machine's byte order (the file never leaves it).
constexpr char notes_magic[8] = {'K', 'W', 'M', 'N', 'O', 'T', 'E', 'S'};
constexpr uint32_t notes_version = 1;

template <typename T>
void put(std::string& out, T value) {
    out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

// Reads a T at `at` from `in`, if it is there.
template <typename T>
bool take(std::string_view in, size_t& at, T& value) {
    if (in.size() - at < sizeof value) return false;
    std::memcpy(&value, in.data() + at, sizeof value);
    at += sizeof value;
    return true;
}

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

void moved_notes::save(const std::filesystem::path& file) const {
    std::string out(notes_magic, sizeof notes_magic);
    put(out, notes_version);
    {
        std::lock_guard lock(mu_);
        put(out, static_cast<uint64_t>(notes_.size()));
        for (const XXH128_hash_t& key : order_) {
            const auto it = notes_.find(key);
            if (it == notes_.end()) continue;
            put(out, key.low64);
            put(out, key.high64);
            put(out, static_cast<uint32_t>(it->second.size()));
            out += it->second;
        }
    }
    put(out, static_cast<uint64_t>(XXH3_64bits(out.data(), out.size())));
    const auto bytes = std::span(reinterpret_cast<const uint8_t*>(out.data()), out.size());
    if (const auto error = write_file_atomically(file, {bytes})) {
        throw std::runtime_error("cannot write " + file.string() + ": " + *error);
    }
}

std::string moved_notes::load(const std::filesystem::path& file) {
    std::error_code ec;
    const auto file_size = std::filesystem::file_size(file, ec);
    if (ec) return "cannot read it: " + ec.message();
    // No more than the bounds hold, with each entry's key and length.
    const uint64_t most = sizeof notes_magic + 4 + 8 + 8 + max_bytes_ + max_entries_ * uint64_t{20};
    if (file_size > most) return "larger than the notes it may hold";
    std::ifstream f(file, std::ios::binary);
    const std::string in((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (!f.good() && !f.eof()) return "cannot read it";
    if (in.size() < sizeof notes_magic + 4 + 8 + 8 || std::memcmp(in.data(), notes_magic, sizeof notes_magic) != 0)
        return "not a notes file";
    size_t at = sizeof notes_magic;
    uint32_t version = 0;
    take(in, at, version);
    if (version != notes_version)
        return "format version " + std::to_string(version) + ", not " + std::to_string(notes_version);
    const std::string_view body(in.data(), in.size() - 8);
    uint64_t checksum = 0;
    std::memcpy(&checksum, in.data() + body.size(), sizeof checksum);
    if (checksum != XXH3_64bits(body.data(), body.size())) return "checksum mismatch";
    uint64_t count = 0;
    take(body, at, count);
    std::vector<std::pair<XXH128_hash_t, std::string>> entries;
    for (uint64_t i = 0; i < count; ++i) {
        XXH128_hash_t key{};
        uint32_t length = 0;
        if (!take(body, at, key.low64) || !take(body, at, key.high64) || !take(body, at, length) ||
            body.size() - at < length)
            return "truncated";
        entries.emplace_back(key, std::string(body.substr(at, length)));
        at += length;
    }
    if (at != body.size()) return "inconsistent: bytes after its last note";
    for (auto& [key, note] : entries) remember(key, std::move(note));
    return {};
}

}  // namespace keepwarm::policy

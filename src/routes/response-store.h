// The Responses API's stored responses (`store`, `previous_response_id`, GET and DELETE /v1/responses/{id}): each
// finished response kept with the conversation that led to it (its input items, a previous response's included, and
// its output items), so that a request naming it continues that conversation without sending it again. Bounded in
// count and bytes, least recently used evicted first; with a folder (beside the disk tier) each one is also a file,
// written whole or not at all, so a restart keeps them. A response belongs to the tenant that made it: another
// tenant's id is not found, and no tenant pushes out another's: one over its own quota loses its own least recently
// used, and when the store is full the tenant holding the most (in the measure that is over) gives one up, so a
// tenant's flood evicts only its own. Files in the folder are read as hostile input: one that does not parse is
// removed.
// Thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <list>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>

namespace keepwarm {

class response_store {
public:
    using json = nlohmann::ordered_json;

    struct options {
        size_t max_responses = 4096;
        size_t max_bytes = 256u << 20;
        // Each tenant's quota, within the limits above.
        size_t max_responses_per_tenant = 4096;
        size_t max_bytes_per_tenant = 256u << 20;
        std::filesystem::path dir;  // empty: in memory only
    };
    struct record {
        json items;     // the conversation: input items then output items, as the API writes them
        json response;  // the response object, as GET returns it
    };

    // Loads the folder's responses, newest first, up to the limits (older ones are removed).
    explicit response_store(options opts);

    // Keeps `id` (replacing one of the same id), evicting beyond the limits as said above.
    void put(const std::string& id, const std::string& tenant, record r);
    // The record of `id` if `tenant` made it; marks it used.
    std::optional<record> get(const std::string& id, const std::string& tenant);
    // Removes `id` if `tenant` made it; false when there was none.
    bool erase(const std::string& id, const std::string& tenant);

    size_t size() const;
    size_t bytes() const;
    size_t size_of(const std::string& tenant) const;

    // Whether `id` can name a stored response (resp_ and letters, digits, '_'; at most 64 characters): anything
    // else is not found without looking, and never becomes a file name.
    static bool valid_id(const std::string& id);

private:
    struct entry {
        std::string tenant;
        std::string text;                      // the record as stored: {"tenant", "items", "response"}
        std::list<std::string>::iterator use;  // its place in its tenant's lru
    };
    struct tenant_entries {
        std::list<std::string> lru;  // ids, most recent first
        size_t bytes = 0;
    };
    // Adds a new id as its tenant's most recent (oldest: last, as loading adds them); caller holds mu_.
    void add_locked(const std::string& id, const std::string& tenant, std::string text, bool oldest);
    void remove_locked(const std::string& id);
    void evict_locked(const std::string& tenant);
    void remove_file(const std::string& id) const;

    options opts_;
    mutable std::mutex mu_;
    std::unordered_map<std::string, entry> entries_;           // guarded by mu_
    std::unordered_map<std::string, tenant_entries> tenants_;  // guarded by mu_; no tenant without entries
    size_t bytes_ = 0;                                         // guarded by mu_
};

}  // namespace keepwarm

// See response-store.h. A record is kept as its JSON text (what the file holds), parsed again on each get: stored
// responses are read once per turn, and the text is both the size the limits count and the file's bytes.
#include "routes/response-store.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

#include "base/file-io.h"
#include "base/logger.h"
#include "json/bounded-json.h"

namespace keepwarm {

namespace {

constexpr size_t max_id_length = 64;

std::filesystem::path file_of(const std::filesystem::path& dir, const std::string& id) {
    return dir / (id + ".json");
}

}  // namespace

bool response_store::valid_id(const std::string& id) {
    if (id.size() <= 5 || id.size() > max_id_length || id.rfind("resp_", 0) != 0) return false;
    return std::all_of(id.begin(), id.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    });
}

response_store::response_store(options opts) : opts_(std::move(opts)) {
    if (opts_.dir.empty()) return;
    std::error_code ec;
    std::filesystem::create_directories(opts_.dir, ec);
    if (ec) {
        log::warn("responses", "cannot create {}: {}; stored responses are kept in memory only", opts_.dir.string(),
                  ec.message());
        opts_.dir.clear();
        return;
    }
    struct found {
        std::string id;
        std::filesystem::file_time_type mtime;
    };
    std::vector<found> files;
    for (const auto& f : std::filesystem::directory_iterator(opts_.dir, ec)) {
        const std::string name = f.path().filename().string();
        if (name.find(".tmp.") != std::string::npos) {
            remove_abandoned_temp(f.path());
            continue;
        }
        if (f.path().extension() != ".json" || !valid_id(f.path().stem().string())) continue;
        files.push_back({f.path().stem().string(), f.last_write_time(ec)});
    }
    std::sort(files.begin(), files.end(), [](const found& a, const found& b) { return a.mtime > b.mtime; });
    size_t rejected = 0;
    for (const found& f : files) {
        const std::filesystem::path path = file_of(opts_.dir, f.id);
        const uintmax_t size = std::filesystem::file_size(path, ec);
        if (ec || entries_.size() >= opts_.max_responses || bytes_ + size > opts_.max_bytes ||
            size > opts_.max_bytes_per_tenant) {
            remove_file(f.id);
            continue;
        }
        std::ifstream in(path, std::ios::binary);
        std::ostringstream text;
        text << in.rdbuf();
        std::string tenant;
        try {
            const json stored = bounded_json::parse(text.str());
            if (!stored.is_object() || !stored.contains("items") || !stored["items"].is_array() ||
                !stored.contains("response") || !stored["response"].is_object() || !stored.contains("tenant") ||
                !stored["tenant"].is_string()) {
                throw std::runtime_error("not a stored response");
            }
            tenant = stored["tenant"].get<std::string>();
        } catch (const std::exception&) {
            ++rejected;
            remove_file(f.id);
            continue;
        }
        if (const auto own = tenants_.find(tenant);
            own != tenants_.end() && (own->second.lru.size() >= opts_.max_responses_per_tenant ||
                                      own->second.bytes + size > opts_.max_bytes_per_tenant)) {
            remove_file(f.id);
            continue;
        }
        add_locked(f.id, tenant, text.str(), true);
    }
    if (!entries_.empty() || rejected > 0) {
        log::info("responses", "{} stored responses loaded from {}{}", entries_.size(), opts_.dir.string(),
                  rejected > 0 ? " (" + std::to_string(rejected) + " damaged files removed)" : "");
    }
}

void response_store::put(const std::string& id, const std::string& tenant, record r) {
    if (!valid_id(id)) return;
    std::string text =
        json{{"tenant", tenant}, {"items", std::move(r.items)}, {"response", std::move(r.response)}}.dump(
            -1, ' ', false, json::error_handler_t::replace);
    if (text.size() > std::min(opts_.max_bytes, opts_.max_bytes_per_tenant)) {
        log::warn("responses", "{} is larger than the store ({} bytes): not stored", id, text.size());
        return;
    }
    if (!opts_.dir.empty()) {
        const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
        if (auto error = write_file_atomically(file_of(opts_.dir, id), {std::span(bytes, text.size())})) {
            log::warn("responses", "cannot write {}: {}; it is kept in memory only", id, *error);
        }
    }
    std::lock_guard lock(mu_);
    remove_locked(id);
    add_locked(id, tenant, std::move(text), false);
    evict_locked(tenant);
}

std::optional<response_store::record> response_store::get(const std::string& id, const std::string& tenant) {
    if (!valid_id(id)) return std::nullopt;
    std::string text;
    {
        std::lock_guard lock(mu_);
        auto it = entries_.find(id);
        if (it == entries_.end() || it->second.tenant != tenant) return std::nullopt;
        std::list<std::string>& lru = tenants_.at(tenant).lru;
        lru.splice(lru.begin(), lru, it->second.use);
        text = it->second.text;
    }
    json stored = json::parse(text);  // written by put() or checked at load
    return record{std::move(stored["items"]), std::move(stored["response"])};
}

bool response_store::erase(const std::string& id, const std::string& tenant) {
    if (!valid_id(id)) return false;
    {
        std::lock_guard lock(mu_);
        auto it = entries_.find(id);
        if (it == entries_.end() || it->second.tenant != tenant) return false;
        remove_locked(id);
    }
    remove_file(id);
    return true;
}

size_t response_store::size() const {
    std::lock_guard lock(mu_);
    return entries_.size();
}

size_t response_store::bytes() const {
    std::lock_guard lock(mu_);
    return bytes_;
}

size_t response_store::size_of(const std::string& tenant) const {
    std::lock_guard lock(mu_);
    const auto it = tenants_.find(tenant);
    return it == tenants_.end() ? 0 : it->second.lru.size();
}

void response_store::add_locked(const std::string& id, const std::string& tenant, std::string text, bool oldest) {
    tenant_entries& own = tenants_[tenant];
    const auto use = oldest ? own.lru.insert(own.lru.end(), id) : own.lru.insert(own.lru.begin(), id);
    own.bytes += text.size();
    bytes_ += text.size();
    entries_.emplace(id, entry{tenant, std::move(text), use});
}

void response_store::remove_locked(const std::string& id) {
    const auto it = entries_.find(id);
    if (it == entries_.end()) return;
    const auto own = tenants_.find(it->second.tenant);
    own->second.lru.erase(it->second.use);
    own->second.bytes -= it->second.text.size();
    if (own->second.lru.empty()) tenants_.erase(own);
    bytes_ -= it->second.text.size();
    entries_.erase(it);
}

void response_store::evict_locked(const std::string& tenant) {
    const auto evict_oldest_of = [this](const tenant_entries& own) {
        const std::string victim = own.lru.back();  // a copy: removing it may erase `own`
        remove_locked(victim);
        remove_file(victim);
    };
    for (auto own = tenants_.find(tenant);
         own != tenants_.end() &&
         (own->second.lru.size() > opts_.max_responses_per_tenant || own->second.bytes > opts_.max_bytes_per_tenant);
         own = tenants_.find(tenant)) {
        evict_oldest_of(own->second);
    }
    // Full: the tenant that holds the most of what is over gives up its least recently used.
    while (!tenants_.empty() && (entries_.size() > opts_.max_responses || bytes_ > opts_.max_bytes)) {
        const bool by_count = entries_.size() > opts_.max_responses;
        const auto largest =
            std::max_element(tenants_.begin(), tenants_.end(), [by_count](const auto& a, const auto& b) {
                return by_count ? a.second.lru.size() < b.second.lru.size() : a.second.bytes < b.second.bytes;
            });
        evict_oldest_of(largest->second);
    }
}

void response_store::remove_file(const std::string& id) const {
    if (opts_.dir.empty()) return;
    std::error_code ec;
    std::filesystem::remove(file_of(opts_.dir, id), ec);
}

}  // namespace keepwarm

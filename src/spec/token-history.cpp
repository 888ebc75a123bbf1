// See token-history.h. Each kept stream puts one index entry per k-gram that has a token after it; evicting the
// oldest stream takes its entries off the front of each key's list (they are the oldest there), so the index holds
// exactly the streams within the budget.
#include "spec/token-history.h"

#include <algorithm>
#include <utility>

namespace keepwarm::spec {

std::uint64_t kgram_key(const token* end, std::size_t k) {
    std::uint64_t h = 0x9e3779b97f4a7c15ull ^ k;
    for (const token* t = end - k; t != end; ++t) {
        h ^= static_cast<std::uint32_t>(*t);
        h *= 0x100000001b3ull;
        h ^= h >> 29;
    }
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 32);
}

token_history::token_history(token_history_options options) : options_(options) {
    options_.key_tokens = std::max<std::size_t>(options_.key_tokens, 1);
}

void token_history::add_stream(const std::string& tenant, std::span<const token> tokens) {
    const std::size_t k = options_.key_tokens;
    if (tokens.size() > options_.token_budget) {
        stats_.tokens_truncated += tokens.size() - options_.token_budget;
        tokens = tokens.last(options_.token_budget);
    }
    // An offset is 32 bits: no stream is longer than that, whatever the budget.
    constexpr std::size_t max_stream = std::size_t{1} << 31;
    if (tokens.size() > max_stream) {
        stats_.tokens_truncated += tokens.size() - max_stream;
        tokens = tokens.last(max_stream);
    }
    if (tokens.size() < k + 1) return;
    while (!streams_.empty() && stats_.tokens + tokens.size() > options_.token_budget) evict_oldest();

    const std::uint64_t serial = next_serial_++;
    if (streams_.empty()) first_serial_ = serial;
    streams_.push_back({serial, tenant, std::vector<token>(tokens.begin(), tokens.end())});
    const std::vector<token>& held = streams_.back().tokens;
    tenant_index& index = tenants_[tenant];
    for (std::size_t end = k; end < held.size(); ++end) {
        index[kgram_key(held.data() + end, k)].push_back({serial, static_cast<std::uint32_t>(end)});
    }
    stats_.tokens += held.size();
    ++stats_.streams;
    ++stats_.streams_added;
}

void token_history::unindex(const stream& s) {
    const std::size_t k = options_.key_tokens;
    auto tenant = tenants_.find(s.tenant);
    if (tenant == tenants_.end()) return;
    tenant_index& index = tenant->second;
    for (std::size_t end = k; end < s.tokens.size(); ++end) {
        auto it = index.find(kgram_key(s.tokens.data() + end, k));
        if (it == index.end()) continue;  // the stream's earlier k-gram with the same key took them all
        std::vector<position>& ends = it->second;
        const auto first_newer =
            std::find_if(ends.begin(), ends.end(), [&](const position& p) { return p.serial != s.serial; });
        ends.erase(ends.begin(), first_newer);
        if (ends.empty()) index.erase(it);
    }
    if (index.empty()) tenants_.erase(tenant);
}

void token_history::evict_oldest() {
    stream& oldest = streams_.front();
    if (!oldest.tokens.empty()) {
        unindex(oldest);
        stats_.tokens -= oldest.tokens.size();
        --stats_.streams;
        ++stats_.streams_evicted;
    }
    streams_.pop_front();
    ++first_serial_;
}

void token_history::remove_tenant(const std::string& tenant) {
    for (stream& s : streams_) {
        if (s.tokens.empty() || s.tenant != tenant) continue;
        stats_.tokens -= s.tokens.size();
        --stats_.streams;
        s.tokens.clear();
        s.tokens.shrink_to_fit();
    }
    tenants_.erase(tenant);
    while (!streams_.empty() && streams_.front().tokens.empty()) {
        streams_.pop_front();
        ++first_serial_;
    }
}

void token_history::visit_newest_first(const std::string& tenant, std::uint64_t key,
                                       const std::function<bool(std::span<const token>, position)>& visit) const {
    const auto index = tenants_.find(tenant);
    if (index == tenants_.end()) return;
    const auto it = index->second.find(key);
    if (it == index->second.end()) return;
    const std::vector<position>& ends = it->second;
    for (auto p = ends.rbegin(); p != ends.rend(); ++p) {
        const stream& s = streams_[p->serial - first_serial_];
        if (!visit(s.tokens, *p)) return;
    }
}

}  // namespace keepwarm::spec

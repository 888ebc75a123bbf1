// See api-keys.h.
#include "http/api-keys.h"

#include <fstream>
#include <map>
#include <set>
#include <stdexcept>

namespace keepwarm::http {

namespace {

bool tenant_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
}

bool blank(char c) {
    return c == ' ' || c == '\t';
}

[[noreturn]] void fail(const std::string& source, size_t line, const std::string& what) {
    throw std::invalid_argument(source + ":" + std::to_string(line) + ": " + what);
}

}  // namespace

std::vector<api_key_entry> parse_api_keys(std::string_view text, const std::string& source, bool key_per_line) {
    if (text.size() > max_api_keys_file_bytes) {
        throw std::invalid_argument(source + ": larger than " + std::to_string(max_api_keys_file_bytes) +
                                    " bytes; a keys file holds at most " + std::to_string(max_api_keys) + " keys");
    }
    std::vector<api_key_entry> keys;
    std::map<std::string, size_t> line_of_key;
    size_t tenants = 0;
    std::set<std::string> seen_tenants;
    size_t line_no = 0;
    while (!text.empty()) {
        ++line_no;
        const size_t end = text.find('\n');
        std::string_view line = text.substr(0, end);
        text = end == std::string_view::npos ? std::string_view{} : text.substr(end + 1);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        while (!line.empty() && blank(line.front())) line.remove_prefix(1);
        while (!line.empty() && blank(line.back())) line.remove_suffix(1);
        if (line.empty() || line.front() == '#') continue;

        size_t i = 0;
        while (!key_per_line && i < line.size() && !blank(line[i])) ++i;
        const std::string_view tenant = line.substr(0, i);
        while (i < line.size() && blank(line[i])) ++i;
        const std::string_view key = line.substr(i);

        if (key_per_line) {
            for (const char c : key) {
                if (blank(c)) {
                    fail(source, line_no,
                         "one key per line, without spaces (for 'TENANT KEY' lines use --api-keys-file)");
                }
            }
        }
        for (const char c : tenant) {
            if (!tenant_char(c)) fail(source, line_no, "a tenant name holds only A-Z a-z 0-9 . _ - (then a key)");
        }
        if (tenant.size() > max_tenant_name) {
            fail(source, line_no, "tenant name longer than " + std::to_string(max_tenant_name) + " characters");
        }
        if (key.empty()) fail(source, line_no, "expected 'TENANT KEY', found no key after the tenant name");
        for (const char c : key) {
            if (blank(c)) fail(source, line_no, "expected 'TENANT KEY': the key may not contain spaces");
            if (static_cast<unsigned char>(c) < 0x21 || static_cast<unsigned char>(c) > 0x7e) {
                fail(source, line_no, "the key holds a character that is not printable ASCII");
            }
        }
        if (key.size() < min_api_key_length || key.size() > max_api_key_length) {
            fail(source, line_no,
                 "the key has " + std::to_string(key.size()) + " characters; keys have " +
                     std::to_string(min_api_key_length) + " to " + std::to_string(max_api_key_length));
        }
        if (const auto it = line_of_key.find(std::string(key)); it != line_of_key.end()) {
            fail(source, line_no,
                 "the same key as line " + std::to_string(it->second) + " (each key names one tenant)");
        }
        if (keys.size() >= max_api_keys) fail(source, line_no, "more than " + std::to_string(max_api_keys) + " keys");
        if (seen_tenants.insert(std::string(tenant)).second && ++tenants > max_tenants) {
            fail(source, line_no, "more than " + std::to_string(max_tenants) + " tenants");
        }
        line_of_key.emplace(std::string(key), line_no);
        keys.push_back({std::string(key), std::string(tenant)});
    }
    if (keys.empty()) {
        throw std::invalid_argument(source + ": no keys (expected lines of " +
                                    (key_per_line ? "one key" : "'TENANT KEY'") + ")");
    }
    return keys;
}

std::vector<api_key_entry> load_api_keys_file(const std::string& path, bool key_per_line) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::invalid_argument(path + ": cannot be read");
    std::string text(max_api_keys_file_bytes + 1, '\0');
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    if (in.bad()) throw std::invalid_argument(path + ": read failed");
    text.resize(static_cast<size_t>(in.gcount()));
    return parse_api_keys(text, path, key_per_line);
}

void check_api_key(std::string_view key, const std::string& where_given) {
    if (key.empty()) return;
    const std::string where = where_given.empty() ? "" : where_given + ": ";
    const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f'; };
    if (space(key.front()) || space(key.back())) {
        throw std::invalid_argument(where + "the API key " + (space(key.front()) ? "starts" : "ends") +
                                    " with whitespace, which no client can send (a header's value is trimmed); "
                                    "remove it (check the quotes around the key)");
    }
    for (const char c : key) {
        const auto byte = static_cast<unsigned char>(c);
        if (byte < 0x20 || byte == 0x7f) {
            throw std::invalid_argument(where + "the API key holds a control character (byte " + std::to_string(byte) +
                                        "), which no client can send in a header");
        }
    }
}

std::vector<std::string> split_api_key_list(std::string_view list) {
    std::vector<std::string> keys;
    while (true) {
        const size_t comma = list.find(',');
        std::string_view key = list.substr(0, comma);
        while (!key.empty() && blank(key.front())) key.remove_prefix(1);
        while (!key.empty() && blank(key.back())) key.remove_suffix(1);
        if (!key.empty()) keys.emplace_back(key);
        if (comma == std::string_view::npos) break;
        list.remove_prefix(comma + 1);
    }
    return keys;
}

std::vector<std::string> tenant_names(const std::vector<api_key_entry>& keys) {
    std::vector<std::string> names;
    for (const auto& k : keys) {
        bool known = false;
        for (const auto& n : names) known = known || n == k.tenant;
        if (!known) names.push_back(k.tenant);
    }
    return names;
}

std::vector<api_key_entry> assign_tenants(std::vector<api_key_entry> keys, bool shared_cache) {
    if (shared_cache || tenant_names(keys).size() < 2) {
        for (auto& k : keys) k.tenant.clear();
    }
    return keys;
}

namespace {

// The tenants kept apart; none when every key is the shared tenant's.
std::vector<std::string> isolated_tenants(const std::vector<api_key_entry>& keys) {
    std::vector<std::string> tenants = tenant_names(keys);
    if (tenants.size() == 1 && tenants.front().empty()) tenants.clear();
    return tenants;
}

}  // namespace

std::vector<std::string> configure_tenants(std::string& single_key, std::vector<api_key_entry>& keys,
                                           const std::string& keys_file, bool shared_cache,
                                           const std::string& shared_keys_file,
                                           const std::vector<api_key_entry>& listed_keys) {
    const std::string where = "--api-key (or KEEPWARM_API_KEY, LLAMA_API_KEY, or the settings file's key)";
    std::vector<api_key_entry> more_keys;  // llama-server's --api-key KEY1,KEY2: the keys after the first
    if (single_key.find(',') != std::string::npos) {
        const std::vector<std::string> listed = split_api_key_list(single_key);
        if (listed.empty()) throw std::invalid_argument(where + ": no key in the list");
        std::set<std::string> seen;
        for (const std::string& key : listed) {
            check_api_key(key, where);
            if (!seen.insert(key).second) throw std::invalid_argument(where + ": the same key is listed twice");
            if (&key != &listed.front()) more_keys.push_back({key, ""});
        }
        single_key = listed.front();
    }
    check_api_key(single_key, where);
    if (!listed_keys.empty()) {
        if (!keys_file.empty() || !shared_keys_file.empty() || !single_key.empty()) {
            throw std::invalid_argument(
                "the settings file lists [tenants] keys: give no --api-key, --api-keys-file or --api-key-file too");
        }
        keys = assign_tenants(listed_keys, shared_cache);
        return isolated_tenants(keys);
    }
    if (!shared_keys_file.empty()) {
        // llama-server's keys are all alike, one server's: the shared tenant, beside --api-key if there is one.
        if (!keys_file.empty()) throw std::invalid_argument("give either --api-key-file or --api-keys-file");
        if (shared_cache) throw std::invalid_argument("--shared-cache goes with --api-keys-file, not --api-key-file");
        keys = load_api_keys_file(shared_keys_file, /*key_per_line=*/true);
        keys.insert(keys.end(), more_keys.begin(), more_keys.end());
        return {};
    }
    if (keys_file.empty()) {
        if (shared_cache) throw std::invalid_argument("--shared-cache needs --api-keys-file");
        keys = std::move(more_keys);
        return {};
    }
    if (!single_key.empty()) {
        throw std::invalid_argument(
            "give either --api-key or --api-keys-file (put the key in the file, with a tenant)");
    }
    keys = assign_tenants(load_api_keys_file(keys_file), shared_cache);
    return isolated_tenants(keys);
}

std::string describe_tenants(const std::string& single_key, const std::vector<api_key_entry>& keys,
                             const std::vector<std::string>& tenants) {
    if (keys.empty()) return single_key.empty() ? "none (no API key)" : "one (--api-key)";
    if (tenants.empty()) {
        return std::to_string(keys.size() + (single_key.empty() ? 0 : 1)) + " keys sharing one cache";
    }
    return std::to_string(tenants.size()) + " isolated (" + std::to_string(keys.size()) +
           " keys): each sees only its own cache and reports";
}

}  // namespace keepwarm::http

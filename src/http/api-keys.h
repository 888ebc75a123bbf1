// API keys and the tenants they belong to (`--api-keys-file`): each key names a tenant, and a tenant's requests see
// only that tenant's prefix cache, prompt index and cache-buster reports. The file is read as hostile input: every
// error names the file and line, and no error ever prints a key.
// Threading: plain values and pure functions; safe from any thread.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace keepwarm::http {

struct api_key_entry {
    std::string key;
    std::string tenant;  // empty: the shared tenant (one key, or --shared-cache)
};

inline constexpr size_t max_api_keys_file_bytes = 1u << 20;
inline constexpr size_t max_api_keys = 4096;
inline constexpr size_t max_tenants = 256;
inline constexpr size_t max_tenant_name = 64;
inline constexpr size_t min_api_key_length = 8;
inline constexpr size_t max_api_key_length = 512;

// The keys file's text. One key per line: `TENANT KEY` (separated by spaces or tabs); blank lines and lines starting
// with '#' are ignored. TENANT: 1-64 of [A-Za-z0-9._-]; KEY: 8-512 printable ASCII characters without spaces.
// Several keys may name the same tenant (a key being rotated). A key may appear only once. Throws
// std::invalid_argument "SOURCE:LINE: what is wrong" (never the key itself).
// `key_per_line`: llama-server's --api-key-file instead: each line is a key (same rules), all of the shared tenant.
std::vector<api_key_entry> parse_api_keys(std::string_view text, const std::string& source, bool key_per_line = false);

// Reads and parses a keys file (at most max_api_keys_file_bytes). Throws std::invalid_argument as above, or naming
// the file when it cannot be read.
std::vector<api_key_entry> load_api_keys_file(const std::string& path, bool key_per_line = false);

// A key given whole (--api-key, KEEPWARM_API_KEY, a settings file's api_key; empty: no key): refused, not trimmed,
// when it starts or ends with whitespace or holds a control character anywhere, since a client cannot send such a key
// (a header's value loses its outer spaces, and a control character ends or breaks the header) and the server would
// start and refuse everyone. A key pasted with a stray space is better stopped at start-up than silently changed.
// Throws std::invalid_argument naming `where` (if not empty) and what is wrong, never the key.
void check_api_key(std::string_view key, const std::string& where);

// llama-server's --api-key list: "KEY1,KEY2" is two keys (spaces around each are dropped, empty ones skipped), all
// of the shared tenant. A single key comes back alone.
std::vector<std::string> split_api_key_list(std::string_view list);

// The distinct tenant names of `keys`, in first-seen order.
std::vector<std::string> tenant_names(const std::vector<api_key_entry>& keys);

// Tenants are isolated (each key's requests carry its tenant) unless there is only one tenant or `shared_cache`;
// then every key's tenant becomes the shared one (""), as with a single --api-key.
std::vector<api_key_entry> assign_tenants(std::vector<api_key_entry> keys, bool shared_cache);

// What `serve` and `proxy` do with --api-key (a comma-separated list, as llama-server's: the first key stays in
// `single_key`, the others join `keys` as the shared tenant's), --api-keys-file, --shared-cache and llama-server's
// --api-key-file
// (`shared_keys_file`: a key per line, every key of the one shared tenant, as many as with --api-key): fills `keys`
// from the file and returns the isolated tenants' names (none when every key shares the one tenant: a single key,
// one tenant name, --shared-cache, or a key-per-line file). Throws std::invalid_argument naming the file's line, or
// for flags that do not go together.
// `listed_keys`: keys given by a settings file's [tenants] table instead of a keys file (the same rules).
std::vector<std::string> configure_tenants(std::string& single_key, std::vector<api_key_entry>& keys,
                                           const std::string& keys_file, bool shared_cache,
                                           const std::string& shared_keys_file = "",
                                           const std::vector<api_key_entry>& listed_keys = {});
// One line for the start-up banner.
std::string describe_tenants(const std::string& single_key, const std::vector<api_key_entry>& keys,
                             const std::vector<std::string>& tenants);

}  // namespace keepwarm::http

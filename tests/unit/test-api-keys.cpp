// The keys file (--api-keys-file): 'TENANT KEY' lines, read as hostile input. Every mistake names its line, no error
// ever quotes a key, and the tenants are isolated only when there is more than one of them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "http/api-keys.h"

using namespace keepwarm::http;

namespace {

// The message of the std::invalid_argument `text` raises (empty: it parsed).
std::string error_of(const std::string& text) {
    try {
        parse_api_keys(text, "keys.txt");
    } catch (const std::invalid_argument& e) {
        return e.what();
    }
    return {};
}

}  // namespace

// configure_tenants with a key given as a literal (it rewrites the key it is given when it is a list).
template <class... Rest>
std::vector<std::string> configure(std::string single_key, std::vector<api_key_entry>& keys, Rest&&... rest) {
    return configure_tenants(single_key, keys, std::forward<Rest>(rest)...);
}

TEST(api_keys, parses_tenants_keys_comments_and_blank_lines) {
    const auto keys = parse_api_keys(
        "# team keys\n"
        "\n"
        "alice  sk-alice-0123456789\r\n"
        "\tbob\tsk-bob-0123456789   \n"
        "alice sk-alice-rotated-99\n",
        "keys.txt");
    ASSERT_EQ(keys.size(), 3u);
    EXPECT_EQ(keys[0].tenant, "alice");
    EXPECT_EQ(keys[0].key, "sk-alice-0123456789");
    EXPECT_EQ(keys[1].tenant, "bob");
    EXPECT_EQ(keys[1].key, "sk-bob-0123456789");
    EXPECT_EQ(keys[2].tenant, "alice");
    EXPECT_EQ(tenant_names(keys), (std::vector<std::string>{"alice", "bob"}));
}

TEST(api_keys, every_mistake_names_its_line_and_never_the_key) {
    const std::string secret = "sk-secret-0123456789";
    const struct {
        std::string text;
        std::string expected;
    } cases[] = {
        {"alice " + secret + "\nbob\n", "keys.txt:2: expected 'TENANT KEY', found no key"},
        {"al/ice " + secret + "\n", "keys.txt:1: a tenant name holds only"},
        {"alice " + secret + " extra\n", "keys.txt:1: expected 'TENANT KEY': the key may not contain spaces"},
        {"alice short\n", "keys.txt:1: the key has 5 characters; keys have 8 to 512"},
        {"alice " + std::string(513, 'k') + "\n", "keys.txt:1: the key has 513 characters"},
        {"alice sk-\x01" + secret + "\n", "keys.txt:1: the key holds a character that is not printable ASCII"},
        {"alice sk-\xc3\xa9" + secret + "\n", "keys.txt:1: the key holds a character that is not printable ASCII"},
        {"alice " + secret + "\n# c\nbob " + secret + "\n", "keys.txt:3: the same key as line 1"},
        {std::string(65, 't') + " " + secret + "\n", "keys.txt:1: tenant name longer than 64"},
        {"", "keys.txt: no keys"},
        {"# only a comment\n\n", "keys.txt: no keys"},
    };
    for (const auto& c : cases) {
        const std::string error = error_of(c.text);
        EXPECT_EQ(error.rfind(c.expected, 0), 0u) << "got: " << error;
        EXPECT_EQ(error.find(secret), std::string::npos) << error;
        EXPECT_EQ(error.find("short"), std::string::npos) << error;
    }
}

TEST(api_keys, bounds_size_keys_and_tenants) {
    EXPECT_NE(error_of(std::string(max_api_keys_file_bytes + 1, '#')).find("larger than"), std::string::npos);
    std::string many_tenants;
    for (size_t i = 0; i <= max_tenants; ++i) {
        const std::string n = std::to_string(i);
        many_tenants.append("t").append(n).append(" key-").append(n).append("-xxxxxx\n");
    }
    EXPECT_EQ(error_of(many_tenants).rfind("keys.txt:257: more than 256 tenants", 0), 0u) << error_of(many_tenants);
    std::string many_keys;
    for (size_t i = 0; i <= max_api_keys; ++i) many_keys.append("t key-").append(std::to_string(i)).append("-xxxxxx\n");
    EXPECT_EQ(error_of(many_keys).rfind("keys.txt:4097: more than 4096 keys", 0), 0u) << error_of(many_keys);
}

TEST(api_keys, tenants_are_isolated_only_with_more_than_one_unless_shared) {
    const auto two = parse_api_keys("a key-a-0123\nb key-b-0123\n", "k");
    EXPECT_EQ(assign_tenants(two, false)[1].tenant, "b");
    EXPECT_EQ(assign_tenants(two, true)[1].tenant, "");
    const auto one = parse_api_keys("a key-a-0123\na key-a-4567\n", "k");
    EXPECT_EQ(assign_tenants(one, false)[0].tenant, "");
}

TEST(api_keys, configure_tenants_reads_the_file_and_refuses_mixed_flags) {
    const auto dir = std::filesystem::temp_directory_path();
    const auto file = dir / ("keepwarm-keys-" + std::to_string(::getpid()) + ".txt");
    std::ofstream(file) << "a key-a-0123\nb key-b-0123\n";
    std::vector<api_key_entry> keys;
    EXPECT_EQ(configure("", keys, file.string(), false), (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ(keys.size(), 2u);
    EXPECT_TRUE(configure("", keys, file.string(), true).empty());
    EXPECT_THROW(configure("single-key", keys, file.string(), false), std::invalid_argument);
    EXPECT_THROW(configure("", keys, "", true), std::invalid_argument);
    EXPECT_THROW(configure("", keys, (dir / "no-such-keys-file").string(), false), std::invalid_argument);
    std::filesystem::remove(file);
}

// llama-server's --api-key-file: a key per line, every key of the one shared tenant, the same rules for each key.
TEST(api_keys, a_key_per_line_file_gives_shared_keys_and_names_its_mistakes) {
    const auto keys = parse_api_keys("# llama-server\nkey-one-0123\n\n  key-two-4567 \r\n", "k", true);
    ASSERT_EQ(keys.size(), 2u);
    EXPECT_EQ(keys[0].key, "key-one-0123");
    EXPECT_EQ(keys[1].key, "key-two-4567");
    EXPECT_EQ(keys[0].tenant, "");
    EXPECT_EQ(keys[1].tenant, "");
    auto error = [](const std::string& text) {
        try {
            parse_api_keys(text, "k", true);
        } catch (const std::invalid_argument& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    EXPECT_EQ(error("alice key-one-0123\n"),
              "k:1: one key per line, without spaces (for 'TENANT KEY' lines use --api-keys-file)");
    EXPECT_EQ(error("key-one-0123\nshort\n"), "k:2: the key has 5 characters; keys have 8 to 512");
    EXPECT_EQ(error("key-one-0123\nkey-one-0123\n"), "k:2: the same key as line 1 (each key names one tenant)");
    EXPECT_EQ(error("# nothing\n"), "k: no keys (expected lines of one key)");
}

TEST(api_keys, configure_tenants_takes_a_key_per_line_file_as_one_shared_tenant) {
    const auto dir = std::filesystem::temp_directory_path();
    const auto file = dir / ("keepwarm-shared-keys-" + std::to_string(::getpid()) + ".txt");
    std::ofstream(file) << "key-a-0123\nkey-b-0123\n";
    std::vector<api_key_entry> keys;
    EXPECT_TRUE(configure("", keys, "", false, file.string()).empty());
    EXPECT_EQ(keys.size(), 2u);
    keys.clear();
    EXPECT_TRUE(configure("single-key", keys, "", false, file.string()).empty()) << "beside --api-key";
    EXPECT_EQ(keys.size(), 2u);
    EXPECT_THROW(configure("", keys, file.string(), false, file.string()), std::invalid_argument);
    EXPECT_THROW(configure("", keys, "", true, file.string()), std::invalid_argument);
    std::filesystem::remove(file);
}

// --api-key " key" started a server that refused every client: nobody can send a key with outer spaces.
TEST(api_keys, a_single_key_with_outer_whitespace_or_a_control_character_stops_the_start) {
    const auto error = [](const std::string& key) {
        std::vector<api_key_entry> keys;
        try {
            configure(key, keys, "", false);
        } catch (const std::invalid_argument& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    for (const std::string key : {" sk-secret-1", "sk-secret-1 ", "\tsk-secret-1", "sk-secret-1\n", "   "}) {
        SCOPED_TRACE(key);
        const std::string message = error(key);
        EXPECT_NE(message.find("--api-key"), std::string::npos) << message;
        EXPECT_NE(message.find("whitespace"), std::string::npos) << message;
        EXPECT_EQ(message.find("sk-secret"), std::string::npos) << "the key is never printed: " << message;
    }
    EXPECT_NE(error(std::string("sk-se\x01"
                                "cret"))
                  .find("control character (byte 1)"),
              std::string::npos);
    EXPECT_NE(error("sk-secret\r\nx-evil: 1").find("control character (byte 13)"), std::string::npos);
    EXPECT_EQ(error(""), "");  // no key: no auth
    EXPECT_EQ(error("sk-secret-1"), "");
    EXPECT_EQ(error("a key with inner spaces"), "");  // a client sends it as it is
    EXPECT_NO_THROW(check_api_key("sk-secret-1", "where"));
    EXPECT_THROW(check_api_key(" sk", "where"), std::invalid_argument);
}

// llama-server's --api-key KEY1,KEY2: two keys of one shared cache; the list itself is no key.
TEST(api_keys, a_comma_separated_api_key_is_several_keys_of_the_shared_tenant) {
    EXPECT_EQ(split_api_key_list("key-a-0123, key-b-4567,,"), (std::vector<std::string>{"key-a-0123", "key-b-4567"}));
    EXPECT_EQ(split_api_key_list("key-a-0123"), (std::vector<std::string>{"key-a-0123"}));
    std::string single = "key-a-0123,key-b-4567";
    std::vector<api_key_entry> keys;
    EXPECT_TRUE(configure_tenants(single, keys, "", false).empty());
    EXPECT_EQ(single, "key-a-0123");
    ASSERT_EQ(keys.size(), 1u);
    EXPECT_EQ(keys[0].key, "key-b-4567");
    EXPECT_EQ(keys[0].tenant, "");
    EXPECT_EQ(describe_tenants(single, keys, {}), "2 keys sharing one cache");
    std::string twice = "key-a-0123,key-a-0123";
    EXPECT_THROW(configure_tenants(twice, keys, "", false), std::invalid_argument);
    std::string none = ",,";
    EXPECT_THROW(configure_tenants(none, keys, "", false), std::invalid_argument);
}

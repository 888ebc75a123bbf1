// block_key: chain hashing of KV block keys, their hex names, and the model fingerprint that roots every chain.
#include <gtest/gtest.h>
#include <unistd.h>
#include <xxhash.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <string_view>
#include <unordered_set>

#include "cache/block-key.h"
#include "ggml-cpp.h"
#include "gguf.h"

using keepwarm::block_key;
using keepwarm::chain_block_key;
using keepwarm::model_fingerprint;
using keepwarm::root_block_key;
using keepwarm::tenant_root_block_key;
using tokens = std::vector<llama_token>;
namespace fs = std::filesystem;

TEST(block_key, hex_round_trip_and_rejects_malformed) {
    const block_key key{0x0123456789abcdefull, 0xfedcba9876543210ull};
    EXPECT_EQ(key.hex(), "0123456789abcdeffedcba9876543210");
    EXPECT_EQ(block_key::from_hex(key.hex()), key);
    EXPECT_EQ(block_key::from_hex("0123456789ABCDEFFEDCBA9876543210"), key);
    EXPECT_FALSE(block_key::from_hex("0123456789abcdeffedcba987654321"));    // 31 digits
    EXPECT_FALSE(block_key::from_hex("0123456789abcdeffedcba98765432100"));  // 33 digits
    EXPECT_FALSE(block_key::from_hex("0123456789abcdeffedcba987654321g"));
    EXPECT_EQ(block_key{}.hex(), std::string(32, '0'));
}

TEST(block_key, ordering_equality_and_hash) {
    const block_key a{1, 2}, b{1, 3}, c{2, 0};
    EXPECT_TRUE(a < b);
    EXPECT_TRUE(b < c);
    EXPECT_FALSE(c < a);
    EXPECT_NE(a, b);
    EXPECT_EQ(a, (block_key{1, 2}));
    std::unordered_set<block_key> set{a, b, c, a};
    EXPECT_EQ(set.size(), 3u);
}

TEST(block_key, bytes_are_xxh3_canonical_form) {
    const block_key key{0x0102030405060708ull, 0x090a0b0c0d0e0f10ull};
    unsigned char bytes[keepwarm::block_key_size];
    keepwarm::block_key_to_bytes(key, bytes);
    for (int i = 0; i < 16; ++i) EXPECT_EQ(bytes[i], i + 1);
    EXPECT_EQ(keepwarm::block_key_from_bytes(bytes), key);
}

TEST(block_key, chain_key_is_xxh3_of_parent_and_tokens) {
    const block_key parent = root_block_key("model-a");
    const tokens t{1, 2, 3, 70000, -1};

    // Computed here with the XXH3 API directly, so a change to the scheme (which would orphan every disk cache)
    // cannot pass unnoticed.
    XXH128_canonical_t canonical;
    XXH128_canonicalFromHash(&canonical, XXH128_hash_t{parent.low, parent.high});
    std::vector<unsigned char> input(canonical.digest, canonical.digest + 16);
    const auto* token_bytes = reinterpret_cast<const unsigned char*>(t.data());
    input.insert(input.end(), token_bytes, token_bytes + t.size() * 4);
    const XXH128_hash_t expected = XXH3_128bits(input.data(), input.size());

    const block_key key = chain_block_key(parent, t);
    EXPECT_EQ(key.high, expected.high64);
    EXPECT_EQ(key.low, expected.low64);
}

TEST(block_key, root_key_is_xxh3_of_tag_and_fingerprint) {
    const std::string input = "keepwarm.root.v1model-a";
    const XXH128_hash_t expected = XXH3_128bits(input.data(), input.size());
    EXPECT_EQ(root_block_key("model-a"), (block_key{expected.high64, expected.low64}));
}

TEST(block_key, keys_are_stable_across_runs) {
    // Pinned values: these name files on disk, so they must not change between builds.
    EXPECT_EQ(root_block_key("model-a").hex(), "a0644f2d83b59b5ca2b76505a3440d10");
    EXPECT_EQ(chain_block_key(root_block_key("model-a"), tokens{1, 2, 3}).hex(), "f1780076aebfe01d44f1be59e6fdc9e7");
}

TEST(block_key, chain_key_changes_with_any_token_or_the_parent) {
    const block_key root_a = root_block_key("model-a");
    const block_key root_b = root_block_key("model-b");
    EXPECT_NE(root_a, root_b);

    const tokens base{10, 20, 30, 40};
    const block_key key = chain_block_key(root_a, base);
    EXPECT_EQ(key, chain_block_key(root_a, base));
    EXPECT_NE(key, chain_block_key(root_b, base));
    for (size_t i = 0; i < base.size(); ++i) {
        tokens changed = base;
        changed[i] += 1;
        EXPECT_NE(key, chain_block_key(root_a, changed)) << "token " << i;
    }
    EXPECT_NE(key, chain_block_key(root_a, tokens{10, 20, 30}));

    // The same tokens after different prefixes get different keys: a key names the whole prefix.
    const block_key p1 = chain_block_key(root_a, tokens{1});
    const block_key p2 = chain_block_key(root_a, tokens{2});
    EXPECT_NE(chain_block_key(p1, base), chain_block_key(p2, base));
}

namespace {

struct temp_file {
    fs::path path;
    explicit temp_file(const std::string& stem)
        : path(fs::temp_directory_path() / (stem + "-" + std::to_string(::getpid()) + ".bin")) {}
    ~temp_file() {
        std::error_code ec;
        fs::remove(path, ec);
    }
};

void write_random(const fs::path& path, size_t size) {
    std::vector<char> bytes(size);
    std::mt19937 rng(7);
    for (auto& b : bytes) b = static_cast<char>(rng());
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void patch_byte(const fs::path& path, size_t offset) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(offset));
    char c = 0;
    f.get(c);
    f.seekp(static_cast<std::streamoff>(offset));
    f.put(static_cast<char>(c ^ 0x5a));
}

}  // namespace

TEST(model_fingerprint, sees_the_head_the_sampled_tensor_data_the_size_and_the_kv_format) {
    temp_file file("keepwarm-fingerprint");
    const size_t size = (16u << 20) + (3u << 20);  // head plus a tail that gets sampled
    write_random(file.path, size);

    const std::string fp = model_fingerprint(file.path.string(), "k=f16 v=f16");
    EXPECT_EQ(fp.size(), 32u);
    EXPECT_TRUE(block_key::from_hex(fp).has_value());
    EXPECT_EQ(fp, model_fingerprint(file.path.string(), "k=f16 v=f16"));
    EXPECT_NE(fp, model_fingerprint(file.path.string(), "k=q8_0 v=q8_0"));

    patch_byte(file.path, 100);  // GGUF metadata
    const std::string fp_head = model_fingerprint(file.path.string(), "k=f16 v=f16");
    EXPECT_NE(fp_head, fp);

    patch_byte(file.path, size - 1);  // the last sample ends at the end of the file
    const std::string fp_tail = model_fingerprint(file.path.string(), "k=f16 v=f16");
    EXPECT_NE(fp_tail, fp_head);

    fs::resize_file(file.path, size + 1);
    EXPECT_NE(model_fingerprint(file.path.string(), "k=f16 v=f16"), fp_tail);
}

TEST(model_fingerprint, small_file_is_hashed_whole) {
    temp_file file("keepwarm-fingerprint-small");
    write_random(file.path, 4096);
    const std::string fp = model_fingerprint(file.path.string(), "");
    patch_byte(file.path, 4000);
    EXPECT_NE(model_fingerprint(file.path.string(), ""), fp);
}

namespace {

// What model_fingerprint made of a file under 16 MiB before sliding-window models got their tag, computed with the
// XXH3 API directly: the size, the whole file and the length-prefixed KV format.
std::string fingerprint_before_the_swa_tag(const fs::path& path, std::string_view kv_format) {
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::string input;
    const uint64_t size = bytes.size(), format_size = kv_format.size();
    input.append(reinterpret_cast<const char*>(&size), sizeof size);
    input += bytes;
    input.append(reinterpret_cast<const char*>(&format_size), sizeof format_size);
    input += kv_format;
    const XXH128_hash_t h = XXH3_128bits(input.data(), input.size());
    return block_key{h.high64, h.low64}.hex();
}

// A GGUF of metadata only: an architecture and, where given, its sliding window.
void write_gguf(const fs::path& path, const std::string& arch, std::optional<uint32_t> sliding_window) {
    const gguf_context_ptr meta(gguf_init_empty());
    gguf_set_val_str(meta.get(), "general.architecture", arch.c_str());
    gguf_set_val_u32(meta.get(), (arch + ".block_count").c_str(), 6);
    if (sliding_window) gguf_set_val_u32(meta.get(), (arch + ".attention.sliding_window").c_str(), *sliding_window);
    ASSERT_TRUE(gguf_write_to_file(meta.get(), path.c_str(), /*only_meta =*/false));
}

}  // namespace

// A sliding-window model's disk entries written before the window was kept whole (prompt_cache::swa_window_intact)
// may hold KV positions llama.cpp had overwritten. Its fingerprint changed, so those entries are another model's to
// this version and never read; every other model's fingerprint, and so its disk cache, is what it was.
TEST(model_fingerprint, changed_for_sliding_window_models_only) {
    const std::string format = "k=f16 v=f16 block=256 state=llama.cpp-80fb11a";
    temp_file dense("keepwarm-fingerprint-dense"), hybrid("keepwarm-fingerprint-hybrid");
    temp_file swa("keepwarm-fingerprint-swa"), no_window("keepwarm-fingerprint-swa-0");
    write_gguf(dense.path, "qwen3", std::nullopt);
    write_gguf(hybrid.path, "qwen35moe", std::nullopt);
    write_gguf(swa.path, "gemma3", 512);
    write_gguf(no_window.path, "gemma3", 0);

    EXPECT_EQ(model_fingerprint(dense.path.string(), format), fingerprint_before_the_swa_tag(dense.path, format));
    EXPECT_EQ(model_fingerprint(hybrid.path.string(), format), fingerprint_before_the_swa_tag(hybrid.path, format));
    EXPECT_EQ(model_fingerprint(no_window.path.string(), format),
              fingerprint_before_the_swa_tag(no_window.path, format));
    const std::string swa_fp = model_fingerprint(swa.path.string(), format);
    EXPECT_NE(swa_fp, fingerprint_before_the_swa_tag(swa.path, format));
    EXPECT_EQ(swa_fp.size(), 32u);
    EXPECT_EQ(swa_fp, model_fingerprint(swa.path.string(), format)) << "still stable across start-ups";
    EXPECT_NE(swa_fp, model_fingerprint(swa.path.string(), "k=q8_0 v=q8_0 block=256 state=llama.cpp-80fb11a"));
}

TEST(model_fingerprint, missing_file_throws_with_the_path) {
    const std::string path = "/nonexistent/keepwarm/model.gguf";
    try {
        model_fingerprint(path, "");
        FAIL() << "no exception";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
}

TEST(block_key, tenants_root_their_chains_apart) {
    // The shared tenant keeps the old root, so entries written before tenants existed stay readable.
    EXPECT_EQ(tenant_root_block_key("fp", ""), root_block_key("fp"));
    const block_key a = tenant_root_block_key("fp", "alice"), b = tenant_root_block_key("fp", "bob");
    EXPECT_NE(a, b);
    EXPECT_NE(a, root_block_key("fp"));
    EXPECT_NE(tenant_root_block_key("fpa", "lice"), a);  // the fingerprint's length keeps the split unambiguous
    EXPECT_NE(tenant_root_block_key("other", "alice"), a);
    const std::vector<llama_token> prompt{1, 2, 3, 4};
    EXPECT_NE(chain_block_key(a, prompt), chain_block_key(b, prompt));
    EXPECT_NE(chain_block_key(a, prompt), chain_block_key(root_block_key("fp"), prompt));
}

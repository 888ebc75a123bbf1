// The Responses API's stored responses: kept and continued per tenant, bounded in count and bytes (least recently
// used out first), kept across a restart in their folder, and a damaged or foreign file there never loaded.
#include "routes/response-store.h"

#include <gtest/gtest.h>

#include <fstream>

#include "test-temp-dir.h"

using keepwarm::response_store;
using json = response_store::json;

namespace {

response_store::record record_of(const std::string& text) {
    return {json::array({{{"role", "user"}, {"content", text}}}), json{{"id", "x"}, {"output_text", text}}};
}

std::string text_of(const std::optional<response_store::record>& r) {
    return r ? r->items[0]["content"].get<std::string>() : "<none>";
}

}  // namespace

TEST(response_store, keeps_gets_and_erases_a_tenants_own_responses) {
    response_store store({});
    store.put("resp_a1", "", record_of("hello"));
    store.put("resp_b1", "bob", record_of("bob's"));
    EXPECT_EQ(text_of(store.get("resp_a1", "")), "hello");
    EXPECT_EQ(store.get("resp_a1", "")->response["output_text"], "hello");
    EXPECT_EQ(text_of(store.get("resp_b1", "")), "<none>");  // another tenant's id is not found
    EXPECT_EQ(text_of(store.get("resp_b1", "bob")), "bob's");
    EXPECT_FALSE(store.erase("resp_b1", "alice"));
    EXPECT_TRUE(store.erase("resp_b1", "bob"));
    EXPECT_FALSE(store.get("resp_b1", "bob"));
    EXPECT_FALSE(store.erase("resp_b1", "bob"));
    EXPECT_EQ(store.size(), 1u);
}

TEST(response_store, ids_that_cannot_be_ours_are_never_looked_up) {
    for (const char* id : {"", "resp_", "../etc/passwd", "resp_../x", "resp_a/b", "msg_abc", "resp_a.json"}) {
        EXPECT_FALSE(response_store::valid_id(id)) << id;
    }
    EXPECT_FALSE(response_store::valid_id("resp_" + std::string(60, 'a')));
    EXPECT_TRUE(response_store::valid_id("resp_Azi19eZvENXgXDYoTWdVyn81YnAoBbrl"));
}

TEST(response_store, the_least_recently_used_go_first_past_the_count_and_the_bytes) {
    response_store store({.max_responses = 2, .max_bytes = 1 << 20, .dir = {}});
    store.put("resp_1", "", record_of("one"));
    store.put("resp_2", "", record_of("two"));
    ASSERT_TRUE(store.get("resp_1", ""));  // used: resp_2 is now the least recent
    store.put("resp_3", "", record_of("three"));
    EXPECT_TRUE(store.get("resp_1", ""));
    EXPECT_FALSE(store.get("resp_2", ""));
    EXPECT_TRUE(store.get("resp_3", ""));

    response_store small({.max_responses = 100, .max_bytes = 400, .dir = {}});
    small.put("resp_big", "", record_of(std::string(1000, 'x')));  // larger than the whole store: not kept
    EXPECT_FALSE(small.get("resp_big", ""));
    for (int i = 0; i < 10; ++i) small.put("resp_" + std::to_string(i), "", record_of(std::string(50, 'a' + i)));
    EXPECT_LE(small.bytes(), 400u);
    EXPECT_TRUE(small.get("resp_9", ""));
    EXPECT_FALSE(small.get("resp_0", ""));
}

TEST(response_store, a_restart_keeps_them_and_damaged_files_are_removed) {
    keepwarm::test_support::temp_dir dir("responses");
    {
        response_store store({.dir = dir.path});
        store.put("resp_kept", "alice", record_of("kept"));
        store.put("resp_gone", "", record_of("gone"));
        EXPECT_TRUE(store.erase("resp_gone", ""));
    }
    std::ofstream(dir.path / "resp_damaged.json") << "{\"tenant\": \"\", \"items\": [";
    std::ofstream(dir.path / "resp_wrong.json") << R"({"tenant": 3, "items": [], "response": {}})";
    std::ofstream(dir.path / "notes.txt") << "not ours";

    response_store again({.dir = dir.path});
    EXPECT_EQ(text_of(again.get("resp_kept", "alice")), "kept");
    EXPECT_FALSE(again.get("resp_kept", ""));
    EXPECT_FALSE(again.get("resp_gone", ""));
    EXPECT_FALSE(std::filesystem::exists(dir.path / "resp_damaged.json"));
    EXPECT_FALSE(std::filesystem::exists(dir.path / "resp_wrong.json"));
    EXPECT_TRUE(std::filesystem::exists(dir.path / "notes.txt"));  // not a response file: left alone
    EXPECT_EQ(again.size(), 1u);

    response_store bounded({.max_responses = 0, .max_bytes = 1 << 20, .dir = dir.path});  // over the limit at load
    EXPECT_EQ(bounded.size(), 0u);
    EXPECT_FALSE(std::filesystem::exists(dir.path / "resp_kept.json"));
}

// Issue 39 (F3): one tenant's flood, of many small responses or of a few large ones, evicts only its own; tenant A's
// conversation is still there to continue.
TEST(response_store, a_tenants_flood_never_evicts_another_tenants_response) {
    response_store by_count({.max_responses = 100, .max_bytes = 1 << 20, .dir = {}});
    by_count.put("resp_alice", "alice", record_of("alice's"));
    for (int i = 0; i < 150; ++i) by_count.put("resp_b" + std::to_string(i), "bob", record_of("tiny"));
    EXPECT_EQ(text_of(by_count.get("resp_alice", "alice")), "alice's");
    EXPECT_EQ(by_count.size(), 100u);
    EXPECT_EQ(by_count.size_of("bob"), 99u);
    EXPECT_TRUE(by_count.get("resp_b149", "bob"));  // bob loses his oldest
    EXPECT_FALSE(by_count.get("resp_b0", "bob"));

    response_store by_bytes({.max_responses = 100, .max_bytes = 4000, .dir = {}});
    by_bytes.put("resp_alice", "alice", record_of(std::string(500, 'a')));
    for (int i = 0; i < 10; ++i) by_bytes.put("resp_b" + std::to_string(i), "bob", record_of(std::string(700, 'b')));
    EXPECT_EQ(text_of(by_bytes.get("resp_alice", "alice")), std::string(500, 'a'));
    EXPECT_LE(by_bytes.bytes(), 4000u);
    EXPECT_TRUE(by_bytes.get("resp_b9", "bob"));

    // The tenant holding the most gives up its least recently used when the store is full, whoever put last.
    response_store shared({.max_responses = 4, .max_bytes = 1 << 20, .dir = {}});
    for (int i = 0; i < 3; ++i) shared.put("resp_b" + std::to_string(i), "bob", record_of("b"));
    shared.put("resp_a0", "alice", record_of("a"));
    shared.put("resp_a1", "alice", record_of("a"));
    EXPECT_FALSE(shared.get("resp_b0", "bob"));
    EXPECT_EQ(shared.size_of("alice"), 2u);
    EXPECT_EQ(shared.size_of("bob"), 2u);
}

TEST(response_store, a_tenant_over_its_quota_evicts_its_own_oldest) {
    response_store store({.max_responses = 100,
                          .max_bytes = 1 << 20,
                          .max_responses_per_tenant = 2,
                          .max_bytes_per_tenant = 1000,
                          .dir = {}});
    store.put("resp_a0", "alice", record_of("a"));
    store.put("resp_b0", "bob", record_of("b"));
    store.put("resp_b1", "bob", record_of("b"));
    ASSERT_TRUE(store.get("resp_b0", "bob"));  // used: resp_b1 is bob's least recent
    store.put("resp_b2", "bob", record_of("b"));
    EXPECT_TRUE(store.get("resp_b0", "bob"));
    EXPECT_FALSE(store.get("resp_b1", "bob"));
    EXPECT_TRUE(store.get("resp_a0", "alice"));
    store.put("resp_big", "bob", record_of(std::string(2000, 'x')));  // over bob's byte quota alone: not kept
    EXPECT_FALSE(store.get("resp_big", "bob"));
    store.put("resp_b3", "bob", record_of(std::string(420, 'x')));  // bob's bytes over: his oldest go
    EXPECT_EQ(store.size_of("bob"), 1u);
    EXPECT_TRUE(store.get("resp_b3", "bob"));
    EXPECT_EQ(store.size(), 2u);
}

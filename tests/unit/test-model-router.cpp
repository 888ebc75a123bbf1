// Several models behind one port: the router's scheduling with a fake launcher (no process starts): models load on
// demand, --models-max holds and so does --models-memory (a model over it alone is refused), the least recently used
// idle model that is not pinned makes room, a full queue refuses, a server that exits leaves its model unloaded,
// keep_alive and idle times unload; and the model set: a folder's scan and a settings file's [models.NAME] tables,
// whose mistakes name the file and line.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/request-error.h"
#include "config/config-error.h"
#include "router/keep-alive.h"
#include "router/model-router.h"
#include "router/model-set.h"
#include "router/router-routes.h"

namespace fs = std::filesystem;
using namespace keepwarm;
using namespace keepwarm::router;
using namespace std::chrono_literals;

namespace {

class fake_child : public model_child {
public:
    explicit fake_child(int port) : origin_(http::endpoint::parse("http://127.0.0.1:" + std::to_string(port))) {}
    const http::endpoint& origin() const override { return origin_; }
    int pid() const override { return 0; }
    void stop(std::chrono::milliseconds) override { stopped = true; }
    bool stopped = false;

private:
    http::endpoint origin_;
};

// Starts nothing: records which models it launched and stopped, and keeps each one's exit callback.
class fake_launcher : public child_launcher {
public:
    std::unique_ptr<model_child> launch(const model_entry& m, child_exit_callback on_exit) override {
        std::lock_guard lk(mu);
        if (failing == m.name) throw std::runtime_error("its server exited with status 1 before it listened");
        launched.push_back(m.name);
        exits[m.name] = std::move(on_exit);
        return std::make_unique<fake_child>(10000 + static_cast<int>(launched.size()));
    }
    std::mutex mu;
    std::vector<std::string> launched;
    std::map<std::string, child_exit_callback> exits;
    std::string failing;
};

model_set three_models(bool pin_b = false) {
    std::vector<model_entry> entries;
    for (const char* name : {"a", "b", "c"}) {
        model_entry m;
        m.name = name;
        m.path = std::string("/models/") + name + ".gguf";
        m.pinned = pin_b && m.name == "b";
        entries.push_back(m);
    }
    entries[0].aliases = {"alpha"};
    return model_set(entries, {});
}

router_options opts(int max, int queue = 64) {
    router_options o;
    o.models_max = max;
    o.queue_limit = queue;
    o.housekeeping_thread = false;
    o.wait_timeout = 5s;
    return o;
}

model_state state_of(const model_router& r, size_t i) {
    return r.snapshot()[i].state;
}

}  // namespace

TEST(ModelRouter, LoadsOnDemandAndFindsAliases) {
    fake_launcher launcher;
    model_router r(three_models(), launcher, opts(4));
    EXPECT_EQ(r.models().find("alpha"), std::optional<size_t>(0));
    EXPECT_EQ(r.models().find("b"), std::optional<size_t>(1));
    EXPECT_FALSE(r.models().find("d"));
    EXPECT_EQ(state_of(r, 0), model_state::unloaded);
    {
        model_router::lease l = r.acquire(0);
        EXPECT_EQ(l.origin().port, 10001);
        EXPECT_EQ(r.snapshot()[0].in_flight, 1);
    }
    EXPECT_EQ(state_of(r, 0), model_state::loaded);
    EXPECT_EQ(r.snapshot()[0].in_flight, 0);
    { model_router::lease again = r.acquire(0); }
    EXPECT_EQ(launcher.launched, std::vector<std::string>{"a"});  // loaded once
    EXPECT_EQ(r.counters().loads, 1u);
}

TEST(ModelRouter, ModelsMaxUnloadsTheLeastRecentlyUsedIdleModel) {
    fake_launcher launcher;
    model_router r(three_models(), launcher, opts(2));
    { auto l = r.acquire(0); }
    std::this_thread::sleep_for(2ms);
    { auto l = r.acquire(1); }
    std::this_thread::sleep_for(2ms);
    { auto l = r.acquire(0); }  // a is now used more recently than b
    { auto l = r.acquire(2); }  // full: b goes
    EXPECT_EQ(state_of(r, 0), model_state::loaded);
    EXPECT_EQ(state_of(r, 1), model_state::unloaded);
    EXPECT_EQ(state_of(r, 2), model_state::loaded);
    EXPECT_EQ(r.counters().unloads, 1u);
    EXPECT_EQ(r.counters().loaded, 2);
}

TEST(ModelRouter, TheVictimSkipsBusyAndPinnedModels) {
    fake_launcher launcher;
    model_router r(three_models(/*pin_b=*/true), launcher, opts(2));
    std::optional<model_router::lease> busy_a(r.acquire(0));  // a: least recently used, but a request is in flight
    std::this_thread::sleep_for(2ms);
    { auto l = r.acquire(1); }  // b: pinned
    std::atomic<bool> got_c{false};
    std::thread waiter([&] {
        auto l = r.acquire(2);  // neither may go: waits until a's request ends
        got_c = true;
    });
    std::this_thread::sleep_for(100ms);
    EXPECT_FALSE(got_c);
    EXPECT_EQ(r.counters().waiting, 1);
    EXPECT_EQ(state_of(r, 0), model_state::loaded);
    busy_a.reset();
    waiter.join();
    EXPECT_TRUE(got_c);
    EXPECT_EQ(state_of(r, 0), model_state::unloaded);  // a went, not the pinned b
    EXPECT_EQ(state_of(r, 1), model_state::loaded);
}

// With room for one model, a model that always has a request in flight would keep a request for another out until
// its wait timed out: once a request waits for room, the busy model takes no new requests, is unloaded when its last
// one ends, and the requests that came for it meanwhile are served after it loads again.
TEST(ModelRouter, ABusyModelTakesNoNewRequestsWhileAnotherWaitsForRoom) {
    fake_launcher launcher;
    model_router r(three_models(), launcher, opts(1));
    std::optional<model_router::lease> first_a(r.acquire(0));
    std::atomic<bool> got_b{false};
    std::atomic<bool> got_second_a{false};
    std::thread b_request([&] {
        auto l = r.acquire(1);
        got_b = true;
        std::this_thread::sleep_for(50ms);  // served while the second request for a still waits
        EXPECT_FALSE(got_second_a);
    });
    while (r.counters().waiting < 1) std::this_thread::sleep_for(1ms);
    std::thread second_a([&] {
        auto l = r.acquire(0);  // a is loaded, but b waits for its room: this one waits too
        got_second_a = true;
    });
    for (int i = 0; i < 2000 && r.counters().waiting < 2 && !got_second_a; ++i) std::this_thread::sleep_for(1ms);
    EXPECT_FALSE(got_b);
    EXPECT_FALSE(got_second_a);
    EXPECT_EQ(r.snapshot()[0].in_flight, 1);
    first_a.reset();  // a's last request ends: a makes room for b
    b_request.join();
    second_a.join();
    EXPECT_TRUE(got_b);
    EXPECT_TRUE(got_second_a);
    EXPECT_EQ(launcher.launched, (std::vector<std::string>{"a", "b", "a"}));
    EXPECT_EQ(r.counters().wait_timeouts, 0u);
}

// A request that stops waiting for room (its wait timed out) leaves the busy model serving new requests again.
TEST(ModelRouter, AModelDrainingForAWaiterThatLeftServesAgain) {
    fake_launcher launcher;
    router_options o = opts(1);
    o.wait_timeout = 100ms;
    model_router r(three_models(), launcher, o);
    std::optional<model_router::lease> busy_a(r.acquire(0));
    EXPECT_THROW(r.acquire(1), request_error);  // a stays busy past b's wait
    EXPECT_EQ(r.counters().wait_timeouts, 1u);
    auto again = r.acquire(0);  // at once: a is no longer kept for b
    EXPECT_EQ(r.snapshot()[0].in_flight, 2);
    EXPECT_EQ(launcher.launched, std::vector<std::string>{"a"});
}

TEST(ModelRouter, AFullQueueRefusesAndAWaitTimesOut) {
    fake_launcher launcher;
    router_options o = opts(1, /*queue=*/1);
    o.wait_timeout = 300ms;
    model_router r(three_models(), launcher, o);
    std::optional<model_router::lease> busy(r.acquire(0));
    std::atomic<int> status{0};
    std::thread waiter([&] {
        try {
            auto l = r.acquire(1);
        } catch (const request_error& e) {
            status = e.status;
        }
    });
    while (r.counters().waiting == 0) std::this_thread::yield();
    try {
        auto l = r.acquire(2);  // the one place in the queue is taken
        FAIL() << "a request over --models-queue was queued";
    } catch (const request_error& e) {
        EXPECT_EQ(e.status, 503);
        EXPECT_GT(e.retry_after_s, 0);
    }
    waiter.join();
    EXPECT_EQ(status, 503);  // its wait ended: the only model stayed busy
    EXPECT_EQ(r.counters().queue_refused, 1u);
    EXPECT_EQ(r.counters().wait_timeouts, 1u);
    EXPECT_EQ(r.counters().waiting, 0);
}

// A launcher whose launch of `slow` waits until released: a model that takes long to load.
class gated_launcher : public fake_launcher {
public:
    std::unique_ptr<model_child> launch(const model_entry& m, child_exit_callback on_exit) override {
        if (m.name == slow) {
            std::unique_lock lk(gate_mu);
            loading = true;
            gate_cv.notify_all();
            gate_cv.wait(lk, [this] { return open; });
        }
        return fake_launcher::launch(m, std::move(on_exit));
    }
    void release() {
        std::lock_guard lk(gate_mu);
        open = true;
        gate_cv.notify_all();
    }
    void wait_loading() {
        std::unique_lock lk(gate_mu);
        gate_cv.wait(lk, [this] { return loading; });
    }
    std::string slow = "c";
    std::mutex gate_mu;
    std::condition_variable gate_cv;
    bool loading = false;
    bool open = false;
};

TEST(ModelRouter, OtherModelsKeepServingWhileOneLoadsAndItsRequestsWaitForIt) {
    gated_launcher launcher;
    model_router r(three_models(), launcher, opts(3));
    { auto l = r.acquire(0); }
    std::atomic<int> served{0};
    std::thread first([&] {
        auto l = r.acquire(2);
        ++served;
    });
    launcher.wait_loading();
    std::thread second([&] {
        auto l = r.acquire(2);  // the same model: waits for the load under way, does not start another
        ++served;
    });
    while (r.counters().waiting == 0) std::this_thread::yield();
    EXPECT_EQ(state_of(r, 2), model_state::loading);
    { auto l = r.acquire(0); }  // loaded: served at once
    { auto l = r.acquire(1); }  // not loaded: loads beside it
    EXPECT_EQ(served, 0);
    launcher.release();
    first.join();
    second.join();
    EXPECT_EQ(served, 2);
    EXPECT_EQ(std::count(launcher.launched.begin(), launcher.launched.end(), "c"), 1);
}

TEST(ModelRouter, UnlimitedModelsMaxNeverUnloads) {
    fake_launcher launcher;
    model_router r(three_models(), launcher, opts(0));
    for (size_t i = 0; i < 3; ++i) auto l = r.acquire(i);
    EXPECT_EQ(r.counters().loaded, 3);
    EXPECT_EQ(r.counters().unloads, 0u);
}

TEST(ModelRouter, AServerThatExitsLeavesItsModelUnloadedAndTheNextRequestStartsIt) {
    fake_launcher launcher;
    model_router r(three_models(), launcher, opts(4));
    { auto l = r.acquire(1); }
    launcher.exits["b"]("was killed by signal 9 (Killed)");
    EXPECT_EQ(state_of(r, 1), model_state::unloaded);
    EXPECT_EQ(r.counters().crashes, 1u);
    EXPECT_EQ(r.counters().loaded, 0);
    { auto l = r.acquire(1); }
    EXPECT_EQ(launcher.launched, (std::vector<std::string>{"b", "b"}));
    // The first server's late callback changes nothing now.
    EXPECT_EQ(state_of(r, 1), model_state::loaded);
}

TEST(ModelRouter, AServerThatFailsToStartAnswers503AndStaysUnloaded) {
    fake_launcher launcher;
    launcher.failing = "c";
    model_router r(three_models(), launcher, opts(4));
    try {
        auto l = r.acquire(2);
        FAIL();
    } catch (const request_error& e) {
        EXPECT_EQ(e.status, 503);
        EXPECT_NE(std::string(e.what()).find("failed to load"), std::string::npos) << e.what();
    }
    EXPECT_EQ(state_of(r, 2), model_state::unloaded);
    EXPECT_EQ(r.counters().load_failures, 1u);
    EXPECT_EQ(r.counters().loaded, 0);
}

TEST(ModelRouter, WithoutAutoloadOnlyLoadLoads) {
    fake_launcher launcher;
    router_options o = opts(4);
    o.autoload = false;
    model_router r(three_models(), launcher, o);
    EXPECT_THROW(r.acquire(0), request_error);
    r.load(0);
    { auto l = r.acquire(0); }
    EXPECT_TRUE(r.unload(0));
    EXPECT_EQ(state_of(r, 0), model_state::unloaded);
    EXPECT_FALSE(r.unload(0));
}

TEST(ModelRouter, UnloadWaitsForTheRequestsInFlight) {
    fake_launcher launcher;
    model_router r(three_models(), launcher, opts(4));
    std::optional<model_router::lease> busy(r.acquire(0));
    EXPECT_TRUE(r.unload(0));
    EXPECT_EQ(state_of(r, 0), model_state::loaded);  // not under its request
    busy.reset();
    EXPECT_EQ(state_of(r, 0), model_state::unloaded);
}

TEST(ModelRouter, KeepAliveZeroUnloadsWhenTheRequestEndsAndNegativePins) {
    fake_launcher launcher;
    router_options quick = opts(1);
    quick.wait_timeout = 200ms;
    model_router r(three_models(), launcher, quick);
    {
        auto l = r.acquire(0);
        l.set_keep_alive(*parse_keep_alive_text("0"));
        EXPECT_EQ(state_of(r, 0), model_state::loaded);
    }
    EXPECT_EQ(state_of(r, 0), model_state::unloaded);
    {
        auto l = r.acquire(1);
        l.set_keep_alive(*parse_keep_alive_text("-1"));
    }
    EXPECT_TRUE(r.snapshot()[1].pinned);
    EXPECT_THROW(r.acquire(2), request_error);  // b is pinned and the set is full
    EXPECT_EQ(state_of(r, 1), model_state::loaded);
}

TEST(ModelRouter, IdleModelsUnloadAfterTheirIdleTime) {
    fake_launcher launcher;
    router_options o = opts(4);
    o.idle_unload = 60s;
    model_router r(three_models(), launcher, o);
    { auto l = r.acquire(0); }
    {
        auto l = r.acquire(1);
        l.set_keep_alive(*parse_keep_alive_text("5m"));
    }
    {
        auto l = r.acquire(2);
        l.set_keep_alive(*parse_keep_alive_text("-1"));
    }
    ASSERT_TRUE(r.snapshot()[0].expires_at);
    EXPECT_FALSE(r.snapshot()[2].expires_at);
    const auto now = std::chrono::steady_clock::now();
    r.unload_expired(now + 30s);
    EXPECT_EQ(r.counters().loaded, 3);
    r.unload_expired(now + 61s);  // a's default 60 s passed; b's 5 minutes did not
    EXPECT_EQ(state_of(r, 0), model_state::unloaded);
    EXPECT_EQ(state_of(r, 1), model_state::loaded);
    r.unload_expired(now + 301s);
    EXPECT_EQ(state_of(r, 1), model_state::unloaded);
    r.unload_expired(now + std::chrono::hours(1000));
    EXPECT_EQ(state_of(r, 2), model_state::loaded);  // pinned
}

TEST(ModelRouter, StopAllStopsEveryServerAndRefusesAfter) {
    fake_launcher launcher;
    model_router r(three_models(), launcher, opts(4));
    { auto l = r.acquire(0); }
    { auto l = r.acquire(1); }
    r.stop_all();
    EXPECT_EQ(r.counters().loaded, 0);
    EXPECT_EQ(r.counters().unloads, 2u);
    EXPECT_THROW(r.acquire(0), request_error);
}

TEST(KeepAlive, OllamaDurations) {
    using kind = keep_alive::kind;
    EXPECT_EQ(parse_keep_alive_text("0")->what, kind::unload_now);
    EXPECT_EQ(parse_keep_alive_text("0s")->what, kind::unload_now);
    EXPECT_EQ(parse_keep_alive_text("-1")->what, kind::pinned);
    EXPECT_EQ(parse_keep_alive_text("-1m")->what, kind::pinned);
    EXPECT_EQ(parse_keep_alive_text("5m")->idle, std::chrono::minutes(5));
    EXPECT_EQ(parse_keep_alive_text("30s")->idle, std::chrono::seconds(30));
    EXPECT_EQ(parse_keep_alive_text("1h30m")->idle, std::chrono::minutes(90));
    EXPECT_EQ(parse_keep_alive_text("1.5h")->idle, std::chrono::minutes(90));
    EXPECT_EQ(parse_keep_alive_text("300ms")->idle, std::chrono::milliseconds(300));
    EXPECT_EQ(parse_keep_alive_text("300")->idle, std::chrono::minutes(5));
    for (const char* bad : {"", "5", "m", "5x", "5 m", "forever", "1e400h", "--1"}) {
        if (std::string(bad) == "5") continue;  // seconds: valid
        EXPECT_FALSE(parse_keep_alive_text(bad)) << bad;
    }
    EXPECT_EQ(parse_keep_alive(bounded_json::json(0))->what, kind::unload_now);
    EXPECT_EQ(parse_keep_alive(bounded_json::json(-1))->what, kind::pinned);
    EXPECT_EQ(parse_keep_alive(bounded_json::json(120))->idle, std::chrono::minutes(2));
    EXPECT_FALSE(parse_keep_alive(bounded_json::json(nullptr)));
    EXPECT_THROW(parse_keep_alive(bounded_json::json::array()), request_error);
    EXPECT_THROW(parse_keep_alive(bounded_json::json("soon")), request_error);
}

namespace {
struct temp_dir {
    fs::path path;
    temp_dir() {
        path =
            fs::temp_directory_path() / ("keepwarm-models-" + std::to_string(::getpid()) + "-" +
                                         std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
        fs::create_directories(path);
    }
    ~temp_dir() { fs::remove_all(path); }
    void file(const fs::path& rel) {
        fs::create_directories((path / rel).parent_path());
        std::ofstream(path / rel) << "x";
    }
};
}  // namespace

TEST(ModelSet, AFolderScanNamesModelsByStemOrFolder) {
    temp_dir d;
    d.file("coder-7b.gguf");
    d.file("notes.txt");
    d.file("mmproj-F16.gguf");
    d.file("vision/vision-4b.gguf");
    d.file("vision/mmproj-F16.gguf");
    d.file("kimi/kimi-00002-of-00002.gguf");
    d.file("kimi/kimi-00001-of-00002.gguf");
    d.file("empty/readme.md");
    d.file("two/a.gguf");
    d.file("two/b.gguf");
    d.file("qwen/qwen-8b.gguf");
    d.file("qwen/mtp-qwen-8b.gguf");  // llama-server's draft sidecar: not a model, nor a second one in the folder
    d.file("dflash-head.gguf");
    std::vector<std::string> skipped;
    const std::vector<model_entry> found = scan_models_dir(d.path, &skipped);
    std::vector<std::string> names;
    for (const model_entry& m : found) names.push_back(m.name);
    EXPECT_EQ(names, (std::vector<std::string>{"coder-7b", "kimi", "qwen", "vision"}));
    EXPECT_EQ(found[0].path, (d.path / "coder-7b.gguf").string());
    EXPECT_EQ(found[1].path, (d.path / "kimi/kimi-00001-of-00002.gguf").string());
    EXPECT_EQ(found[2].path, (d.path / "qwen/qwen-8b.gguf").string());
    EXPECT_EQ(found[3].path, (d.path / "vision/vision-4b.gguf").string());
    EXPECT_EQ(skipped.size(), 3u);  // empty/, two/ and the sidecar, named
    EXPECT_NE(std::string(skipped[0] + skipped[1] + skipped[2]).find("mtp-qwen-8b.gguf: an MTP"), std::string::npos);
    EXPECT_THROW(scan_models_dir(d.path / "missing"), std::runtime_error);
}

namespace {
std::vector<model_entry> read_tables(const std::string& text) {
    const toml::table root = config::parse_toml(text, "settings.toml");
    config::toml_reader reader("settings.toml");
    const auto arity = [](const std::string& key) {
        if (key == "ctx-size" || key == "parallel") return option_arity::value;
        if (key == "swa-full") return option_arity::flag;
        if (key == "chat-template-file") return option_arity::value;
        return option_arity::unknown;
    };
    return read_models_table(*root["models"].as_table(), reader, "/etc/keepwarm", arity, {"port", "host"},
                             {"chat-template-file"});
}

std::string table_error(const std::string& text) {
    try {
        read_tables(text);
    } catch (const config::config_file_error& e) {
        return e.what();
    }
    return "no error";
}
}  // namespace

TEST(ModelSet, SettingsTablesGiveEachModelItsOptions) {
    const std::vector<model_entry> m = read_tables(R"(
[models.coder]
path = "models/coder.gguf"
aliases = ["big", "qwen-coder"]
ctx_size = 65536
swa-full = true
load = true
chat-template-file = "t.jinja"

[models.small]
path = "/srv/small.gguf"
aliases = "tiny"
swa-full = false
pinned = true
)");
    ASSERT_EQ(m.size(), 2u);
    EXPECT_EQ(m[0].name, "coder");
    EXPECT_EQ(m[0].path, "/etc/keepwarm/models/coder.gguf");
    EXPECT_EQ(m[0].aliases, (std::vector<std::string>{"big", "qwen-coder"}));
    EXPECT_TRUE(m[0].load_at_start);
    using opt = std::pair<std::string, std::vector<std::string>>;
    // toml++ keeps a table's keys sorted: the options come in key order.
    EXPECT_EQ(m[0].options,
              (std::vector<opt>{
                  {"chat-template-file", {"/etc/keepwarm/t.jinja"}}, {"ctx-size", {"65536"}}, {"swa-full", {}}}));
    EXPECT_EQ(m[1].aliases, std::vector<std::string>{"tiny"});
    EXPECT_TRUE(m[1].pinned);
    EXPECT_TRUE(m[1].options.empty());  // a flag set false is the default

    // A table's model replaces the folder's of the same name; two models may not share a name.
    model_entry from_dir;
    from_dir.name = "coder";
    from_dir.path = "/dir/coder.gguf";
    const model_set set({from_dir}, m);
    EXPECT_EQ(set.size(), 2u);
    EXPECT_EQ(set[*set.find("big")].path, "/etc/keepwarm/models/coder.gguf");
    model_entry clash;
    clash.name = "other";
    clash.path = "/x.gguf";
    clash.aliases = {"tiny"};
    EXPECT_THROW(model_set({clash}, m), std::invalid_argument);
    model_entry escaping;  // a name is a folder of the cache directory too
    escaping.name = "../elsewhere";
    escaping.path = "/x.gguf";
    EXPECT_THROW(model_set({escaping}, {}), std::invalid_argument);
}

TEST(ModelSet, SettingsTableMistakesNameTheFileAndLine) {
    EXPECT_EQ(table_error("[models.a]\npath = \"a.gguf\"\nctx-sise = 4\n").rfind("settings.toml:3:", 0), 0u)
        << table_error("[models.a]\npath = \"a.gguf\"\nctx-sise = 4\n");
    EXPECT_NE(table_error("[models.a]\npath = \"a.gguf\"\nctx-sise = 4\n").find("unknown key 'ctx-sise'"),
              std::string::npos);
    const std::string missing = table_error("\n[models.a]\nctx-size = 4\n");
    EXPECT_EQ(missing.rfind("settings.toml:2:", 0), 0u) << missing;
    EXPECT_NE(missing.find("no 'path'"), std::string::npos) << missing;
    const std::string router_set = table_error("[models.a]\npath = \"a.gguf\"\nport = 9000\n");
    EXPECT_NE(router_set.find("set by the router"), std::string::npos) << router_set;
    const std::string wrong_type = table_error("[models.a]\npath = 3\n");
    EXPECT_EQ(wrong_type.rfind("settings.toml:2:", 0), 0u) << wrong_type;
    const std::string not_table = table_error("[models]\na = 3\n");
    EXPECT_NE(not_table, "no error");
}

namespace {

// a, b, c of `each` bytes each, and d of `big` bytes.
model_set models_of_footprints(uint64_t each, uint64_t big) {
    std::vector<model_entry> entries;
    for (const char* name : {"a", "b", "c", "d"}) {
        model_entry m;
        m.name = name;
        m.path = std::string("/models/") + name + ".gguf";
        m.footprint_bytes = m.name == "d" ? big : each;
        entries.push_back(m);
    }
    return model_set(entries, {});
}

constexpr uint64_t GiB = uint64_t{1} << 30;

}  // namespace

TEST(ModelRouter, MemoryBudgetUnloadsTheLeastRecentlyUsedIdleModelBeforeModelsMax) {
    fake_launcher launcher;
    router_options o = opts(/*max=*/4);
    o.memory_budget = 5 * GiB;  // two of a, b, c (2 GiB each), not three
    model_router r(models_of_footprints(2 * GiB, 8 * GiB), launcher, o);
    { auto l = r.acquire(0); }
    std::this_thread::sleep_for(2ms);
    { auto l = r.acquire(1); }
    std::this_thread::sleep_for(2ms);
    { auto l = r.acquire(0); }  // a is now used more recently than b
    EXPECT_EQ(r.counters().memory_in_use, 4 * GiB);
    { auto l = r.acquire(2); }  // 6 GiB would not fit: b goes, though --models-max is far
    EXPECT_EQ(state_of(r, 0), model_state::loaded);
    EXPECT_EQ(state_of(r, 1), model_state::unloaded);
    EXPECT_EQ(state_of(r, 2), model_state::loaded);
    EXPECT_EQ(r.counters().unloads, 1u);
    EXPECT_EQ(r.counters().loaded, 2);
    EXPECT_EQ(r.counters().memory_in_use, 4 * GiB);
    EXPECT_NE(router_metrics_text(r).find("keepwarm_router_memory_bytes " + std::to_string(4 * GiB)), std::string::npos)
        << router_metrics_text(r);
    // The listings say each model's footprint: /api/ps's size, /v1/models' footprint_bytes.
    const auto ps = nlohmann::json::parse(ollama_tags_json(r, /*loaded_only=*/true));
    ASSERT_EQ(ps["models"].size(), 2u);
    EXPECT_EQ(ps["models"][0]["size"], 2 * GiB);
    const auto list = nlohmann::json::parse(models_list_json(r));
    EXPECT_EQ(list["data"][3]["footprint_bytes"], 8 * GiB);
}

TEST(ModelRouter, AModelOverTheMemoryBudgetIsRefusedNamingBothSizes) {
    fake_launcher launcher;
    router_options o = opts(4);
    o.memory_budget = 5 * GiB;
    model_router r(models_of_footprints(2 * GiB, 6 * GiB), launcher, o);
    { auto l = r.acquire(0); }
    for (const bool by_load : {false, true}) {
        try {
            if (by_load) {
                r.load(3);
            } else {
                auto l = r.acquire(3);
            }
            FAIL() << "a model over --models-memory was loaded";
        } catch (const request_error& e) {
            EXPECT_EQ(e.status, 503);
            const std::string message = e.what();
            EXPECT_NE(message.find("'d'"), std::string::npos) << message;
            EXPECT_NE(message.find("6.0 GiB"), std::string::npos) << message;
            EXPECT_NE(message.find("--models-memory is 5.0 GiB"), std::string::npos) << message;
        }
    }
    EXPECT_EQ(launcher.launched, std::vector<std::string>{"a"});  // nothing unloaded or started for it
    EXPECT_EQ(state_of(r, 0), model_state::loaded);
    EXPECT_EQ(r.counters().waiting, 0);
}

TEST(ModelRouter, NoMemoryBudgetCountsOnlyModelsMax) {
    fake_launcher launcher;
    model_router r(models_of_footprints(100 * GiB, 1000 * GiB), launcher, opts(4));  // memory_budget 0
    for (size_t i = 0; i < 4; ++i) {
        auto l = r.acquire(i);
    }
    EXPECT_EQ(r.counters().loaded, 4);
    EXPECT_EQ(r.counters().unloads, 0u);
    EXPECT_EQ(r.counters().memory_in_use, 1300 * GiB);
}

// An alias may be a shell pattern ("claude-haiku-*": an agent's background model, whatever its version); an exact name
// or alias wins over a pattern. A name no model has goes to the default model only where one is set (the policy's
// mode "any"); the router's routes send it there, and a strict policy sets none (a 404).
TEST(ModelSet, PatternAliasesAndTheDefaultModel) {
    std::vector<model_entry> entries(2);
    entries[0].name = "coder";
    entries[0].path = "/models/coder.gguf";
    entries[0].aliases = {"claude-sonnet-*", "claude-haiku-4-5"};
    entries[1].name = "small";
    entries[1].path = "/models/small.gguf";
    entries[1].aliases = {"claude-haiku-*"};
    model_set models(entries, {});
    EXPECT_EQ(models.find("claude-sonnet-4-5"), std::optional<size_t>(0));
    EXPECT_EQ(models.find("claude-haiku-4-1"), std::optional<size_t>(1));
    EXPECT_EQ(models.find("claude-haiku-4-5"), std::optional<size_t>(0));  // the exact alias over the pattern
    EXPECT_FALSE(models.find("gpt-4o"));
    EXPECT_FALSE(models.default_model());
    models.set_default_model(1);
    EXPECT_EQ(models.default_model(), std::optional<size_t>(1));
    EXPECT_FALSE(models.find("gpt-4o"));  // find() stays exact: the default is the routes' choice for generations
}

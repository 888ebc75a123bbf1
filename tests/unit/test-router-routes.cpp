// The router's HTTP face against a fake model server (keepwarm's own http_server on 127.0.0.1, no model): a request
// goes to the server of the model it names, as it came (method, path, query, Authorization, body; hop-by-hop headers
// dropped), its streamed answer comes back piece by piece, a client that goes away cancels the call, an unknown model
// is a 404 in its API's shape, and the listings show each model's state.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <thread>

#include "http/http-client.h"
#include "http/http-server.h"
#include "json/bounded-json.h"
#include "router/model-router.h"
#include "router/router-routes.h"

using namespace keepwarm;
using namespace keepwarm::router;
using namespace std::chrono_literals;

namespace {

// Every model's "server" is this one fake; it answers what it was sent.
class model_servers : public child_launcher {
public:
    model_servers() : server_(options()) {
        server_.add_route("POST", "/v1/chat/completions", [](const http::request& req, http::response_writer& w) {
            const bounded_json::json echo = {{"method", req.method},
                                             {"path", req.path},
                                             {"query", req.query},
                                             {"authorization", req.header("authorization")},
                                             {"x-custom", req.header("x-custom")},
                                             {"body", req.body}};
            w.send(200, "application/json", echo.dump(), {{"x-keepwarm-reused", "7"}});
        });
        server_.add_route("GET", "/slots", [](const http::request& req, http::response_writer& w) {
            w.send(200, "application/json", bounded_json::json{{"query", req.query}}.dump());
        });
        server_.add_route("POST", "/stream", [](const http::request&, http::response_writer& w) {
            w.begin_stream(200, "text/event-stream");
            for (int i = 0; i < 3; ++i) {
                if (!w.write_chunk("data: " + std::to_string(i) + "\n\n")) return;
            }
            w.end_stream();
        });
        server_.add_route("POST", "/endless", [this](const http::request&, http::response_writer& w) {
            w.begin_stream(200, "text/event-stream");
            while (w.write_chunk("data: tick\n\n") && !w.client_gone()) std::this_thread::sleep_for(10ms);
            endless_stopped = true;
        });
        server_.start();
    }

    std::unique_ptr<model_child> launch(const model_entry& m, child_exit_callback) override {
        launched.push_back(m.name);
        return std::make_unique<child>(server_.port());
    }

    std::vector<std::string> launched;
    std::atomic<bool> endless_stopped{false};

private:
    struct child : model_child {
        explicit child(uint16_t port) { at.host = "127.0.0.1", at.port = port; }
        const http::endpoint& origin() const override { return at; }
        int pid() const override { return 0; }
        void stop(std::chrono::milliseconds) override {}
        http::endpoint at;
    };
    static http::server_options options() {
        http::server_options o;
        o.port = 0;
        return o;
    }
    http::http_server server_;
};

std::string ollama_shape(int, const std::string&, const std::string& message) {
    return bounded_json::json{{"error", message}}.dump();
}

model_set two_models() {
    model_entry a, b;
    a.name = "alpha";
    a.path = "/models/alpha.gguf";
    a.aliases = {"big"};
    b.name = "beta";
    b.path = "/models/beta.gguf";
    return model_set({a, b}, {});
}

class RouterRoutes : public ::testing::Test {
protected:
    RouterRoutes() : router(two_models(), children, opts()), server(server_options()) {
        register_router_routes(server, router,
                               {.openai = http::openai_error_body,
                                .anthropic = http::openai_error_body,
                                .ollama = ollama_shape,
                                .ollama_version_json = R"({"version":"0.11.0"})"});
        server.start();
        origin.host = "127.0.0.1";
        origin.port = server.port();
    }
    static router_options opts() {
        router_options o;
        o.models_max = 1;
        o.housekeeping_thread = false;
        return o;
    }
    static http::server_options server_options() {
        http::server_options o;
        o.port = 0;
        return o;
    }
    http::fetched post(const std::string& target, const std::string& body, const http::header_list& headers = {}) {
        return http::fetch(origin, "POST", target, body, headers);
    }

    model_servers children;
    model_router router;
    http::http_server server;
    http::endpoint origin;
};

}  // namespace

TEST_F(RouterRoutes, ARequestReachesItsModelAsItCame) {
    const http::fetched r = post("/v1/chat/completions?x=1", R"({"model":"big","messages":[]})",
                                 {{"Authorization", "Bearer k"}, {"X-Custom", "yes"}, {"Connection", "close"}});
    ASSERT_EQ(r.status, 200) << r.body;
    const auto echo = bounded_json::parse(r.body);
    EXPECT_EQ(echo["path"], "/v1/chat/completions");
    EXPECT_EQ(echo["query"], "x=1");
    EXPECT_EQ(echo["authorization"], "Bearer k");
    EXPECT_EQ(echo["x-custom"], "yes");
    EXPECT_EQ(echo["body"], R"({"model":"big","messages":[]})");
    bool reused_header = false;
    for (const auto& [n, v] : r.headers) reused_header = reused_header || (n == "x-keepwarm-reused" && v == "7");
    EXPECT_TRUE(reused_header);
    EXPECT_EQ(children.launched, std::vector<std::string>{"alpha"});  // "big" is alpha's alias

    // A GET names its model in the query.
    const http::fetched slots = http::fetch(origin, "GET", "/slots?model=beta");
    EXPECT_EQ(slots.status, 200);
    EXPECT_EQ(bounded_json::parse(slots.body)["query"], "model=beta");
    EXPECT_EQ(children.launched, (std::vector<std::string>{"alpha", "beta"}));
}

TEST_F(RouterRoutes, AStreamComesBackPieceByPiece) {
    http::client_connection c(origin);
    const http::client_response head = c.send("POST", "/stream", R"({"model":"alpha"})");
    EXPECT_EQ(head.status, 200);
    EXPECT_EQ(head.header("content-type"), "text/event-stream");
    std::string all, piece;
    while (c.read_some(piece)) all += piece;
    EXPECT_EQ(all, "data: 0\n\ndata: 1\n\ndata: 2\n\n");
}

TEST_F(RouterRoutes, AClientThatGoesAwayCancelsTheCall) {
    {
        http::client_connection c(origin);
        c.send("POST", "/endless", R"({"model":"alpha"})");
        std::string piece;
        ASSERT_TRUE(c.read_some(piece));
    }  // closed
    for (int i = 0; i < 500 && !children.endless_stopped; ++i) std::this_thread::sleep_for(10ms);
    EXPECT_TRUE(children.endless_stopped);
    EXPECT_EQ(router.snapshot()[0].in_flight, 0);
}

TEST_F(RouterRoutes, UnknownAndMissingModelsInTheirApisShape) {
    const http::fetched openai = post("/v1/chat/completions", R"({"model":"gamma"})");
    EXPECT_EQ(openai.status, 404);
    EXPECT_NE(bounded_json::parse(openai.body)["error"]["message"].get<std::string>().find(
                  "'gamma' does not exist; this server serves alpha, beta"),
              std::string::npos);
    const http::fetched ollama = post("/api/chat", R"({"model":"gamma"})");
    EXPECT_EQ(ollama.status, 404);
    EXPECT_TRUE(bounded_json::parse(ollama.body)["error"].is_string()) << ollama.body;
    EXPECT_EQ(post("/v1/chat/completions", R"({"messages":[]})").status, 400);  // none loaded, none named
    EXPECT_EQ(post("/v1/chat/completions", R"({"model":)").status, 400);
    EXPECT_EQ(post("/v1/chat/completions", R"({"model":"alpha","keep_alive":"soon"})").status, 400);
    EXPECT_TRUE(children.launched.empty());  // nothing loaded for any of them
}

TEST_F(RouterRoutes, ListingsShowEachModelsState) {
    post("/v1/chat/completions", R"({"model":"beta"})");
    const auto models = bounded_json::parse(http::fetch(origin, "GET", "/v1/models").body);
    ASSERT_EQ(models["data"].size(), 2u);
    EXPECT_EQ(models["data"][0]["id"], "alpha");
    EXPECT_EQ(models["data"][0]["status"]["value"], "unloaded");
    EXPECT_EQ(models["data"][1]["status"]["value"], "loaded");
    const auto ps = bounded_json::parse(http::fetch(origin, "GET", "/api/ps").body);
    ASSERT_EQ(ps["models"].size(), 1u);
    EXPECT_EQ(ps["models"][0]["name"], "beta");
    const auto one = bounded_json::parse(http::fetch(origin, "GET", "/v1/models/big").body);
    EXPECT_EQ(one["id"], "big");
    EXPECT_EQ(one["path"], "/models/alpha.gguf");
    EXPECT_EQ(post("/models/unload", R"({"model":"beta"})").status, 200);
    EXPECT_EQ(router.snapshot()[1].state, model_state::unloaded);
    const std::string metrics = http::fetch(origin, "GET", "/metrics").body;
    EXPECT_NE(metrics.find("keepwarm_router_loads_total 1"), std::string::npos) << metrics;
    EXPECT_NE(metrics.find("keepwarm_router_unloads_total 1"), std::string::npos) << metrics;
}

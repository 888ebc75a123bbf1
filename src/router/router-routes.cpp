// See router-routes.h. A forwarded call runs on a thread of its own that reads the model server's answer into a small
// queue; the connection's thread writes it to the client and polls the client meanwhile, so that a client that goes
// away during a long prefill (nothing to write yet) still cancels the call at once.
#include "router/router-routes.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>

#include "base/logger.h"
#include "base/metrics-text.h"
#include "base/request-error.h"
#include "json/bounded-json.h"

namespace keepwarm::router {

namespace {
using json = bounded_json::json;

// A client-given name as an error message may quote it: at most 200 bytes.
std::string quotable(const std::string& name) {
    constexpr size_t limit = 200;
    return name.size() <= limit ? name : name.substr(0, limit) + "...";
}

std::string iso8601(std::chrono::system_clock::time_point t) {
    const std::time_t secs = std::chrono::system_clock::to_time_t(t);
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

uint64_t file_size(const std::string& path) {
    std::error_code ec;
    const uintmax_t n = std::filesystem::file_size(path, ec);
    return ec ? 0 : static_cast<uint64_t>(n);
}

int64_t file_mtime_seconds(const std::string& path) {
    std::error_code ec;
    const auto t = std::filesystem::last_write_time(path, ec);
    if (ec) return 0;
    const auto sys = std::chrono::system_clock::now() + std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                                            t - std::filesystem::file_time_type::clock::now());
    return std::chrono::duration_cast<std::chrono::seconds>(sys.time_since_epoch()).count();
}

// Headers that describe one hop, not the request or answer: never forwarded either way.
bool hop_by_hop(const std::string& name) {
    static const char* const names[] = {"connection", "keep-alive",     "proxy-authenticate", "proxy-authorization",
                                        "te",         "trailer",        "transfer-encoding",  "upgrade",
                                        "host",       "content-length", "content-type",       "expect"};
    return std::any_of(std::begin(names), std::end(names), [&](const char* n) { return name == n; });
}

// Of the model server's answer headers, those the router's own server does not set itself.
bool relayed_answer_header(const std::string& name) {
    return !hop_by_hop(name) && name != "x-request-id" && name != "date" && name != "server" &&
           !name.starts_with("access-control-") && name != "vary";
}

// The answer of a model's server, read on a thread of its own into a queue the connection's thread drains.
class upstream_relay {
public:
    upstream_relay(const http::endpoint& origin, const http::request& req) : conn_(origin, client_options()) {
        http::header_list headers;
        for (const auto& [name, value] : req.headers) {
            if (!hop_by_hop(name)) headers.emplace_back(name, value);
        }
        headers.emplace_back("x-forwarded-for", req.remote.substr(0, req.remote.rfind(':')));
        const std::string target = req.path + (req.query.empty() ? "" : "?" + req.query);
        const std::string content_type = req.header("content-type");
        reader_ = std::thread([this, method = req.method, target, body = req.body, content_type, headers] {
            run(method, target, body, content_type, headers);
        });
    }
    ~upstream_relay() {
        {
            std::lock_guard lk(mu_);
            cancelled_ = true;
            cv_.notify_all();
        }
        conn_.cancel();
        reader_.join();
    }

    // Waits up to `wait` for the answer's head; true once it came (head()), false on a timeout, throws the call's
    // failure as a request_error.
    bool wait_head(std::chrono::milliseconds wait) {
        std::unique_lock lk(mu_);
        cv_.wait_for(lk, wait, [this] { return head_ || failure_; });
        if (head_) return true;
        if (failure_) throw *failure_;
        return false;
    }
    const http::client_response& head() const { return *head_; }
    // The next piece of the body: a piece, an empty optional on a timeout, or "done" set when the body ended.
    // Throws the call's failure once the head was sent (the caller then ends the stream).
    std::optional<std::string> next_piece(std::chrono::milliseconds wait, bool& done) {
        std::unique_lock lk(mu_);
        cv_.wait_for(lk, wait, [this] { return !pieces_.empty() || ended_ || failure_; });
        if (!pieces_.empty()) {
            std::string piece = std::move(pieces_.front());
            pieces_.pop_front();
            queued_bytes_ -= piece.size();
            cv_.notify_all();
            return piece;
        }
        if (failure_) throw *failure_;
        done = ended_;
        return std::nullopt;
    }
    void cancel() { conn_.cancel(); }

private:
    static http::client_options client_options() {
        http::client_options o;
        o.connect_timeout = std::chrono::seconds(10);
        o.first_byte_timeout = std::chrono::hours(1);  // a long cold prompt on a CPU; the client may give up first
        o.read_timeout = std::chrono::minutes(30);
        o.write_timeout = std::chrono::minutes(2);
        return o;
    }

    void run(const std::string& method, const std::string& target, const std::string& body,
             const std::string& content_type, const http::header_list& headers) {
        try {
            http::client_response head = conn_.send(method, target, body, content_type, headers);
            {
                std::lock_guard lk(mu_);
                head_ = std::move(head);
                cv_.notify_all();
            }
            std::string piece;
            while (conn_.read_some(piece)) {
                std::unique_lock lk(mu_);
                // A slow client: at most a few MiB wait here, then the model's server waits for it (TCP).
                cv_.wait(lk, [this] { return queued_bytes_ < (4u << 20) || cancelled_; });
                if (cancelled_) break;
                queued_bytes_ += piece.size();
                pieces_.push_back(std::move(piece));
                cv_.notify_all();
            }
            std::lock_guard lk(mu_);
            ended_ = true;
            cv_.notify_all();
        } catch (const http::client_error& e) {
            std::lock_guard lk(mu_);
            const bool timeout = e.reason == http::client_error::kind::timeout;
            failure_ = request_error(timeout ? 504 : 502, std::string("the model's server did not answer: ") + e.what(),
                                     timeout ? "timeout_error" : "server_error");
            cv_.notify_all();
        }
    }

    http::client_connection conn_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::optional<http::client_response> head_;  // guarded by mu_
    std::deque<std::string> pieces_;             // guarded by mu_
    size_t queued_bytes_ = 0;                    // guarded by mu_
    bool ended_ = false;                         // guarded by mu_
    bool cancelled_ = false;                     // guarded by mu_
    std::optional<request_error> failure_;       // guarded by mu_
    std::thread reader_;
};

constexpr auto client_poll = std::chrono::milliseconds(100);

// Sends `req` to the model's server and relays its answer to `w`, streamed when it streams.
void relay(const http::endpoint& origin, const http::request& req, http::response_writer& w, const std::string& name) {
    upstream_relay call(origin, req);
    while (!call.wait_head(client_poll)) {
        if (w.client_gone()) return;  // the relay's destructor cancels the call
    }
    const http::client_response& head = call.head();
    http::header_list headers;
    for (const auto& [n, v] : head.headers) {
        if (relayed_answer_header(n)) headers.emplace_back(n, v);
    }
    const std::string content_type = head.header("content-type");
    const bool whole = !head.header("content-length").empty();
    bool done = false;
    if (whole) {  // a whole answer: sent whole, with its length
        std::string body;
        while (!done) {
            if (std::optional<std::string> piece = call.next_piece(client_poll, done)) {
                body += *piece;
            } else if (!done && w.client_gone()) {
                return;
            }
        }
        w.send(head.status, content_type, body, headers);
        return;
    }
    if (!w.begin_stream(head.status, content_type, headers)) return;
    try {
        while (!done) {
            if (std::optional<std::string> piece = call.next_piece(client_poll, done)) {
                if (!piece->empty() && !w.write_chunk(*piece)) return;
            } else if (!done && w.client_gone()) {
                return;
            }
        }
    } catch (const request_error& e) {
        log::warn("router", "model {}: its answer broke off: {}", name, e.what());
        return;  // the stream ends without its end: the client sees it cut
    }
    w.end_stream();
}

// The model a request names: "model" of a JSON body, else ?model=; with one model only, that one. A name the set does
// not have goes to its default model where `to_default` (a generation, as a single model's server serves any name),
// else is a 404 (/models/load, /models/unload, `ollama stop`: they name a model to act on).
size_t requested_model(const model_router& router, const http::request& req, const std::optional<json>& body,
                       bool to_default = false) {
    std::string name;
    if (body && body->is_object()) {
        if (const auto it = body->find("model"); it != body->end() && it->is_string()) name = it->get<std::string>();
    }
    if (name.empty()) name = http::query_value(req.query, "model").value_or("");
    const model_set& models = router.models();
    if (name.empty()) {
        // Without a name (a GET /slots, /v1/responses/ID): the one model there is, or the one loaded now.
        if (models.size() == 1) return 0;
        std::optional<size_t> loaded;
        int count = 0;
        for (const model_status& st : router.snapshot()) {
            if (st.state == model_state::loaded) {
                loaded = st.index;
                ++count;
            }
        }
        if (count == 1) return *loaded;
        throw request_error(400, "say which model: \"model\" in the JSON body, or ?model=NAME (this server serves " +
                                     models.names() + ")");
    }
    if (const std::optional<size_t> m = models.find(name)) return *m;
    if (to_default && models.default_model()) return *models.default_model();
    throw request_error(404, "The model '" + quotable(name) + "' does not exist; this server serves " + models.names(),
                        "model_not_found");
}

// The body, parsed; nullopt when there is none. Every keepwarm route that takes a body takes JSON: one that is not
// is refused here, as the model's server would refuse it, without loading a model for it.
std::optional<json> json_body(const http::request& req) {
    if (req.body.empty()) return std::nullopt;
    try {
        return bounded_json::parse(req.body);
    } catch (const bounded_json::limit_error& e) {
        throw request_error(400, std::string("the request body is not valid JSON: ") + e.what());
    }
}

void forward(model_router& router, const http::request& req, http::response_writer& w) {
    const std::optional<json> body = json_body(req);
    const size_t model = requested_model(router, req, body, /*to_default=*/true);
    std::optional<keep_alive> keep;
    if (body && body->is_object()) {
        if (const auto it = body->find("keep_alive"); it != body->end()) keep = parse_keep_alive(*it);
    }
    model_router::lease lease = router.acquire(model);
    if (keep) lease.set_keep_alive(*keep);
    relay(lease.origin(), req, w, router.models()[model].name);
}

// Ollama's unload request (`ollama stop`): /api/generate without a prompt, or /api/chat without messages, and
// keep_alive 0. Answered here, so that a model that is not loaded is not loaded to be unloaded.
bool answer_ollama_unload(model_router& router, const http::request& req, http::response_writer& w) {
    const std::optional<json> body = json_body(req);
    if (!body || !body->is_object() || !body->contains("keep_alive")) return false;
    const bool chat = req.path == "/api/chat";
    const auto field = body->find(chat ? "messages" : "prompt");
    if (field != body->end() && !field->is_null() && !field->empty()) return false;
    const std::optional<keep_alive> k = parse_keep_alive((*body)["keep_alive"]);
    if (!k || k->what != keep_alive::kind::unload_now) return false;
    const size_t model = requested_model(router, req, body);
    router.unload(model);
    json answer = {{"model", (*body)["model"]}, {"created_at", iso8601(std::chrono::system_clock::now())}};
    if (chat) {
        answer["message"] = {{"role", "assistant"}, {"content", ""}};
    } else {
        answer["response"] = "";
    }
    answer["done"] = true;
    answer["done_reason"] = "unload";
    w.send(200, "application/json", answer.dump());
    return true;
}

// The model a /models/load or /models/unload body names.
size_t named_model(const model_router& router, const http::request& req) {
    const std::optional<json> body = json_body(req);
    if (!body || !body->is_object() || !body->contains("model") || !(*body)["model"].is_string()) {
        throw request_error(400, "the body must be a JSON object with \"model\": NAME");
    }
    return requested_model(router, req, body);
}

json model_json(const model_router& router, const model_status& st) {
    const model_entry& m = router.models()[st.index];
    json status = {{"value", state_name(st.state)}};
    if (st.state == model_state::loaded) {
        status["url"] = st.url;
        status["pid"] = st.pid;
    }
    json j = {{"id", m.name},
              {"object", "model"},
              {"created", file_mtime_seconds(m.path)},
              {"owned_by", "keepwarm"},
              {"path", m.path},
              {"aliases", m.aliases},
              {"status", std::move(status)},
              {"in_flight", st.in_flight},
              {"pinned", st.pinned}};
    // What --models-memory counts for it: weights + KV cache of its context and slots + its RAM tier.
    if (m.footprint_bytes > 0) j["footprint_bytes"] = m.footprint_bytes;
    return j;
}
}  // namespace

std::string models_list_json(const model_router& router) {
    json data = json::array();
    for (const model_status& st : router.snapshot()) data.push_back(model_json(router, st));
    return json{{"object", "list"}, {"data", std::move(data)}}.dump();
}

std::string ollama_tags_json(const model_router& router, bool loaded_only) {
    json models = json::array();
    for (const model_status& st : router.snapshot()) {
        if (loaded_only && st.state != model_state::loaded) continue;
        const model_entry& m = router.models()[st.index];
        // Ollama's size is the memory a model takes loaded: its footprint where known, else its file's.
        const uint64_t size = m.footprint_bytes > 0 ? m.footprint_bytes : file_size(m.path);
        json j = {{"name", m.name},
                  {"model", m.name},
                  {"modified_at",
                   iso8601(std::chrono::system_clock::time_point(std::chrono::seconds(file_mtime_seconds(m.path))))},
                  {"size", size},
                  {"digest", ""},
                  {"details",
                   {{"parent_model", ""},
                    {"format", "gguf"},
                    {"family", ""},
                    {"families", nullptr},
                    {"parameter_size", ""},
                    {"quantization_level", ""}}}};
        if (loaded_only) {
            // Never by idleness: far in the future, as Ollama says a model kept loaded forever.
            j["expires_at"] = st.expires_at ? iso8601(*st.expires_at) : std::string("2318-01-01T00:00:00Z");
            j["size_vram"] = 0;
        }
        models.push_back(std::move(j));
    }
    return json{{"models", std::move(models)}}.dump();
}

std::string router_metrics_text(const model_router& router) {
    const router_counters c = router.counters();
    metrics_text m;
    m.counter("keepwarm_router_loads_total", "Model servers started and listening", static_cast<double>(c.loads));
    m.counter("keepwarm_router_load_failures_total", "Model servers that exited or timed out before they listened",
              static_cast<double>(c.load_failures));
    m.counter("keepwarm_router_load_seconds_total", "Seconds spent starting model servers", c.load_seconds);
    m.counter("keepwarm_router_unloads_total", "Model servers stopped by the router", static_cast<double>(c.unloads));
    m.counter("keepwarm_router_crashes_total", "Model servers that exited on their own while loaded",
              static_cast<double>(c.crashes));
    m.counter("keepwarm_router_queue_refused_total", "Requests refused because --models-queue requests were waiting",
              static_cast<double>(c.queue_refused));
    m.counter("keepwarm_router_wait_timeouts_total", "Requests that waited too long for their model",
              static_cast<double>(c.wait_timeouts));
    m.gauge("keepwarm_router_waiting_requests", "Requests waiting for their model now", c.waiting);
    m.gauge("keepwarm_router_loaded_models", "Models loaded or loading now", c.loaded);
    m.gauge("keepwarm_router_memory_bytes",
            "Footprints (weights + KV cache + RAM tier) of the models loaded, loading or unloading now",
            static_cast<double>(c.memory_in_use));
    m.gauge("keepwarm_router_memory_budget_bytes", "--models-memory (0: no byte budget)",
            static_cast<double>(router.options().memory_budget));
    m.family("keepwarm_router_model_loaded", "gauge", "1 for each model loaded now, by model");
    for (const model_status& st : router.snapshot()) {
        m.sample("keepwarm_router_model_loaded", st.state == model_state::loaded ? 1 : 0,
                 {{"model", router.models()[st.index].name}});
    }
    return m.str();
}

void register_router_routes(http::http_server& server, model_router& router, const api_shapes& shapes) {
    const http::route_options openai{.format_error = shapes.openai};
    const http::route_options anthropic{.format_error = shapes.anthropic};
    const http::route_options ollama{.format_error = shapes.ollama};
    const http::route_options probe{.requires_auth = false, .format_error = shapes.openai};

    server.add_route(
        "GET", "/health",
        [](const http::request&, http::response_writer& w) { w.send(200, "application/json", R"({"status":"ok"})"); },
        probe);
    const auto list = [&router](const http::request&, http::response_writer& w) {
        w.send(200, "application/json", models_list_json(router));
    };
    server.add_route("GET", "/v1/models", list, openai);
    server.add_route("GET", "/models", list, openai);
    for (const std::string prefix : {"/v1/models/", "/models/"}) {
        server.add_route(
            "GET", prefix + "*",
            [&router, prefix](const http::request& req, http::response_writer& w) {
                const std::optional<std::string> id = http::path_rest(req.path, prefix);
                if (!id) throw request_error(400, "the model id in the path has a malformed %-escape");
                const std::optional<size_t> m = router.models().find(*id);
                if (!m) {
                    throw request_error(404,
                                        "The model '" + quotable(*id) + "' does not exist; this server serves " +
                                            router.models().names(),
                                        "model_not_found");
                }
                json j = model_json(router, router.snapshot()[*m]);
                j["id"] = *id;
                w.send(200, "application/json", j.dump());
            },
            openai);
    }
    server.add_route(
        "POST", "/models/load",
        [&router](const http::request& req, http::response_writer& w) {
            router.load(named_model(router, req));
            w.send(200, "application/json", R"({"success":true})");
        },
        openai);
    server.add_route(
        "POST", "/models/unload",
        [&router](const http::request& req, http::response_writer& w) {
            const bool was_loaded = router.unload(named_model(router, req));
            w.send(200, "application/json", json{{"success", true}, {"was_loaded", was_loaded}}.dump());
        },
        openai);
    server.add_route(
        "GET", "/metrics",
        [&router](const http::request& req, http::response_writer& w) {
            if (http::query_value(req.query, "model")) return forward(router, req, w);  // that model's own metrics
            w.send(200, "text/plain; version=0.0.4", router_metrics_text(router));
        },
        openai);

    server.add_route(
        "GET", "/api/tags",
        [&router](const http::request&, http::response_writer& w) {
            w.send(200, "application/json", ollama_tags_json(router, false));
        },
        ollama);
    server.add_route(
        "GET", "/api/ps",
        [&router](const http::request&, http::response_writer& w) {
            w.send(200, "application/json", ollama_tags_json(router, true));
        },
        ollama);
    const http::route_options ollama_probe{.requires_auth = false, .format_error = shapes.ollama};
    const auto version = [body = shapes.ollama_version_json](const http::request& req, http::response_writer& w) {
        w.send(200, "application/json", req.method == "HEAD" ? "" : body);
    };
    server.add_route("GET", "/api/version", version, ollama_probe);
    server.add_route("HEAD", "/api/version", version, ollama_probe);
    const auto running = [](const http::request& req, http::response_writer& w) {
        w.send(200, "text/plain; charset=utf-8", req.method == "HEAD" ? "" : "Ollama is running");
    };
    server.add_route("GET", "/", running, ollama_probe);
    server.add_route("HEAD", "/", running, ollama_probe);

    // Everything else goes to the model the request names, in the error shape of the API its path belongs to.
    const auto forwarded = [&router](const http::request& req, http::response_writer& w) { forward(router, req, w); };
    const std::pair<std::string, const http::route_options*> prefixes[] = {
        {"/*", &openai}, {"/api/*", &ollama}, {"/v1/messages/*", &anthropic}};
    for (const auto& [prefix, options] : prefixes) {
        for (const char* method : {"GET", "POST", "PUT", "DELETE"})
            server.add_route(method, prefix, forwarded, *options);
    }
    server.add_route("POST", "/v1/messages", forwarded, anthropic);
    for (const char* path : {"/api/generate", "/api/chat"}) {
        server.add_route(
            "POST", path,
            [&router](const http::request& req, http::response_writer& w) {
                if (!answer_ollama_unload(router, req, w)) forward(router, req, w);
            },
            ollama);
    }
    server.set_error_format("/api/", shapes.ollama);
}

}  // namespace keepwarm::router

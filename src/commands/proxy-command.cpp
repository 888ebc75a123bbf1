// See proxy-command.h. Parses options, builds the upstream pool and a frontend_context (the upstreams have the
// model), registers the three APIs' routes with upstream generations and the proxy's own status routes, and runs until
// SIGINT/SIGTERM.
#include "commands/proxy-command.h"

#include <pthread.h>
#include <algorithm>
#include <chrono>
#include <csignal>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "api/openai-api.h"
#include "backend/cache-busters.h"
#include "backend/frontend-context.h"
#include "backend/http-counters.h"
#include "base/command-exit.h"
#include "base/logger.h"
#include "base/request-error.h"
#include "commands/environment-options.h"
#include "commands/listen-options.h"
#include "commands/llama-server-flags.h"
#include "commands/number-checks.h"
#include "config/key-file-mode.h"
#include "http/http-server.h"
#include "policy/policy-file.h"
#include "proxy/proxy-config.h"
#include "proxy/upstream-completion.h"
#include "proxy/upstream-generation.h"
#include "proxy/upstream-pool.h"
#include "routes/anthropic-routes.h"
#include "routes/busters-routes.h"
#include "routes/models-routes.h"
#include "routes/ollama-routes.h"
#include "routes/openai-routes.h"
#include "routes/response-store.h"

namespace keepwarm {

namespace {

using json = nlohmann::ordered_json;

// What the command line says; run_proxy merges it over the --config file.
struct proxy_options {
    proxy::proxy_settings settings;
    std::vector<std::string> upstreams;  // --upstream specs
    std::string config_file;
    listen_options listen;    // over the file's [listen] where given
    tenancy_options tenancy;  // command line only
    bool no_policy = false;   // command line only
    // The options given on the command line (they win over the file).
    std::vector<std::pair<std::string, const CLI::Option*>> given;
    bool was_given(const std::string& name) const {
        for (const auto& [n, opt] : given) {
            if (n == name) return opt->count() > 0;
        }
        return false;
    }
};

// The file's settings (if any) with the command line's over them; at least one upstream in all.
proxy::proxy_settings merged_settings(const proxy_options& opts) {
    proxy::proxy_settings s;
    if (!opts.config_file.empty()) {
        // A mistake ends the command as serve's settings file does: one log line naming the file and line.
        s = proxy::load_proxy_config(opts.config_file);
        const bool holds_keys =
            !s.http.api_key.empty() ||
            std::any_of(s.upstreams.begin(), s.upstreams.end(), [](const auto& u) { return !u.api_key.empty(); });
        const std::string warning = config::readable_by_others_warning(opts.config_file, "settings file");
        if (holds_keys && !warning.empty()) log::warn("proxy", "{}", warning);
    }
    const proxy::proxy_settings& cli = opts.settings;
    opts.listen.copy_given(cli.http, s.http);
    if (opts.was_given("--alias")) s.model_alias = cli.model_alias;
    if (opts.was_given("--policy")) s.policy_file = cli.policy_file;
    if (opts.was_given("--route-block")) s.pool.routing.block_chars = cli.pool.routing.block_chars;
    if (opts.was_given("--route-min-blocks")) s.pool.routing.min_match_blocks = cli.pool.routing.min_match_blocks;
    if (opts.was_given("--rebalance-margin")) s.pool.routing.rebalance_margin = cli.pool.routing.rebalance_margin;
    if (opts.was_given("--health-interval")) s.pool.health_interval = cli.pool.health_interval;
    if (opts.was_given("--first-byte-timeout")) s.pool.first_byte_timeout = cli.pool.first_byte_timeout;
    if (opts.was_given("--upstream-idle-timeout")) s.pool.idle_timeout = cli.pool.idle_timeout;
    if (opts.was_given("--answer-timeout")) s.pool.answer_timeout = cli.pool.answer_timeout;
    if (opts.was_given("--health-failures")) s.pool.health_failures = cli.pool.health_failures;
    for (const std::string& spec : opts.upstreams) {
        try {
            s.upstreams.push_back(proxy::upstream_config::parse(spec));
        } catch (const std::invalid_argument& e) {
            throw CLI::ValidationError("--upstream", e.what());
        }
    }
    if (s.upstreams.empty()) {
        throw CLI::ValidationError("--upstream", "no upstream: give --upstream URL or [[upstream]] in --config");
    }
    return s;
}

// What the proxy answers itself: its health (from its upstreams' health, without asking them now), the model name,
// the policy, the routing state, and its metrics.
void register_proxy_status_routes(http::http_server& server, frontend_context& ctx, proxy::upstream_pool& pool) {
    server.add_route("GET", "/health",
                     [&pool](const http::request&, http::response_writer& w) {
                         const size_t healthy = pool.healthy_count();
                         const json body = {{"status", healthy > 0 ? "ok" : "no upstream"},
                                            {"upstreams", pool.size()},
                                            {"upstreams_healthy", healthy}};
                         w.send(healthy > 0 ? 200 : 503, "application/json", body.dump());
                     },
                     {.requires_auth = false});
    server.add_route("GET", "/v1/cache", [&pool](const http::request&, http::response_writer& w) {
        w.send(200, "application/json", pool.cache_json().dump());
    });
    server.add_route("GET", "/metrics", [&ctx, &pool](const http::request&, http::response_writer& w) {
        metrics_text out;
        write_http_metrics(out, ctx.http);
        pool.write_metrics(out);
        w.send(200, "text/plain; version=0.0.4", out.str());
    });
    server.add_route("GET", "/v1/policy", [&ctx](const http::request&, http::response_writer& w) {
        w.send(200, "application/json", ctx.policy->to_json().dump());
    });
    register_models_routes(server, ctx);
    // Over those: the proxy lists its own name and every model an upstream serves (upstream_pool::all_models: routing
    // by model name), and GET /v1/models/{id} knows each of them too.
    const auto created = std::chrono::duration_cast<std::chrono::seconds>(ctx.started.time_since_epoch()).count();
    const auto list = [&ctx, &pool, created](const http::request&, http::response_writer& w) {
        json data = json::array({api::model_json(ctx.model_id, created, "keepwarm")});
        for (const std::string& name : pool.all_models()) {
            if (name != ctx.model_id) data.push_back(api::model_json(name, created, "keepwarm"));
        }
        w.send(200, "application/json", json{{"object", "list"}, {"data", std::move(data)}}.dump());
    };
    server.add_route("GET", "/v1/models", list);
    server.add_route("GET", "/models", list);
    for (const std::string prefix : {"/v1/models/", "/models/"}) {
        server.add_route(
            "GET", prefix + "*", [&ctx, &pool, created, prefix](const http::request& req, http::response_writer& w) {
                const std::optional<std::string> id = http::path_rest(req.path, prefix);
                if (!id) throw request_error(400, "the model id in the path has a malformed %-escape");
                const std::vector<std::string> listed = pool.all_models();
                if (!model_id_known(ctx, *id) && std::find(listed.begin(), listed.end(), *id) == listed.end()) {
                    const std::string quoted = id->size() <= 200 ? *id : id->substr(0, 200) + "...";
                    throw request_error(404,
                                        "The model '" + quoted + "' does not exist; this proxy serves '" +
                                            ctx.model_id + "' and the models its upstreams list",
                                        "model_not_found");
                }
                w.send(200, "application/json", api::model_json(*id, created, "keepwarm").dump());
            });
    }
}

int run_proxy(proxy::proxy_settings opts, const tenancy_options& tenancy, bool no_policy) {
    const sigset_t signals = block_stop_signals();

    frontend_context ctx;  // the upstreams have the model
    ctx.model_id = opts.model_alias;
    policy::policy_config policy_config = select_policy(opts.policy_file, no_policy, ctx.model_id);
    const std::vector<std::string> tenants = apply_tenancy(tenancy, opts.http, ctx, policy_config, "proxy");
    ctx.policy = std::make_unique<policy::request_policy>(std::move(policy_config), ctx.model_id);
    ctx.stream_keepalive = opts.http.stream_keepalive;
    ctx.busters = make_busters_detector(ctx);

    proxy::pool_options pool_options = opts.pool;
    pool_options.forward_client_keys = !tenants.empty();
    pool_options.bias_texts = ctx.policy->bias_texts();
    proxy::upstream_pool pool(std::move(opts.upstreams), pool_options);
    pool.start_health_checks();

    response_store responses(response_store::options{});  // in memory: the proxy keeps no folder
    http::http_server server(opts.http);
    register_proxy_status_routes(server, ctx, pool);
    const generation_opener open = proxy::upstream_generations(ctx, pool);
    register_openai_routes(server, ctx, open, proxy::upstream_completions(pool), responses);
    register_anthropic_routes(server, ctx, open, proxy::upstream_token_counter(ctx, pool));
    register_ollama_routes(server, ctx, open, proxy::upstream_raw_generations(ctx), std::nullopt);
    register_ollama_proxy_model_routes(server, ctx.model_id);
    register_busters_routes(server, ctx);
    server.start();

    std::ostringstream banner;  // stdout: as it is, or one JSON line per line with --log-format json
    banner << "keepwarm " << KEEPWARM_VERSION << ": proxy for " << pool.size() << " upstream(s), "
           << pool.healthy_count() << " up, as model " << ctx.model_id << "\n";
    const json state = pool.cache_json();
    for (const auto& u : state["upstreams"]) {
        banner << "  " << u["url"].get<std::string>() << " (" << u["dialect"].get<std::string>() << ", model "
               << (u["model"].get<std::string>().empty() ? "unknown yet" : u["model"].get<std::string>()) << ", "
               << (u["healthy"].get<bool>() ? "up" : "down") << ")\n";
    }
    banner << "  policy: " << describe_policy(*ctx.policy) << "\n";
    banner << "  tenants: " << http::describe_tenants(opts.http.api_key, opts.http.api_keys, tenants)
           << (tenants.empty() ? "" : "; upstreams without a key of their own get the client's key") << "\n";
    const std::string url = "http://" + opts.http.host + ":" + std::to_string(server.port());
    log::announce("proxy", banner.str());
    log::announce("proxy", "listening on " + url, {{"url", url}});

    int sig = 0;
    sigwait(&signals, &sig);
    log::announce("proxy",
                  std::string("keepwarm proxy: ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") + ", shutting down");
    server.stop();
    return 0;
}

}  // namespace

void add_proxy_command(CLI::App& app) {
    auto opts = std::make_shared<proxy_options>();
    CLI::App* cmd = app.add_subcommand(
        "proxy", "Serve the OpenAI, Anthropic and Ollama APIs in front of other engines, with cache-aware routing");
    auto& r = opts->settings.pool.routing;
    const auto option = [&](const std::string& name, CLI::Option* opt) {
        opts->given.emplace_back(name, opt);
        return opt;
    };
    cmd->add_option("--config", opts->config_file,
                    "Settings file (TOML): [listen], [[upstream]], [routing], [health], policy (docs/proxy.md); "
                    "options given here win over it")
        ->check(CLI::ExistingFile);
    cmd->add_option("--upstream", opts->upstreams,
                    "Upstream engine: URL[,dialect=openai|anthropic|ollama][,model=NAME][,key=KEY] (repeatable; "
                    "added to the --config file's)");
    option("--alias", cmd->add_option("--alias", opts->settings.model_alias, "Model name reported to clients"))
        ->capture_default_str();
    opts->listen = add_listen_options(*cmd, opts->settings.http);
    add_tenancy_options(*cmd, opts->tenancy, "routing and reports");
    add_log_options(*cmd);
    CLI::Option* policy_option =
        option("--policy", cmd->add_option("--policy", opts->settings.policy_file,
                                           "Policy file (TOML): model pinning, forced options, ping absorption, "
                                           "volatile spans, cache-buster detection (docs/policy.md); without one the "
                                           "built-in defaults run"))
            ->check(CLI::ExistingFile);
    add_no_policy_flag(*cmd, policy_option, opts->no_policy);
    option("--route-block",
           cmd->add_option("--route-block", r.block_chars, "Characters of normalized prompt per routing block"))
        ->capture_default_str()
        ->check(whole_number(16, 1 << 20, "characters"));
    option("--route-min-blocks", cmd->add_option("--route-min-blocks", r.min_match_blocks,
                                                 "Blocks a prefix must match to pull a request to an upstream"))
        ->capture_default_str()
        ->check(whole_number_at_least(1, "blocks"));
    option("--rebalance-margin",
           cmd->add_option("--rebalance-margin", r.rebalance_margin,
                           "In-flight requests by which a matching upstream may exceed the least loaded one"))
        ->capture_default_str()
        ->check(whole_number_at_least(0, "requests"));
    option("--health-interval", cmd->add_option_function<double>(
                                    "--health-interval",
                                    [opts](double seconds) {
                                        opts->settings.pool.health_interval =
                                            std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
                                    },
                                    "Seconds between health checks of each upstream (default 1)"))
        ->check(positive_real("seconds"));
    option("--health-failures",
           cmd->add_option("--health-failures", opts->settings.pool.health_failures,
                           "Health checks in a row that must fail before an upstream that answered is out of routing "
                           "(one never seen up is out at its first)"))
        ->capture_default_str()
        ->check(whole_number(1, 1000, "checks"));
    const auto timeout = [&](const std::string& name, std::chrono::milliseconds proxy::pool_options::*field,
                             const std::string& help) {
        option(name, cmd->add_option_function<double>(
                         name,
                         [opts, field](double seconds) {
                             opts->settings.pool.*field =
                                 std::max(std::chrono::milliseconds(1),
                                          std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
                         },
                         help))
            ->check(real_number(0.001, 86400, "seconds"));
    };
    timeout(
        "--first-byte-timeout", &proxy::pool_options::first_byte_timeout,
        "Seconds an upstream may take to start its answer (its prefill) before the request fails with 504 and the "
        "upstream is out of routing until its health check answers (default 600: a cold 30K-token prompt on a CPU)");
    timeout("--upstream-idle-timeout", &proxy::pool_options::idle_timeout,
            "Seconds an upstream's answer may go without a content or token delta once it has begun (keep-alive "
            "comments are not progress) before the request ends with an error (default 120)");
    timeout("--answer-timeout", &proxy::pool_options::answer_timeout,
            "Seconds a request answered whole (not streamed) may wait for all of its answer before it gets a 504 "
            "(default 1800)");
    cmd->callback([opts, cmd] {
        run_command("proxy", [&] {
            apply_environment(*cmd, api_key_environment(), process_environment());
            return run_proxy(merged_settings(*opts), opts->tenancy, opts->no_policy);
        });
    });
}

}  // namespace keepwarm

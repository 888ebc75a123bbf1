// See serve-router.h.
#include "commands/serve-router.h"

#include <csignal>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <thread>

#include "api/anthropic-api.h"
#include "api/ollama-api.h"
#include "base/logger.h"
#include "cache/cache-dir-lock.h"
#include "commands/llama-server-flags.h"
#include "commands/number-checks.h"
#include "http/api-keys.h"
#include "model/demo-model.h"
#include "model/model-inspect.h"
#include "router/child-process.h"
#include "router/model-router.h"
#include "router/router-routes.h"

namespace keepwarm {

namespace {

// Options the router sets for each child itself, or that only the router reads: never passed on as given.
const std::vector<std::string> router_only = {"model",
                                              "max-connections-per-address",
                                              "alias",
                                              "host",
                                              "port",
                                              "cache-dir",
                                              "models-dir",
                                              "models-max",
                                              "models-memory",
                                              "models-default",
                                              "models-queue",
                                              "models-idle-seconds",
                                              "no-models-autoload",
                                              "models-load-timeout",
                                              "help"};

CLI::Option* find_option(CLI::App& cmd, const std::string& name, bool long_name) {
    for (CLI::Option* opt : cmd.get_options()) {
        if (long_name ? opt->check_lname(name) : opt->check_sname(name)) return opt;
    }
    return nullptr;
}

bool in(const std::vector<std::string>& list, const std::string& name) {
    return std::find(list.begin(), list.end(), name) != list.end();
}

// The arguments this process was started with after `serve`, from /proc/self/cmdline (CLI11 keeps no raw copy), with
// llama-server's multi-letter flags spelled out as main() gave them to CLI11.
std::vector<std::string> serve_arguments() {
    std::ifstream in("/proc/self/cmdline", std::ios::binary);
    const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::string> args;
    std::string current;
    for (char c : all) {
        if (c == '\0') {
            args.push_back(std::move(current));
            current.clear();
        } else {
            current += c;
        }
    }
    if (args.empty()) return {};
    args = expand_llama_server_flags({args.begin() + 1, args.end()});
    const auto serve = std::find(args.begin(), args.end(), "serve");
    if (serve == args.end()) return {};
    return std::vector<std::string>(serve + 1, args.end());
}

// One option as given on the command line: the option and its tokens ("-c", "4096" or "--ctx-size=4096").
struct given_option {
    CLI::Option* option = nullptr;
    std::vector<std::string> tokens;
};

std::vector<given_option> group_arguments(CLI::App& cmd, const std::vector<std::string>& args) {
    std::vector<given_option> groups;
    for (size_t i = 0; i < args.size(); ++i) {
        const std::string& t = args[i];
        given_option g;
        g.tokens.push_back(t);
        bool inline_value = false;
        if (t.starts_with("--") && t.size() > 2) {
            const size_t eq = t.find('=');
            inline_value = eq != std::string::npos;
            g.option = find_option(cmd, t.substr(2, inline_value ? eq - 2 : std::string::npos), true);
        } else if (t.size() >= 2 && t[0] == '-' && t[1] != '-') {
            g.option = find_option(cmd, t.substr(1), false);  // "-c"
            if (!g.option) {                                  // "-c4096"
                inline_value = true;
                g.option = find_option(cmd, t.substr(1, 1), false);
            }
        }
        if (g.option && !inline_value && g.option->get_expected_max() > 0 && i + 1 < args.size()) {
            const bool optional_value = g.option->get_expected_min() == 0;
            if (!optional_value || !args[i + 1].starts_with("-")) g.tokens.push_back(args[++i]);
        }
        groups.push_back(std::move(g));
    }
    return groups;
}

}  // namespace

std::vector<std::string> child_command_line(CLI::App& cmd, const std::vector<std::string>& router_arguments,
                                            const router::model_entry& m, const std::filesystem::path& cache_root,
                                            const std::string& disk_share) {
    const std::vector<given_option> given = group_arguments(cmd, router_arguments);
    std::vector<CLI::Option*> overridden;
    for (const auto& [key, values] : m.options) overridden.push_back(find_option(cmd, key, true));
    // Its aliases too: it answers a request under the name the request gave, as a single-model server does.
    std::string names = m.name;
    for (const std::string& a : m.aliases) names += "," + a;
    std::vector<std::string> args = {"serve", "-m", m.path, "-a", names};
    bool table_sets_disk = false;
    for (const given_option& g : given) {
        if (g.option) {
            const std::string name = g.option->get_lnames().empty() ? "" : g.option->get_lnames().front();
            if (in(router_only, name) || name == "cache-disk") continue;
            if (std::find(overridden.begin(), overridden.end(), g.option) != overridden.end()) continue;
        }
        args.insert(args.end(), g.tokens.begin(), g.tokens.end());
    }
    for (const auto& [key, values] : m.options) {
        table_sets_disk = table_sets_disk || key == "cache-disk";
        if (values.empty()) args.push_back("--" + key);
        for (const std::string& v : values) args.push_back("--" + key + "=" + v);
    }
    // Every connection to it comes from the router, whose own server holds each client address to its share.
    args.insert(args.end(), {"--host", "127.0.0.1", "--port", "0", "--cache-dir", (cache_root / m.name).string(),
                             "--max-connections-per-address", "0"});
    if (!table_sets_disk) args.push_back("--cache-disk=" + disk_share);
    return args;
}

void add_router_options(CLI::App& cmd, router_settings& s) {
    cmd.add_option("--models-dir", s.models_dir,
                   "Serve every model of this folder (each *.gguf, named by its file's stem; a folder holding one "
                   "model, named by the folder), each by a server of its own started when a request names it "
                   "(without -m; docs/models.md)")
        ->check(CLI::ExistingDirectory);
    cmd.add_option("--models-max", s.models_max,
                   "Several models: how many may be loaded at once; the least recently used idle one is unloaded "
                   "(its cache written to disk) to load another (0: no limit)")
        ->capture_default_str()
        ->check(whole_number_at_least(0, "models; 0: no limit"));
    cmd.add_option_function<std::string>(
           "--models-memory",
           [&s](const std::string& text) {
               try {
                   const cache_budget budget = parse_cache_budget(text, "--models-memory");
                   if (!budget) throw std::invalid_argument("--models-memory -1: give a size, or 0 for no budget");
                   s.models_memory = *budget;
               } catch (const std::invalid_argument& e) {
                   throw CLI::ValidationError(e.what());
               }
           },
           "Several models: memory the loaded models may take in all, each counted as its weights + the KV cache "
           "of its context and slots + its --cache-ram; the least recently used idle ones are unloaded until a "
           "model fits (MiB as a bare number, or 8GiB, 512MB; 0: no budget, only --models-max)")
        ->type_name("SIZE")
        ->default_str("0");
    cmd.add_option("--models-default", s.models_default,
                   "Several models: the model (a name or alias) that serves a request naming a model the server does "
                   "not have, as one model's server serves any name (default: the first listed; a policy with [model] "
                   "mode = \"strict\" answers such a name 404)")
        ->type_name("NAME");
    cmd.add_option("--models-queue", s.models_queue,
                   "Several models: requests that may wait for their model to load or to be free; one more gets a "
                   "503 at once")
        ->capture_default_str()
        ->check(whole_number_at_least(1, "requests"));
    cmd.add_option("--models-idle-seconds", s.idle_seconds,
                   "Several models: unload a model no request has used for this long (0: never; a request's Ollama "
                   "keep_alive sets its model's own)")
        ->capture_default_str()
        ->check(real_number(0, 1e9, "seconds; 0: never"));
    cmd.add_flag("--no-models-autoload", s.no_autoload,
                 "Several models: load a model only on POST /models/load, not when a request names it");
    cmd.add_option("--models-load-timeout", s.load_timeout_seconds,
                   "Several models: the longest a model's server may take to start listening")
        ->capture_default_str()
        ->check(positive_real("seconds"));
}

std::vector<std::string> router_option_names() {
    return {"--models-dir",   "--models-max",          "--models-memory",      "--models-default",
            "--models-queue", "--models-idle-seconds", "--no-models-autoload", "--models-load-timeout"};
}

void read_models_settings(const toml::table& models, const config::toml_reader& reader, CLI::App& cmd,
                          router_settings& settings) {
    const auto arity_of = [&cmd](const std::string& key) {
        CLI::Option* opt = find_option(cmd, key, true);
        if (!opt) return router::option_arity::unknown;
        if (opt->get_expected_max() == 0) return router::option_arity::flag;
        return opt->get_expected_max() > 1 ? router::option_arity::values : router::option_arity::value;
    };
    // The file's folder ("" for a file named without one: the working folder, which absolute() refuses to take).
    const std::filesystem::path folder = std::filesystem::path(reader.source()).parent_path();
    const std::filesystem::path base =
        folder.empty() ? std::filesystem::current_path() : std::filesystem::absolute(folder);
    settings.tables = router::read_models_table(
        models, reader, base, arity_of, router_only,
        {"chat-template-file", "policy", "api-keys-file", "api-key-file", "spec-draft-model", "model-draft"});
    settings.has_tables = true;
}

std::vector<model_footprint> set_footprints(std::vector<router::model_entry>& models, const footprint_settings& base,
                                            uint64_t budget) {
    std::vector<model_footprint> footprints;
    for (router::model_entry& m : models) {
        model_footprint f;
        try {
            const footprint_settings settings = footprint_settings_for(base, m);
            std::optional<model_report> draft;
            if (!settings.draft_model.empty()) draft = inspect_model(settings.draft_model);
            f = compute_footprint(inspect_model(m.path), settings, draft ? &*draft : nullptr);
            m.footprint_bytes = f.total();
        } catch (const std::exception& e) {
            if (budget > 0) {
                throw std::runtime_error("--models-memory: the footprint of model " + m.name + " (" + m.source +
                                         ") cannot be computed: " + e.what());
            }
            log::warn("router", "model {}: footprint unknown: {}", m.name, e.what());
        }
        footprints.push_back(f);
    }
    return footprints;
}

int run_router_serve(CLI::App& cmd, const router_run& run) {
    const router_settings& s = run.settings;
    const sigset_t signals = block_stop_signals();
    std::vector<router::model_entry> from_dir;
    if (!s.models_dir.empty()) {
        std::vector<std::string> skipped;
        from_dir = router::scan_models_dir(s.models_dir, &skipped);
        for (const std::string& why : skipped) log::warn("router", "not a model: {}", why);
    }
    router::model_set scanned(std::move(from_dir), s.tables);
    if (scanned.size() == 0) {
        throw std::runtime_error("no models to serve: --models-dir " + s.models_dir +
                                 " holds no .gguf file and the settings file has no [models.NAME] table");
    }
    std::vector<router::model_entry> entries = scanned.entries();
    const std::vector<model_footprint> footprints = set_footprints(entries, run.footprint, s.models_memory);
    router::model_set models(std::move(entries), {});
    if (!run.strict_model_names) {
        const std::optional<size_t> fallback =
            s.models_default.empty() ? std::optional<size_t>(0) : models.find(s.models_default);
        if (!fallback) {
            throw std::runtime_error("--models-default " + s.models_default +
                                     ": no model has that name (the models: " + models.names() + ")");
        }
        models.set_default_model(fallback);
    }

    const std::filesystem::path root =
        run.cache_dir.empty() ? cache_dir() / "prefix-cache" : std::filesystem::path(run.cache_dir);
    cache_dir_lock dir_lock(root, "keepwarm serve (router)");  // the children lock their own folders under it
    const std::filesystem::path cache_root = root / "models";
    const uint64_t disk_total = run.cache_disk ? *run.cache_disk : half_of_free_disk(root);
    const uint64_t share_mib = disk_total / models.size() / (1u << 20);
    const std::string disk_share = disk_total == 0 ? "0" : std::to_string(std::max<uint64_t>(share_mib, 1));

    const std::vector<std::string> given = serve_arguments();
    router::process_launcher launcher(
        "/proc/self/exe",
        [&cmd, &given, cache_root, disk_share](const router::model_entry& m) {
            return child_command_line(cmd, given, m, cache_root, disk_share);
        },
        std::chrono::milliseconds(static_cast<int64_t>(s.load_timeout_seconds * 1000)));
    router::router_options ro;
    ro.models_max = s.models_max;
    ro.memory_budget = s.models_memory;
    ro.queue_limit = s.models_queue;
    ro.autoload = !s.no_autoload;
    ro.idle_unload = std::chrono::milliseconds(static_cast<int64_t>(s.idle_seconds * 1000));
    router::model_router router(models, launcher, ro);

    http::server_options http = run.http;
    const std::vector<std::string> tenants =
        http::configure_tenants(http.api_key, http.api_keys, run.tenancy.api_keys_file, run.tenancy.shared_cache,
                                run.tenancy.shared_keys_file, run.tenancy.listed_keys);
    http::http_server server(http);
    router::api_shapes shapes{.openai = http::openai_error_body,
                              .anthropic = api::anthropic::error_body,
                              .ollama = api::ollama::error_body,
                              .ollama_version_json = api::ollama::version_json(KEEPWARM_VERSION).dump()};
    router::register_router_routes(server, router, shapes);
    server.start();
    const std::string url = "http://" + http.host + ":" + std::to_string(server.port());
    dir_lock.describe("keepwarm serve (router) on " + url);

    std::ostringstream banner;
    banner << "keepwarm " << KEEPWARM_VERSION << ": serving " << models.size()
           << (models.size() == 1 ? " model" : " models") << ", each by a server of its own loaded on demand ("
           << (s.models_max == 0 ? std::string("no limit") : "at most " + std::to_string(s.models_max))
           << " loaded at once"
           << (s.models_memory > 0 ? ", their footprints within " + format_bytes(s.models_memory) + " (--models-memory)"
                                   : std::string())
           << (s.no_autoload ? "; loaded only by POST /models/load" : "") << ")\n";
    for (size_t i = 0; i < models.size(); ++i) {
        const router::model_entry& m = models[i];
        banner << "  " << m.name << ": " << m.path;
        if (!m.aliases.empty()) {
            banner << " (aliases:";
            for (const std::string& a : m.aliases) banner << " " << a;
            banner << ")";
        }
        banner << (m.load_at_start ? ", loaded at start" : "") << (m.pinned ? ", pinned" : "");
        if (m.footprint_bytes > 0) {
            banner << ", footprint " << describe_footprint(footprints[i]);
            if (s.models_memory > 0 && m.footprint_bytes > s.models_memory) {
                banner << ", over --models-memory: its requests are refused";
            }
        }
        banner << "\n";
    }
    banner << "  cache: each model's disk tier in " << cache_root.string() << "/NAME, "
           << (disk_total > 0 ? format_bytes(disk_total / models.size()) + " each (--cache-disk shared)"
                              : std::string("off (--cache-disk 0)"))
           << "\n"
           << "  tenants: " << http::describe_tenants(http.api_key, http.api_keys, tenants) << "\n";
    if (!run.settings_file.empty()) banner << "  settings: " << run.settings_file << "\n";
    log::announce("serve", banner.str());
    log::announce("serve", "listening on " + url, {{"url", url}});
    std::thread loader([&router] { router.load_at_start(); });  // after the line above: a child's is not taken for it

    int sig = 0;
    sigwait(&signals, &sig);
    log::announce("serve", std::string("keepwarm: ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") +
                               ", stopping every model's server (each writes its cache to disk)");
    std::thread([seconds = run.shutdown_seconds * 3] {
        std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
        log::error("serve", "a clean shutdown did not finish in {} s; exiting now", log::fixed(seconds, 0));
        std::_Exit(1);
    }).detach();
    router.stop_all();
    server.stop();
    loader.join();
    return 0;
}

}  // namespace keepwarm

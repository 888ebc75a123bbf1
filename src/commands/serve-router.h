// `keepwarm serve` with several models (--models-dir, or a settings file's [models.NAME] tables, without -m): a router
// (src/router/) in front of one child `keepwarm serve -m FILE` per loaded model. This file wires it: the options that
// choose the mode, the [models] table's rules, each child's command line (the router's own serve options, less those
// the router sets itself, plus the model's table), the banner, and the run until SIGINT/SIGTERM.
// Threading: called on the command's thread.
#pragma once

#include <toml++/toml.h>
#include <CLI/CLI.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "commands/cache-budget-option.h"
#include "commands/listen-options.h"
#include "commands/model-footprint.h"
#include "config/toml-reader.h"
#include "http/http-server.h"
#include "router/model-set.h"

namespace keepwarm {

struct router_settings {
    std::string models_dir;                   // --models-dir
    int models_max = 4;                       // --models-max (0: no limit)
    int models_queue = 64;                    // --models-queue
    double idle_seconds = 0;                  // --models-idle-seconds (0: never)
    bool no_autoload = false;                 // --no-models-autoload
    double load_timeout_seconds = 600;        // --models-load-timeout
    uint64_t models_memory = 0;               // --models-memory: bytes of footprints loaded at once (0: no budget)
    std::string models_default;               // --models-default: serves names no model has (empty: the first)
    std::vector<router::model_entry> tables;  // the settings file's [models.NAME]
    bool has_tables = false;

    // Router mode: no -m, and a folder or tables of models.
    bool wanted(const std::string& model_path) const {
        return model_path.empty() && (!models_dir.empty() || has_tables);
    }
};

// Adds --models-dir, --models-max, --models-memory, --models-default, --models-queue, --models-idle-seconds,
// --no-models-autoload, --models-load-timeout.
void add_router_options(CLI::App& cmd, router_settings& settings);
// serve --help's group of them.
std::vector<std::string> router_option_names();

// Reads a settings file's [models] table into `settings` (errors name the file and line).
void read_models_settings(const toml::table& models, const config::toml_reader& reader, CLI::App& cmd,
                          router_settings& settings);

struct router_run {
    const router_settings& settings;
    http::server_options http;
    const tenancy_options& tenancy;
    cache_budget cache_disk;
    footprint_settings footprint;  // the router's own -c, --parallel, cache types, --cache-ram: each child's default
    std::string cache_dir;         // empty: the default
    double shutdown_seconds = 10;
    std::string settings_file;
    bool strict_model_names = false;  // the policy's [model] mode = "strict": a name no model has is a 404
};

// A model's server's command line after its executable: `serve -m FILE -a NAME,ALIASES`, the router's own serve
// arguments (`router_arguments`, as CLI11 got them) less the options the router sets itself and those the model's table
// sets, then the table's, then where it listens (127.0.0.1, a port of its choice) and keeps its cache
// (`cache_root`/NAME, `disk_share` MiB unless its table sets cache-disk).
std::vector<std::string> child_command_line(CLI::App& serve, const std::vector<std::string>& router_arguments,
                                            const router::model_entry& m, const std::filesystem::path& cache_root,
                                            const std::string& disk_share);

// Each model's footprint (model-footprint.h) into its entry. A model whose header cannot be read or whose table has a
// bad value: with a budget (`budget` > 0) a std::runtime_error naming it; without one a warning, and no footprint.
// Returns each model's footprint, in order (a default one where none was computed).
std::vector<model_footprint> set_footprints(std::vector<router::model_entry>& models, const footprint_settings& base,
                                            uint64_t budget);

// Runs the router until SIGINT/SIGTERM; returns the exit code.
int run_router_serve(CLI::App& cmd, const router_run& run);

}  // namespace keepwarm

// See serve-command.h. Parses options, builds the frontend_context and the local_model, registers the routes, and
// runs until SIGINT/SIGTERM.
#include "commands/serve-command.h"

#include <pthread.h>
#include <unistd.h>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "backend/cache-busters.h"
#include "backend/frontend-context.h"
#include "base/command-exit.h"
#include "base/logger.h"
#include "cache/block-key.h"
#include "cache/cache-dir-lock.h"
#include "commands/cache-budget-option.h"
#include "commands/command-line-help.h"
#include "commands/environment-options.h"
#include "commands/listen-options.h"
#include "commands/llama-server-flags.h"
#include "commands/number-checks.h"
#include "commands/options-file.h"
#include "commands/serve-router.h"
#include "common.h"
#include "engine/backend-placement.h"
#include "engine/draft-sources.h"
#include "engine/embedder.h"
#include "engine/llama-runtime.h"
#include "events/kv-event-encoder.h"
#include "events/kv-event-publisher.h"
#include "http/api-keys.h"
#include "http/http-server.h"
#include "local/chat-generation.h"
#include "local/embedding-routes.h"
#include "local/local-model.h"
#include "local/local-status-routes.h"
#include "local/model-card.h"
#include "local/prompt-index-keeper.h"
#include "local/raw-generation.h"
#include "local/tokenizer-routes.h"
#include "model/context-sizing.h"
#include "model/demo-model.h"
#include "model/model-inspect.h"
#include "policy/policy-file.h"
#include "routes/anthropic-routes.h"
#include "routes/busters-routes.h"
#include "routes/llama-server-routes.h"
#include "routes/models-routes.h"
#include "routes/ollama-routes.h"
#include "routes/openai-routes.h"
#include "routes/render-routes.h"
#include "routes/response-store.h"

namespace keepwarm {

namespace {

struct serve_options {
    engine_options engine;
    http::server_options http;
    std::string cache_type_k = "f16";
    std::string cache_type_v = "f16";
    std::string cache_type_k_draft = "f16";  // -ctkd, -ctvd: the draft model's (-md)
    std::string cache_type_v_draft = "f16";
    std::vector<std::string> model_aliases;  // the first is the name reported; the others map to it
    common_params_sampling sampling;         // what requests that leave a sampling field unset get (--temp, ...)
    std::string chat_template_file;
    std::string cache_dir;                         // empty: <keepwarm cache>/prefix-cache
    cache_budget cache_ram = uint64_t{4} << 30;    // --cache-ram; nullopt: -1, half of the machine's memory
    cache_budget cache_disk = uint64_t{16} << 30;  // --cache-disk; nullopt: -1, half of the disk's free space
    std::string policy_file;
    bool no_policy = false;
    std::string settings_file;                  // --config
    std::vector<std::string> from_environment;  // the variables applied (LLAMA_ARG_*, ...), named in the banner
    std::optional<written_policy> written;      // its [policy] table
    tenancy_options tenancy;
    double shutdown_seconds = 10;  // after SIGINT/SIGTERM, the process exits this soon even if a clean stop hangs
    bool embeddings = false;       // --embeddings: serve the model as an embedding model (see serves_embeddings)
    std::string pooling;           // --pooling: mean, cls, last or rank (--reranking), over the model's own
    router_settings router;        // several models (--models-dir, [models.NAME]): see serve-router.h
    std::string kv_events;         // --kv-events ENDPOINT: publish the prefix cache's blocks (docs/kv-events.md)
    std::string kv_events_pod;     // --kv-events-pod: the topic's pod (default $POD_IP:PORT, else HOST:PORT)
};

// The pod part of the KV-event topic: what llm-d's endpoint picker calls the pod (its address and port, from POD_IP as
// its manifests set it), else this host's name.
std::string kv_events_pod(const std::string& given, int port) {
    if (!given.empty()) return given;
    std::string host;
    if (const char* ip = std::getenv("POD_IP"); ip && *ip) {
        host = ip;
    } else {
        char name[256] = {};
        host = ::gethostname(name, sizeof name - 1) == 0 && name[0] ? name : "localhost";
    }
    return host + ":" + std::to_string(port);
}

std::string read_file(const std::string& path) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) throw std::runtime_error("cannot read '" + path + "'");
    std::string data;
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) data.append(buf, n);
    std::fclose(f);
    return data;
}

// The draft model's flags (-ctkd/-ctvd, -devd, -otd), checked with the model's own rules before anything loads: a
// mistake stops start-up at once, naming the flag, not after the model's minutes of loading.
void check_draft_model_options(serve_options& opts) {
    draft_model_options& d = opts.engine.draft_model;
    d.cache_type_k = parse_cache_type(opts.cache_type_k_draft, "-ctkd/--spec-draft-type-k");
    d.cache_type_v = parse_cache_type(opts.cache_type_v_draft, "-ctvd/--spec-draft-type-v");
    if (!d.devices.empty()) parse_device_list(d.devices, "-devd/--spec-draft-device");
    const tensor_overrides checked(d.tensor_overrides, "-otd/--spec-draft-override-tensor");
}

// Whether the engine loads the draft model: -md, and drafting not turned off (--spec-type none).
bool loads_draft_model(const engine_options& e) {
    return !e.draft_model.path.empty() && e.spec_type != "none";
}

// -c 0 (the default): a context sized from the model's trained context and the memory where it runs, so that
// agents' first requests fit (model/context-sizing.h).
context_choice size_default_context(const engine_options& e) {
    const model_report report = inspect_model(e.model_path);
    uint64_t free_memory = 0, reserved = report.file_size;
    const std::vector<gpu_device> gpus = e.gpu_layers != 0 ? gpu_devices() : std::vector<gpu_device>{};
    if (!gpus.empty()) {
        for (const gpu_device& d : gpus) free_memory += d.free_bytes;
    } else {
        free_memory = host_available_memory();
        reserved += e.cache_ram_bytes;  // the RAM tier lives beside the KV cache in host memory
    }
    const int sequences = e.slots + e.cache_parked_sequences + 2;
    context_sizing_input in =
        sizing_input_for(report, e.cache_type_k, e.cache_type_v, e.slots, sequences, free_memory, reserved);
    in.bytes_per_sequence *= 1 + static_cast<uint64_t>(recurrent_rollback_snapshots(e));  // a hybrid's draft rollback
    if (loads_draft_model(e)) {
        in = with_draft_model(in, inspect_model(e.draft_model.path), e.draft_model.cache_type_k,
                              e.draft_model.cache_type_v);
    }
    if (e.spec_type == draft_sources::mtp_type) {
        in = with_mtp_heads(in, report, e.draft_model.cache_type_k, e.draft_model.cache_type_v);
    }
    return choose_default_context(in);
}

// The RAM and disk tiers' sizes in bytes (llama-server's -1 resolved) and the disk tier's folder.
void resolve_cache_budgets(serve_options& opts) {
    const std::string disk_dir = opts.cache_dir.empty() ? (cache_dir() / "prefix-cache").string() : opts.cache_dir;
    opts.engine.cache_ram_bytes = opts.cache_ram.value_or(half_of_physical_memory());
    opts.engine.cache_disk_bytes = opts.cache_disk ? *opts.cache_disk : half_of_free_disk(disk_dir);
    if (opts.engine.cache_disk_bytes > 0) opts.engine.cache_dir = disk_dir;
}

// The banner's line on what drafting on a hybrid model keeps in memory (every sequence's recurrent-state snapshots,
// parked conversations' included), or nothing where it keeps none.
std::string describe_rollback_snapshots(const engine& llm, const std::string& model_path) {
    const int snapshots = llm.rollback_snapshots();
    if (snapshots == 0) return {};
    const uint64_t state_bytes = inspect_model(model_path).recurrent_state_bytes;
    return "  drafting on a hybrid model: " + std::to_string(snapshots) +
           " recurrent-state snapshots per sequence to drop rejected draft tokens, " +
           format_bytes(state_bytes * static_cast<uint64_t>(snapshots) * static_cast<uint64_t>(llm.sequences())) +
           " over " + std::to_string(llm.sequences()) + " sequences (--spec-rollback-tokens 0 frees them and turns " +
           "drafting off on this model)\n";
}

// The banner's line of cache budgets, tier by tier.
std::string describe_cache_budgets(const engine_options& eo) {
    return "cache: device " + std::to_string(eo.slots) + " slots + " + std::to_string(eo.cache_parked_sequences) +
           " parked conversations; RAM tier " +
           (eo.cache_ram_bytes > 0 ? format_bytes(eo.cache_ram_bytes) : std::string("off (--cache-ram 0)")) +
           "; disk tier " +
           (eo.cache_disk_bytes > 0 ? format_bytes(eo.cache_disk_bytes) + " in " + eo.cache_dir
                                    : std::string("off (--cache-disk 0)"));
}

// Waits for SIGINT/SIGTERM. A clean stop waits for the engine's current step, which one request's grammar can hold
// for long: past the limit, the process exits anyway (the disk tier's files are written whole or not at all).
void wait_for_stop_signal(const sigset_t& signals, double shutdown_seconds) {
    int sig = 0;
    sigwait(&signals, &sig);
    log::announce("serve", std::string("keepwarm: ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") + ", shutting down");
    std::thread([seconds = shutdown_seconds] {
        std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
        log::error("serve", "a clean shutdown did not finish in {} s (--shutdown-timeout); exiting now",
                   log::fixed(seconds, 0));
        std::_Exit(1);
    }).detach();
}

// Which engine serves the model: the embedder when the GGUF declares a pooling type (an embedding model, as
// llama.cpp reads it) or the command line asks for embeddings (--embeddings, --pooling); else the chat engine.
bool serves_embeddings(const serve_options& opts) {
    return opts.embeddings || !opts.pooling.empty() ||
           model_file_pooling(opts.engine.model_path) != LLAMA_POOLING_TYPE_NONE;
}

// `keepwarm serve` on an embedding model: the embedder behind the embedding routes; the chat routes answer 400.
int run_embedding_serve(serve_options& opts, frontend_context& ctx, const sigset_t& signals, bool random_weights,
                        const std::vector<std::string>& tenants) {
    const engine_options& e = opts.engine;
    embedder_options eo;
    eo.model_path = e.model_path;
    eo.context_size = e.context_size;
    eo.batch_size = e.batch_size;
    eo.max_sequences = std::max(e.slots, 16);
    eo.threads = e.threads;
    eo.gpu_layers = e.gpu_layers;
    eo.flash_attn = e.flash_attn;
    eo.load_mode = e.load_mode;
    eo.max_queue = e.max_queue;
    eo.verbose = e.verbose;
    static const std::map<std::string, enum llama_pooling_type> poolings = {{"mean", LLAMA_POOLING_TYPE_MEAN},
                                                                            {"cls", LLAMA_POOLING_TYPE_CLS},
                                                                            {"last", LLAMA_POOLING_TYPE_LAST},
                                                                            {"rank", LLAMA_POOLING_TYPE_RANK}};
    if (!opts.pooling.empty()) eo.pooling = poolings.at(opts.pooling);

    http::http_server server(opts.http);
    server.hold(503, R"({"error":{"code":503,"message":"Loading model","type":"unavailable_error"}})");
    server.start();
    const std::string url = "http://" + opts.http.host + ":" + std::to_string(server.port());
    log::info("serve", "bound {}; loading the embedding model (requests get 503 Loading model until it is loaded)",
              url);
    embedder model(eo);
    const std::string& id = ctx.model_id;
    register_models_routes(server, ctx,
                           {{"path", eo.model_path},
                            {"n_ctx", model.context_size()},
                            {"n_embd", model.n_embd()},
                            {"pooling", pooling_name(model.pooling())},
                            {"random_weights", random_weights}});
    register_embedding_routes(server, ctx, model);
    register_ollama_model_routes(server, make_embedding_model_card(model, eo.model_path, id));
    response_store responses({});  // the Responses routes answer 400 before they store anything
    register_openai_routes(server, ctx, chat_refused(id), openai_completions(raw_completion_refused(id)), responses);
    register_llama_server_routes(server, ctx, raw_completion_refused(id), nullptr);
    register_anthropic_routes(server, ctx, chat_refused(id), token_count_refused(id));
    register_ollama_routes(server, ctx, chat_refused(id), raw_completion_refused(id), false);
    server.open();

    const embedder_options& r = model.options();
    std::ostringstream banner;
    const bool reranker = model.pooling() == LLAMA_POOLING_TYPE_RANK;
    banner << "keepwarm " << KEEPWARM_VERSION << ": serving " << id << " (" << eo.model_path << ") as "
           << (reranker ? "a reranker (POST /rerank)\n" : "an embedding model\n") << "  " << model.n_embd()
           << (reranker ? " classifier labels, " : "-value vectors, ") << pooling_name(model.pooling())
           << " pooling, inputs of up to " << r.context_size << " tokens; " << r.batch_size << " tokens and "
           << r.max_sequences << " inputs per batch, " << r.threads << " threads\n"
           << "  compute: " << describe_compute(r.gpu_layers, llama_model_n_layer(model.model())) << "\n"
           << "  tenants: " << http::describe_tenants(opts.http.api_key, opts.http.api_keys, tenants) << "\n";
    if (random_weights) {
        banner << "  NOTE: this model was generated with random weights for testing: its vectors are noise.\n";
    }
    log::announce("serve", banner.str());
    log::announce("serve", "listening on " + url, {{"url", url}});
    wait_for_stop_signal(signals, opts.shutdown_seconds);
    server.stop();
    return 0;
}

// Router mode reads the policy for its [model] mode only: each model's server applies the whole policy to its own
// requests. Its [model] aliases each name one served model, which a router of several does not have: there,
// [models.NAME] tables' aliases (shell patterns allowed) say which model a name is.
bool router_policy_is_strict(const serve_options& opts) {
    const policy::policy_config config = select_policy(opts.policy_file, opts.no_policy, "", opts.written);
    if (!config.model.aliases.empty()) {
        throw std::runtime_error(
            "the policy's [model] aliases map names to one served model; with several models, "
            "give aliases in [models.NAME] tables (aliases = [\"claude-haiku-*\"]) and take them "
            "out of the policy (" +
            config.source + ")");
    }
    return config.model.mode == policy::model_mode::strict;
}

int run_serve(serve_options opts) {
    const sigset_t signals = block_stop_signals();

    init_llama_runtime(opts.engine.verbose);
    std::optional<cache_dir_lock> dir_lock;  // first in, last out: held until the engine's last write is done
    // Before the model: the engine's prefix cache reports to it until the engine is gone.
    std::unique_ptr<events::kv_event_publisher> kv_events;
    frontend_context ctx;
    local_model model;
    if (opts.engine.model_path.empty()) {
        opts.engine.model_path = ensure_demo_model();
    }
    model.model_path = opts.engine.model_path;
    model.random_weights = model_has_random_weights(model.model_path);
    ctx.model_id = !opts.model_aliases.empty() && !opts.model_aliases.front().empty()
                       ? opts.model_aliases.front()
                       : std::filesystem::path(model.model_path).stem().string();
    // Before the model loads: a mistake in the file stops start-up at once, naming its line.
    policy::policy_config policy_config = select_policy(opts.policy_file, opts.no_policy, ctx.model_id, opts.written);
    for (size_t i = 1; i < opts.model_aliases.size(); ++i) {
        policy_config.model.aliases.push_back({opts.model_aliases[i], ctx.model_id});
    }
    const std::vector<std::string> tenants = apply_tenancy(opts.tenancy, opts.http, ctx, policy_config, "serve");
    ctx.policy = std::make_unique<policy::request_policy>(std::move(policy_config), ctx.model_id);
    ctx.stream_keepalive = opts.http.stream_keepalive;
    ctx.busters = make_busters_detector(ctx);
    if (serves_embeddings(opts) && !opts.kv_events.empty()) {
        throw std::runtime_error("--kv-events: an embedding model has no prefix cache to publish");
    }
    if (serves_embeddings(opts)) return run_embedding_serve(opts, ctx, signals, model.random_weights, tenants);
    opts.engine.cache_type_k = parse_cache_type(opts.cache_type_k, "-ctk/--cache-type-k");
    opts.engine.cache_type_v = parse_cache_type(opts.cache_type_v, "-ctv/--cache-type-v");
    check_draft_model_options(opts);
    resolve_cache_budgets(opts);
    response_store::options stored_responses;  // in memory, unless beside the disk tier
    if (opts.engine.cache_disk_bytes > 0) {
        // Before the model loads, so a second server on the directory stops at once, naming the first.
        dir_lock.emplace(opts.engine.cache_dir, "keepwarm serve");
        // The Responses API's stored responses survive a restart beside the disk tier (a folder it does not read).
        stored_responses.dir = std::filesystem::path(opts.engine.cache_dir) / "responses";
    }
    response_store responses(stored_responses);

    // The port before the model, which can take minutes to load: a port in use stops start-up at once, and a monitor
    // sees the server loading (llama-server's 503 "Loading model" on every route) rather than a refused connection.
    http::http_server server(opts.http);
    server.hold(503, R"({"error":{"code":503,"message":"Loading model","type":"unavailable_error"}})");
    server.start();
    const std::string url = "http://" + opts.http.host + ":" + std::to_string(server.port());
    log::info("serve", "bound {}; loading the model (requests get 503 Loading model until it is loaded)", url);

    std::optional<context_choice> auto_context;
    if (opts.engine.context_size == 0) {
        auto_context = size_default_context(opts.engine);
        opts.engine.context_size = auto_context->context_size;
    }
    if (!opts.kv_events.empty()) {
        kv_events = std::make_unique<events::kv_event_publisher>(events::kv_event_publisher_options{
            .endpoint = opts.kv_events,
            .topic = events::event_topic(kv_events_pod(opts.kv_events_pod, server.port()), ctx.model_id),
            .block_size = opts.engine.cache_block_tokens});
        opts.engine.cache_block_observer = kv_events.get();
        model.kv_events = kv_events.get();
        // Which way the socket goes is easy to get wrong (tcp://127.0.0.1:PORT connects, and then a subscriber that
        // connects too hears nothing): say it.
        const bool binds = opts.kv_events.find('*') != std::string::npos;
        log::info("serve", "publishing KV events as topic {}: {} {}", kv_events->options().topic,
                  binds ? "subscribers connect to" : "connecting to a subscriber that binds", opts.kv_events);
    }
    model.llm = std::make_unique<engine>(opts.engine);
    ctx.policy->bind_vocab([vocab = model.llm->vocab()](const std::string& text) -> std::optional<llama_token> {
        const auto ids = common_tokenize(vocab, text, /*add_special=*/false, /*parse_special=*/true);
        return ids.size() == 1 ? std::optional(ids[0]) : std::nullopt;
    });
    const std::string template_override = opts.chat_template_file.empty() ? "" : read_file(opts.chat_template_file);
    model.renderer = std::make_unique<chat_renderer>(model.llm->model(), template_override);
    model.tokenizer = std::make_unique<prompt_tokenizer>(model.llm->vocab());
    model.default_sampling = opts.sampling;
    // Each tenant's index shares the default budget, so many tenants do not multiply the memory it may take.
    prompt_tokenizer::options tenant_index;
    tenant_index.token_budget =
        std::max<size_t>(tenant_index.token_budget / std::max<size_t>(tenants.size(), 1), 1 << 18);
    for (const std::string& tenant : tenants) {
        model.tenant_tokenizers.emplace(tenant, std::make_unique<prompt_tokenizer>(model.llm->vocab(), tenant_index));
    }
    std::vector<std::unique_ptr<prompt_index_keeper>> index_keepers;  // destroyed (saving the indexes) before model
    if (!opts.engine.cache_dir.empty() && model.tokenizer->indexed()) {
        // The index depends on the vocab only, but a model file is what a fingerprint names. A tenant's index is
        // saved under a fingerprint of its own, so it is only ever loaded for that tenant.
        const std::string fingerprint = model_fingerprint(model.model_path, "prompt-index v1");
        std::vector<std::string> all = tenants;
        all.insert(all.begin(), std::string());
        for (const std::string& tenant : all) {
            const std::string named = tenant.empty() ? fingerprint : tenant_root_block_key(fingerprint, tenant).hex();
            index_keepers.push_back(std::make_unique<prompt_index_keeper>(
                model.tokenizer_for(tenant), prompt_index_keeper::file_in(opts.engine.cache_dir, named), named));
        }
    }

    // Beside the disk tier, the notes `move` span rules appended to messages, so that the first turns after a restart
    // render their history as it was cached (see policy/moved-notes.h). Saved once the server and engine have stopped.
    const bool keeps_notes = opts.engine.cache_disk_bytes > 0 && !opts.engine.cache_dir.empty();
    const std::filesystem::path notes_file =
        keeps_notes ? std::filesystem::path(opts.engine.cache_dir) / "moved-notes.kwmn" : std::filesystem::path();
    if (!notes_file.empty() && std::filesystem::exists(notes_file)) {
        if (const std::string why = ctx.policy->moved_span_notes().load(notes_file); !why.empty()) {
            log::warn("policy", "ignored {}: {}", notes_file.string(), why);
        }
    }

    register_local_status_routes(server, ctx, model);
    register_models_routes(server, ctx, local_model_meta(model));
    const generation_opener open = local_generation(ctx, model);
    const raw_generation_opener open_raw = local_raw_generation(ctx, model);
    register_openai_routes(server, ctx, open, openai_completions(open_raw), responses);
    register_llama_server_routes(server, ctx, open_raw, model.renderer.get());
    register_anthropic_routes(server, ctx, open, local_token_counter(ctx, model));
    register_ollama_routes(server, ctx, open, open_raw, model.renderer->supports_thinking());
    register_ollama_model_routes(server, make_model_card(*model.llm, *model.renderer, model.model_path, ctx.model_id));
    register_tokenizer_routes(server, model);
    register_render_routes(server, ctx, local_chat_prompt(ctx, model), local_raw_prompt(ctx, model));
    register_busters_routes(server, ctx);
    register_embedding_refusals(server, ctx.model_id);
    model.llm->start();
    server.open();
    if (dir_lock) dir_lock->describe("keepwarm serve on " + url);

    const auto& eo = model.llm->options();
    std::ostringstream banner;  // stdout: as it is, or one JSON line per line with --log-format json
    banner << "keepwarm " << KEEPWARM_VERSION << ": serving " << ctx.model_id << " (" << model.model_path << ")\n"
           << "  context " << eo.context_size << " tokens, " << eo.slots << (eo.slots == 1 ? " slot of " : " slots of ")
           << model.llm->slot_context_size() << " tokens"
           << (auto_context ? " (" + auto_context->why + ")" : std::string()) << ", KV cache " << opts.cache_type_k
           << "/" << opts.cache_type_v << ", " << eo.threads << " threads\n"
           << "  compute: " << describe_compute(eo.gpu_layers, llama_model_n_layer(model.llm->model()))
           << (eo.cpu_moe_layers == 0  ? ""
               : eo.cpu_moe_layers < 0 ? "; expert weights of every block in host memory (--cpu-moe)"
                                       : "; expert weights of the first " + std::to_string(eo.cpu_moe_layers) +
                                             " blocks in host memory (--n-cpu-moe)")
           << "\n"
           << "  " << describe_cache_budgets(eo) << "\n"
           << describe_rollback_snapshots(*model.llm, model.model_path) << "  policy: " << describe_policy(*ctx.policy)
           << "\n"
           << "  tenants: " << http::describe_tenants(opts.http.api_key, opts.http.api_keys, tenants) << "\n";
    if (!opts.from_environment.empty()) {
        std::string names;
        for (const std::string& v : opts.from_environment) names += (names.empty() ? "" : ", ") + v;
        banner << "  environment: " << names << " (the command line wins over them)\n";
    }
    if (!opts.settings_file.empty()) {
        banner << "  settings: " << opts.settings_file << " (the command line and the environment win)\n";
    }
    if (model.random_weights) {
        banner << "  NOTE: this model was generated with random weights for testing: its output is noise.\n"
               << "        Pass --model PATH.gguf to serve a real model.\n";
    }
    log::announce("serve", banner.str());
    log::announce("serve", "listening on " + url, {{"url", url}});

    wait_for_stop_signal(signals, opts.shutdown_seconds);
    server.stop();
    model.llm->stop();
    if (!notes_file.empty()) {
        try {
            ctx.policy->moved_span_notes().save(notes_file);
        } catch (const std::exception& e) {
            log::warn("policy", "moved-span notes not saved: {}", e.what());
        }
    }
    return 0;
}

// [tenants] of the settings file: TENANT = "KEY" or ["KEY", ...], each key under the rules of --api-keys-file's lines.
std::vector<http::api_key_entry> read_tenants(const toml::table& t, const config::toml_reader& reader) {
    std::vector<http::api_key_entry> keys;
    std::set<std::string> seen;
    for (auto&& [tenant, node] : t) {
        const std::string what = "tenants." + std::string(tenant.str());
        std::vector<const toml::node*> items;
        if (const toml::array* list = node.as_array()) {
            for (const toml::node& item : *list) items.push_back(&item);
        } else {
            items.push_back(&node);
        }
        for (const toml::node* item : items) {
            const std::string key = reader.string(*item, what);
            std::vector<http::api_key_entry> parsed;
            try {
                parsed = http::parse_api_keys(std::string(tenant.str()) + " " + key, "");
            } catch (const std::invalid_argument& e) {
                const std::string message = e.what();  // ":1: what is wrong"
                reader.fail(item->source(), "'" + what + "': " + message.substr(message.find(' ') + 1));
            }
            if (parsed.size() != 1) reader.fail(item->source(), "'" + what + "': a key is one line of text");
            if (!seen.insert(key).second) reader.fail(item->source(), "'" + what + "': this key is listed twice");
            keys.push_back(std::move(parsed.front()));
        }
    }
    return keys;
}

// What `serve --config FILE` may hold besides serve's options, and which of those are paths.
options_file_rules settings_file_rules(serve_options& opts, CLI::App& cmd) {
    options_file_rules rules;
    rules.path_options = {"model",         "chat-template-file", "cache-dir",        "policy",
                          "api-keys-file", "api-key-file",       "spec-draft-model", "model-draft"};
    rules.not_in_file = {"config", "help"};
    rules.key_settings = {"api-key", "tenants"};
    rules.tables["policy"] = [&opts](const toml::table& t, const config::toml_reader& reader) {
        opts.written = written_policy{t, reader.source()};
    };
    rules.tables["models"] = [&opts, &cmd](const toml::table& t, const config::toml_reader& reader) {
        read_models_settings(t, reader, cmd, opts.router);
    };
    rules.tables["tenants"] = [&opts, &cmd](const toml::table& t, const config::toml_reader& reader) {
        const bool keys_on_command_line = cmd.get_option("--api-key")->count() > 0 ||
                                          cmd.get_option("--api-keys-file")->count() > 0 ||
                                          cmd.get_option("--api-key-file")->count() > 0;
        if (!keys_on_command_line) opts.tenancy.listed_keys = read_tenants(t, reader);
    };
    return rules;
}

// `serve --help`'s groups, in their order; every option of serve but --help is in one.
help_groups serve_help_groups() {
    return {
        {"Model",
         {"--model", "--alias", "--chat-template-file", "--gpu-layers", "--n-cpu-moe", "--cpu-moe", "--flash-attn",
          "--threads", "--threads-batch", "--no-mmap", "--mlock", "--load-mode", "--embeddings", "--pooling",
          "--reranking"}},
        {"Several models (docs/models.md)", router_option_names()},
        {"Context & slots",
         {"--ctx-size", "--parallel", "--batch-size", "--ubatch-size", "--cache-type-k", "--cache-type-v",
          "--max-step-ms", "--pad-to-tile"}},
        {"Cache",
         {"--cache-ram", "--cache-disk", "--cache-dir", "--cache-parked", "--cache-block", "--checkpoint-every",
          "--swa-full", "--idle-to-ram-at", "--no-cache-hints", "--exact-reuse", "--kv-events", "--kv-events-pod"}},
        {"Speculative decoding",
         {"--spec-type", "--spec-draft-n-max", "--spec-draft-n-min", "--spec-rollback-tokens", "--spec-draft-fixed",
          "--spec-history", "--spec-draft-model", "--spec-draft-ngl", "--spec-draft-p-min", "--spec-draft-threads",
          "--spec-draft-threads-batch", "--spec-draft-type-k", "--spec-draft-type-v", "--spec-draft-device",
          "--spec-draft-override-tensor"}},
        {"Policy", {"--policy", "--no-policy"}},
        {"Network", {"--host", "--port", "--cors-origin", "--idle-timeout", "--header-timeout", "--stream-keepalive"}},
        {"Security: keys, tenants, connection limits",
         {"--api-key", "--api-keys-file", "--api-key-file", "--shared-cache", "--log-prompts", "--no-reuse-report",
          "--max-connections", "--max-connections-per-address", "--max-body"}},
        {"Sampling defaults (of requests that set none)", {"--temp", "--top-k", "--top-p", "--min-p", "--n-predict"}},
        {"Limits",
         {"--max-sample-ms", "--max-grammar-bytes", "--max-grammar-alternatives", "--stall-timeout", "--max-queue",
          "--shutdown-timeout"}},
        {"Settings & log", {"--config", "--verbose", "--log-level", "--log-format", "--log-slow-steps"}},
        {llama_server_flags_group, {}},
    };
}

}  // namespace

void add_serve_command(CLI::App& app) {
    auto opts = std::make_shared<serve_options>();
    CLI::App* cmd = app.add_subcommand("serve", "Serve a model over the OpenAI-compatible HTTP API");
    auto& e = opts->engine;
    auto& h = opts->http;
    cmd->add_option("-m,--model", e.model_path, "GGUF model file (default: a generated demo model with random weights)")
        ->check(CLI::ExistingFile);
    cmd->add_option("-a,--alias", opts->model_aliases,
                    "Model name reported to clients (default: the file name); NAME,OTHER,...: the other names are "
                    "aliases of the first")
        ->delimiter(',');
    add_router_options(*cmd, opts->router);
    add_listen_options(*cmd, h);
    add_tenancy_options(*cmd, opts->tenancy, "cache");
    add_log_options(*cmd);
    e.context_size = 0;
    cmd->add_option("-c,--ctx-size", e.context_size,
                    "KV cache size in tokens, shared by all slots (0, the default: the model's trained context per "
                    "slot, at most 131072, as far as free memory holds it, never under 32768 where it fits; the "
                    "banner says what was chosen)")
        ->capture_default_str()
        ->check(whole_number_at_least(0, "tokens; 0: sized from the model and the free memory"));
    cmd->add_option("--parallel", e.slots, "Slots: requests decoded together")
        ->capture_default_str()
        ->check(whole_number(1, 256, "slots"));
    cmd->add_option("-b,--batch-size", e.batch_size, "Tokens per decode call")
        ->capture_default_str()
        ->check(whole_number_at_least(1, "tokens"));
    cmd->add_option("--ubatch-size", e.ubatch_size, "Physical batch size")
        ->capture_default_str()
        ->check(whole_number_at_least(1, "tokens"));
    cmd->add_option("-t,--threads", e.threads, "Threads for decoding (default: physical cores)")
        ->check(whole_number_at_least(0, "threads; 0: one per physical core"));
    cmd->add_option("--threads-batch", e.threads_batch, "Threads for prompt processing (default: --threads)")
        ->check(whole_number_at_least(0, "threads; 0: as --threads"));
    cmd->add_option("--gpu-layers,--n-gpu-layers", e.gpu_layers, "Layers to offload to a GPU (-1, all or auto: all)")
        ->transform(CLI::Transformer({{"all", "-1"}, {"auto", "-1"}}))
        ->capture_default_str()
        ->check(whole_number_at_least(-1, "layers; -1: all"));
    cmd->add_option("--n-cpu-moe", e.cpu_moe_layers,
                    "MoE models: keep the expert weights of the first N blocks in host memory, computed by the "
                    "CPU, so a model larger than the GPU still runs on it")
        ->check(whole_number_at_least(0, "blocks"));
    cmd->add_flag_callback(
        "--cpu-moe", [&e] { e.cpu_moe_layers = -1; }, "MoE models: keep every block's expert weights in host memory");
    cmd->add_option_function<std::string>(
           "--flash-attn",
           [&e](const std::string& v) {
               e.flash_attn = v == "on"    ? LLAMA_FLASH_ATTN_TYPE_ENABLED
                              : v == "off" ? LLAMA_FLASH_ATTN_TYPE_DISABLED
                                           : LLAMA_FLASH_ATTN_TYPE_AUTO;
           },
           "Flash attention; auto turns it on where the backend has it")
        ->expected(0, 1)
        ->default_str("on")  // what the flag alone means (llama-server's former -fa)
        ->option_text("on|off|auto (default auto; alone: on)")
        ->transform(CLI::CheckedTransformer(std::map<std::string, std::string>{{"on", "on"},
                                                                               {"enabled", "on"},
                                                                               {"true", "on"},
                                                                               {"1", "on"},
                                                                               {"off", "off"},
                                                                               {"disabled", "off"},
                                                                               {"false", "off"},
                                                                               {"0", "off"},
                                                                               {"auto", "auto"},
                                                                               {"-1", "auto"}}));
    // Callbacks run in this order: --mlock wins over --no-mmap, --load-mode over both.
    cmd->add_flag_callback(
        "--no-mmap", [&e] { e.load_mode = LLAMA_LOAD_MODE_NONE; },
        "Read the model into memory instead of mapping the file (slower start)");
    cmd->add_flag_callback(
        "--mlock", [&e] { e.load_mode = LLAMA_LOAD_MODE_MLOCK; },
        "Read the model into memory and lock it there (never swapped out)");
    cmd->add_option_function<std::string>(
           "--load-mode", [&e](const std::string& v) { e.load_mode = llama_load_mode_from_str(v.c_str()); },
           "How the model file is read: auto (map it), none, mmap, mlock, mmap+mlock, dio")
        ->check(CLI::IsMember({"auto", "none", "mmap", "mlock", "mmap+mlock", "dio"}));
    cmd->add_option("--cache-type-k", opts->cache_type_k, "KV cache type for K: f16, q8_0, q4_0, bf16, f32")
        ->capture_default_str();
    cmd->add_option("--cache-type-v", opts->cache_type_v, "KV cache type for V: f16, q8_0, q4_0, bf16, f32")
        ->capture_default_str();
    cmd->add_option("--chat-template-file", opts->chat_template_file,
                    "Jinja chat template to use instead of the model's")
        ->check(CLI::ExistingFile);
    add_cache_budget_option(*cmd, "--cache-ram", opts->cache_ram,
                            "Host RAM for cached KV blocks and checkpoints (default 4 GiB)");
    add_cache_budget_option(*cmd, "--cache-disk", opts->cache_disk,
                            "Disk space for cached KV blocks, in --cache-dir (default 16 GiB)");
    cmd->add_option("--cache-dir", opts->cache_dir,
                    "Folder of the disk tier (default: $KEEPWARM_CACHE_DIR or ~/.cache/keepwarm, + /prefix-cache)");
    cmd->add_option("--cache-parked", e.cache_parked_sequences,
                    "Idle conversations kept on the device, sharing cells, besides the slots")
        ->check(whole_number(0, 240, "conversations"))
        ->capture_default_str();
    cmd->add_option("--cache-block", e.cache_block_tokens, "Tokens per RAM/disk block")
        ->check(whole_number(16, 65536, "tokens"))
        ->capture_default_str();
    cmd->add_option("--kv-events", opts->kv_events,
                    "Publish the prefix cache's blocks as KV events (vLLM's wire format, for llm-d and keepwarm proxy) "
                    "on this ZeroMQ endpoint: tcp://*:PORT binds, tcp://HOST:PORT connects (docs/kv-events.md)");
    cmd->add_option("--kv-events-pod", opts->kv_events_pod,
                    "The pod in the KV events' topic kv@POD@MODEL (default: $POD_IP:PORT, else HOSTNAME:PORT)");
    cmd->add_flag("--swa-full", e.swa_full,
                  "Sliding-window models: the SWA layers keep every position's KV, so a prompt branching from inside "
                  "a cached conversation reuses all before it; costs a full context of KV in those layers and slower "
                  "attention (default: about a window per conversation, kept as checkpoints; docs/sliding-window.md)");
    cmd->add_option("--checkpoint-every", e.checkpoint_interval,
                    "Hybrid models and sliding-window models without --swa-full: tokens of a prompt between "
                    "checkpoints of the state its blocks do not hold, the most a restore recomputes (0: --ubatch-size "
                    "on a CPU, --batch-size on a GPU, at least the window, rounded up to whole --cache-block)")
        ->check(whole_number(0, 1 << 20, "tokens"))
        ->capture_default_str();
    cmd->add_option("--idle-to-ram-at", e.idle_to_ram_tokens,
                    "A prompt computing at least this many tokens, or an answer reaching this many, moves the idle "
                    "conversations on the device to RAM, out of its attention's way; they come back from RAM on "
                    "their next turn (0: never)")
        ->check(whole_number_at_least(0, "tokens; 0: never"))
        ->capture_default_str();
    cmd->add_flag("!--no-cache-hints", e.cache_hints,
                  "Ignore clients' cache hints (Anthropic cache_control, OpenAI prompt_cache_key); by default a "
                  "prefix a client marked is evicted after what nobody marked");
    cmd->add_flag("--exact-reuse", e.exact_reuse,
                  "A reused prefix gives a fresh server's answer bit for bit (one request at a time): prompts are "
                  "computed in whole "
                  "--ubatch-size batches from a multiple of one, each alone in its step, and only those batches' KV is "
                  "reused (costs up to a --ubatch-size of recomputation per warm turn, plus the last answer)");
    CLI::Option* policy_option =
        cmd->add_option("--policy", opts->policy_file,
                        "Policy file (TOML): model pinning, forced options, ping absorption, volatile spans "
                        "(docs/policy.md); without one the built-in defaults run (pings absorbed, Claude Code's "
                        "billing nonce kept out of the prompt, automatic rules for random ids)")
            ->check(CLI::ExistingFile);
    add_no_policy_flag(*cmd, policy_option, opts->no_policy);
    cmd->add_option("-n,--n-predict,--predict", e.default_max_tokens,
                    "Tokens generated for a request that sets no limit (-1: until end of generation or full context)")
        ->capture_default_str()
        ->check(whole_number(-1, std::numeric_limits<int>::max(), "tokens; -1: no limit"));
    cmd->add_option("--max-sample-ms", e.sample_ms_limit,
                    "A request whose one token takes longer than this to sample (a costly grammar) ends with an error")
        ->capture_default_str()
        ->check(positive_real("ms"));
    cmd->add_option("--max-step-ms", e.step_ms_target,
                    "While a request generates, other requests' prompts go in chunks sized so that one step takes "
                    "about this long: its tokens keep streaming during a long prefill (0: one --ubatch-size per step)")
        ->capture_default_str()
        ->check(real_number(0, 60000, "ms"));
    const std::map<std::string, engine_options::tile_padding> paddings{
        {"auto", engine_options::tile_padding::automatic},
        {"on", engine_options::tile_padding::on},
        {"off", engine_options::tile_padding::off}};
    cmd->add_option("--pad-to-tile", e.pad_to_tile,
                    "Fill a batch under 64 rows up to a whole attention tile with throwaway rows: CPU flash attention "
                    "computes fewer row by row, many times slower deep in a context (auto: where the steps before "
                    "say it pays; on; off)")
        ->transform(CLI::CheckedTransformer(paddings))
        ->default_str("auto");
    cmd->add_option("--log-slow-steps", e.slow_step_log_ms,
                    "Log each step that holds a generating request this many ms, with what it spent its time on "
                    "(decode, restores, making way, sampling) (0: never)")
        ->capture_default_str()
        ->check(real_number(0, 86400000, "ms; 0: never"));
    cmd->add_option("--max-grammar-bytes", e.grammar_max_bytes,
                    "Largest grammar a response format or tools may make, in bytes")
        ->capture_default_str()
        ->check(whole_number_at_least(1, "bytes"));
    cmd->add_option("--max-grammar-alternatives", e.grammar_max_alternatives,
                    "Most alternatives one grammar rule may offer (e.g. an enum's values)")
        ->capture_default_str()
        ->check(whole_number_at_least(1, "alternatives"));
    cmd->add_option("--stall-timeout", e.stall_seconds,
                    "/health answers 503 when the engine makes no progress within one step for this many seconds")
        ->capture_default_str()
        ->check(positive_real("seconds"));
    std::vector<std::string> spec_types = draft_sources::types();
    spec_types.insert(spec_types.begin(), "none");
    cmd->add_option(
           "--spec-type", e.spec_type,
           "Speculative decoding: suffix (keepwarm's drafter over the request and its tenant's earlier "
           "conversations), one of llama.cpp's n-gram types, draft-simple (a draft model, -md), draft-mtp (the "
           "model's own multi-token prediction heads, as Qwen3.5 ships them), or none. "
           "Drafts are verified by the model: "
           "answers are the ones decoding without them gives")
        ->check(CLI::IsMember(spec_types))
        ->capture_default_str();
    cmd->add_option("--spec-draft-n-max,--draft-max,--draft,--draft-n", e.draft_max,
                    "Draft tokens one step may verify per slot; fewer where drafts are often wrong (0: no drafting)")
        ->check(CLI::Range(0, 256))
        ->capture_default_str();
    cmd->add_option("--spec-draft-n-min,--draft-min,--draft-n-min", e.draft_min, "A shorter draft is not verified")
        ->check(CLI::Range(0, 256))
        ->capture_default_str();
    cmd->add_option(
           "--spec-rollback-tokens", e.rollback_tokens,
           "Hybrid models (Qwen3.5): draft tokens a step may verify, kept as as many recurrent-state snapshots "
           "for every sequence, parked ones included (memory: 1 + N times the recurrent state; 0: no drafting)")
        ->check(CLI::Range(0, 256))
        ->capture_default_str();
    cmd->add_flag("--spec-draft-fixed", e.whole_drafts,
                  "Verify each draft whole, up to --spec-draft-n-max, as llama-server does, instead of sizing it by "
                  "the acceptance and step costs measured so far (for tests and benchmarks whose drafting must not "
                  "depend on the machine's speed or load)");
    cmd->add_option("--spec-draft-model,--model-draft", e.draft_model.path,
                    "Draft model (GGUF) for speculative decoding, with the model's tokenizer; implies --spec-type "
                    "draft-simple")
        ->check(CLI::ExistingFile);
    cmd->add_option("--spec-draft-ngl,--gpu-layers-draft,--n-gpu-layers-draft", e.draft_model.gpu_layers,
                    "Layers of the draft model to offload to a GPU (-1, all or auto: all)")
        ->transform(CLI::Transformer({{"all", "-1"}, {"auto", "-1"}}))
        ->capture_default_str()
        ->check(whole_number_at_least(-1, "layers; -1: all"));
    cmd->add_option("--spec-draft-p-min,--draft-p-min", e.draft_model.p_min,
                    "A draft model's draft stops at a token it gives a lower probability than this")
        ->capture_default_str()
        ->check(real_number(0, 1, ""));
    // llama-server's draft-model flags (common/arg.cpp): each one the draft model's own of the model's flag.
    const auto draft_threads = [](int& threads) {
        return [&threads](int n) { threads = n > 0 ? n : static_cast<int>(std::thread::hardware_concurrency()); };
    };
    cmd->add_option_function<int>("--spec-draft-threads,--threads-draft", draft_threads(e.draft_model.threads),
                                  "Threads of the draft model's steps (default: --threads; 0 or less: every CPU)")
        ->type_name("N");
    cmd->add_option_function<int>("--spec-draft-threads-batch,--threads-batch-draft",
                                  draft_threads(e.draft_model.threads_batch),
                                  "Threads of the draft model's prompt batches (default: --threads-batch; 0 or less: "
                                  "every CPU)")
        ->type_name("N");
    cmd->add_option("--spec-draft-type-k,--cache-type-k-draft", opts->cache_type_k_draft,
                    "The draft model's KV cache type for K: f16, q8_0, q4_0, bf16, f32")
        ->capture_default_str();
    cmd->add_option("--spec-draft-type-v,--cache-type-v-draft", opts->cache_type_v_draft,
                    "The draft model's KV cache type for V: f16, q8_0, q4_0, bf16, f32")
        ->capture_default_str();
    cmd->add_option("--spec-draft-device,--device-draft", e.draft_model.devices,
                    "Devices for the draft model's layers, DEV1,DEV2,... as llama.cpp names them (none: the CPU; "
                    "default: every GPU)");
    cmd->add_option("--spec-draft-override-tensor,--override-tensor-draft", e.draft_model.tensor_overrides,
                    "The draft model's tensors whose names match PATTERN go to BUFFER_TYPE: PATTERN=BUFFER_TYPE,... "
                    "(e.g. 'ffn_.*=CPU'), as llama-server's -otd")
        ->type_name("PATTERN=TYPE,...");
    cmd->add_option("--spec-history", e.spec_history_tokens,
                    "Tokens of earlier conversations (per tenant, oldest dropped first) the suffix drafter keeps")
        ->check(CLI::Range(size_t{0}, size_t{1} << 28))
        ->capture_default_str();
    cmd->add_option("--max-queue", e.max_queue,
                    "Requests that may wait for a slot; one more gets a 503 with Retry-After at once (0: no limit)")
        ->capture_default_str()
        ->check(whole_number_at_least(0, "requests; 0: no limit"));
    cmd->add_option("--shutdown-timeout", opts->shutdown_seconds,
                    "After SIGINT/SIGTERM, exit within this many seconds even if a clean stop has not finished")
        ->capture_default_str()
        ->check(positive_real("seconds"));
    auto& sampling = opts->sampling;
    cmd->add_option("--temp,--temperature", sampling.temp, "Temperature of requests that set none")
        ->capture_default_str()
        ->check(real_number(0, 2, ""));
    cmd->add_option("--top-k", sampling.top_k, "top_k of requests that set none (0: off)")
        ->capture_default_str()
        ->check(whole_number_at_least(0, "tokens; 0: off"));
    cmd->add_option("--top-p", sampling.top_p, "top_p of requests that set none (1: off)")
        ->capture_default_str()
        ->check(real_number(0, 1, ""));
    cmd->add_option("--min-p", sampling.min_p, "min_p of requests that set none (0: off)")
        ->capture_default_str()
        ->check(real_number(0, 1, ""));
    cmd->add_flag("--embeddings,--embedding", opts->embeddings,
                  "Serve the model as an embedding model (POST /v1/embeddings, /api/embed, /embedding), as "
                  "llama-server's flag; a model whose GGUF declares a pooling type is served so without it");
    cmd->add_option("--pooling", opts->pooling,
                    "Embedding models: how a sequence becomes one vector (mean, cls, last; rank: a reranker's "
                    "score), over the model's own")
        ->check(CLI::IsMember({"mean", "cls", "last", "rank"}));
    cmd->add_flag_callback(
        "--reranking,--rerank", [opts] { opts->pooling = "rank"; },
        "Serve the model as a reranker (POST /rerank), as llama-server's flag: --pooling rank");
    cmd->add_flag("-v,--verbose", e.verbose, "Log llama.cpp's messages");
    add_llama_server_flags(*cmd);
    cmd->add_option("--config", opts->settings_file,
                    "Settings file (TOML): serve's long options without their dashes (ctx-size = 65536), a [policy] "
                    "table, a [tenants] table of keys. The command line wins, then llama-server's environment "
                    "variables (LLAMA_ARG_MODEL, LLAMA_ARG_CTX_SIZE, ...: docs/operations.md: Coming from "
                    "llama-server), then this file (docs/operations.md: Running it as a service)")
        ->check(CLI::ExistingFile);
    group_help(*cmd, serve_help_groups());
    cmd->callback([opts, cmd] {
        run_command("serve", [&] {
            if (cmd->get_option("--model")->count() > 0 && cmd->get_option("--models-dir")->count() > 0) {
                throw CLI::ValidationError("--models-dir", "give -m FILE (one model) or --models-dir DIR, not both");
            }
            const environment env = process_environment();
            opts->from_environment = apply_environment(*cmd, llama_server_environment(), env);
            if (const auto unread = unread_variables(llama_server_environment(), env, "LLAMA_ARG_"); !unread.empty()) {
                std::string names;
                for (const std::string& v : unread) names += (names.empty() ? "" : ", ") + v;
                log::warn("serve",
                          "environment variables of llama-server options that keepwarm does not have, not "
                          "read: {}",
                          names);
            }
            if (!opts->settings_file.empty()) {
                apply_options_file(*cmd, opts->settings_file, settings_file_rules(*opts, *cmd));
                if (opts->written && !opts->policy_file.empty() && cmd->get_option("--policy")->count() == 0) {
                    throw std::runtime_error(opts->settings_file +
                                             ": give either 'policy = FILE' or a [policy] table, not both");
                }
            }
            // llama-server's meaning: a draft model drafts unless --spec-type says otherwise.
            if (!opts->engine.draft_model.path.empty() && cmd->get_option("--spec-type")->count() == 0) {
                opts->engine.spec_type = draft_sources::draft_model_type;
            }
            if (opts->router.wanted(opts->engine.model_path)) {
                if (!opts->kv_events.empty()) {
                    throw CLI::ValidationError("--kv-events",
                                               "is for one model; --models-dir runs one server per model");
                }
                return run_router_serve(
                    *cmd, router_run{.settings = opts->router,
                                     .http = opts->http,
                                     .tenancy = opts->tenancy,
                                     .cache_disk = opts->cache_disk,
                                     .footprint = {.context_size = static_cast<uint64_t>(opts->engine.context_size),
                                                   .slots = opts->engine.slots,
                                                   .parked = opts->engine.cache_parked_sequences,
                                                   .cache_type_k = opts->cache_type_k,
                                                   .cache_type_v = opts->cache_type_v,
                                                   .cache_ram = opts->cache_ram,
                                                   .draft_model = loads_draft_model(opts->engine)
                                                                      ? opts->engine.draft_model.path
                                                                      : std::string(),
                                                   .cache_type_k_draft = opts->cache_type_k_draft,
                                                   .cache_type_v_draft = opts->cache_type_v_draft,
                                                   .mtp_heads = opts->engine.spec_type == draft_sources::mtp_type},
                                     .cache_dir = opts->cache_dir,
                                     .shutdown_seconds = opts->shutdown_seconds,
                                     .settings_file = opts->settings_file,
                                     .strict_model_names = router_policy_is_strict(*opts)});
            }
            return run_serve(*opts);
        });
    });
}

}  // namespace keepwarm

// See llama-server-flags.h. docs/operations.md's "Coming from llama-server" lists the same flags for users.
#include "commands/llama-server-flags.h"

#include <map>

#include "base/logger.h"

namespace keepwarm {

namespace {

// llama-server's multi-letter single-dash names (its `--help`) that keepwarm knows by a long name. The long names
// are serve's options, accepted or refused (add_llama_server_flags).
const std::map<std::string, std::string>& single_dash_names() {
    static const std::map<std::string, std::string> names = {
        {"-np", "--parallel"},
        {"-ngl", "--gpu-layers"},
        {"-ctk", "--cache-type-k"},
        {"-ctv", "--cache-type-v"},
        {"-ub", "--ubatch-size"},
        {"-tb", "--threads-batch"},
        {"-fa", "--flash-attn"},
        {"-lm", "--load-mode"},
        {"-cb", "--cont-batching"},
        {"-nocb", "--no-cont-batching"},
        {"-to", "--timeout"},
        {"-hf", "--hf-repo"},
        {"-hfr", "--hf-repo"},
        {"-hff", "--hf-file"},
        {"-hft", "--hf-token"},
        {"-hfd", "--hf-repo-draft"},
        {"-hfrd", "--hf-repo-draft"},
        {"-mu", "--model-url"},
        {"-dr", "--docker-repo"},
        {"-ncmoe", "--n-cpu-moe"},
        {"-cmoe", "--cpu-moe"},
        {"-cram", "--cache-ram"},
        {"-md", "--model-draft"},
        {"-ngld", "--gpu-layers-draft"},
        // The draft model's own of the model's flags (-td, -ctkd, ...: llama-server's -md set).
        {"-td", "--threads-draft"},
        {"-tbd", "--threads-batch-draft"},
        {"-ctkd", "--cache-type-k-draft"},
        {"-ctvd", "--cache-type-v-draft"},
        {"-devd", "--device-draft"},
        {"-otd", "--override-tensor-draft"},
    };
    return names;
}

bool single_dash_word(const std::string& arg) {
    if (arg.size() < 3 || arg[0] != '-' || arg[1] == '-') return false;
    for (size_t i = 1; i < arg.size(); ++i) {
        const char c = arg[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) return false;
    }
    return true;
}

[[noreturn]] void refuse(const std::string& message) {
    throw CLI::ParseError(message, refused_flag_exit_code);
}

const std::string download_advice =
    "keepwarm does not download models: download the GGUF file first (e.g. `huggingface-cli download "
    "Qwen/Qwen3-8B-GGUF Qwen3-8B-Q4_K_M.gguf --local-dir .`, or `curl -LO URL`) and pass it with -m FILE";

// A refused flag: hidden from the help; its value, if any, is optional so that the message below is what the user
// reads, not "argument missing".
void add_refused(CLI::App& serve, const std::string& names, bool takes_value, std::string message) {
    if (takes_value) {
        serve.add_option_function<std::string>(names, [message](const std::string&) { refuse(message); })
            ->expected(0, 1)
            ->group("");
    } else {
        serve.add_flag_function(names, [message](int64_t) { refuse(message); })->group("");
    }
}

}  // namespace

std::vector<std::string> llama_server_single_dash_names(const std::string& long_name) {
    std::vector<std::string> names;
    for (const auto& [single, name] : single_dash_names()) {
        if (name == long_name) names.push_back(single);
    }
    return names;
}

std::vector<std::string> expand_llama_server_flags(const std::vector<std::string>& args) {
    std::vector<std::string> out;
    out.reserve(args.size());
    bool options_ended = false;
    for (const std::string& arg : args) {
        if (options_ended || arg == "--") {
            options_ended = true;
            out.push_back(arg);
            continue;
        }
        if (const auto it = single_dash_names().find(arg); it != single_dash_names().end()) {
            out.push_back(it->second);
        } else if (single_dash_word(arg)) {
            refuse("'" + arg +
                   "' is not an option of keepwarm: options longer than one letter start with two dashes "
                   "(`keepwarm serve --help` lists them; docs/operations.md: Coming from llama-server)");
        } else {
            out.push_back(arg);
        }
    }
    return out;
}

const std::vector<environment_binding>& api_key_environment() {
    static const std::vector<environment_binding> bindings = {
        {"--api-key", "KEEPWARM_API_KEY"},
        {"--api-key", "LLAMA_API_KEY"},
    };
    return bindings;
}

const std::vector<environment_binding>& llama_server_environment() {
    static const std::vector<environment_binding> bindings = [] {
        std::vector<environment_binding> b = api_key_environment();
        const std::vector<environment_binding> llama = {
            // Model and engine.
            {"--model", "LLAMA_ARG_MODEL"},
            {"--alias", "LLAMA_ARG_ALIAS"},
            {"--ctx-size", "LLAMA_ARG_CTX_SIZE"},
            {"--parallel", "LLAMA_ARG_N_PARALLEL"},
            {"--batch-size", "LLAMA_ARG_BATCH"},
            {"--ubatch-size", "LLAMA_ARG_UBATCH"},
            {"--threads", "LLAMA_ARG_THREADS"},
            {"--gpu-layers", "LLAMA_ARG_N_GPU_LAYERS"},
            {"--n-cpu-moe", "LLAMA_ARG_N_CPU_MOE"},
            {"--cpu-moe", "LLAMA_ARG_CPU_MOE"},
            {"--flash-attn", "LLAMA_ARG_FLASH_ATTN"},
            {"--embeddings", "LLAMA_ARG_EMBEDDINGS"},
            {"--pooling", "LLAMA_ARG_POOLING"},
            {"--reranking", "LLAMA_ARG_RERANKING"},
            {"--mlock", "LLAMA_ARG_MLOCK"},
            {"--no-mmap", "LLAMA_ARG_MMAP", /*inverted=*/true},
            {"--no-mmap", "LLAMA_ARG_NO_MMAP"},
            {"--load-mode", "LLAMA_ARG_LOAD_MODE"},
            {"--cache-type-k", "LLAMA_ARG_CACHE_TYPE_K"},
            {"--cache-type-v", "LLAMA_ARG_CACHE_TYPE_V"},
            {"--cache-ram", "LLAMA_ARG_CACHE_RAM"},
            {"--n-predict", "LLAMA_ARG_N_PREDICT"},
            {"--spec-type", "LLAMA_ARG_SPEC_TYPE"},
            {"--spec-draft-n-max", "LLAMA_ARG_SPEC_DRAFT_N_MAX"},
            {"--spec-draft-n-min", "LLAMA_ARG_SPEC_DRAFT_N_MIN"},
            {"--spec-draft-model", "LLAMA_ARG_SPEC_DRAFT_MODEL"},
            {"--spec-draft-ngl", "LLAMA_ARG_N_GPU_LAYERS_DRAFT"},
            {"--spec-draft-p-min", "LLAMA_ARG_SPEC_DRAFT_P_MIN"},
            {"--spec-draft-type-k", "LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K"},
            {"--spec-draft-type-v", "LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V"},
            {"--top-k", "LLAMA_ARG_TOP_K"},
            {"--chat-template-file", "LLAMA_ARG_CHAT_TEMPLATE_FILE"},
            // Network and keys.
            {"--host", "LLAMA_ARG_HOST"},
            {"--port", "LLAMA_ARG_PORT"},
            {"--api-key-file", "LLAMA_ARG_API_KEY_FILE"},
            // What keepwarm does anyway: accepted, or refused when they ask for the opposite.
            {"--jinja", "LLAMA_ARG_JINJA"},
            {"--no-jinja", "LLAMA_ARG_JINJA", /*inverted=*/true},
            {"--no-jinja", "LLAMA_ARG_NO_JINJA"},
            {"--cont-batching", "LLAMA_ARG_CONT_BATCHING"},
            {"--no-cont-batching", "LLAMA_ARG_CONT_BATCHING", /*inverted=*/true},
            {"--no-cont-batching", "LLAMA_ARG_NO_CONT_BATCHING"},
            {"--no-webui", "LLAMA_ARG_UI", /*inverted=*/true},
            {"--no-webui", "LLAMA_ARG_NO_UI"},
            {"--metrics", "LLAMA_ARG_ENDPOINT_METRICS"},
            {"--slots", "LLAMA_ARG_ENDPOINT_SLOTS"},
            {"--reasoning-format", "LLAMA_ARG_THINK"},
            // Refused, with the flag's own message. (HF_TOKEN, -hft's variable, is set for many other tools: not read.)
            {"--hf-repo", "LLAMA_ARG_HF_REPO"},
            {"--hf-file", "LLAMA_ARG_HF_FILE"},
            {"--hf-repo-draft", "LLAMA_ARG_SPEC_DRAFT_HF_REPO"},
            {"--model-url", "LLAMA_ARG_MODEL_URL"},
            {"--docker-repo", "LLAMA_ARG_DOCKER_REPO"},
            {"--timeout", "LLAMA_ARG_TIMEOUT"},
            {"--threads-http", "LLAMA_ARG_THREADS_HTTP"},
        };
        b.insert(b.end(), llama.begin(), llama.end());
        return b;
    }();
    return bindings;
}

void add_llama_server_flags(CLI::App& serve) {
    const std::string group = llama_server_flags_group;
    serve.add_flag("--jinja")
        ->description("Chat templates are always the model's Jinja template (or --chat-template-file)")
        ->group(group);
    serve.add_flag("--cont-batching")
        ->description("Busy slots are always decoded together (continuous batching)")
        ->group(group);
    serve.add_flag("--no-webui")->description("There is no web UI")->group(group);
    serve.add_flag("--metrics")->description("GET /metrics (Prometheus) is always on")->group(group);
    serve
        .add_flag_function(
            "--slots,--no-slots",
            [](int64_t) {
                log::info("serve",
                          "--slots/--no-slots: GET /slots is always on; it shows counts and no prompt text, and "
                          "needs the API key like every route");
            },
            "GET /slots is always on (counts, no prompt text; behind the API key like every route)")
        ->group(group);
    serve
        .add_option_function<std::string>(
            "--reasoning-format",
            [](const std::string& format) {
                if (format == "none" || format == "deepseek-legacy") {
                    refuse("--reasoning-format " + format +
                           ": keepwarm always returns reasoning apart from the answer (OpenAI: "
                           "message.reasoning_content, Anthropic: thinking blocks, Ollama: message.thinking), as "
                           "with deepseek; leave the flag out");
                }
            },
            "Reasoning is always returned apart from the answer: deepseek (auto is the same); none and "
            "deepseek-legacy are refused")
        ->check(CLI::IsMember({"auto", "deepseek", "none", "deepseek-legacy"}))
        ->group(group);

    add_refused(serve, "--hf-repo", true, "-hf/--hf-repo: " + download_advice);
    add_refused(serve, "--hf-file", true, "-hff/--hf-file: " + download_advice);
    add_refused(serve, "--hf-token", true, "-hft/--hf-token: " + download_advice);
    add_refused(serve, "--hf-repo-draft", true,
                "-hfd/--hf-repo-draft: keepwarm does not download models: download the draft model's GGUF file "
                "first and pass it with -md FILE");
    add_refused(serve, "--model-url", true, "-mu/--model-url: " + download_advice);
    add_refused(serve, "--docker-repo", true, "-dr/--docker-repo: " + download_advice);
    add_refused(
        serve, "--no-jinja", false,
        "--no-jinja: keepwarm always renders chats with a Jinja template, the model's or --chat-template-file's");
    add_refused(serve, "--no-cont-batching", false,
                "-nocb/--no-cont-batching: keepwarm always decodes busy slots together; --parallel 1 serves one "
                "request at a time");
    add_refused(serve, "--timeout", true,
                "-to/--timeout: keepwarm has no single read/write timeout: --header-timeout bounds a request's head "
                "(default 10 s), --idle-timeout a keep-alive wait and a request body (default 120 s); a generation "
                "is never cut short by time (a client that leaves cancels it)");
    add_refused(serve, "--threads-http", true,
                "--threads-http: keepwarm serves each connection on its own thread; --max-connections bounds them "
                "(more get 503), and --parallel sets how many requests are decoded at once");
}

}  // namespace keepwarm

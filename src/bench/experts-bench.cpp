// See experts-bench.h. Recording hooks libllama's eval callback onto the router's top-k tensor; the simulation
// replays the recorded ids through one LRU list per layer, optionally behind a use-count admission gate.
#include "bench/experts-bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <list>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "bench/report-text.h"
#include "common.h"
#include "engine/cpu-threadpool.h"
#include "engine/llama-runtime.h"
#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "gguf.h"
#include "llama-cpp.h"
#include "model/model-inspect.h"

namespace keepwarm {

namespace {

// llama-graph.cpp names the router's selection `ffn_moe_topk-<layer>`: I32 expert ids, [n_expert_used, n_tokens].
constexpr char k_router_topk_prefix[] = "ffn_moe_topk-";
constexpr char k_binary_magic[8] = {'K', 'W', 'E', 'X', 'P', 'T', 'R', '1'};
// Tokens per prefill decode. Every token must be an output (see record_expert_trace), so this also bounds the
// logits buffer: chunk x vocabulary floats.
constexpr int k_prefill_chunk = 128;

using report_text::fixed;
using report_text::xml_escape;

std::string human_bytes(double bytes) {
    if (bytes < 1024) return fixed(bytes, bytes == std::floor(bytes) ? 0 : 1) + " B";
    if (bytes < 1024.0 * 1024) return fixed(bytes / 1024.0, 2) + " KiB";
    if (bytes < 1024.0 * 1024 * 1024) return fixed(bytes / (1024.0 * 1024.0), 2) + " MiB";
    return fixed(bytes / (1024.0 * 1024.0 * 1024.0), 2) + " GiB";
}

bool ends_with(const std::string& text, const std::string& suffix) {
    return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Eval-callback state: the router ids of each MoE layer, appended ubatch by ubatch in token order.
struct router_capture {
    uint32_t n_expert_used = 0;
    std::map<int, std::vector<int32_t>> ids_by_layer;
    std::vector<uint8_t> staging;  // device tensors are copied here before reading
    std::string error;
};

bool capture_router_topk(ggml_tensor* t, bool ask, void* user_data) {
    // Asked first whether a node's data is wanted (the scheduler then runs the graph up to it and calls again to
    // hand it over); returning false from the second call aborts the decode.
    if (std::strncmp(t->name, k_router_topk_prefix, sizeof(k_router_topk_prefix) - 1) != 0) return !ask;
    if (ask) return true;

    auto* capture = static_cast<router_capture*>(user_data);
    if (t->type != GGML_TYPE_I32 || t->ne[0] != int64_t(capture->n_expert_used) || t->ne[2] != 1 || t->ne[3] != 1) {
        capture->error = std::string("unexpected shape of ") + t->name + ": expected I32 [" +
                         std::to_string(capture->n_expert_used) + ", n_tokens]";
        return false;  // aborts the decode; record_expert_trace reports the error
    }
    const int layer = std::atoi(t->name + sizeof(k_router_topk_prefix) - 1);
    const uint8_t* base = static_cast<const uint8_t*>(t->data);
    if (!ggml_backend_buffer_is_host(t->buffer)) {
        capture->staging.resize(ggml_nbytes(t));
        ggml_backend_tensor_get(t, capture->staging.data(), 0, capture->staging.size());
        base = capture->staging.data();
    }
    // The tensor is a view of the full argsort, so rows are n_expert apart: read through the strides.
    std::vector<int32_t>& ids = capture->ids_by_layer[layer];
    for (int64_t token = 0; token < t->ne[1]; ++token) {
        for (int64_t k = 0; k < t->ne[0]; ++k) {
            int32_t id;
            std::memcpy(&id, base + token * t->nb[1] + k * t->nb[0], sizeof(id));
            ids.push_back(id);
        }
    }
    return true;
}

// Bytes of one expert per layer: each blk.<layer>.ffn_*_exps.* tensor holds n_expert equal slices.
std::map<int, uint64_t> expert_bytes_by_layer(const std::string& path, uint32_t n_expert) {
    gguf_init_params params{/*no_alloc =*/true, /*ctx =*/nullptr};
    gguf_context_ptr ctx(gguf_init_from_file(path.c_str(), params));
    if (!ctx) throw std::runtime_error("cannot read '" + path + "' as GGUF");
    std::map<int, uint64_t> bytes;
    for (int64_t i = 0; i < gguf_get_n_tensors(ctx.get()); ++i) {
        const std::string name = gguf_get_tensor_name(ctx.get(), i);
        int layer = -1, prefix_len = 0;
        if (std::sscanf(name.c_str(), "blk.%d.ffn_%n", &layer, &prefix_len) != 1 || prefix_len == 0) continue;
        if (name.find("_exps.", size_t(prefix_len)) == std::string::npos) continue;
        bytes[layer] += gguf_get_tensor_size(ctx.get(), i) / n_expert;
    }
    return bytes;
}

// A token batch in which every token is an output. llama.cpp drops the rows that produce no output before the last
// block's feed-forward, so with only the last token as output the last MoE layer would route just that one token.
class output_all_batch {
public:
    explicit output_all_batch(int capacity)
        : tokens_(capacity),
          positions_(capacity),
          n_seq_id_(capacity, 1),
          seq_ids_(capacity, &seq_),
          logits_(capacity, 1) {}

    llama_batch fill(const llama_token* tokens, int count, llama_pos first_pos) {
        for (int i = 0; i < count; ++i) {
            tokens_[i] = tokens[i];
            positions_[i] = first_pos + i;
        }
        return llama_batch{count,           tokens_.data(), nullptr, positions_.data(), n_seq_id_.data(),
                           seq_ids_.data(), logits_.data()};
    }

private:
    llama_seq_id seq_ = 0;
    std::vector<llama_token> tokens_;
    std::vector<llama_pos> positions_;
    std::vector<int32_t> n_seq_id_;
    std::vector<llama_seq_id*> seq_ids_;
    std::vector<int8_t> logits_;
};

// Per-layer state of the simulated cache: an LRU list of resident experts and, for the gate, recent use times.
class layer_cache {
public:
    layer_cache(uint32_t n_expert, uint32_t slots, const expert_cache_policy& policy)
        : slots_(slots), policy_(policy), where_(n_expert), resident_(n_expert, false), recent_uses_(n_expert) {}

    void access(int32_t expert, uint64_t token, uint64_t expert_bytes, expert_cache_stats& stats) {
        ++stats.lookups;
        if (policy_.gated()) note_use(expert, token);
        if (resident_[expert]) {
            ++stats.hits;
            lru_.splice(lru_.begin(), lru_, where_[expert]);
            return;
        }
        stats.bytes_moved += expert_bytes;
        if (policy_.gated() && recent_uses_[expert].size() < policy_.admit_k) {
            ++stats.streamed;
            return;
        }
        ++stats.fills;
        if (lru_.size() == slots_) {
            resident_[lru_.back()] = false;
            lru_.pop_back();
            ++stats.evictions;
        }
        lru_.push_front(expert);
        where_[expert] = lru_.begin();
        resident_[expert] = true;
    }

private:
    // Keeps the uses within the last admit_window tokens, the current one included.
    void note_use(int32_t expert, uint64_t token) {
        std::deque<uint64_t>& uses = recent_uses_[expert];
        uses.push_back(token);
        while (uses.front() + policy_.admit_window <= token) uses.pop_front();
    }

    uint32_t slots_;
    expert_cache_policy policy_;
    std::list<int32_t> lru_;  // most recently used first
    std::vector<std::list<int32_t>::iterator> where_;
    std::vector<bool> resident_;
    std::vector<std::deque<uint64_t>> recent_uses_;
};

// Binary trace I/O: native little-endian fields, the same on every platform keepwarm builds for.
template <typename T>
void put(std::ostream& out, T value) {
    out.write(reinterpret_cast<const char*>(&value), sizeof(value));
}

void put_string(std::ostream& out, const std::string& text) {
    put<uint32_t>(out, uint32_t(text.size()));
    out.write(text.data(), std::streamsize(text.size()));
}

class binary_reader {
public:
    binary_reader(std::istream& in, uint64_t size) : in_(in), left_(size) {}

    template <typename T>
    T get() {
        T value;
        take(&value, sizeof(value));
        return value;
    }

    std::string get_string() {
        std::string text(get<uint32_t>(), '\0');
        take(text.data(), text.size());
        return text;
    }

    void take(void* data, uint64_t size) {
        if (size > left_) throw std::runtime_error("truncated");
        in_.read(static_cast<char*>(data), std::streamsize(size));
        if (!in_) throw std::runtime_error("truncated");
        left_ -= size;
    }

    uint64_t left() const { return left_; }

private:
    std::istream& in_;
    uint64_t left_;
};

void write_binary_trace(const expert_trace& trace, std::ostream& out) {
    out.write(k_binary_magic, sizeof(k_binary_magic));
    put<uint32_t>(out, trace.n_expert);
    put<uint32_t>(out, trace.n_expert_used);
    put<uint64_t>(out, trace.n_prompt_tokens);
    put<uint64_t>(out, trace.n_generated_tokens);
    put_string(out, trace.model_path);
    put_string(out, trace.model_desc);
    put<uint32_t>(out, uint32_t(trace.layers.size()));
    for (const auto& layer : trace.layers) {
        put<int32_t>(out, layer.layer);
        put<uint64_t>(out, layer.expert_bytes);
        std::vector<uint16_t> ids(layer.ids.begin(), layer.ids.end());
        out.write(reinterpret_cast<const char*>(ids.data()), std::streamsize(ids.size() * sizeof(uint16_t)));
    }
}

expert_trace read_binary_trace(std::istream& in, uint64_t size) {
    binary_reader r(in, size);
    char magic[sizeof(k_binary_magic)];
    r.take(magic, sizeof(magic));
    expert_trace trace;
    trace.n_expert = r.get<uint32_t>();
    trace.n_expert_used = r.get<uint32_t>();
    trace.n_prompt_tokens = r.get<uint64_t>();
    trace.n_generated_tokens = r.get<uint64_t>();
    trace.model_path = r.get_string();
    trace.model_desc = r.get_string();
    const uint32_t n_layers = r.get<uint32_t>();
    // Bounded by the file size before multiplying, so a corrupt header can't overflow or allocate wildly.
    if (trace.n_prompt_tokens > r.left() || trace.n_generated_tokens > r.left() ||
        trace.n_expert_used > trace.n_expert) {
        throw std::runtime_error("inconsistent header");
    }
    const uint64_t per_layer_ids = trace.n_tokens() * trace.n_expert_used;
    for (uint32_t i = 0; i < n_layers; ++i) {
        expert_layer_trace layer;
        layer.layer = r.get<int32_t>();
        layer.expert_bytes = r.get<uint64_t>();
        if (per_layer_ids > r.left() / sizeof(uint16_t)) throw std::runtime_error("truncated");
        std::vector<uint16_t> ids(per_layer_ids);
        r.take(ids.data(), ids.size() * sizeof(uint16_t));
        layer.ids.assign(ids.begin(), ids.end());
        trace.layers.push_back(std::move(layer));
    }
    if (r.left() != 0) throw std::runtime_error("unexpected bytes after the last layer");
    return trace;
}

std::string json_trace(const expert_trace& trace) {
    nlohmann::ordered_json j;
    j["format"] = "keepwarm-expert-trace";
    j["version"] = 1;
    j["model"] = {{"path", trace.model_path}, {"desc", trace.model_desc}};
    j["n_expert"] = trace.n_expert;
    j["n_expert_used"] = trace.n_expert_used;
    j["prompt_tokens"] = trace.n_prompt_tokens;
    j["generated_tokens"] = trace.n_generated_tokens;
    j["layers"] = nlohmann::ordered_json::array();
    for (const auto& layer : trace.layers) {
        j["layers"].push_back({{"layer", layer.layer}, {"expert_bytes", layer.expert_bytes}, {"ids", layer.ids}});
    }
    return j.dump();
}

expert_trace parse_json_trace(const std::string& text) {
    const auto j = nlohmann::json::parse(text);
    if (j.value("format", "") != "keepwarm-expert-trace") throw std::runtime_error("not a keepwarm expert trace");
    expert_trace trace;
    trace.model_path = j.at("model").value("path", "");
    trace.model_desc = j.at("model").value("desc", "");
    trace.n_expert = j.at("n_expert").get<uint32_t>();
    trace.n_expert_used = j.at("n_expert_used").get<uint32_t>();
    trace.n_prompt_tokens = j.at("prompt_tokens").get<uint64_t>();
    trace.n_generated_tokens = j.at("generated_tokens").get<uint64_t>();
    for (const auto& layer : j.at("layers")) {
        trace.layers.push_back({layer.at("layer").get<int>(), layer.at("expert_bytes").get<uint64_t>(),
                                layer.at("ids").get<std::vector<int32_t>>()});
    }
    return trace;
}

std::vector<std::string> split_list(const std::string& text) {
    std::vector<std::string> items;
    std::string item;
    std::istringstream in(text);
    while (std::getline(in, item, ',')) items.push_back(item);
    if (!text.empty() && text.back() == ',') items.push_back("");  // getline drops a trailing empty entry
    return items;
}

double per_token(uint64_t value, uint64_t tokens) {
    return tokens ? double(value) / double(tokens) : 0;
}

std::string percent(double rate) {
    return fixed(100 * rate, 1);
}

const char* k_policy_colors[2] = {"#1f77b4", "#d62728"};

}  // namespace

void validate_expert_trace(const expert_trace& trace) {
    if (trace.n_expert == 0 || trace.n_expert > std::numeric_limits<uint16_t>::max()) {
        throw std::invalid_argument("expert count " + std::to_string(trace.n_expert) + " is outside 1..65535");
    }
    if (trace.n_expert_used == 0 || trace.n_expert_used > trace.n_expert) {
        throw std::invalid_argument("experts used per token (" + std::to_string(trace.n_expert_used) +
                                    ") must be between 1 and the expert count (" + std::to_string(trace.n_expert) +
                                    ")");
    }
    if (trace.layers.empty()) throw std::invalid_argument("the trace has no MoE layers");
    const uint64_t expected = trace.n_tokens() * trace.n_expert_used;
    std::vector<uint64_t> seen_in_token(trace.n_expert, std::numeric_limits<uint64_t>::max());
    for (const auto& layer : trace.layers) {
        const std::string where = "layer " + std::to_string(layer.layer);
        if (layer.ids.size() != expected) {
            throw std::invalid_argument(where + " has " + std::to_string(layer.ids.size()) + " expert ids, expected " +
                                        std::to_string(trace.n_tokens()) + " tokens x " +
                                        std::to_string(trace.n_expert_used) + " = " + std::to_string(expected));
        }
        std::fill(seen_in_token.begin(), seen_in_token.end(), std::numeric_limits<uint64_t>::max());
        for (uint64_t i = 0; i < layer.ids.size(); ++i) {
            const int32_t id = layer.ids[i];
            const uint64_t token = i / trace.n_expert_used;
            if (id < 0 || uint32_t(id) >= trace.n_expert) {
                throw std::invalid_argument(where + ", token " + std::to_string(token) + ": expert id " +
                                            std::to_string(id) + " is outside 0.." +
                                            std::to_string(trace.n_expert - 1));
            }
            if (seen_in_token[id] == token) {
                throw std::invalid_argument(where + ", token " + std::to_string(token) + ": expert " +
                                            std::to_string(id) + " is chosen twice");
            }
            seen_in_token[id] = token;
        }
    }
}

void write_expert_trace(const expert_trace& trace, const std::string& path) {
    validate_expert_trace(trace);  // the binary form keeps 16-bit ids
    std::ofstream out(path, std::ios::binary);
    if (ends_with(path, ".json")) {
        out << json_trace(trace) << "\n";
    } else {
        write_binary_trace(trace, out);
    }
    if (!out) throw std::runtime_error("cannot write '" + path + "'");
}

expert_trace read_expert_trace(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot open trace '" + path + "'");
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(path, ec);
    char magic[sizeof(k_binary_magic)] = {};
    in.read(magic, sizeof(magic));
    in.clear();
    in.seekg(0);
    expert_trace trace;
    try {
        if (!ec && std::memcmp(magic, k_binary_magic, sizeof(magic)) == 0) {
            trace = read_binary_trace(in, size);
        } else {
            std::ostringstream text;
            text << in.rdbuf();
            trace = parse_json_trace(text.str());
        }
        validate_expert_trace(trace);
    } catch (const std::exception& e) {
        throw std::runtime_error("bad trace file '" + path + "': " + e.what());
    }
    return trace;
}

const std::string& builtin_expert_workload() {
    // Several kinds of text on purpose: routers specialise, so a single genre would flatter a small cache.
    static const std::string text =
        R"(The harbour was quiet that morning. Fishing boats rocked against the pier while gulls argued over
scraps, and an old man mended a net with slow, patient knots. Nobody hurried; the tide would come when it came.

## Installing the service

1. Download the release archive and unpack it into /opt/service.
2. Copy config.example.toml to config.toml and set `listen = "0.0.0.0:8080"`.
3. Run `systemctl enable --now service` and check `journalctl -u service -f` for errors.

```python
def merge_intervals(intervals):
    """Merge overlapping [start, end] intervals and return them sorted."""
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged
```

```cpp
template <typename T>
std::optional<T> parse_number(std::string_view text) {
    T value{};
    auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || ptr != text.data() + text.size()) return std::nullopt;
    return value;
}
```

{"tool": "read_file", "arguments": {"path": "src/server/routes.cpp", "offset": 120, "limit": 80},
 "result": {"ok": true, "lines": 80, "truncated": false}}

| quarter | revenue (M$) | growth |
|---------|-------------:|-------:|
| Q1      |         12.4 |   3.1% |
| Q2      |         13.9 |  12.1% |
| Q3      |         13.1 |  -5.8% |

Let x be a real number with x^2 - 5x + 6 = 0. Factoring gives (x - 2)(x - 3) = 0, so x = 2 or x = 3. The sum of the
roots is 5 and their product is 6, as Vieta's formulas predict.

La réunion est reportée à jeudi prochain : merci de confirmer votre présence avant mercredi midi.
Die Ergebnisse der Messung weichen um weniger als zwei Prozent von der Simulation ab.
明天上午十点在三号会议室开会，请准时参加。

User: the build fails with "undefined reference to `pthread_create`" after I switched to static linking. Why?
Assistant: Static linking needs the thread library named explicitly. Add `-pthread` to both the compile and the
link flags (or link Threads::Threads in CMake); the order matters, so keep it after the objects that use it.
)";
    return text;
}

expert_trace record_expert_trace(const expert_record_options& options, std::ostream& progress) {
    if (options.n_gen < 0) throw std::invalid_argument("generated tokens must not be negative");
    const model_report shape = inspect_model(options.model_path);
    if (shape.n_expert == 0 || shape.n_expert_used == 0) {
        throw std::runtime_error("'" + options.model_path + "' (" + shape.architecture +
                                 ") is not a mixture-of-experts model: it has no experts to route to. bench experts "
                                 "needs an MoE model (e.g. keepwarm mkmodel --preset tiny-moe)");
    }
    init_llama_runtime();

    llama_model_ptr model(llama_model_load_from_file(options.model_path.c_str(), llama_model_default_params()));
    if (!model) throw std::runtime_error("failed to load model from '" + options.model_path + "'");
    expert_trace trace;
    trace.model_path = options.model_path;
    char desc[256];
    llama_model_desc(model.get(), desc, sizeof(desc));
    trace.model_desc = desc;
    trace.n_expert = shape.n_expert;
    trace.n_expert_used = shape.n_expert_used;

    const llama_vocab* vocab = llama_model_get_vocab(model.get());
    const std::string& text = options.prompt_text.empty() ? builtin_expert_workload() : options.prompt_text;
    const std::vector<llama_token> prompt = common_tokenize(vocab, text, llama_vocab_get_add_bos(vocab), false);
    if (prompt.empty()) throw std::invalid_argument("the prompt has no tokens");

    router_capture capture;
    capture.n_expert_used = shape.n_expert_used;
    const int threads = options.threads > 0 ? options.threads : common_cpu_get_num_math();
    llama_context_params cparams = llama_context_default_params();
    const uint64_t n_ctx = prompt.size() + uint64_t(options.n_gen);
    cparams.n_ctx = uint32_t(std::max<uint64_t>(256, (n_ctx + 255) / 256 * 256));
    cparams.n_batch = k_prefill_chunk;
    cparams.n_ubatch = k_prefill_chunk;
    cparams.n_threads = threads;
    cparams.n_threads_batch = threads;
    cparams.no_perf = true;
    cparams.cb_eval = capture_router_topk;
    cparams.cb_eval_user_data = &capture;
    llama_context_ptr ctx(llama_init_from_model(model.get(), cparams));
    if (!ctx) throw std::runtime_error("failed to create a context of " + std::to_string(cparams.n_ctx) + " tokens");
    cpu_threadpool pool(threads);
    if (pool.get()) llama_attach_threadpool(ctx.get(), pool.get(), nullptr);

    const auto decode = [&](llama_batch batch, const char* what) {
        const int32_t rc = llama_decode(ctx.get(), batch);
        if (!capture.error.empty()) throw std::runtime_error(capture.error);
        if (rc != 0) {
            throw std::runtime_error(std::string("llama_decode failed during ") + what + " (" + std::to_string(rc) +
                                     ")");
        }
    };
    using clock = std::chrono::steady_clock;
    output_all_batch batch(k_prefill_chunk);

    progress << "[prefill] " << prompt.size() << " tokens... " << std::flush;
    auto start = clock::now();
    for (size_t done = 0; done < prompt.size(); done += k_prefill_chunk) {
        const int count = int(std::min<size_t>(k_prefill_chunk, prompt.size() - done));
        decode(batch.fill(prompt.data() + done, count, llama_pos(done)), "prefill");
    }
    trace.n_prompt_tokens = prompt.size();
    progress << fixed(prompt.size() / std::chrono::duration<double>(clock::now() - start).count(), 1) << " t/s\n";

    progress << "[decode] up to " << options.n_gen << " tokens... " << std::flush;
    start = clock::now();
    llama_sampler_ptr greedy(llama_sampler_init_greedy());
    for (int i = 0; i < options.n_gen; ++i) {
        const llama_token next = llama_sampler_sample(greedy.get(), ctx.get(), -1);
        if (llama_vocab_is_eog(vocab, next)) break;
        decode(batch.fill(&next, 1, llama_pos(trace.n_tokens())), "decode");
        ++trace.n_generated_tokens;
    }
    progress << trace.n_generated_tokens << " tokens, "
             << fixed(trace.n_generated_tokens / std::chrono::duration<double>(clock::now() - start).count(), 1)
             << " t/s\n";
    ctx.reset();  // before the pool it uses goes

    if (capture.ids_by_layer.empty()) {
        throw std::runtime_error("the model's graph produced no " + std::string(k_router_topk_prefix) +
                                 "<layer> tensors: this architecture's router can't be traced");
    }
    const std::map<int, uint64_t> bytes = expert_bytes_by_layer(options.model_path, shape.n_expert);
    for (auto& [layer, ids] : capture.ids_by_layer) {
        const auto it = bytes.find(layer);
        if (it == bytes.end()) {
            throw std::runtime_error("layer " + std::to_string(layer) + " routes to experts but the GGUF has no " +
                                     "blk." + std::to_string(layer) + ".ffn_*_exps tensors");
        }
        trace.layers.push_back({layer, it->second, std::move(ids)});
    }
    validate_expert_trace(trace);
    return trace;
}

expert_cache_stats simulate_expert_cache(const expert_trace& trace, uint32_t slots, const expert_cache_policy& policy) {
    if (slots == 0) throw std::invalid_argument("an expert cache needs at least 1 slot");
    if (policy.admit_k == 0 || policy.admit_window < policy.admit_k) {
        throw std::invalid_argument("admission needs 1 <= k <= window (k " + std::to_string(policy.admit_k) +
                                    ", window " + std::to_string(policy.admit_window) + ")");
    }
    expert_cache_stats stats;
    stats.slots = slots;
    for (const auto& layer : trace.layers) {
        layer_cache cache(trace.n_expert, slots, policy);
        for (uint64_t i = 0; i < layer.ids.size(); ++i) {
            cache.access(layer.ids[i], i / trace.n_expert_used, layer.expert_bytes, stats);
        }
    }
    return stats;
}

experts_bench_report simulate_expert_caches(const expert_trace& trace, const std::vector<uint32_t>& slots,
                                            const expert_cache_policy& admission) {
    experts_bench_report report;
    report.model_path = trace.model_path;
    report.model_desc = trace.model_desc;
    report.n_expert = trace.n_expert;
    report.n_expert_used = trace.n_expert_used;
    report.n_moe_layers = uint32_t(trace.layers.size());
    report.n_prompt_tokens = trace.n_prompt_tokens;
    report.n_generated_tokens = trace.n_generated_tokens;
    for (const auto& layer : trace.layers) report.bytes_per_token_uncached += layer.expert_bytes * trace.n_expert_used;
    report.admission = admission;
    report.slots = slots;
    for (const uint32_t s : slots) {
        report.lru.push_back(simulate_expert_cache(trace, s, expert_cache_policy{}));
        report.gated.push_back(simulate_expert_cache(trace, s, admission));
    }
    return report;
}

std::vector<uint32_t> parse_slot_list(const std::string& text) {
    std::vector<uint32_t> slots;
    for (const std::string& item : split_list(text)) {
        const bool digits = !item.empty() && item.size() <= 6 &&
                            std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; });
        const unsigned long value = digits ? std::stoul(item) : 0;
        if (value == 0) {
            throw std::invalid_argument("bad slot count '" + item +
                                        "': expected a comma-separated list of expert slots per layer, e.g. 8,16,32");
        }
        slots.push_back(uint32_t(value));
    }
    if (slots.empty()) throw std::invalid_argument("no slot counts given: expected e.g. 8,16,32");
    return slots;
}

std::vector<uint32_t> default_slot_list(uint32_t n_expert, uint32_t n_expert_used) {
    std::vector<uint32_t> slots = {n_expert_used, n_expert};
    for (uint32_t s = 1; s < n_expert; s *= 2) slots.push_back(s);
    std::sort(slots.begin(), slots.end());
    slots.erase(std::unique(slots.begin(), slots.end()), slots.end());
    return slots;
}

std::string format_experts_table(const experts_bench_report& report) {
    const uint64_t tokens = report.n_tokens();
    std::ostringstream out;
    out << "model: "
        << (report.model_desc.empty() ? report.model_path : report.model_desc + " (" + report.model_path + ")")
        << "\ntrace: " << tokens << " tokens (" << report.n_prompt_tokens << " prompt + " << report.n_generated_tokens
        << " generated), " << report.n_moe_layers << " MoE layers, " << report.n_expert << " experts, "
        << report.n_expert_used << " used per token\n"
        << "without an expert cache: " << fixed(double(report.n_expert_used) * report.n_moe_layers, 0)
        << " uploads/token, " << human_bytes(double(report.bytes_per_token_uncached)) << "/token\n"
        << "gated: an expert takes a slot after " << report.admission.admit_k << " uses in the last "
        << report.admission.admit_window << " tokens; until then it is streamed\n\n";

    const std::vector<std::string> header = {"slots/layer", "LRU hit %",         "LRU uploads/tok", "LRU bytes/tok",
                                             "gated hit %", "gated uploads/tok", "gated bytes/tok"};
    std::vector<std::vector<std::string>> rows;
    for (size_t i = 0; i < report.slots.size(); ++i) {
        std::vector<std::string> row = {std::to_string(report.slots[i])};
        for (const auto* stats : {&report.lru[i], &report.gated[i]}) {
            row.push_back(percent(stats->hit_rate()));
            row.push_back(fixed(per_token(stats->uploads(), tokens), 2));
            row.push_back(human_bytes(per_token(stats->bytes_moved, tokens)));
        }
        rows.push_back(row);
    }
    out << report_text::markdown_table(header, rows);
    return out.str();
}

std::string format_experts_json(const experts_bench_report& report) {
    const uint64_t tokens = report.n_tokens();
    nlohmann::ordered_json j;
    j["model"] = {{"path", report.model_path}, {"desc", report.model_desc}};
    j["n_expert"] = report.n_expert;
    j["n_expert_used"] = report.n_expert_used;
    j["moe_layers"] = report.n_moe_layers;
    j["tokens"] = {{"prompt", report.n_prompt_tokens}, {"generated", report.n_generated_tokens}};
    j["uncached"] = {{"uploads_per_token", report.n_expert_used * report.n_moe_layers},
                     {"bytes_per_token", report.bytes_per_token_uncached}};
    j["admission"] = {{"k", report.admission.admit_k}, {"window", report.admission.admit_window}};
    j["results"] = nlohmann::ordered_json::array();
    for (size_t i = 0; i < report.slots.size(); ++i) {
        for (const auto& [policy, stats] : {std::pair{"lru", &report.lru[i]}, std::pair{"gated", &report.gated[i]}}) {
            j["results"].push_back({{"policy", policy},
                                    {"slots", stats->slots},
                                    {"hit_rate", stats->hit_rate()},
                                    {"uploads_per_token", per_token(stats->uploads(), tokens)},
                                    {"bytes_per_token", per_token(stats->bytes_moved, tokens)},
                                    {"lookups", stats->lookups},
                                    {"hits", stats->hits},
                                    {"fills", stats->fills},
                                    {"streamed", stats->streamed},
                                    {"evictions", stats->evictions},
                                    {"bytes_moved", stats->bytes_moved}});
        }
    }
    return j.dump(2);
}

std::string format_experts_svg(const experts_bench_report& report) {
    // x = slots per layer on a log2 scale (slot counts are usually powers of two), y = hit rate, one line per policy.
    const int width = 720, height = 460;
    const double left = 80, top = 80, plot_w = 580, plot_h = 300, bottom = top + plot_h;
    double lo = 0, hi = 0;
    if (!report.slots.empty()) {
        lo = std::log2(double(*std::min_element(report.slots.begin(), report.slots.end())));
        hi = std::log2(double(*std::max_element(report.slots.begin(), report.slots.end())));
    }
    const auto px = [&](uint32_t slots) {
        return hi > lo ? left + (std::log2(double(slots)) - lo) / (hi - lo) * plot_w : left + plot_w / 2;
    };
    const auto py = [&](double rate) { return bottom - rate * plot_h; };

    std::ostringstream svg;
    svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
        << "\" viewBox=\"0 0 " << width << " " << height << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
    svg << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
    svg << "<text x=\"" << width / 2 << "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">"
        << xml_escape("keepwarm bench experts: " + (report.model_desc.empty() ? report.model_path : report.model_desc) +
                      ", " + std::to_string(report.n_tokens()) + " tokens")
        << "</text>\n";
    const std::string labels[2] = {"LRU", "gated (k=" + std::to_string(report.admission.admit_k) +
                                              ", w=" + std::to_string(report.admission.admit_window) + ")"};
    for (int p = 0; p < 2; ++p) {
        const double x = width / 2.0 - 140 + 160.0 * p;
        svg << "<g class=\"legend\"><line x1=\"" << x << "\" y1=\"48\" x2=\"" << x + 24 << "\" y2=\"48\" stroke=\""
            << k_policy_colors[p] << "\" stroke-width=\"2.5\"/><text x=\"" << x + 30 << "\" y=\"52\">"
            << xml_escape(labels[p]) << "</text></g>\n";
    }
    for (int pct = 0; pct <= 100; pct += 20) {
        svg << "<line x1=\"" << left << "\" y1=\"" << py(pct / 100.0) << "\" x2=\"" << left + plot_w << "\" y2=\""
            << py(pct / 100.0) << "\" stroke=\"#e0e0e0\"/><text x=\"" << left - 6 << "\" y=\"" << py(pct / 100.0) + 4
            << "\" text-anchor=\"end\">" << pct << "%</text>\n";
    }
    for (const uint32_t s : report.slots) {
        svg << "<line x1=\"" << fixed(px(s), 1) << "\" y1=\"" << bottom << "\" x2=\"" << fixed(px(s), 1) << "\" y2=\""
            << bottom + 5 << "\" stroke=\"black\"/><text x=\"" << fixed(px(s), 1) << "\" y=\"" << bottom + 18
            << "\" text-anchor=\"middle\">" << s << "</text>\n";
    }
    svg << "<line x1=\"" << left << "\" y1=\"" << bottom << "\" x2=\"" << left + plot_w << "\" y2=\"" << bottom
        << "\" stroke=\"black\"/><line x1=\"" << left << "\" y1=\"" << top << "\" x2=\"" << left << "\" y2=\"" << bottom
        << "\" stroke=\"black\"/>\n";
    svg << "<text x=\"" << left + plot_w / 2 << "\" y=\"" << bottom + 40 << "\" text-anchor=\"middle\">expert slots per"
        << " layer (of " << report.n_expert << ")</text>\n";
    svg << "<text transform=\"translate(" << left - 50 << " " << top + plot_h / 2
        << ") rotate(-90)\" text-anchor=\"middle\">hit rate</text>\n";

    const std::vector<expert_cache_stats>* series[2] = {&report.lru, &report.gated};
    const char* classes[2] = {"policy-lru", "policy-gated"};
    for (int p = 0; p < 2; ++p) {
        std::ostringstream points, dots;
        for (const auto& stats : *series[p]) {
            const std::string x = fixed(px(stats.slots), 1), y = fixed(py(stats.hit_rate()), 1);
            points << (points.tellp() > 0 ? " " : "") << x << "," << y;
            dots << "<circle cx=\"" << x << "\" cy=\"" << y << "\" r=\"3\" fill=\"" << k_policy_colors[p]
                 << "\"><title>" << xml_escape(labels[p]) << ", " << stats.slots
                 << " slots: " << percent(stats.hit_rate()) << "% hits</title></circle>\n";
        }
        svg << "<polyline class=\"" << classes[p] << "\" fill=\"none\" stroke=\"" << k_policy_colors[p]
            << "\" stroke-width=\"2\" points=\"" << points.str() << "\"/>\n"
            << dots.str();
    }
    svg << "</svg>\n";
    return svg.str();
}

void add_experts_bench_command(CLI::App& bench) {
    struct cli_options {
        expert_record_options record;
        std::string prompt_file;
        std::string trace_in;
        std::string trace_out;
        std::string slots;
        expert_cache_policy admission{2, 32};
        std::string json_path;
        std::string svg_path;
    };
    auto o = std::make_shared<cli_options>();
    CLI::App* cmd = bench.add_subcommand(
        "experts",
        "Which experts each MoE layer routes to over a workload, and the hit rate of a per-layer expert cache of S "
        "slots (LRU and admission-gated)");
    CLI::Option* model = cmd->add_option("-m,--model", o->record.model_path, "GGUF model file (MoE)");
    CLI::Option* prompt =
        cmd->add_option("--prompt-file", o->prompt_file, "Text file to prefill (default: a built-in mixed workload)");
    CLI::Option* gen = cmd->add_option("-n,--gen", o->record.n_gen, "Tokens decoded greedily after the prompt")
                           ->capture_default_str()
                           ->check(CLI::NonNegativeNumber);
    CLI::Option* threads =
        cmd->add_option("-t,--threads", o->record.threads, "CPU threads (default: the number of math cores)");
    cmd->add_option("--trace-in", o->trace_in, "Simulate a trace recorded earlier with --trace-out instead of a model")
        ->excludes(model)
        ->excludes(prompt)
        ->excludes(gen)
        ->excludes(threads);
    cmd->add_option("--trace-out", o->trace_out,
                    "Also write the routing trace to this file (JSON if it ends in .json, else binary)");
    cmd->add_option("--slots", o->slots,
                    "Comma-separated expert slots per layer (default: powers of two up to the "
                    "expert count)");
    cmd->add_option("--admit-k", o->admission.admit_k, "Gated policy: uses needed before an expert takes a slot")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    cmd->add_option("--admit-window", o->admission.admit_window, "Gated policy: the window of tokens uses count in")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    cmd->add_option("--json", o->json_path, "Also write the results as JSON to this file");
    cmd->add_option("--svg", o->svg_path, "Also write a hit rate vs slots chart as SVG to this file");
    cmd->callback([o] {
        const auto fail = [](const std::string& message) {
            std::cerr << "keepwarm bench experts: error: " << message << "\n";
            throw CLI::RuntimeError(1);
        };
        const auto write_file = [&](const std::string& path, const std::string& text) {
            std::ofstream out(path, std::ios::binary);
            out << text;
            if (!out) fail("cannot write '" + path + "'");
            std::cerr << "wrote " << path << "\n";
        };
        if (o->trace_in.empty() && o->record.model_path.empty()) fail("give a model (-m) or a trace (--trace-in)");
        if (o->admission.admit_k > o->admission.admit_window) {
            fail("--admit-k " + std::to_string(o->admission.admit_k) + " can never be reached within --admit-window " +
                 std::to_string(o->admission.admit_window));
        }
        experts_bench_report report;
        try {
            std::vector<uint32_t> slots;
            if (!o->slots.empty()) slots = parse_slot_list(o->slots);
            const auto check_slots = [&](uint32_t n_expert) {
                for (const uint32_t s : slots) {
                    if (s > n_expert) {
                        fail("--slots " + std::to_string(s) + " is more than the model's " + std::to_string(n_expert) +
                             " experts per layer");
                    }
                }
            };
            expert_trace trace;
            if (!o->trace_in.empty()) {
                trace = read_expert_trace(o->trace_in);
            } else {
                // Before recording, which takes minutes on a real model; a dense model's 0 experts is reported later.
                if (const uint32_t n_expert = inspect_model(o->record.model_path).n_expert) check_slots(n_expert);
                if (!o->prompt_file.empty()) {
                    std::ifstream in(o->prompt_file, std::ios::binary);
                    if (!in) fail("cannot read prompt file '" + o->prompt_file + "'");
                    std::ostringstream text;
                    text << in.rdbuf();
                    o->record.prompt_text = text.str();
                    if (o->record.prompt_text.empty()) fail("prompt file '" + o->prompt_file + "' is empty");
                }
                trace = record_expert_trace(o->record, std::cerr);
            }
            if (!o->trace_out.empty()) {
                write_expert_trace(trace, o->trace_out);
                std::cerr << "wrote " << o->trace_out << "\n";
            }
            check_slots(trace.n_expert);
            if (slots.empty()) slots = default_slot_list(trace.n_expert, trace.n_expert_used);
            report = simulate_expert_caches(trace, slots, o->admission);
        } catch (const CLI::RuntimeError&) {
            throw;
        } catch (const std::exception& e) {
            fail(e.what());
        }
        std::cout << "\n" << format_experts_table(report);
        if (!o->json_path.empty()) write_file(o->json_path, format_experts_json(report) + "\n");
        if (!o->svg_path.empty()) write_file(o->svg_path, format_experts_svg(report));
    });
}

}  // namespace keepwarm

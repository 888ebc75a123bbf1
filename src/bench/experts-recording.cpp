// See experts-recording.h. Every token of a batch is an output, so no layer drops rows before its feed-forward; the
// eval callback copies each `ffn_moe_topk-<layer>` tensor off the device, and each layer's expert size comes from
// the GGUF's ffn_*_exps tensors.
#include "bench/experts-recording.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <ostream>
#include <stdexcept>
#include <vector>

#include "bench/report-text.h"
#include "common.h"
#include "engine/cpu-threadpool.h"
#include "engine/llama-runtime.h"
#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "gguf.h"
#include "llama-cpp.h"
#include "model/model-inspect.h"

namespace keepwarm::bench {

namespace {

// llama-graph.cpp names the router's selection `ffn_moe_topk-<layer>`: I32 expert ids, [n_expert_used, n_tokens].
constexpr char k_router_topk_prefix[] = "ffn_moe_topk-";
// Tokens per prefill decode. Every token must be an output (see record_expert_trace), so this also bounds the
// logits buffer: chunk x vocabulary floats.
constexpr int k_prefill_chunk = 128;

using report_text::fixed;

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

}  // namespace

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

}  // namespace keepwarm::bench

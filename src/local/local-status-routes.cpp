// See local-status-routes.h.
#include "local/local-status-routes.h"

#include <algorithm>
#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "base/request-error.h"
#include "build-info.h"
#include "common.h"
#include "events/kv-event-encoder.h"
#include "events/kv-event-publisher.h"
#include "local/server-status.h"

namespace keepwarm {

namespace {
using json = nlohmann::ordered_json;

// llama-server's `llamacpp:` families, with its names, TYPEs and meanings (the pinned tools/server/server-task.cpp's
// to_metrics), for dashboards built on it. Its two throughput gauges cover the time since the previous scrape, as
// there (its "bucket" is reset by every GET /metrics); its speculative decoding counters sum every draft source.
void write_llamacpp_metrics(metrics_text& out, const engine& llm, int busy, llamacpp_scrape_window& window) {
    const engine_counters& c = llm.counters();
    uint64_t drafts = 0, draft_tokens = 0, draft_accepted = 0;
    for (const engine_counters::draft_counts& d : c.drafts) {
        drafts += d.drafts.load();
        draft_tokens += d.tokens.load();
        draft_accepted += d.accepted.load();
    }
    const auto prefix = [](const char* name) { return std::string("llamacpp:") + name; };
    const uint64_t prompt_n = c.computed_tokens.load(), prompt_us = c.prefill_us.load();
    const uint64_t predicted_n = c.generated_tokens.load(), predicted_us = c.decode_us.load();
    const uint64_t decodes = c.decode_steps.load();
    out.counter(prefix("prompt_tokens_total"), "Number of prompt tokens processed, excluding cached tokens",
                static_cast<double>(prompt_n));
    out.counter(prefix("prompt_tokens_cached_total"), "Number of prompt tokens reused from the cache",
                static_cast<double>(c.reused_tokens.load()));
    out.counter(prefix("prompt_seconds_total"), "Total time spent processing prompts", prompt_us / 1e6);
    out.counter(prefix("tokens_predicted_total"), "Number of generation tokens processed",
                static_cast<double>(predicted_n));
    out.counter(prefix("tokens_predicted_seconds_total"), "Total time spent generating tokens", predicted_us / 1e6);
    out.counter(prefix("n_decode_total"),
                "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
                static_cast<double>(decodes));
    out.counter(prefix("n_tokens_max"), "Largest observed sequence length (prompt + generation)",
                static_cast<double>(c.longest_sequence.load()));
    out.counter(prefix("spec_decode_num_draft_tokens_total"), "Speculative: Total draft tokens generated",
                static_cast<double>(draft_tokens));
    out.counter(prefix("spec_decode_num_accepted_tokens_total"),
                "Speculative: Total draft tokens accepted by the target model", static_cast<double>(draft_accepted));
    out.counter(prefix("spec_decode_num_drafts_total"), "Speculative: Total speculative decoding verification steps",
                static_cast<double>(drafts));
    double prompt_rate = 0, predicted_rate = 0;
    {
        std::lock_guard lock(window.mu);
        const auto rate = [](uint64_t n, uint64_t n_before, uint64_t us, uint64_t us_before) {
            return us > us_before ? 1e6 * static_cast<double>(n - n_before) / static_cast<double>(us - us_before) : 0.0;
        };
        prompt_rate = rate(prompt_n, window.prompt_n, prompt_us, window.prompt_us);
        predicted_rate = rate(predicted_n, window.predicted_n, predicted_us, window.predicted_us);
        window.prompt_n = prompt_n;
        window.prompt_us = prompt_us;
        window.predicted_n = predicted_n;
        window.predicted_us = predicted_us;
    }
    out.gauge(prefix("prompt_tokens_seconds"), "Average prompt throughput in tokens/s", prompt_rate);
    out.gauge(prefix("predicted_tokens_seconds"), "Average generation throughput in tokens/s", predicted_rate);
    out.gauge(prefix("requests_processing"), "Number of requests processing", busy);
    out.gauge(prefix("requests_deferred"), "Number of requests deferred", llm.queued());
    out.gauge(prefix("n_busy_slots_per_decode"), "Average number of busy slots per llama_decode() call",
              static_cast<double>(c.decode_step_slots.load()) / std::max(static_cast<double>(decodes), 1.0));
}

// Speculative decoding by where the drafts came from (draft_source), and the steps that produced answer tokens: the
// answer's tokens per step are keepwarm_generated_tokens_total's share of them over keepwarm_answer_steps_total.
void write_draft_metrics(metrics_text& out, const engine_counters& c) {
    const auto by_source = [&](const char* name, const char* help, auto count) {
        out.family(name, "counter", help);
        for (size_t i = 0; i < draft_source_count; ++i) {
            out.sample(name, static_cast<double>(count(c.drafts[i])),
                       {{"source", draft_source_name(static_cast<draft_source>(i))}});
        }
    };
    by_source("keepwarm_draft_drafts_total", "Drafts of speculative decoding the model verified, by their source",
              [](const engine_counters::draft_counts& d) { return d.drafts.load(); });
    by_source("keepwarm_draft_tokens_total", "Draft tokens the model verified, by their source",
              [](const engine_counters::draft_counts& d) { return d.tokens.load(); });
    by_source("keepwarm_draft_accepted_total", "Draft tokens the model accepted, by their source",
              [](const engine_counters::draft_counts& d) { return d.accepted.load(); });
    out.counter("keepwarm_answer_steps_total",
                "Engine steps that sampled answer tokens after a request's first (drafting or not), per request",
                c.answer_steps.load());
    out.counter("keepwarm_draft_model_reused_tokens_total",
                "A draft model (-md): prompt tokens a request found in its draft sequence's KV",
                c.draft_model_reused.load());
    out.counter("keepwarm_draft_model_computed_tokens_total",
                "A draft model (-md): tokens its context computed to catch up with a request's sequence",
                c.draft_model_computed.load());
    out.counter("keepwarm_draft_model_drafted_tokens_total",
                "A draft model (-md): tokens it proposed, verified or not (each costs a decode of the draft model)",
                c.draft_model_drafted.load());
}

// What llm-d's endpoint picker reads for load besides the queue and the busy slots (docs/kv-events.md): the share of
// the context's cells that requests being served hold. Idle conversations kept on the device do not count: as vLLM's
// cached blocks that no request holds, they give way to new work (counted, every keepwarm server would look full).
void write_kv_cache_gauges(metrics_text& out, const engine& llm, const std::vector<slot_status>& slots) {
    const int context = std::max(llm.options().context_size, 1);
    int64_t serving = 0;
    for (const auto& s : slots) serving += s.busy ? s.cached_tokens : 0;
    out.gauge("keepwarm_kv_cache_usage_ratio",
              "Share (0..1) of the context's KV cells held by requests being served (idle conversations not counted)",
              std::min(1.0, static_cast<double>(serving) / context));
    const int block = llm.options().cache_block_tokens;
    out.gauge("keepwarm_kv_cache_block_size", "Tokens per prefix-cache block (--cache-block)", block);
    out.gauge("keepwarm_kv_cache_blocks", "Blocks the context holds: its size over the block size", context / block);
}

void write_kv_event_metrics(metrics_text& out, const events::kv_event_counters& c) {
    out.counter("keepwarm_kv_events_messages_total", "KV-event messages published (--kv-events)", c.messages.load());
    out.family("keepwarm_kv_events_blocks_total", "counter", "Blocks in published KV events, by event");
    out.sample("keepwarm_kv_events_blocks_total", static_cast<double>(c.blocks_stored.load()),
               {{"event", "BlockStored"}});
    out.sample("keepwarm_kv_events_blocks_total", static_cast<double>(c.blocks_removed.load()),
               {{"event", "BlockRemoved"}});
    out.family("keepwarm_kv_events_resyncs_total", "counter",
               "Full listings sent (AllBlocksCleared, then every block): the queue overflowed, or a subscriber joined");
    out.sample("keepwarm_kv_events_resyncs_total", static_cast<double>(c.overflow_resyncs.load()),
               {{"reason", "overflow"}});
    out.sample("keepwarm_kv_events_resyncs_total", static_cast<double>(c.subscriber_snapshots.load()),
               {{"reason", "subscriber"}});
}

}  // namespace

std::string render_metrics(const frontend_context& front, const local_model& model, llamacpp_scrape_window* window) {
    const engine_counters& c = model.llm->counters();
    const auto slots = model.llm->slots();
    int busy = 0;
    for (const auto& s : slots) busy += s.busy ? 1 : 0;
    metrics_text out;
    out.counter("keepwarm_requests_total", "Generation requests admitted to a slot", c.requests.load());
    write_http_metrics(out, front.http);
    out.counter("keepwarm_prompt_tokens_total", "Prompt tokens received", c.prompt_tokens.load());
    out.counter("keepwarm_reused_tokens_total", "Prompt tokens whose KV was reused from the cache",
                c.reused_tokens.load());
    out.counter("keepwarm_computed_prompt_tokens_total", "Prompt tokens computed (prefill)", c.computed_tokens.load());
    out.counter("keepwarm_generated_tokens_total", "Tokens generated", c.generated_tokens.load());
    out.counter("keepwarm_prefill_seconds_total", "Time spent computing prompts, summed over requests",
                c.prefill_us.load() / 1e6);
    out.counter("keepwarm_decode_seconds_total", "Time spent generating, summed over requests",
                c.decode_us.load() / 1e6);
    out.counter("keepwarm_decode_steps_total", "llama_decode calls", c.decode_steps.load());
    out.counter("keepwarm_shared_decode_steps_total",
                "llama_decode calls that carried tokens of several slots (continuous batching)",
                c.shared_decode_steps.load());
    out.family("keepwarm_engine_seconds_total", "counter",
               "The engine thread's time in its loop (part=all), and in restoring prefixes from RAM or disk, moving "
               "idle conversations to RAM, llama_decode and sampling");
    out.sample("keepwarm_engine_seconds_total", c.loop_us.load() / 1e6, {{"part", "all"}});
    out.sample("keepwarm_engine_seconds_total", c.restore_us.load() / 1e6, {{"part", "restore"}});
    out.sample("keepwarm_engine_seconds_total", c.make_way_us.load() / 1e6, {{"part", "make_way"}});
    out.sample("keepwarm_engine_seconds_total", c.batch_decode_us.load() / 1e6, {{"part", "decode"}});
    out.sample("keepwarm_engine_seconds_total", c.sample_us.load() / 1e6, {{"part", "sampling"}});
    out.counter("keepwarm_slow_stream_steps_total",
                "Engine loop turns that held a generating slot --log-slow-steps ms or longer (each is logged)",
                c.slow_stream_steps.load());
    out.counter("keepwarm_padded_steps_total",
                "Batches under 64 rows filled up to a whole attention tile with throwaway rows (--pad-to-tile)",
                c.padded_steps.load());
    write_draft_metrics(out, c);
    out.counter("keepwarm_requests_cancelled_total", "Generations stopped because the client went away",
                c.cancelled.load());
    out.counter("keepwarm_request_errors_total", "Generations that ended with an error", c.errors.load());
    out.gauge("keepwarm_slots", "Slots (sequences decoded together)", static_cast<double>(slots.size()));
    out.gauge("keepwarm_slots_busy", "Slots serving a request", busy);
    out.gauge("keepwarm_queue_depth", "Requests waiting for a slot", model.llm->queued());
    write_kv_cache_gauges(out, *model.llm, slots);
    if (model.kv_events) {
        write_kv_event_metrics(out, model.kv_events->counters());
        out.counter("keepwarm_kv_events_report_seconds_total",
                    "Engine-thread CPU time the prefix cache spent listing its blocks for the KV events",
                    model.llm->cache_stats().block_report_us / 1e6);
    }
    const request_latencies latencies = model.llm->latencies();
    out.family("keepwarm_queue_wait_seconds", "histogram", "Time finished requests waited for a slot");
    out.histogram("keepwarm_queue_wait_seconds", latencies.queue_wait);
    out.family("keepwarm_time_to_first_token_seconds", "histogram",
               "From a request's arrival to its first sampled token (parse, queue, prefill)");
    out.histogram("keepwarm_time_to_first_token_seconds", latencies.time_to_first_token);
    out.family("keepwarm_stream_step_seconds", "histogram",
               "Engine loop turns that carried a generated token: how long a stream waited for it");
    out.histogram("keepwarm_stream_step_seconds", latencies.stream_step);
    const cache_snapshot cache = model.llm->cache_stats();
    out.counter("keepwarm_cache_hits_total", "Requests that reused cached KV", cache.hits);
    out.counter("keepwarm_cache_misses_total", "Requests that reused nothing", cache.misses);
    out.gauge("keepwarm_cache_device_tokens", "Tokens whose KV cells the context holds", cache.device.tokens);
    out.gauge("keepwarm_cache_ram_bytes", "Bytes of KV blocks and checkpoints in RAM", cache.ram.bytes);
    out.gauge("keepwarm_cache_disk_bytes", "Bytes of KV blocks and checkpoints on disk", cache.disk.bytes);
    out.counter("keepwarm_cache_hinted_requests_total", "Requests whose client marked a prefix to keep (cache hints)",
                cache.hinted.requests);
    out.gauge("keepwarm_cache_hinted_device_tokens", "Marked tokens whose KV cells the context holds",
              cache.hinted.device_tokens);
    out.gauge("keepwarm_cache_hinted_ram_bytes", "Bytes of marked KV blocks and checkpoints in RAM",
              cache.hinted.ram_bytes);
    out.counter("keepwarm_cache_hinted_evictions_total", "Marked entries evicted when nothing unmarked was left",
                cache.hinted.evicted);
    out.counter("keepwarm_cache_evictions_total", "Entries evicted from any tier",
                cache.device.evictions + cache.ram.evictions + cache.disk.evictions);
    const prompt_tokenizer::counters index = model.tokenizer->snapshot();
    out.gauge("keepwarm_prompt_index_tokens", "Tokens the prompt tokenizer's index holds",
              static_cast<double>(index.tokens_held));
    out.counter("keepwarm_prompt_index_matched_tokens_total",
                "Prompt tokens taken from the index instead of tokenizing", index.tokens_matched);
    out.counter("keepwarm_prompt_index_tokenized_tokens_total", "Prompt tokens produced by the tokenizer",
                index.tokens_tokenized);
    out.counter("keepwarm_answers_delivered_differently_total",
                "Answers the client got trimmed or with replaced bytes, mapped back to the generated tokens",
                index.answers_delivered_differently);
    llamacpp_scrape_window scratch;
    write_llamacpp_metrics(out, *model.llm, busy, window ? *window : scratch);
    return out.str();
}

static std::string token_text(const llama_vocab* vocab, llama_token token) {
    return token == LLAMA_TOKEN_NULL ? std::string() : common_token_to_piece(vocab, token, true);
}

static server_props server_props_of(const frontend_context& front, const local_model& model) {
    const engine& llm = *model.llm;
    return {.slot_context_size = llm.slot_context_size(),
            .total_slots = llm.options().slots,
            .model_alias = front.model_id,
            .model_path = model.model_path,
            .chat_template = model.renderer->source(),
            .bos_token = token_text(llm.vocab(), llama_vocab_bos(llm.vocab())),
            .eos_token = token_text(llm.vocab(), llama_vocab_eos(llm.vocab())),
            .build_info = std::string("keepwarm ") + KEEPWARM_VERSION + " (llama.cpp " + llama_build_info() + ")",
            .default_max_tokens = llm.options().default_max_tokens,
            .sampling = common_params_sampling{}};  // what chat_generation and raw_generation start from
}

static json cache_json(const cache_snapshot& c) {
    const auto tier = [](const cache_tier_stats& t, const char* what) {
        return json{{"entries", t.entries},     {"entry_kind", what}, {"tokens", t.tokens},      {"bytes", t.bytes},
                    {"budget_bytes", t.budget}, {"hits", t.hits},     {"evictions", t.evictions}};
    };
    return {{"tiers",
             {{"device", tier(c.device, "sequence")}, {"ram", tier(c.ram, "block")}, {"disk", tier(c.disk, "file")}}},
            {"lookups", c.lookups},
            {"hits", c.hits},
            {"misses", c.misses},
            {"tree_nodes", c.tree_nodes},
            {"block_tokens", c.block_tokens},
            {"checkpoints",
             {{"enabled", c.checkpoints_enabled}, {"in_ram", c.checkpoints}, {"ram_bytes", c.checkpoint_bytes}}},
            {"hinted",
             {{"requests", c.hinted.requests},
              {"device_tokens", c.hinted.device_tokens},
              {"ram_entries", c.hinted.ram_entries},
              {"ram_bytes", c.hinted.ram_bytes},
              {"disk_entries", c.hinted.disk_entries},
              {"disk_bytes", c.hinted.disk_bytes},
              {"evicted", c.hinted.evicted}}},
            {"disk_rejected", c.disk_rejected},
            {"disk_read_failures", c.disk_read_failures},
            {"restore_failures", c.restore_failures}};
}

void register_local_status_routes(http::http_server& server, frontend_context& front, local_model& model) {
    const http::route_options public_route{.requires_auth = false};

    server.add_route(
        "GET", "/health",
        [&model](const http::request&, http::response_writer& w) {
            int busy = 0;
            const auto slots = model.llm->slots();
            for (const auto& s : slots) busy += s.busy ? 1 : 0;
            const engine_health health = model.llm->health();
            json body = {{"status", health.stalled ? "stalled" : "ok"},
                         {"slots_idle", static_cast<int>(slots.size()) - busy},
                         {"slots_processing", busy},
                         {"queued", model.llm->queued()}};
            if (!health.stalled) {
                w.send(200, "application/json", body.dump());
                return;
            }
            // The engine thread is inside one step that has not moved (e.g. a costly grammar): every client waits.
            char reason[160];
            std::snprintf(reason, sizeof reason,
                          "the engine has made no progress for %.1f s (one step running for %.1f s)",
                          health.seconds_since_progress, health.seconds_in_step);
            body["reason"] = reason;
            w.send(503, "application/json", body.dump());
        },
        public_route);

    server.add_route("GET", "/metrics",
                     [&front, &model, window = std::make_shared<llamacpp_scrape_window>()](const http::request&,
                                                                                           http::response_writer& w) {
                         w.send(200, "text/plain; version=0.0.4", render_metrics(front, model, window.get()));
                     });

    server.add_route("GET", "/v1/cache", [&model](const http::request&, http::response_writer& w) {
        json body = cache_json(model.llm->cache_stats());
        const prompt_tokenizer::counters t = model.tokenizer->snapshot();
        body["prompt_index"] = {{"indexed", model.tokenizer->indexed()},
                                {"lookups", t.lookups},
                                {"tokens_matched", t.tokens_matched},
                                {"tokens_tokenized", t.tokens_tokenized},
                                {"tokens_held", t.tokens_held},
                                {"tokens_evicted", t.tokens_evicted},
                                {"answers_delivered_differently", t.answers_delivered_differently}};
        w.send(200, "application/json", body.dump());
    });

    if (model.kv_events) {
        // What the prefix cache reports to the KV-event publisher now (docs/kv-events.md), for a subscriber to check
        // its index against. Hashes and media only: the token ids go to the subscribers.
        server.add_route("GET", "/v1/cache/blocks", [&model](const http::request&, http::response_writer& w) {
            json blocks = json::array();
            for (const kv_listed_block& b : model.llm->cache_blocks()) {
                json media = json::array();
                for (int m = 0; m < kv_medium_count; ++m) {
                    const auto medium = static_cast<kv_medium>(m);
                    if (b.media & kv_medium_bit(medium)) media.push_back(events::medium_name(medium));
                }
                blocks.push_back({{"hash", b.hash}, {"parent", b.parent ? json(*b.parent) : json()}, {"media", media}});
            }
            const json body = {{"topic", model.kv_events->options().topic},
                               {"block_size", model.kv_events->options().block_size},
                               {"blocks", std::move(blocks)}};
            w.send(200, "application/json", body.dump());
        });
    }

    server.add_route("GET", "/v1/policy", [&front](const http::request&, http::response_writer& w) {
        w.send(200, "application/json", front.policy->to_json().dump());
    });

    server.add_route("GET", "/slots", [&model](const http::request& req, http::response_writer& w) {
        const std::vector<slot_status> slots = model.llm->slots();
        // As llama-server: a load balancer can ask for a 503 when every slot is busy.
        if (const auto fail = http::query_value(req.query, "fail_on_no_slot");
            fail && *fail != "0" &&
            std::all_of(slots.begin(), slots.end(), [](const slot_status& s) { return s.busy; })) {
            throw request_error(503, "no slot available", "unavailable_error");
        }
        w.send(200, "application/json", slots_json(slots, model.llm->slot_context_size(), req.tenant).dump());
    });

    // Read once: nothing in it changes while the server runs.
    const std::string props = props_json(server_props_of(front, model)).dump();
    server.add_route("GET", "/props", [props](const http::request&, http::response_writer& w) {
        w.send(200, "application/json", props);
    });
}

nlohmann::ordered_json local_model_meta(const local_model& model) {
    const auto& eo = model.llm->options();
    return {{"path", model.model_path},
            {"n_ctx", eo.context_size},
            {"n_ctx_slot", model.llm->slot_context_size()},
            {"n_ctx_train", llama_model_n_ctx_train(model.llm->model())},
            {"slots", eo.slots},
            {"random_weights", model.random_weights}};
}

}  // namespace keepwarm

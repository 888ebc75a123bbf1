// What every frontend (`keepwarm serve` and `keepwarm proxy` alike) gives its routes and its backend: the policy, the
// cache-buster detector, the HTTP counters, the served model's name, when it started, and the tenants' log and report
// switches.
// What only a local model has (engine, renderer, prompt tokenizers) is local/local-model.h. Built once by a command;
// read-only afterwards except for the atomic counters and what is thread-safe itself (the policy's span rules, the
// detector).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "backend/http-counters.h"
#include "policy/busters.h"
#include "policy/policy.h"

namespace keepwarm {

struct frontend_context {
    // What requests go through before rendering (--policy FILE); without a file it changes nothing but reports.
    std::unique_ptr<policy::request_policy> policy = std::make_unique<policy::request_policy>();
    // Per-client prompt comparison (GET /v1/cache/busters); null when the policy's detect mode is off. Built by the
    // command (make_busters_detector in routes/busters-routes.h).
    std::unique_ptr<policy::cache_buster_detector> busters;
    http_counters http;
    std::string model_id;  // name reported by /v1/models and in responses
    std::chrono::system_clock::time_point started = std::chrono::system_clock::now();

    // Tenants (--api-keys-file): set at start-up, read-only afterwards.
    bool log_prompts = false;  // --log-prompts: log lines may quote prompt text (a divergence, a cache buster)
    bool reuse_report = true;  // --no-reuse-report turns it off: responses say nothing about what was reused
    // A stream with nothing to send for this long gets its API's keep-alive (0: never): --stream-keepalive, set at
    // start-up from http::server_options::stream_keepalive.
    std::chrono::milliseconds stream_keepalive{std::chrono::seconds(10)};
};

}  // namespace keepwarm

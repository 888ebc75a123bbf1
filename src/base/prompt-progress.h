// How far a prompt's processing has come (llama-server's prompt_progress), as the engine reports it to a request that
// asked (generation_request::report_progress) and as the routes write it (llama-server's return_progress).
#pragma once

namespace keepwarm {

struct prompt_progress {
    int total = 0;       // tokens in the prompt
    int cache = 0;       // of them, reused from the cache
    int processed = 0;   // of them, in the KV so far (the reused ones included): reaches `total` when done
    double time_ms = 0;  // since the request entered its slot
};

}  // namespace keepwarm

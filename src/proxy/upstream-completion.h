// Raw completions through `keepwarm proxy`, after the policy call every raw completion goes through
// (apply_raw_completion_policy). POST /v1/completions: a raw prompt needs the upstream's own tokenizer and template,
// so the request is forwarded as it came (the upstream's pinned model name put in; forced max_tokens and sampling
// options of the policy applied; a model name strict pinning refuses gets its 404) to an OpenAI-dialect upstream
// chosen by the prompt's prefix, and its answer is relayed as it arrives, streamed or whole. Ollama's raw
// /api/generate is not forwarded.
// Threading: route handlers, called by the HTTP thread of their connection.
#pragma once

#include "backend/frontend-context.h"
#include "backend/generation-source.h"
#include "proxy/upstream-pool.h"

namespace keepwarm::proxy {

// The /v1/completions handler. Throws request_error (in the OpenAI error shape): 400 for a body without a prompt, 501
// when no upstream speaks the OpenAI dialect, 503 when none of those is up, 504 on a timeout, the upstream's 4xx as
// is, 502 for its 5xx. A client that goes away mid-answer cancels the upstream call.
generation_handler upstream_completions(upstream_pool& pool);

// Raw /api/generate through the proxy: the policy's answer where it refuses the request (404 for a model strict
// pinning refuses), else 501 (it needs the local model's tokenizer).
raw_generation_opener upstream_raw_generations(frontend_context& ctx);

}  // namespace keepwarm::proxy

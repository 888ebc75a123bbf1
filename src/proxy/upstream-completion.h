// POST /v1/completions through `keepwarm proxy`: a raw prompt needs the upstream's own tokenizer and template, so the
// request is forwarded as it came (the upstream's pinned model name put in; forced max_tokens and sampling options
// of the policy applied; a model name strict pinning refuses gets its 404) to an OpenAI-dialect upstream chosen by
// the prompt's prefix, and its answer is relayed as it arrives, streamed or whole.
// Threading: a route handler, called by the HTTP thread of its connection.
#pragma once

#include "proxy/upstream-pool.h"
#include "routes/generation-relay.h"
#include "routes/server-context.h"

namespace keepwarm::proxy {

// The route's handler. Throws request_error (in the OpenAI error shape): 400 for a body without a prompt, 501 when no
// upstream speaks the OpenAI dialect, 503 when none of those is up, 504 on a timeout, the upstream's 4xx as is, 502 for
// its 5xx. A client that goes away mid-answer cancels the upstream call.
generation_handler upstream_completions(upstream_pool& pool);

}  // namespace keepwarm::proxy

// What a finished generation reports to the client, whatever dialect writes it: the engine's generation_stats turned
// into the neutral usage_info and timings_info once, here, with the operator's reuse-hiding rule applied; each dialect
// (api/) only formats these numbers in its own fields and units. Pure functions, callable from any thread.
#pragma once

#include "chat/chat-request.h"
#include "engine/generation.h"

namespace keepwarm {

// The numbers a response may show: `st` itself, or, when the operator turned reuse reports off (st.reuse_hidden), as
// if nothing was reused: no reused tokens in any tier, no checkpoint, no prefix match, every prompt token computed.
generation_stats reported_stats(const generation_stats& st);

// Token counts of a response, from reported_stats(st): prompt (reused included), completion, reused and their tiers.
usage_info usage_of(const generation_stats& st);

// llama-server's timings of a response, from reported_stats(st): prompt tokens computed and reused, the time computing
// the prompt and generating, the tiers, and keepwarm's setup, queue and preparation times.
timings_info timings_of(const generation_stats& st);

}  // namespace keepwarm

// The one place the engine's accounting of a request (engine/generation.h generation_stats) becomes the neutral report
// the routes write every response from (chat/generation-report.h). Pure; callable from any thread.
#pragma once

#include "chat/generation-report.h"
#include "engine/generation.h"

namespace keepwarm {

// `stats` as a report; `reuse_hidden`: the operator turned reuse reports off (--no-reuse-report), so responses show
// nothing reused while the log and the cache-buster detector keep the real numbers.
generation_report report_of(const generation_stats& stats, bool reuse_hidden);

}  // namespace keepwarm

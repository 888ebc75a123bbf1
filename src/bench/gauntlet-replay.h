// Replays a workload against one target: one thread per agent sends that agent's requests in order (agents run
// concurrently), carrying the target's answers into the next turn; a pinger sends the health pings at their times
// until the agents are done; a restart event stops and starts a launched target while no request is in flight.
#pragma once

#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "bench/gauntlet-conversation.h"
#include "bench/gauntlet-launcher.h"
#include "bench/gauntlet-report.h"
#include "bench/gauntlet-workload.h"

namespace keepwarm::bench::gauntlet {

struct replay_target {
    std::string name;
    std::string url;                    // the server's root, e.g. http://127.0.0.1:8080
    std::optional<wire_api> api;        // the one API the target speaks; unset: each line's own
    launched_server* server = nullptr;  // set when the bench launched it (restart events need it)
};

// "NAME=URL[,api=openai|anthropic]"; throws std::invalid_argument naming what is wrong.
replay_target parse_target(const std::string& text);

// One request as replayed, with what the ideal needs.
struct replayed_request {
    request_record record;
    wire_api api = wire_api::openai;
    json normalized;  // the body without the killers the bench injected (null for pings)
    assistant_answer answer;
};

// Throws std::invalid_argument before sending anything when a line's API is not the target's. Request failures
// are recorded, not thrown. `seed` makes the tool results.
std::vector<replayed_request> replay_workload(const std::vector<workload_line>& lines, replay_target& target,
                                              uint64_t seed, std::ostream& progress);

}  // namespace keepwarm::bench::gauntlet

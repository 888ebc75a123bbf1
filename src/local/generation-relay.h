// Relaying a generation submitted to the local engine to the route that answers it: its events as they come, while
// watching for a client that went away; when it ends, what the model read and wrote goes back to the prompt tokenizer
// and one log line says what it reused.
// Threading: used by the route's own thread.
#pragma once

#include <optional>
#include <string>

#include "backend/frontend-context.h"
#include "backend/generation-source.h"
#include "chat/generation-report.h"
#include "engine/generation.h"
#include "http/http-server.h"
#include "local/local-model.h"

namespace keepwarm {

// Waits for the next event of a submitted generation. Returns nullopt once the client is gone (client_watch), after
// telling the generation to stop and counting the disconnect.
// When the generation ends, its prompt and generated tokens are recorded in the prompt tokenizer and one log line
// says what it reused. A relay destroyed early (client gone, failed write, exception) cancels the generation and
// waits briefly for its final event so that what was generated still counts: the engine keeps that KV too.
class generation_relay {
public:
    generation_relay(generation_request& gen, http::response_writer& w, frontend_context& front,
                     const local_model& model, std::string id);
    generation_relay(const generation_relay&) = delete;
    generation_relay& operator=(const generation_relay&) = delete;
    ~generation_relay();

    std::optional<generation_event> next();
    // Stops a generation that has not ended: tells the engine, waits (at most 2 s) for its final event, records it as
    // next() would, and returns it. nullopt when the generation had ended already, or no final event came in time.
    std::optional<generation_event> cancel();
    // A final event's numbers as the neutral report the routes write (local/engine-report.h), with the tenants'
    // reuse-report switch.
    generation_report report(const generation_event& ev) const;

private:
    void finish(const generation_event& ev);
    void log_request(const generation_event& ev) const;

    generation_request& gen_;
    client_watch client_;
    frontend_context& front_;
    const local_model& model_;
    std::string id_;
    bool finished_ = false;  // the final event was seen
};

}  // namespace keepwarm

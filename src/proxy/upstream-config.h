// One upstream engine behind `keepwarm proxy` as the operator configured it: where it is, which API it speaks, the
// model sent to it and the key it wants. Every part of the pool (health, connections, bias tokens) reads it.
// Threading: a plain value, immutable once the pool is built.
#pragma once

#include <string>

#include "http/http-client.h"
#include "proxy/upstream-dialects.h"

namespace keepwarm::proxy {

struct upstream_config {
    http::endpoint origin;
    upstream_dialect dialect = upstream_dialect::openai;
    std::string model;    // the one model sent to it; empty: the first one its health answer lists
    std::string api_key;  // sent in the header its API reads; empty: none
    // Where it publishes its KV events (keepwarm serve --kv-events, vLLM's --kv-events-config), tcp://HOST:PORT:
    // the proxy subscribes and routes by the blocks it holds (kv-block-index.h). Empty: routing infers them.
    std::string events;

    // "URL[,dialect=openai|anthropic|ollama][,model=NAME][,key=KEY][,events=tcp://HOST:PORT]". Throws
    // std::invalid_argument naming the part.
    static upstream_config parse(const std::string& spec);
};

// Throws std::invalid_argument unless `endpoint` is one the proxy can connect to: tcp://HOST:PORT or ipc://PATH, not
// a bind address such as tcp://*:5557.
void check_events_endpoint(const std::string& endpoint);

}  // namespace keepwarm::proxy

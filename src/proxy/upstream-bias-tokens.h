// The token ids, at each upstream, of the texts the policy's forced logit biases name, so that a bias reaches an
// upstream as its own model's token. Asked of each OpenAI-dialect upstream through its POST /tokenize (keepwarm and
// llama-server have it) once it is found up; asked again after a failure that may pass (no answer, 5xx, 429), not
// after a definite one (another dialect, no /tokenize, an answer that is not a token list); forgotten when the
// upstream is found down, since it may come back with another model.
// Threading: lookup() and known() from any thread; bind() and forget() from one thread at a time (the health
// checker's), since bind() asks the upstream without the lock held. One mutex (mu_) guards the table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "http/http-client.h"
#include "proxy/upstream-config.h"

namespace keepwarm::proxy {

class bias_tokens {
public:
    // `upstreams` must outlive this object; `texts` are the bias texts (none: nothing is ever asked).
    bias_tokens(const std::vector<upstream_config>& upstreams, std::vector<std::string> texts);

    // Asks `upstream` for the token of each text unless its answer is known; a failure that may pass leaves them
    // unknown, to be asked again at the next call. Logs what it learned.
    void bind(size_t upstream, const http::client_options& client);
    // The upstream went down: its answer is asked again once it is up.
    void forget(size_t upstream);

    // The token `text` is at this upstream; nullopt: not known (another dialect, no /tokenize, not yet asked) or not
    // one token there.
    std::optional<int32_t> lookup(size_t upstream, const std::string& text) const;
    // Whether the upstream's answer is in (the texts bound, or definitely not bindable there).
    bool known(size_t upstream) const;

private:
    // The texts' token ids at the upstream (-1: not one token; an empty map: not bindable there); nullopt after a
    // failure that may pass.
    std::optional<std::map<std::string, int32_t>> ask(size_t upstream, const http::client_options& client);

    const std::vector<upstream_config>& upstreams_;
    const std::vector<std::string> texts_;
    std::vector<int> retries_;  // bind()'s thread only: failed attempts in a row, per upstream

    mutable std::mutex mu_;
    // guarded by mu_: per upstream, text -> token (-1: not one token); nullopt until known
    std::vector<std::optional<std::map<std::string, int32_t>>> tokens_;
};

}  // namespace keepwarm::proxy

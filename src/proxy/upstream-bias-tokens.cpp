// See upstream-bias-tokens.h.
#include "proxy/upstream-bias-tokens.h"

#include <climits>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "base/logger.h"

namespace keepwarm::proxy {

using json = nlohmann::ordered_json;

bias_tokens::bias_tokens(const std::vector<upstream_config>& upstreams, std::vector<std::string> texts)
    : upstreams_(upstreams), texts_(std::move(texts)), retries_(upstreams.size(), 0), tokens_(upstreams.size()) {}

void bias_tokens::bind(size_t upstream, const http::client_options& client) {
    if (texts_.empty() || known(upstream)) return;
    if (auto tokens = ask(upstream, client)) {
        std::lock_guard lock(mu_);
        tokens_[upstream] = std::move(*tokens);
    }
}

void bias_tokens::forget(size_t upstream) {
    std::lock_guard lock(mu_);
    tokens_.at(upstream).reset();
}

bool bias_tokens::known(size_t upstream) const {
    std::lock_guard lock(mu_);
    return tokens_.at(upstream).has_value();
}

std::optional<int32_t> bias_tokens::lookup(size_t upstream, const std::string& text) const {
    std::lock_guard lock(mu_);
    const auto& tokens = tokens_.at(upstream);
    if (!tokens) return std::nullopt;
    const auto it = tokens->find(text);
    if (it == tokens->end() || it->second < 0) return std::nullopt;
    return it->second;
}

std::optional<std::map<std::string, int32_t>> bias_tokens::ask(size_t i, const http::client_options& client) {
    const upstream_config& u = upstreams_.at(i);
    const auto unbound = [&](const std::string& why) {
        log::warn("proxy", "upstream {}: forced logit biases are not applied there ({})", u.origin.url(), why);
        return std::map<std::string, int32_t>{};
    };
    const auto later = [&](const std::string& why) -> std::optional<std::map<std::string, int32_t>> {
        if (retries_[i]++ == 0) {
            log::warn("proxy", "upstream {}: forced logit biases not bound yet ({}); asking again at each health check",
                      u.origin.url(), why);
        }
        return std::nullopt;
    };
    if (u.dialect != upstream_dialect::openai) return unbound(std::string(dialect_name(u.dialect)) + " dialect");
    http::header_list headers;
    if (!u.api_key.empty()) headers.emplace_back("authorization", "Bearer " + u.api_key);
    std::map<std::string, int32_t> tokens;
    for (const std::string& text : texts_) {
        const json body = {{"content", text}, {"add_special", false}, {"parse_special", true}};
        http::fetched answer;
        try {
            answer = http::fetch(u.origin, "POST", "/tokenize", body.dump(), headers, client);
        } catch (const std::exception& e) {
            return later(std::string("POST /tokenize: ") + e.what());
        }
        if (answer.status >= 500 || answer.status == 429) {
            return later("POST /tokenize answered " + std::to_string(answer.status));
        }
        if (answer.status != 200) return unbound("POST /tokenize answered " + std::to_string(answer.status));
        try {
            const json ids = json::parse(answer.body).at("tokens");
            if (!ids.is_array()) throw std::runtime_error("\"tokens\" is not a list");
            // An id that is not a token id (negative, or past int32) is read as a list that is not one token.
            const bool one = ids.size() == 1 && ids[0].is_number_integer() && ids[0].get<int64_t>() >= 0 &&
                             ids[0].get<int64_t>() <= INT32_MAX;
            tokens[text] = one ? static_cast<int32_t>(ids[0].get<int64_t>()) : -1;
            std::fprintf(
                stderr, "keepwarm proxy: upstream %s: logit_bias '%s' %s\n", u.origin.url().c_str(), text.c_str(),
                one ? ("is token " + std::to_string(tokens[text])).c_str()
                    : ("is " + std::to_string(ids.size()) + " tokens of its model: not applied there").c_str());
        } catch (const std::exception& e) {
            return unbound(std::string("POST /tokenize answer: ") + e.what());
        }
    }
    retries_[i] = 0;
    return tokens;
}

}  // namespace keepwarm::proxy

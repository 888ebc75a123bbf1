// See upstream-generation.h.
#include "proxy/upstream-generation.h"

#include <algorithm>
#include <utility>

#include "backend/cache-busters.h"
#include "backend/client-identity.h"
#include "base/logger.h"
#include "proxy/upstream-call.h"

namespace keepwarm::proxy {

namespace {
double ms_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}
}  // namespace

upstream_generation::upstream_generation(frontend_context& ctx, upstream_pool& pool, const http::request& req,
                                         chat_request chat, const request_clock& clock, http::response_writer& w,
                                         std::string id)
    : ctx_(ctx), pool_(pool), client_(w), chat_(std::move(chat)), id_(std::move(id)), received_(clock.received) {
    policy::policy_outcome outcome = apply_request_policy(*ctx_.policy, req, chat_, id_, headers_);
    if (outcome.ping) {
        ping_.emplace(std::move(outcome.ping_reply));
        return;
    }
    unbound_biases_ = std::move(outcome.unbound_biases);
    client_biases_ = chat_.sampling.logit_bias;
    prompt_text_ = canonical_prompt_text(chat_);
    if (ctx_.busters) {
        buster_ =
            ctx_.busters->inspect({client_name(req), id_, chat_.api, req.tenant}, prompt_text_, chat_.messages, {});
        // Auto mode may rewrite this request with the span's new rule before it is sent (see busters-routes.h).
        if (buster_ && adopt_cache_buster_rule(ctx_, *buster_, chat_.messages))
            prompt_text_ = canonical_prompt_text(chat_);
    }
    connect(req);
    body_.emplace(*conn_);
}

void upstream_generation::connect(const http::request& req) {
    const std::vector<uint64_t> blocks = chained_block_hashes(prompt_text_, pool_.routing().block_chars, req.tenant);
    // Exact routing needs the prompt's token ids. Upstreams publish only their shared cache's blocks
    // (docs/kv-events.md, "Tenants"), so a tenant's own request is routed by inference.
    std::vector<int32_t> tokens;
    if (req.tenant.empty() && pool_.routes_by_events()) tokens = pool_.prompt_tokens(chat_, chat_.model, req.api_key);
    std::vector<std::string> bias_rules;  // the policy's biases as bound for the upstream that answers
    upstream_exchange x = call_upstream(
        pool_,
        {.blocks = blocks,
         .model = chat_.model,
         .routing_key = routing_key(chat_.prompt_cache_key, req.tenant),
         .tokens = tokens},
        [&](const upstream_pool::route& route) {
            bias_rules = bind_biases(route.upstream);
            return build_call(route.config->dialect, chat_, route.model, pool_.credential(route.upstream, req.api_key));
        },
        id_);
    route_ = std::move(x.route);
    conn_ = std::move(x.conn);
    sent_ = x.sent;
    const upstream_config& u = *route_->config;
    headers_.emplace_back("x-keepwarm-upstream", u.origin.url());
    if (!bias_rules.empty()) name_fired_rules(bias_rules);
    decoder_.emplace(u.dialect);
}

std::vector<std::string> upstream_generation::bind_biases(size_t upstream) {
    chat_.sampling.logit_bias = client_biases_;
    std::vector<std::string> fired;
    for (const policy::forced_bias& b : unbound_biases_) {
        const std::optional<int32_t> token = pool_.bias_token(upstream, b.text);
        if (token) {
            std::erase_if(chat_.sampling.logit_bias, [&](const auto& entry) { return entry.first == *token; });
            chat_.sampling.logit_bias.emplace_back(*token, b.bias);
        }
        fired.push_back(b.fired_name(token.has_value()));
    }
    return fired;
}

void upstream_generation::name_fired_rules(const std::vector<std::string>& rules) {
    std::string added;
    for (const std::string& rule : rules) added += (added.empty() ? "" : "; ") + rule;
    const auto it =
        std::find_if(headers_.begin(), headers_.end(), [](const auto& h) { return h.first == "x-keepwarm-policy"; });
    if (it == headers_.end()) {
        headers_.emplace_back("x-keepwarm-policy", added);
    } else {
        it->second += "; " + added;
    }
    log::info("proxy", "{} policy at upstream {}: {}", id_, route_->config->origin.url(), added);
}

upstream_generation::~upstream_generation() {
    leave_upstream();
}

void upstream_generation::leave_upstream() {
    if (left_) return;
    left_ = true;
    if (body_) {
        // A complete answer leaves at most the stream's end marker unread: it is read, and the connection goes back
        // to the pool for the upstream's next request. Anything else is cancelled.
        const bool answered = decoder_ && decoder_->done() && decoder_->error().empty();
        if (body_->finish(answered) && answered) {
            body_.reset();
            pool_.keep_alive(route_->upstream, std::move(conn_));
        }
    }
    if (route_) pool_.release(route_->upstream);
}

std::optional<generation_source::update> upstream_generation::next() {
    if (ping_) return ping_->next();
    const std::string upstream = route_->config->origin.url();
    for (;;) {
        std::optional<answer_limit> overdue;  // set when the answer ran out of time before a piece came
        const std::optional<upstream_body_reader::piece> next_piece =
            client_.next([this, &overdue](std::chrono::milliseconds timeout) {
                const auto [at, limit] = deadline();
                const auto now = std::chrono::steady_clock::now();
                const auto left = at == std::chrono::steady_clock::time_point::max()
                                      ? timeout
                                      : std::chrono::ceil<std::chrono::milliseconds>(at - now);
                std::optional<upstream_body_reader::piece> p;
                if (left.count() > 0) p = body_->next(std::min(timeout, left));
                if (!p && std::chrono::steady_clock::now() >= at) {
                    overdue = limit;
                    p.emplace();  // ends the wait; `overdue` says why
                }
                return p;
            });
        if (overdue) {
            // The upstream answers (its health checks say whether it is up), but not this request: it is cancelled
            // and the upstream stays in routing.
            const std::string why = overdue_message(*overdue);
            log::warn("proxy", "{} {}, call cancelled", id_, why);
            conn_->cancel();
            if (!chat_.stream) {
                leave_upstream();
                throw request_error(504, why, "timeout_error");
            }
            update u{.done = true, .reason = finish_reason::error, .error = why};
            u.report = stats();
            log_end(u);
            leave_upstream();
            return u;
        }
        if (!next_piece) {
            conn_->cancel();
            ctx_.http.disconnects++;
            log::info("proxy", "{} client went away, upstream {} call cancelled", id_, upstream);
            return std::nullopt;
        }
        const upstream_body_reader::piece& p = *next_piece;
        update u;
        if (!p.error.empty()) {
            // The upstream went away mid-answer (killed, reset, timed out): this request ends with an error.
            pool_.mark_down(route_->upstream, "its answer broke off");
            u.done = true;
            u.reason = finish_reason::error;
            u.error = "upstream " + p.error;
        } else {
            // The end of the body reads a last line without its newline, and is an error before the stream's end.
            u.diffs = p.end ? decoder_->end_of_body() : decoder_->push(p.bytes);
            last_read_ = p.read_at;
            if (p.end && !decoder_->error().empty()) pool_.mark_down(route_->upstream, "its answer ended early");
            if (!u.diffs.empty() && !seen_delta_) {
                seen_delta_ = true;
                first_delta_ = std::chrono::steady_clock::now();
                first_delta_read_ = p.read_at;
            }
            if (!u.diffs.empty()) last_delta_ = std::chrono::steady_clock::now();
            if (decoder_->done()) {
                u.done = true;
                if (!decoder_->error().empty()) {
                    u.reason = finish_reason::error;
                    u.error = "upstream " + upstream + ": " + decoder_->error();
                } else {
                    u.reason = decoder_->usage().hit_token_limit ? finish_reason::length : finish_reason::stop;
                }
            }
        }
        if (!u.done && u.diffs.empty()) continue;
        if (u.done) {
            u.report = stats();
            // What the proxy added to this request's time to first token: receiving and forwarding it, and passing
            // the first delta on (the route writes it right after this returns).
            if (seen_delta_) {
                pool_.record_overhead(ms_between(received_, sent_), ms_between(first_delta_read_, first_delta_));
            }
            if (buster_ && u.reason != finish_reason::error) confirm_buster(u.report);
            log_end(u);
            // Before the client gets its last chunk (and can send its next turn): the connection is back in the
            // pool and the upstream's load counts one request less.
            leave_upstream();
        }
        return u;
    }
}

std::pair<std::chrono::steady_clock::time_point, upstream_generation::answer_limit> upstream_generation::deadline()
    const {
    const pool_options& o = pool_.options();
    std::pair d(std::chrono::steady_clock::time_point::max(), answer_limit::whole_answer);
    // Silence since the last delta is the connection's own read timeouts' (the same limits, counted from the last
    // byte): they name it and take the upstream out of routing, as before. Bytes that came since and were not
    // progress are this check's.
    if (last_read_ > (seen_delta_ ? last_delta_ : sent_)) {
        d = seen_delta_ ? std::pair(last_delta_ + o.idle_timeout, answer_limit::next_delta)
                        : std::pair(sent_ + o.first_byte_timeout, answer_limit::first_delta);
    }
    if (!chat_.stream && sent_ + o.answer_timeout < d.first) d = {sent_ + o.answer_timeout, answer_limit::whole_answer};
    return d;
}

std::string upstream_generation::overdue_message(answer_limit limit) const {
    const pool_options& o = pool_.options();
    const std::string upstream = "upstream " + route_->config->origin.url();
    switch (limit) {
        case answer_limit::first_delta:
            return upstream + " sent no content in " + http::seconds_text(o.first_byte_timeout) +
                   " after the request (--first-byte-timeout; keep-alive comments are not progress)";
        case answer_limit::next_delta:
            return upstream + " sent no content for " + http::seconds_text(o.idle_timeout) +
                   " (--upstream-idle-timeout; keep-alive comments are not progress)";
        case answer_limit::whole_answer:
            break;
    }
    return upstream + " did not finish its answer in " + http::seconds_text(o.answer_timeout) + " (--answer-timeout)";
}

generation_report upstream_generation::stats() const {
    const upstream_usage& usage = decoder_->usage();
    generation_report st;
    st.prompt_tokens = usage.prompt_tokens;
    st.reused_tokens = usage.cached_tokens;
    st.computed_tokens = usage.prompt_tokens - usage.cached_tokens;
    st.generated_tokens = usage.completion_tokens;
    // As the proxy sees them: setup up to sending upstream, the prompt up to the first delta, generation after.
    const auto now = std::chrono::steady_clock::now();
    st.setup_ms = st.prepare_ms = ms_between(received_, sent_);
    st.prompt_ms = ms_between(sent_, seen_delta_ ? first_delta_ : now);
    st.generation_ms = seen_delta_ ? ms_between(first_delta_, now) : 0;
    st.reuse_hidden = !ctx_.reuse_report;  // the usage writers leave reuse out; the log and detector keep it
    return st;
}

void upstream_generation::confirm_buster(const generation_report& st) {
    policy::cache_buster_report report = *std::exchange(buster_, std::nullopt);
    // Without the upstream's tokenizer, the span's token is estimated from where it sits in the normalized text. An
    // upstream that reused clearly past that point kept its cache (a keepwarm upstream's own policy, say): no report.
    if (st.prompt_tokens > 0 && !prompt_text_.empty()) {
        const double share = static_cast<double>(report.char_offset) / static_cast<double>(prompt_text_.size());
        const int estimate = static_cast<int>(share * st.prompt_tokens);
        if (st.reused_tokens > estimate + estimate / 10 + 32) return;
        report.token_offset = st.reused_tokens > 0 ? st.reused_tokens : estimate;
        report.token_offset_estimated = true;
    }
    confirm_cache_buster(ctx_, std::move(report), st);
}

void upstream_generation::log_end(const update& u) const {
    const generation_report& st = u.report;
    log::info(
        "proxy",
        "{} upstream {} ({}, {} blocks matched): prompt {} tokens (reused {}, computed {}), generated {} in {} ms, "
        "{}{}{}",
        id_, route_->config->origin.url(), dialect_name(route_->config->dialect), route_->matched_blocks,
        st.prompt_tokens, st.reused_tokens, st.computed_tokens, st.generated_tokens,
        log::fixed(st.prompt_ms + st.generation_ms, 0), finish_reason_name(u.reason), u.error.empty() ? "" : ": ",
        u.error);
}

generation_opener upstream_generations(frontend_context& ctx, upstream_pool& pool) {
    return [&ctx, &pool](const http::request& req, chat_request chat, const request_clock& clock,
                         http::response_writer& w, std::string id) -> generation_source_ptr {
        return std::make_unique<upstream_generation>(ctx, pool, req, std::move(chat), clock, w, std::move(id));
    };
}

token_counter upstream_token_counter(frontend_context& ctx, upstream_pool& pool) {
    return [&ctx, &pool](const http::request& req, const chat_request& chat) {
        chat_request served = chat;
        ctx.policy->apply(served, {}, policy::policy_use::counting);
        const auto route =
            pool.peek(chained_block_hashes(canonical_prompt_text(served), pool.routing().block_chars, req.tenant),
                      served.model, routing_key(served.prompt_cache_key, req.tenant));
        if (!route) throw request_error(503, "no upstream is up to count the tokens", "server_error");
        const upstream_config& u = *route->config;
        const auto call =
            build_count_call(u.dialect, served, route->model, pool.credential(route->upstream, req.api_key));
        if (!call) {
            throw request_error(501,
                                "count_tokens: upstream " + u.origin.url() + " speaks " + dialect_name(u.dialect) +
                                    ", which cannot count a chat's tokens",
                                "api_error");
        }
        http::fetched answer;
        try {
            answer = http::fetch(u.origin, "POST", call->target, call->body, call->headers,
                                 {.read_timeout = std::chrono::seconds(60), .max_body_bytes = 1u << 20});
        } catch (const http::client_error& e) {
            const bool timeout = e.reason == http::client_error::kind::timeout;
            throw request_error(timeout ? 504 : 502, "count_tokens: upstream " + u.origin.url() + ": " + e.what(),
                                timeout ? "timeout_error" : "server_error");
        }
        if (answer.status >= 300 && answer.status < 400) {
            throw upstream_redirect_error(answer.status, answer.headers, u.origin.url());
        }
        if (answer.status >= 400) {
            const upstream_error_info info = parse_error_body(answer.body);
            if (answer.status < 500 && answer.status != 404) {
                throw request_error(answer.status, info.message,
                                    info.type.empty() ? "invalid_request_error" : info.type);
            }
            throw request_error(502,
                                "count_tokens: upstream " + u.origin.url() + " answered " +
                                    std::to_string(answer.status) + ": " + info.message,
                                "server_error");
        }
        try {
            return parse_count_answer(answer.body);
        } catch (const std::invalid_argument& e) {
            throw request_error(502, "count_tokens: upstream " + u.origin.url() + ": " + e.what(), "server_error");
        }
    };
}

}  // namespace keepwarm::proxy

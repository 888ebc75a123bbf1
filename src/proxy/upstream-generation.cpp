// See upstream-generation.h.
#include "proxy/upstream-generation.h"

#include <cstdio>

namespace keepwarm::proxy {

using namespace std::chrono_literals;

namespace {
constexpr auto check_interval = 50ms;
constexpr size_t max_queued_pieces = 64;  // beyond this the reader waits for the client to catch up

double ms_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}
}  // namespace

upstream_generation::upstream_generation(server_context& ctx, upstream_pool& pool, const http::request& req,
                                         api::chat_request chat, const std::shared_ptr<generation_request>& gen,
                                         http::response_writer& w, std::string id)
    : ctx_(ctx), pool_(pool), w_(w), chat_(std::move(chat)), id_(std::move(id)), received_(gen->received) {
    if (policy::policy_outcome outcome = apply_request_policy(*ctx_.policy, req, chat_, id_, headers_); outcome.ping) {
        common_chat_msg reply;
        reply.role = "assistant";
        reply.content = std::move(outcome.ping_reply);
        ping_reply_ = std::move(reply);
        return;
    }
    connect();
    reader_ = std::thread([this] { read_body(); });
}

void upstream_generation::connect() {
    const std::vector<uint64_t> blocks =
        chained_block_hashes(canonical_prompt_text(chat_), pool_.routing().block_chars);
    std::vector<size_t> tried;
    for (;;) {
        route_ = pool_.acquire(blocks, tried, chat_.model);
        if (!route_) {
            throw http::http_error(503,
                                   "no upstream can take the request: " + std::to_string(pool_.size()) +
                                       " configured, " + std::to_string(pool_.size() - pool_.healthy_count()) +
                                       " down" + (tried.empty() ? "" : ", the others failed"),
                                   "server_error");
        }
        const upstream_config& u = *route_->config;
        const upstream_call call = build_call(u.dialect, chat_, route_->model, u.api_key);
        conn_ = std::make_unique<http::client_connection>(u.origin);
        sent_ = std::chrono::steady_clock::now();
        http::client_response head;
        try {
            head = conn_->send("POST", call.target, call.body, "application/json", call.headers);
        } catch (const http::client_error& e) {
            const size_t failed = route_->upstream;
            pool_.release(failed);
            route_.reset();
            if (e.reason == http::client_error::kind::timeout) {
                throw http::http_error(504, "upstream " + u.origin.url() + " did not answer in time: " + e.what(),
                                       "timeout_error");
            }
            // Refused, reset or not HTTP before any answer: nothing reached the client, so another upstream may try.
            std::fprintf(stderr, "keepwarm proxy: %s upstream %s failed (%s), trying another\n", id_.c_str(),
                         u.origin.url().c_str(), e.what());
            pool_.mark_down(failed);
            tried.push_back(failed);
            continue;
        }
        if (head.status >= 400) {
            std::string body;
            try {
                body = conn_->read_body();
            } catch (const http::client_error&) {
            }
            pool_.release(route_->upstream);
            route_.reset();
            const upstream_error_info info = parse_error_body(body);
            if (head.status < 500) {
                throw http::http_error(head.status, info.message,
                                       info.type.empty() ? "invalid_request_error" : info.type);
            }
            throw http::http_error(
                502, "upstream " + u.origin.url() + " answered " + std::to_string(head.status) + ": " + info.message,
                "server_error");
        }
        headers_.emplace_back("x-keepwarm-upstream", u.origin.url());
        decoder_.emplace(u.dialect);
        return;
    }
}

upstream_generation::~upstream_generation() {
    if (reader_.joinable()) {
        bool reader_done;
        {
            std::lock_guard lock(mu_);
            stop_reader_ = true;
            reader_done = reader_done_;
        }
        cv_.notify_all();
        if (!reader_done) conn_->cancel();
        reader_.join();
    }
    if (route_) pool_.release(route_->upstream);
}

void upstream_generation::read_body() {
    piece last;
    try {
        std::string bytes;
        while (conn_->read_some(bytes)) {
            std::unique_lock lock(mu_);
            cv_.wait(lock, [this] { return pieces_.size() < max_queued_pieces || stop_reader_; });
            if (stop_reader_) break;
            pieces_.push_back({.bytes = std::move(bytes)});
            cv_.notify_all();
        }
        last.end = true;
    } catch (const http::client_error& e) {
        last.error = e.what();
    }
    std::lock_guard lock(mu_);
    pieces_.push_back(std::move(last));
    reader_done_ = true;
    cv_.notify_all();
}

std::optional<generation_source::update> upstream_generation::next() {
    if (ping_reply_) {
        update u;
        u.done = true;
        if (!ping_answered_) {
            common_chat_msg_diff diff;
            diff.content_delta = ping_reply_->content;
            u.diffs.push_back(std::move(diff));
            ping_answered_ = true;
        }
        return u;
    }
    const std::string upstream = route_->config->origin.url();
    for (;;) {
        if (const auto now = std::chrono::steady_clock::now(); now - last_check_ >= check_interval) {
            last_check_ = now;
            if (w_.client_gone()) {
                conn_->cancel();
                ctx_.http.disconnects++;
                std::fprintf(stderr, "keepwarm proxy: %s client went away, upstream %s call cancelled\n", id_.c_str(),
                             upstream.c_str());
                return std::nullopt;
            }
        }
        piece p;
        {
            std::unique_lock lock(mu_);
            if (!cv_.wait_for(lock, check_interval, [this] { return !pieces_.empty(); })) continue;
            p = std::move(pieces_.front());
            pieces_.pop_front();
            cv_.notify_all();
        }
        update u;
        if (!p.error.empty() || (p.end && !decoder_->done())) {
            // The upstream went away mid-answer (killed, reset, timed out): this request ends with an error.
            pool_.mark_down(route_->upstream);
            u.done = true;
            u.reason = finish_reason::error;
            u.error = "upstream " + upstream + " " +
                      (p.error.empty() ? "ended its answer early" : "failed mid-answer: " + p.error);
        } else {
            u.diffs = decoder_->push(p.bytes);
            if (!u.diffs.empty() && !seen_delta_) {
                seen_delta_ = true;
                first_delta_ = std::chrono::steady_clock::now();
            }
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
            u.stats = stats();
            log_end(u);
        }
        return u;
    }
}

generation_stats upstream_generation::stats() const {
    const upstream_usage& usage = decoder_->usage();
    generation_stats st;
    st.prompt_tokens = usage.prompt_tokens;
    st.reused_tokens = usage.cached_tokens;
    st.computed_tokens = usage.prompt_tokens - usage.cached_tokens;
    st.generated_tokens = usage.completion_tokens;
    // As the proxy sees them: setup up to sending upstream, the prompt up to the first delta, generation after.
    const auto now = std::chrono::steady_clock::now();
    st.setup_ms = st.prepare_ms = ms_between(received_, sent_);
    st.prompt_ms = ms_between(sent_, seen_delta_ ? first_delta_ : now);
    st.generation_ms = seen_delta_ ? ms_between(first_delta_, now) : 0;
    return st;
}

void upstream_generation::log_end(const update& u) const {
    const generation_stats& st = u.stats;
    std::fprintf(stderr,
                 "keepwarm proxy: %s upstream %s (%s, %zu blocks matched): prompt %d tokens (reused %d, computed %d), "
                 "generated %d in %.0f ms, %s%s%s\n",
                 id_.c_str(), route_->config->origin.url().c_str(), dialect_name(route_->config->dialect),
                 route_->matched_blocks, st.prompt_tokens, st.reused_tokens, st.computed_tokens, st.generated_tokens,
                 st.prompt_ms + st.generation_ms, finish_reason_name(u.reason), u.error.empty() ? "" : ": ",
                 u.error.c_str());
}

generation_opener upstream_generations(server_context& ctx, upstream_pool& pool) {
    return
        [&ctx, &pool](const http::request& req, api::chat_request chat, const std::shared_ptr<generation_request>& gen,
                      http::response_writer& w, std::string id) -> generation_source_ptr {
            return std::make_unique<upstream_generation>(ctx, pool, req, std::move(chat), gen, w, std::move(id));
        };
}

}  // namespace keepwarm::proxy

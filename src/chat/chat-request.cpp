// The request model's own checks and conversions (see chat/chat-request.h).
#include "chat/chat-request.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>

#include "json/json-fields.h"

namespace keepwarm {

namespace {

using json_fields::fail;
using json_fields::in_quotes;

void check_range(const std::optional<float>& v, const char* field, float lo, float hi) {
    if (v && !(std::isfinite(*v) && *v >= lo && *v <= hi)) {
        char buf[128];
        snprintf(buf, sizeof(buf), "'%s' must be a number between %g and %g", field, lo, hi);
        fail(buf);
    }
}

void check_range(const std::optional<int>& v, const char* field, int lo, int hi) {
    if (v && (*v < lo || *v > hi)) {
        fail(in_quotes(field) + " must be an integer between " + std::to_string(lo) + " and " + std::to_string(hi));
    }
}

}  // namespace

void validate_sampling(const sampling_options& s) {
    check_range(s.temperature, "temperature", 0.0f, 2.0f);
    check_range(s.top_p, "top_p", 0.0f, 1.0f);
    check_range(s.min_p, "min_p", 0.0f, 1.0f);
    check_range(s.presence_penalty, "presence_penalty", -2.0f, 2.0f);
    check_range(s.frequency_penalty, "frequency_penalty", -2.0f, 2.0f);
    if (s.repeat_penalty && !(std::isfinite(*s.repeat_penalty) && *s.repeat_penalty > 0.0f)) {
        fail("'repeat_penalty' must be a number greater than 0");
    }
    check_range(s.top_k, "top_k", 0, std::numeric_limits<int32_t>::max());
    check_range(s.repeat_last_n, "repeat_last_n", -1, std::numeric_limits<int32_t>::max());
}

common_params_sampling to_sampling_params(const sampling_options& s, const common_params_sampling& defaults) {
    validate_sampling(s);
    common_params_sampling p = defaults;
    if (s.temperature) p.temp = *s.temperature;
    if (s.top_k) p.top_k = *s.top_k;
    if (s.top_p) p.top_p = *s.top_p;
    if (s.min_p) p.min_p = *s.min_p;
    if (s.repeat_penalty) p.penalty_repeat = *s.repeat_penalty;
    if (s.repeat_last_n) p.penalty_last_n = *s.repeat_last_n;
    if (s.presence_penalty) p.penalty_present = *s.presence_penalty;
    if (s.frequency_penalty) p.penalty_freq = *s.frequency_penalty;
    if (s.seed) p.seed = *s.seed;
    for (const auto& [token, bias] : s.logit_bias) p.logit_bias.push_back({token, bias});
    p.ignore_eos = s.ignore_eos;
    return p;
}

std::string random_id(std::string_view prefix) {
    static const char alphabet[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    thread_local std::mt19937_64 rng{std::random_device{}()};
    std::uniform_int_distribution<size_t> pick(0, sizeof(alphabet) - 2);
    std::string id(prefix);
    for (int i = 0; i < 32; i++) {
        id += alphabet[pick(rng)];
    }
    return id;
}

}  // namespace keepwarm

// Deterministic prose for engine and prompt-cache tests: `n` words, different per seed, with a sentence end now and
// then (so a chat template's text has the shape of a real message).
#pragma once

#include <iterator>
#include <random>
#include <string>

namespace keepwarm::test_prose {

inline std::string words(int n, unsigned seed) {
    static const char* vocab[] = {"cache", "prefix", "token", "agent", "model", "tool",  "request", "system",
                                  "slot",  "turn",   "reuse", "block", "disk",  "state", "answer",  "context",
                                  "the",   "of",     "and",   "to",    "in",    "with",  "for",     "a"};
    std::mt19937 rng(seed);
    std::string out;
    for (int i = 0; i < n; ++i) {
        out += vocab[rng() % std::size(vocab)];
        out += (rng() % 11 == 0) ? ".\n" : " ";
    }
    return out;
}

}  // namespace keepwarm::test_prose

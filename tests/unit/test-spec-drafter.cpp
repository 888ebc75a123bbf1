// The draft source of speculative decoding (spec/suffix-drafter.h, spec/token-history.h): a repeated command is
// drafted whole, a draft stops where the history diverges, never comes from another tenant, the history stays within
// its token budget, and degenerate inputs give no draft rather than a crash.
#include <gtest/gtest.h>

#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "spec/suffix-drafter.h"
#include "spec/token-history.h"

using namespace keepwarm::spec;

namespace {

std::vector<token> range(token first, std::size_t n) {
    std::vector<token> out;
    for (std::size_t i = 0; i < n; ++i) out.push_back(first + static_cast<token>(i));
    return out;
}

std::vector<token> concat(std::vector<token> a, const std::vector<token>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

// A shell command of 12 tokens the agent types again and again.
const std::vector<token> command = {501, 502, 503, 504, 505, 506, 507, 508, 509, 510, 511, 512};

}  // namespace

// The tokens before the command in every conversation ("```bash\n"), and what follows it.
const std::vector<token> marker = {40, 41, 42};
const std::vector<token> trailer = {90, 91, 92, 93};

std::vector<token> tail_of(const std::vector<token>& v, std::size_t from) {
    return {v.begin() + from, v.end()};
}

TEST(SpecDrafter, RepeatedCommandFromTheTenantsHistoryIsDraftedWhole) {
    token_history history;
    history.add_stream("alice", concat(concat(concat(range(100, 20), marker), command), trailer));
    suffix_drafter drafter(history, "alice");
    // A new conversation whose answer starts typing the command after the same marker.
    drafter.append(range(300, 15));
    drafter.append(marker);
    drafter.append(std::vector<token>(command.begin(), command.begin() + 2));
    const suffix_draft rest = drafter.propose(command.size() - 2);
    EXPECT_EQ(rest.tokens, tail_of(command, 2));
    EXPECT_TRUE(rest.from_history);
    EXPECT_EQ(rest.match_length, marker.size() + 2);
    EXPECT_EQ(rest.occurrences, 1u);
    // With room for more, the draft runs on into what followed the command, as far as the match supports.
    const suffix_draft longer = drafter.propose(64);
    ASSERT_GE(longer.tokens.size(), command.size() - 2);
    EXPECT_EQ(std::vector<token>(longer.tokens.begin(), longer.tokens.begin() + 10), tail_of(command, 2));
}

TEST(SpecDrafter, ACommandRepeatedWithinTheRequestIsDrafted) {
    token_history history;  // empty: the request's own prompt is the source
    suffix_drafter drafter(history, "alice");
    drafter.append(concat(concat(concat(range(100, 20), marker), command), trailer));
    drafter.append(range(300, 5));
    drafter.append(marker);
    drafter.append(command[0]);
    drafter.append(command[1]);
    const suffix_draft draft = drafter.propose(command.size() - 2);
    EXPECT_EQ(draft.tokens, tail_of(command, 2));
    EXPECT_FALSE(draft.from_history);
}

TEST(SpecDrafter, ARequestRepeatingItselfRunsOnIntoItsDraft) {
    token_history history;
    suffix_drafter drafter(history, "alice");
    drafter.append(std::vector<token>(8, 7));  // "        " as eight space tokens
    const suffix_draft draft = drafter.propose(10);
    EXPECT_EQ(draft.tokens, std::vector<token>(10, 7));
}

TEST(SpecDrafter, ADraftStopsWhereTheHistoryDiverges) {
    token_history history;
    const std::vector<token> shared = {60, 61, 62, 63, 64, 65};
    // Four conversations agree on `shared` and then each goes its own way: no continuation has 30% support.
    for (token next = 70; next < 74; ++next) {
        history.add_stream("alice", concat(concat(range(1000 + 100 * next, 5), shared), {next, 80, 81}));
    }
    suffix_drafter drafter(history, "alice");
    drafter.append(range(5000, 5));
    drafter.append(std::vector<token>(shared.begin(), shared.begin() + 3));
    const suffix_draft draft = drafter.propose(16);
    EXPECT_EQ(draft.tokens, tail_of(shared, 3));
    EXPECT_EQ(draft.occurrences, 4u);
}

TEST(SpecDrafter, TheMajorityContinuationIsDraftedPastAMinorityThatDiverges) {
    token_history history;
    const std::vector<token> shared = {60, 61, 62, 63};
    history.add_stream("alice", concat(concat(range(2000, 5), shared), {71, 72, 73}));  // oldest, the minority
    for (int i = 0; i < 3; ++i) history.add_stream("alice", concat(concat(range(3000, 5), shared), {81, 82, 83}));
    suffix_drafter drafter(history, "alice");
    drafter.append(range(5000, 5));
    drafter.append(shared);
    EXPECT_EQ(drafter.propose(3).tokens, (std::vector<token>{81, 82, 83}));
}

TEST(SpecDrafter, ADraftStopsWhereTheOnlyOccurrenceEnds) {
    token_history history;
    history.add_stream("alice", concat(range(100, 10), command));
    suffix_drafter drafter(history, "alice");
    drafter.append(std::vector<token>(command.begin(), command.begin() + 8));
    EXPECT_EQ(drafter.propose(16).tokens, tail_of(command, 8));
}

TEST(SpecDrafter, NoDraftComesFromAnotherTenantsText) {
    token_history history;
    history.add_stream("bob", concat(concat(concat(range(100, 20), marker), command), trailer));
    const auto typing_the_command = [&](const std::string& tenant) {
        suffix_drafter drafter(history, tenant);
        drafter.append(marker);
        drafter.append(std::vector<token>(command.begin(), command.begin() + 4));
        return drafter.propose(16);
    };
    EXPECT_TRUE(typing_the_command("alice").tokens.empty()) << "bob's command drafted for alice";
    EXPECT_TRUE(typing_the_command("").tokens.empty());
    EXPECT_TRUE(typing_the_command("bob ").tokens.empty());
    EXPECT_FALSE(typing_the_command("bob").tokens.empty()) << "bob's own history drafts for him";
}

TEST(SpecDrafter, TheOldestStreamsGoToStayWithinTheTokenBudget) {
    token_history history({.token_budget = 100, .key_tokens = 3});
    const std::vector<token> first = concat(range(100, 40), command);  // 52 tokens
    history.add_stream("alice", first);
    history.add_stream("bob", range(1000, 30));
    EXPECT_EQ(history.stats().streams, 2u);
    EXPECT_EQ(history.stats().tokens, 82u);
    history.add_stream("alice", range(2000, 40));  // 122 > 100: alice's first stream, the oldest, goes
    EXPECT_EQ(history.stats().streams, 2u);
    EXPECT_EQ(history.stats().tokens, 70u);
    EXPECT_EQ(history.stats().streams_evicted, 1u);

    suffix_drafter drafter(history, "alice");
    drafter.append(std::vector<token>(command.begin(), command.begin() + 4));
    EXPECT_TRUE(drafter.propose(16).tokens.empty()) << "a draft from an evicted stream";
    suffix_drafter bobs(history, "bob");
    bobs.append(range(1000, 4));
    EXPECT_EQ(bobs.propose(3).tokens, range(1004, 3)) << "bob's stream, newer, stays";

    // A stream longer than the whole budget keeps its tail, alone.
    history.add_stream("alice", range(5000, 150));
    EXPECT_EQ(history.stats().streams, 1u);
    EXPECT_EQ(history.stats().tokens, 100u);
    EXPECT_EQ(history.stats().tokens_truncated, 50u);
    suffix_drafter tail(history, "alice");
    tail.append(range(5000, 4));
    EXPECT_TRUE(tail.propose(4).tokens.empty()) << "the cut head is gone";
    suffix_drafter kept(history, "alice");
    kept.append(range(5100, 4));
    EXPECT_EQ(kept.propose(4).tokens, range(5104, 4));
}

TEST(SpecDrafter, ATenantRemovedDraftsNothingAndFreesItsTokens) {
    token_history history;
    history.add_stream("alice", concat(range(100, 10), command));
    history.add_stream("bob", concat(range(100, 10), command));
    history.remove_tenant("alice");
    EXPECT_EQ(history.stats().streams, 1u);
    EXPECT_EQ(history.stats().tokens, 22u);
    suffix_drafter alice(history, "alice");
    alice.append(range(100, 10));
    EXPECT_TRUE(alice.propose(4).tokens.empty());
    suffix_drafter bob(history, "bob");
    bob.append(range(100, 10));
    EXPECT_EQ(bob.propose(4).tokens, std::vector<token>(command.begin(), command.begin() + 4));
}

TEST(SpecDrafter, DegenerateInputsDraftNothingOrStayBounded) {
    token_history history;
    history.add_stream("alice", std::vector<token>{});   // empty: not kept
    history.add_stream("alice", std::vector<token>{1});  // no token after its only k-gram: not kept
    EXPECT_EQ(history.stats().streams, 0u);
    history.add_stream("alice", concat(range(100, 10), command));

    suffix_drafter empty(history, "alice");
    EXPECT_TRUE(empty.propose(16).tokens.empty());
    suffix_drafter one(history, "alice");
    one.append(999);  // never seen
    EXPECT_TRUE(one.propose(16).tokens.empty());
    suffix_drafter one_seen(history, "alice");
    one_seen.append(100);  // one token of evidence: at most 2 drafted
    EXPECT_EQ(one_seen.propose(16).tokens, range(101, 2));

    suffix_drafter matching(history, "alice");
    matching.append(range(100, 5));
    EXPECT_TRUE(matching.propose(0).tokens.empty()) << "N = 0";
    const suffix_draft huge = matching.propose(std::numeric_limits<std::size_t>::max());
    // Bounded by the sizing: 5 tokens matched, at most 2 drafted per token matched.
    EXPECT_EQ(huge.tokens, concat(range(105, 5), std::vector<token>(command.begin(), command.begin() + 5)));

    // A request that repeats one token for long: a huge N is bounded by the match-based sizing.
    suffix_drafter spaces(history, "alice");
    spaces.append(std::vector<token>(1000, 7));
    const suffix_draft run = spaces.propose(std::numeric_limits<std::size_t>::max());
    EXPECT_FALSE(run.tokens.empty());
    EXPECT_LE(run.tokens.size(), 2 * suffix_draft_options{}.max_match);

    // Sizing options out of range draft nothing.
    for (const double bad : {-1.0, std::numeric_limits<double>::quiet_NaN()}) {
        suffix_drafter odd_sizing(history, "alice", {.draft_per_match = bad});
        odd_sizing.append(range(100, 5));
        EXPECT_TRUE(odd_sizing.propose(16).tokens.empty()) << bad;
    }

    // Token ids at the ends of the range, and a key of zero tokens (taken as one).
    token_history odd({.token_budget = 1000, .key_tokens = 0});
    odd.add_stream("alice",
                   std::vector<token>{std::numeric_limits<token>::min(), -1, std::numeric_limits<token>::max(), 0, 5});
    suffix_drafter extremes(odd, "alice");
    extremes.append(std::vector<token>{std::numeric_limits<token>::min(), -1});
    EXPECT_EQ(extremes.propose(8).tokens, (std::vector<token>{std::numeric_limits<token>::max(), 0, 5}));
}

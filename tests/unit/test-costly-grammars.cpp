// costly_grammars: the grammars whose token took too long, remembered for a while and within a capacity.
#include "engine/costly-grammars.h"

#include <gtest/gtest.h>

#include <string>

using keepwarm::costly_grammars;
using namespace std::chrono_literals;

TEST(costly_grammars, a_grammar_is_remembered_for_a_while_then_forgotten) {
    costly_grammars remembered(8, 10min);
    EXPECT_FALSE(remembered.cost_of("root ::= \"a\""));
    remembered.remember("root ::= \"a\"", 1234.0);
    const auto now = costly_grammars::clock::now();
    ASSERT_TRUE(remembered.cost_of("root ::= \"a\"", now));
    EXPECT_EQ(*remembered.cost_of("root ::= \"a\"", now), 1234.0);
    EXPECT_FALSE(remembered.cost_of("root ::= \"b\"", now));
    EXPECT_TRUE(remembered.cost_of("root ::= \"a\"", now + 9min));
    EXPECT_FALSE(remembered.cost_of("root ::= \"a\"", now + 11min))
        << "a busy spell must not refuse a grammar for good";
}

TEST(costly_grammars, the_oldest_is_forgotten_past_the_capacity) {
    costly_grammars remembered(3);
    for (int i = 0; i < 5; ++i) remembered.remember("g" + std::to_string(i), i);
    EXPECT_FALSE(remembered.cost_of("g0"));
    EXPECT_FALSE(remembered.cost_of("g1"));
    for (int i = 2; i < 5; ++i) EXPECT_TRUE(remembered.cost_of("g" + std::to_string(i))) << i;
    remembered.remember("g2", 9.0);  // again: updated in place, nothing else forgotten
    EXPECT_EQ(*remembered.cost_of("g2"), 9.0);
    EXPECT_TRUE(remembered.cost_of("g3"));
}

// vLLM's plain-text constraints: a regular expression the whole output
// matches (guided_regex) and one of a list of strings (guided_choice).
#include <gtest/gtest.h>

#include "constrain_test_util.hpp"

namespace eh::constrain {
namespace {

using test::matches;
using test::prefix_ok;

TEST(TextGrammars, RegexMatchesTheWholeRawOutput) {
    auto g = regex_output_grammar(R"(\w+@\w+\.com\n)");
    EXPECT_TRUE(matches(g, "alan_turing@enigma.com\n"));
    EXPECT_FALSE(matches(g, "alan@enigma.com"));        // the \n is part of it
    EXPECT_FALSE(matches(g, "x alan@enigma.com\n"));    // no search: the whole output
    EXPECT_FALSE(prefix_ok(g, "alan@enigma.org"));
    // Raw text: quotes and backslashes are themselves, not JSON escapes.
    auto q = regex_output_grammar(R"(^"[^"\\]*"$)");
    EXPECT_TRUE(matches(q, "\"it's\""));
    EXPECT_FALSE(prefix_ok(q, "\"a\\"));
    auto uni = regex_output_grammar("[α-ω]{2}|\\d");
    EXPECT_TRUE(matches(uni, "αβ"));
    EXPECT_TRUE(matches(uni, "7"));
    EXPECT_FALSE(matches(uni, "α"));
    auto dot = regex_output_grammar("a.c");
    EXPECT_TRUE(matches(dot, "a\xE2\x82\xAC" "c"));
    EXPECT_FALSE(matches(dot, "a\nc"));
    EXPECT_TRUE(matches(regex_output_grammar("(?!no)[a-z]+"), "yes"));
    EXPECT_FALSE(matches(regex_output_grammar("(?!no)[a-z]+"), "nope"));
    EXPECT_TRUE(matches(regex_output_grammar("\\p{Lu}\\p{Ll}+"), "\xC3\x89cole"));
    for (const char* bad : {"(a)\\1", "a(?=b)", "a(?!b)", "a{2000}", "(", "\\p{Nope}"}) {
        try {
            regex_output_grammar(bad);
            ADD_FAILURE() << bad << " was accepted";
        } catch (const GrammarError& e) {
            EXPECT_EQ(e.keyword(), "pattern") << bad;
        }
    }
}

TEST(TextGrammars, ChoiceIsExactlyOneOfTheStrings) {
    auto g = choice_grammar({"positive", "negative", "it's \"mixed\"\\", "\xC3\xA9t\xC3\xA9", "tab\there", ""});
    EXPECT_TRUE(matches(g, "positive"));
    EXPECT_TRUE(matches(g, "negative"));
    EXPECT_TRUE(matches(g, "it's \"mixed\"\\"));
    EXPECT_TRUE(matches(g, "\xC3\xA9t\xC3\xA9"));
    EXPECT_TRUE(matches(g, "tab\there"));
    EXPECT_TRUE(matches(g, ""));
    EXPECT_FALSE(matches(g, "positive!"));
    EXPECT_FALSE(matches(g, "pos"));
    EXPECT_FALSE(prefix_ok(g, "neutral"));
    try {
        choice_grammar({});
        ADD_FAILURE() << "an empty list was accepted";
    } catch (const GrammarError& e) {
        EXPECT_EQ(e.keyword(), "choice");
    }
    try {
        choice_grammar(std::vector<std::string>(300, std::string(1000, 'x')));
        ADD_FAILURE() << "300 KB of choices were accepted";
    } catch (const GrammarError& e) {
        EXPECT_NE(std::string(e.what()).find("limit"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace eh::constrain

// The grammar text: what it accepts, and how it refuses bad grammars.
#include <gtest/gtest.h>

#include "constrain_test_util.hpp"

namespace eh::constrain {
namespace {

using test::expect_language;
using test::matches;
using test::prefix_ok;

TEST(Gbnf, LiteralsAlternativesAndGroups) {
    auto g = gbnf_grammar(R"(root ::= "a" ("b" | "cd") "e"  # comment
)");
    expect_language(g, {.match = {"abe", "acde"}, .no_match = {"ace", "ab"}, .prefix = {"ab"}, .no_prefix = {"ax"}});
}

TEST(Gbnf, RepeatsAndBounds) {
    auto g = gbnf_grammar("root ::= [0-9]{2,4} \"x\"* \"y\"+ \"z\"?\n");
    expect_language(g, {.match = {"12y", "1234xxxyyz"}, .no_match = {"1y", "12345y", "12", "12yzz"}});
    auto exact = gbnf_grammar("root ::= \"ab\"{3}\n");
    EXPECT_TRUE(matches(exact, "ababab"));
    EXPECT_FALSE(matches(exact, "abab"));
    auto open = gbnf_grammar("root ::= \"a\"{2,}\n");
    EXPECT_FALSE(matches(open, "a"));
    EXPECT_TRUE(matches(open, std::string(50, 'a')));
}

TEST(Gbnf, ClassesAreCodePointsInUtf8) {
    auto g = gbnf_grammar("root ::= [^a\\n]\n");
    expect_language(g, {
        .match = {"b", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80"},  // é; €; an emoji
        .no_match = {"a", "\n", "\xC3"},  // "\xC3": a cut character is no match
        .no_prefix = {"\xC0\x80", "\xED\xA0\x80", "\xFF"}  // overlong; a surrogate; not UTF-8
    });
    auto range = gbnf_grammar("root ::= [α-ω]+\n");
    EXPECT_TRUE(matches(range, "αβω"));
    EXPECT_FALSE(prefix_ok(range, "a"));
    auto any = gbnf_grammar("root ::= .\n");
    expect_language(any, {
        .match = {"\x7F", "\xF4\x8F\xBF\xBF"},  // U+10FFFF
        .no_prefix = {"\xF4\x90"}  // above U+10FFFF
    });
}

TEST(Gbnf, EscapesInLiterals) {
    auto g = gbnf_grammar(R"(root ::= "\x41\u00e9\n\t\"\\" "\U0001F600")" "\n");
    EXPECT_TRUE(matches(g, "A\xC3\xA9\n\t\"\\\xF0\x9F\x98\x80"));
}

TEST(Gbnf, RulesRecursionAndContinuationLines) {
    auto g = gbnf_grammar(R"g(
# balanced parentheses
root ::= item*
item ::= "(" root ")"
       | "x"
)g");
    expect_language(g, {.match = {"", "(x(x))x"}, .no_match = {"(x"}, .prefix = {"((("}, .no_prefix = {")"}});
}

// As llama.cpp writes its grammars: the body on the line after `::=`, and
// alternatives on the lines after a trailing `|`.
TEST(Gbnf, BodyMayStartOnTheLineAfterTheRuleName) {
    auto g = gbnf_grammar("root ::=\n  \"a\" |\n  \"b\" (\n    \"c\"\n  )?\nother ::= \"z\"\n");
    expect_language(g, {.match = {"a", "bc", "b"}, .no_match = {"z"}});
    // ...unless the next line starts the next rule: then the body is empty.
    auto empty = gbnf_grammar("root ::= a \"x\"\na ::=\nb ::= \"y\"\n");
    EXPECT_TRUE(matches(empty, "x"));
    EXPECT_FALSE(matches(empty, "yx"));
}

TEST(Gbnf, LongRepeatsKeepTheStackFlat) {
    // x* is right recursion in tail position: 10,000 items must not hit the
    // stack depth limit.
    auto g = gbnf_grammar("root ::= \"[\" \"x\"* \"]\"\n");
    EXPECT_TRUE(matches(g, "[" + std::string(10000, 'x') + "]"));
}

void expect_error(std::string_view text, std::string_view needle) {
    try {
        gbnf_grammar(text);
        ADD_FAILURE() << "accepted: " << text;
    } catch (const GrammarError& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        EXPECT_EQ(e.code(), Code::InvalidRequest);
    }
}

TEST(Gbnf, RefusesBadGrammarsByName) {
    expect_error("", "no rule named 'root'");
    expect_error("root ::= a\n", "rule 'a' is used but not defined");
    expect_error("root ::= \"a\"\nroot ::= \"b\"\n", "defined twice");
    expect_error("root ::= root \"a\" | \"b\"\n", "left-recursive");
    expect_error("root ::= a\na ::= \"x\"? root | \"y\"\n", "left-recursive");
    expect_error("root ::= \"a\" root\n", "can never end");
    expect_error("root ::= [^\\x00-\\U0010FFFF]\n", "can never end");
    expect_error("root ::= \"abc\n", "not closed");
    expect_error("root ::= [abc\n", "not closed");
    expect_error("root ::= (\"a\"\n", "expected ')'");
    expect_error("root ::= \"a\"{3,2}\n", "maximum below its minimum");
    expect_error("root ::= \"a\"{1001}\n", "larger than 1000");
    expect_error("root ::= \"\\q\"\n", "unknown escape");
    expect_error("root ::= \"\\uD800\"\n", "not a Unicode scalar value");
    expect_error("root = \"a\"\n", "expected '::='");
    expect_error("root ::= \"a\" @\n", "unexpected '@'");
    expect_error("root ::= \"a\" b ::= \"c\"\n", "same line");
    expect_error("root ::= " + std::string(100, '(') + "\"a\"" + std::string(100, ')') + "\n", "nest deeper");
    expect_error(std::string(300 * 1024, ' '), "limit");
}

}  // namespace
}  // namespace eh::constrain

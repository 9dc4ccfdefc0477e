// The schema compile path's shortcuts (issue 51's < 50 ms on the largest
// real schemas): the schema text read by simdjson with nlohmann's meaning
// kept (a key given twice: its first place, its last value), large $defs
// looked up by name, and what a large schema repeats (the same number bounds
// on many properties, the same counted repeat) compiled once.
#include <gtest/gtest.h>

#include <string>

#include "constrain_test_util.hpp"

namespace eh::constrain {
namespace {

using test::matches;

std::string many_properties(int n, const std::string& value) {
    std::string props;
    for (int i = 0; i < n; ++i) props += (i ? "," : "") + std::string("\"p") + std::to_string(i) + "\":" + value;
    return R"({"type":"object","properties":{)" + props + "}}";
}

TEST(SchemaCompile, AKeyGivenTwiceKeepsItsLastValue) {
    // A small object and one past the size where keys are looked up by hash.
    auto g = json_schema_grammar(R"({"type":"string","type":"integer"})");
    EXPECT_TRUE(matches(g, "5"));
    EXPECT_FALSE(matches(g, R"("a")"));
    std::string props;
    for (int i = 0; i < 20; ++i) props += "\"k" + std::to_string(i) + "\":{\"type\":\"string\"},";
    auto big = json_schema_grammar(R"({"type":"object","additionalProperties":false,"required":["k3"],"properties":{)" + props +
                                   R"("k3":{"type":"integer"}}})");
    EXPECT_TRUE(matches(big, R"({"k3":7})"));
    EXPECT_FALSE(matches(big, R"({"k3":"x"})"));
}

TEST(SchemaCompile, TextThatIsNotJsonOrPastSimdjsonStaysAClearError) {
    for (const char* bad : {R"({"type":)", R"({"type":"string"} x)", "\xff", R"({"a":1,})"}) {
        try {
            json_schema_grammar(bad);
            ADD_FAILURE() << "accepted: " << bad;
        } catch (const GrammarError& e) {
            EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos) << e.what();
        }
    }
    // A number past 64 bits (simdjson refuses it) is read as nlohmann reads it.
    auto g = json_schema_grammar(R"({"type":"integer","minimum":0,"maximum":123456789012345678901234567890})");
    EXPECT_TRUE(matches(g, "12345"));
    EXPECT_FALSE(matches(g, "-1"));
}

TEST(SchemaCompile, LargeDefsAreFoundByName) {
    std::string defs;
    for (int i = 0; i < 40; ++i) defs += "\"d" + std::to_string(i) + "\":{\"const\":" + std::to_string(i) + "},";
    const std::string doc = R"({"$defs":{)" + defs + R"("a/b":{"type":"boolean"},"c%d":{"type":"null"}},)";
    EXPECT_TRUE(matches(json_schema_grammar(doc + R"("$ref":"#/$defs/d37"})"), "37"));
    EXPECT_FALSE(matches(json_schema_grammar(doc + R"("$ref":"#/$defs/d37"})"), "36"));
    EXPECT_TRUE(matches(json_schema_grammar(doc + R"("$ref":"#/$defs/a~1b"})"), "true"));
    EXPECT_TRUE(matches(json_schema_grammar(doc + R"("$ref":"#/$defs/c%25d"})"), "null"));
    try {
        json_schema_grammar(doc + R"("$ref":"#/$defs/d40"})");
        ADD_FAILURE() << "a missing definition was accepted";
    } catch (const GrammarError& e) {
        EXPECT_EQ(e.keyword(), "$ref");
    }
}

TEST(SchemaCompile, TheSameNumberBoundsOnManyPropertiesShareTheirRules) {
    const size_t plain = json_schema_grammar(many_properties(300, R"({"type":"number"})"))->alts.size();
    const size_t bounded =
        json_schema_grammar(many_properties(300, R"({"type":"number","minimum":0,"maximum":360})"))->alts.size();
    const size_t one = json_schema_grammar(many_properties(1, R"({"type":"number","minimum":0,"maximum":360})"))->alts.size() -
                       json_schema_grammar(many_properties(1, R"({"type":"number"})"))->alts.size();
    ASSERT_GT(one, 10u);  // a bounded number is a digit automaton of its own
    EXPECT_LE(bounded - plain, one);  // once, not once per property
    auto g = json_schema_grammar(many_properties(3, R"({"type":"number","minimum":0,"maximum":360})"));
    EXPECT_TRUE(matches(g, R"({"p0":12.5,"p2":360})"));
    EXPECT_FALSE(matches(g, R"({"p1":360.5})"));
}

TEST(SchemaCompile, TheSameCountedRepeatSharesItsChain) {
    const size_t one = gbnf_grammar("root ::= [0-9]{0,50}\n")->alts.size();
    const size_t two = gbnf_grammar("root ::= a \"-\" b\na ::= [0-9]{0,50}\nb ::= [0-9]{0,50}\n")->alts.size();
    ASSERT_GT(one, 50u);
    EXPECT_LT(two, one + 5);  // the second repeat is one rule more, not 50
    auto g = gbnf_grammar("root ::= a \"-\" b\na ::= [0-9]{0,50}\nb ::= [0-9]{0,50}\n");
    EXPECT_TRUE(matches(g, "12-"));
    EXPECT_TRUE(matches(g, std::string(50, '1') + "-" + std::string(50, '2')));
    EXPECT_FALSE(matches(g, std::string(51, '1') + "-"));
    EXPECT_FALSE(matches(g, "-" + std::string(51, '2')));
}

}  // namespace
}  // namespace eh::constrain

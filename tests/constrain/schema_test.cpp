// JSON schemas: the documented subset compiles and the output it allows
// validates; every other keyword is refused by name.
#include <gtest/gtest.h>

#include "constrain_test_util.hpp"

namespace eh::constrain {
namespace {

using test::matches;
using test::prefix_ok;

const char* kPerson = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "description": "ignored"},
    "age": {"type": "integer"},
    "score": {"type": ["number", "null"]},
    "tags": {"type": "array", "items": {"type": "string"}},
    "kind": {"enum": ["a", "b", 3, null]},
    "ok": {"type": "boolean"},
    "v": {"const": {"x": [1, "y"]}}
  },
  "required": ["name", "age", "score", "tags", "kind", "ok", "v"],
  "additionalProperties": false
})";

TEST(Schema, ObjectWithEveryScalarType) {
    auto g = json_schema_grammar(kPerson);
    EXPECT_TRUE(matches(g, R"({"name":"Ann","age":-3,"score":null,"tags":[],"kind":3,"ok":true,"v":{"x":[1,"y"]}})"));
    EXPECT_TRUE(matches(g, "\n{ \"name\" : \"\\u00e9\\n\\\"\" , \"age\": 0, \"score\": 1.5e-3, \"tags\": [\"a\", \"b\"],\n"
                           "  \"kind\": \"b\", \"ok\": false, \"v\": {\"x\":[1,\"y\"]} }"));
    // order, missing, extra, wrong types
    EXPECT_FALSE(prefix_ok(g, R"({"age")"));
    EXPECT_FALSE(prefix_ok(g, R"({"name":"a","age":1.5)"));
    EXPECT_FALSE(prefix_ok(g, R"({"name":"a","age":01)"));
    EXPECT_FALSE(prefix_ok(g, R"({"name":"a","age":1,"score":"x")"));
    EXPECT_FALSE(prefix_ok(g, R"({"name":"a","age":1,"score":1,"tags":[1])"));
    EXPECT_FALSE(prefix_ok(g, R"({"name":"a","age":1,"score":1,"tags":[],"kind":"c")"));
    EXPECT_FALSE(prefix_ok(g, R"({"name":"a","age":1,"score":1,"tags":[],"kind":"a","ok":true,"v":{"x":[2)"));
    EXPECT_FALSE(matches(g, R"({"name":"a","age":1,"score":1,"tags":[],"kind":"a","ok":true})"));
    EXPECT_FALSE(prefix_ok(g, "{\"name\":\"a\nb"));        // raw control character in a string
    EXPECT_FALSE(prefix_ok(g, R"({"name":"\x")"));          // bad escape
    EXPECT_FALSE(prefix_ok(g, R"({"name":"\udc00)"));       // lone low surrogate
    EXPECT_TRUE(prefix_ok(g, R"({"name":"\ud83d\ude00)"));  // a pair
    EXPECT_FALSE(prefix_ok(g, "{\"name\":\"\xFF"));          // invalid UTF-8
}

TEST(Schema, CompleteAfterTheRootCloses) {
    Matcher m = test::matcher(json_schema_grammar(R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],"additionalProperties":false})"));
    ASSERT_TRUE(m.accept_bytes(R"({"a":12)"));
    EXPECT_FALSE(m.accepting());
    ASSERT_TRUE(m.accept_bytes("}"));
    EXPECT_TRUE(m.accepting());
    EXPECT_TRUE(m.complete());
    EXPECT_FALSE(m.accept_bytes(" "));
}

TEST(Schema, EnumAndConstValuesWithEscapesAreWrittenExactly) {
    auto g = json_schema_grammar(R"({"enum":["a\"b\\c", "\u00e9\n", 1.5, {"k":[true,null]}]})");
    EXPECT_TRUE(matches(g, R"("a\"b\\c")"));
    EXPECT_TRUE(matches(g, "\"\xC3\xA9\\n\""));
    EXPECT_TRUE(matches(g, "1.5"));
    EXPECT_TRUE(matches(g, R"({"k":[true,null]})"));
    EXPECT_FALSE(prefix_ok(g, R"("a\"c)"));
}

TEST(Schema, OptionalPropertiesKeepOrderAndCommas) {
    auto g = json_schema_grammar(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"},
        "c":{"type":"integer"}},"required":["b"],"additionalProperties":false})");
    EXPECT_TRUE(matches(g, R"({"b":1})"));
    EXPECT_TRUE(matches(g, R"({"a":1,"b":2})"));
    EXPECT_TRUE(matches(g, R"({"b":2,"c":3})"));
    EXPECT_TRUE(matches(g, R"({"a":1,"b":2,"c":3})"));
    EXPECT_FALSE(matches(g, R"({})"));
    EXPECT_FALSE(matches(g, R"({"a":1})"));
    EXPECT_FALSE(prefix_ok(g, R"({"b":2,"a")"));
    EXPECT_FALSE(prefix_ok(g, R"({,)"));
    auto none = json_schema_grammar(R"({"properties":{"a":{},"b":{}}})");
    EXPECT_TRUE(matches(none, "{}"));
    EXPECT_TRUE(matches(none, R"({"b":[{"q":null}]})"));
    EXPECT_FALSE(prefix_ok(none, R"({"c")"));
}

TEST(Schema, AnyOfRefsAndRecursion) {
    auto g = json_schema_grammar(R"({
      "$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                "required": ["v", "kids"], "additionalProperties": false}},
      "anyOf": [{"$ref": "#/$defs/node"}, {"type": "string"}]})");
    EXPECT_TRUE(matches(g, R"("leaf")"));
    EXPECT_TRUE(matches(g, R"({"v":1,"kids":[{"v":2,"kids":[]},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"));
    EXPECT_FALSE(prefix_ok(g, R"({"v":1,"kids":[{"v":"x")"));
    auto self = json_schema_grammar(R"({"type":"object","properties":{"next":{"anyOf":[{"$ref":"#"},{"type":"null"}]}},
        "required":["next"],"additionalProperties":false})");
    EXPECT_TRUE(matches(self, R"({"next":{"next":{"next":null}}})"));
    auto defs = json_schema_grammar(R"({"definitions":{"a/b":{"type":"boolean"}},"$ref":"#/definitions/a~1b"})");
    EXPECT_TRUE(matches(defs, "true"));
}

TEST(Schema, ArraysWithBounds) {
    auto g = json_schema_grammar(R"({"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":3})");
    EXPECT_FALSE(matches(g, "[1]"));
    EXPECT_TRUE(matches(g, "[1,2]"));
    EXPECT_TRUE(matches(g, "[1, 2, 3]"));
    EXPECT_FALSE(prefix_ok(g, "[1,2,3,"));
    auto empty = json_schema_grammar(R"({"type":"array","maxItems":0})");
    EXPECT_TRUE(matches(empty, "[]"));
    EXPECT_FALSE(prefix_ok(empty, "[1"));
}

TEST(Schema, MapsAndAnyObject) {
    auto map = json_schema_grammar(R"({"type":"object","additionalProperties":{"type":"integer"}})");
    EXPECT_TRUE(matches(map, R"({"x":1,"y":2})"));
    EXPECT_FALSE(prefix_ok(map, R"({"x":"s")"));
    auto any = json_object_grammar();
    EXPECT_TRUE(matches(any, R"( {"a":[1,{"b":null}],"c":"d"})"));
    EXPECT_FALSE(prefix_ok(any, "["));
    EXPECT_FALSE(prefix_ok(any, "\"x\""));
    EXPECT_TRUE(matches(json_schema_grammar("{}"), "[1]"));
    EXPECT_TRUE(matches(json_schema_grammar("true"), "\"s\""));
}

TEST(Schema, NumbersFollowJson) {
    auto g = json_schema_grammar(R"({"type":"number"})");
    for (const char* ok : {"0", "-0", "1.25", "-12e+5", "3E-2", "10"}) EXPECT_TRUE(matches(g, ok)) << ok;
    for (const char* bad : {"01", "+1", ".5", "1.", "1e", "--1", "NaN"}) EXPECT_FALSE(matches(g, bad)) << bad;
    // Bounded so a model repeating a digit still reaches the end.
    EXPECT_TRUE(matches(g, "1234567890123456.1234567890123456e-123"));
    EXPECT_FALSE(prefix_ok(g, "12345678901234567"));
    EXPECT_FALSE(prefix_ok(g, "1.12345678901234567"));
    EXPECT_FALSE(prefix_ok(g, "1e1234"));
}

TEST(Schema, WhitespaceIsBounded) {
    auto g = json_schema_grammar(R"({"type":"array","items":{"type":"integer"}})");
    EXPECT_TRUE(matches(g, "[1, 2,\n\t\t3\n]"));
    EXPECT_TRUE(matches(g, "\n" + std::string(20, ' ') + "[1]"));
    EXPECT_FALSE(prefix_ok(g, "[1,  2"));
    EXPECT_FALSE(prefix_ok(g, "[1,\n\n"));
    EXPECT_FALSE(prefix_ok(g, "[1,\n" + std::string(21, ' ')));
    EXPECT_FALSE(prefix_ok(g, "[1]\n"));  // nothing after the value
}

TEST(Schema, TaggedJsonForToolCalls) {
    std::vector<TaggedJson> alts = {
        {"<call>", R"({"type":"object","properties":{"name":{"const":"f"},"arguments":{"type":"object",
          "properties":{"x":{"type":"integer"}},"required":["x"],"additionalProperties":false}},
          "required":["name","arguments"],"additionalProperties":false})", "</call>"},
        {"<call>", R"({"type":"object","properties":{"name":{"const":"g"},"arguments":{"type":"object",
          "properties":{},"additionalProperties":false}},"required":["name","arguments"],"additionalProperties":false})",
         "</call>"}};
    auto one = tagged_json_grammar(alts);
    EXPECT_TRUE(matches(one, R"(<call>{"name":"f","arguments":{"x":1}}</call>)"));
    EXPECT_TRUE(matches(one, R"(<call>{"name": "g", "arguments": {}}</call>)"));
    EXPECT_FALSE(prefix_ok(one, R"(<call>{"name":"h")"));
    EXPECT_FALSE(prefix_ok(one, " <call>"));
    EXPECT_FALSE(matches(one, R"(<call>{"name":"g","arguments":{}}</call><call>)"));
    auto many = tagged_json_grammar(alts, 1, 3, "\n");
    EXPECT_TRUE(matches(many, "<call>{\"name\":\"g\",\"arguments\":{}}</call>\n<call>{\"name\":\"f\",\"arguments\":{\"x\":2}}</call>"));
    EXPECT_FALSE(matches(many, ""));
    auto any_value = tagged_json_grammar({{"A:", "", ";"}}, 0, 2);
    EXPECT_TRUE(matches(any_value, ""));
    EXPECT_TRUE(matches(any_value, "A:[1];A:\"s\";"));
    EXPECT_THROW(tagged_json_grammar({}), GrammarError);
    EXPECT_THROW(tagged_json_grammar(alts, 2, 1), GrammarError);
}

void expect_refused(const std::string& schema, const std::string& keyword) {
    try {
        json_schema_grammar(schema);
        ADD_FAILURE() << "accepted: " << schema;
    } catch (const GrammarError& e) {
        EXPECT_EQ(e.keyword(), keyword) << e.what();
        if (!keyword.empty()) {
            EXPECT_NE(std::string(e.what()).find("'" + keyword + "'"), std::string::npos) << e.what();
        }
    }
}

TEST(Schema, RefusesUnsupportedKeywordsByName) {
    // Keywords that constrain and are not enforced (issue 51's policy).
    for (const char* kw : {"not", "minContains"})
        expect_refused(std::string(R"({"type":"object","properties":{"a":{"type":"string",")") + kw + R"(":{"pattern":"x"}}}})", kw);
    expect_refused(R"({"type":"array","contains":{"type":"string"},"unevaluatedItems":false})", "unevaluatedItems");
    expect_refused(R"({"type":"array","uniqueItems":true,"minItems":2})", "uniqueItems");
    expect_refused(R"({"type":"object","dependentSchemas":{"a":3}})", "dependentSchemas");
    expect_refused(R"({"type":"object","properties":{"a":{}},"required":["b"],"additionalProperties":false})", "required");
    expect_refused(R"({"type":"strings"})", "type");
    expect_refused(R"({"type":"object","properties":{"a":{"$ref":"#/$defs/missing"}}})", "$ref");
    expect_refused(R"({"$ref":"http://example.com/s.json"})", "$ref");
    expect_refused(R"({"enum":[]})", "enum");
    expect_refused(R"({"type":"array","minItems":5000})", "minItems");
    expect_refused(R"({"type":"array","minItems":3,"maxItems":2})", "maxItems");
    expect_refused(R"({"properties":{"a":false},"required":["a"]})", "false");
    expect_refused(R"({"type": )", "");
    expect_refused(R"([1,2])", "");
    std::string deep = R"({"type":"array","items":)";
    std::string s;
    for (int i = 0; i < 100; ++i) s += deep;
    s += "{}";
    for (int i = 0; i < 100; ++i) s += "}";
    expect_refused(s, "");
}

// A $ref that is the whole value (alone or as an anyOf alternative) means
// "or what the target allows", and must not become a left-recursive rule,
// which the grammar refuses.
TEST(Schema, RecursiveRefAsAWholeAlternative) {
    // The issue's schema: the root allows itself or null, i.e. null.
    auto self = json_schema_grammar(R"({"anyOf":[{"$ref":"#"},{"type":"null"}]})");
    EXPECT_TRUE(matches(self, "null"));
    EXPECT_FALSE(prefix_ok(self, "1"));
    EXPECT_FALSE(prefix_ok(self, "{"));

    // A linked list at the root: null, or a node whose "next" is a list.
    auto list = json_schema_grammar(R"({"anyOf":[{"$ref":"#"},{"type":"null"},
        {"type":"object","properties":{"v":{"type":"integer"},"next":{"$ref":"#"}},
         "required":["v","next"],"additionalProperties":false}]})");
    EXPECT_TRUE(matches(list, "null"));
    EXPECT_TRUE(matches(list, R"({"v":1,"next":{"v":2,"next":{"v":3,"next":null}}})"));
    EXPECT_FALSE(prefix_ok(list, R"({"v":1,"next":{"v":"x")"));
    EXPECT_FALSE(matches(list, R"({"v":1,"next":{"v":2}})"));
    EXPECT_FALSE(prefix_ok(list, R"({"v":1,"next":[)"));

    // Two definitions that name each other as whole alternatives: both are
    // an integer or an array of them, nested to any depth.
    auto mutual = json_schema_grammar(R"({"$defs":{
        "a":{"anyOf":[{"$ref":"#/$defs/b"},{"type":"integer"}]},
        "b":{"anyOf":[{"$ref":"#/definitions/a"},{"type":"array","items":{"$ref":"#/$defs/a"}}]}},
      "definitions":{"a":{"$ref":"#/$defs/a"}},
      "type":"object","properties":{"x":{"$ref":"#/$defs/b"}},"required":["x"],"additionalProperties":false})");
    EXPECT_TRUE(matches(mutual, R"({"x":7})"));
    EXPECT_TRUE(matches(mutual, R"({"x":[1,[2,[[]]],3]})"));
    EXPECT_FALSE(prefix_ok(mutual, R"({"x":[1,[true)"));
    EXPECT_FALSE(prefix_ok(mutual, R"({"x":"s")"));
}

// A target that leads only to itself matches nothing: a clear error, never
// a grammar that cannot end. Many targets, or self-references that branch,
// stay bounded.
TEST(Schema, HostileRecursiveRefsAreBounded) {
    expect_refused(R"({"$ref":"#"})", "$ref");
    expect_refused(R"({"anyOf":[{"$ref":"#"},{"$ref":"#"}]})", "$ref");
    expect_refused(R"({"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"anyOf":[{"$ref":"#/$defs/a"}]}},
                       "type":"array","items":{"$ref":"#/$defs/a"}})", "$ref");
    // Each definition names the next twice, 60 deep (a chain of $refs nests
    // like the schema, at most 64): one rule each, not 2^60.
    std::string defs;
    for (int i = 0; i < 60; ++i) {
        const std::string me = std::to_string(i), next = "{\"$ref\":\"#/$defs/d" + std::to_string(i + 1) + "\"}";
        defs += "\"d" + me + "\":{\"anyOf\":[" + next + "," + next + ",{\"const\":" + me + "}]},";
    }
    defs += R"("d60":{"anyOf":[{"$ref":"#/$defs/d0"},{"type":"null"}]})";
    auto chain = json_schema_grammar(R"({"$defs":{)" + defs + R"(},"type":"array","items":{"$ref":"#/$defs/d0"}})");
    EXPECT_TRUE(matches(chain, "[0,59,null,7]"));
    EXPECT_FALSE(prefix_ok(chain, "[60"));
    // Up to 5,000 different targets (Biome's schema has 2,768); more: a 400 naming the limit.
    auto targets = [](int n) {
        std::string many = R"({"$defs":{)";
        for (int i = 0; i < n; ++i) many += (i ? ",\"d" : "\"d") + std::to_string(i) + R"(":{"type":"null"})";
        many += R"(},"type":"object","properties":{)";
        for (int i = 0; i < n; ++i)
            many += (i ? ",\"p" : "\"p") + std::to_string(i) + R"(":{"$ref":"#/$defs/d)" + std::to_string(i) + "\"}";
        return many + "}}";
    };
    EXPECT_TRUE(prefix_ok(json_schema_grammar(targets(1001)), R"({"p0":null,"p1":null)"));
    try {
        json_schema_grammar(targets(5001));
        ADD_FAILURE() << "accepted 5,001 $ref targets";
    } catch (const GrammarError& e) {
        EXPECT_EQ(e.keyword(), "$ref");
        EXPECT_NE(std::string(e.what()).find("at most 5000 different schemas"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace eh::constrain

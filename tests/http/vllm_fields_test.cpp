// vLLM's structured-output request fields on /v1/completions and
// /v1/chat/completions, as parsed: guided_json / guided_regex /
// guided_choice / guided_grammar and structured_outputs {json, regex,
// choice, grammar, json_object}, mapped onto the same constraints as
// response_format and `grammar`; two at once is a 400.
#include <gtest/gtest.h>

#include "eh/constrain/automaton.hpp"
#include "parse/openai_request.hpp"

using namespace eh::http;
using namespace eh::service;
using Kind = OutputConstraint::Kind;

namespace {

const RequestLimits kLimits;
const std::string kChat = R"({"messages":[{"role":"user","content":"x"}],)";

OutputConstraint constraint_of(const std::string& fields, bool chat = true) {
    const std::string body = chat ? kChat + fields + "}" : R"({"prompt":"p",)" + fields + "}";
    return parse_openai_request(body, chat, kLimits).gen.constraint;
}

std::string error_of(const std::string& fields, bool chat = true) {
    try {
        constraint_of(fields, chat);
    } catch (const RequestError& e) {
        return e.field() + ": " + e.what();
    }
    return "";
}

// Does the prebuilt grammar match exactly `text`? (one byte per token)
bool matches(const OutputConstraint& c, const std::string& text) {
    std::vector<std::string> bytes;
    for (int b = 0; b < 256; ++b) bytes.emplace_back(1, char(b));
    bytes.emplace_back();
    auto vocab = std::make_shared<const eh::constrain::TokenVocab>(std::move(bytes), std::vector<int32_t>{256});
    eh::constrain::Matcher m(std::make_shared<eh::constrain::Automaton>(c.grammar, vocab));
    return m.accept_bytes(text) && m.accepting();
}

}  // namespace

TEST(VllmFields, GuidedFieldsMapOntoTheConstraints) {
    auto json = constraint_of(R"("guided_json":{"type": "object", "properties": {"a": {"type": "integer"}}})");
    EXPECT_EQ(json.kind, Kind::JsonSchema);
    EXPECT_EQ(json.field, "guided_json");
    EXPECT_EQ(json.text, R"({"type":"object","properties":{"a":{"type":"integer"}}})");
    // A schema sent as JSON text (as vLLM's clients may).
    auto text = constraint_of(R"("guided_json":"{\"type\": \"string\"}")", false);
    EXPECT_EQ(text.kind, Kind::JsonSchema);
    EXPECT_EQ(text.text, R"({"type":"string"})");
    auto rx = constraint_of(R"("guided_regex":"\\w+@\\w+\\.com")");
    EXPECT_EQ(rx.kind, Kind::Prebuilt);
    EXPECT_EQ(rx.field, "guided_regex");
    EXPECT_TRUE(matches(rx, "alan@enigma.com"));
    EXPECT_FALSE(matches(rx, "alan@enigma.org"));
    auto choice = constraint_of(R"("guided_choice":["positive","negative"])", false);
    EXPECT_EQ(choice.kind, Kind::Prebuilt);
    EXPECT_TRUE(matches(choice, "negative"));
    EXPECT_FALSE(matches(choice, "neutral"));
    // Different choices or patterns are different cache keys.
    EXPECT_NE(choice.text, constraint_of(R"("guided_choice":["positive"])").text);
    EXPECT_NE(rx.text, constraint_of(R"("guided_regex":"\\w+")").text);
    auto gr = constraint_of(R"("guided_grammar":"root ::= \"yes\" | \"no\"\n")");
    EXPECT_EQ(gr.kind, Kind::Grammar);
    EXPECT_EQ(gr.field, "guided_grammar");
    EXPECT_EQ(gr.text, "root ::= \"yes\" | \"no\"\n");
    // The backend choice is vLLM's business: accepted and ignored.
    EXPECT_EQ(constraint_of(R"("guided_choice":["a"],"guided_decoding_backend":"xgrammar")").kind, Kind::Prebuilt);
}

TEST(VllmFields, StructuredOutputsObject) {
    auto json = constraint_of(R"("structured_outputs":{"json":{"type":"boolean"}})", false);
    EXPECT_EQ(json.kind, Kind::JsonSchema);
    EXPECT_EQ(json.field, "structured_outputs");
    EXPECT_EQ(json.text, R"({"type":"boolean"})");
    auto rx = constraint_of(R"("structured_outputs":{"regex":"[0-9]{3}"})");
    EXPECT_TRUE(matches(rx, "123"));
    EXPECT_FALSE(matches(rx, "12"));
    auto choice = constraint_of(R"("structured_outputs":{"choice":["x","y"]})");
    EXPECT_TRUE(matches(choice, "y"));
    EXPECT_EQ(constraint_of(R"("structured_outputs":{"grammar":"root ::= \"a\"\n"})").kind, Kind::Grammar);
    EXPECT_EQ(constraint_of(R"("structured_outputs":{"json_object":true})").kind, Kind::JsonObject);
    EXPECT_EQ(constraint_of(R"("structured_outputs":null)").kind, Kind::None);
}

TEST(VllmFields, TwoConstraintsOrBadValuesAreA400NamingTheField) {
    struct Case {
        const char* fields;
        const char* error_starts;
    };
    for (const Case& c : std::vector<Case>{
             {R"("guided_json":{},"guided_regex":"a")", "guided_regex: give at most one output constraint; got 'guided_json' and 'guided_regex'"},
             {R"("response_format":{"type":"json_object"},"guided_choice":["a"])", "guided_choice: give at most one output constraint; got 'response_format' and 'guided_choice'"},
             {R"("structured_outputs":{"regex":"a","choice":["a"]})", "structured_outputs: give at most one output constraint; got 'structured_outputs.regex' and 'structured_outputs.choice'"},
             {R"("guided_grammar":"root ::= \"a\"\n","structured_outputs":{"json":{}})", "structured_outputs: give at most one"},
             {R"("structured_outputs":{})", "structured_outputs: 'structured_outputs' needs one of"},
             {R"("structured_outputs":"json")", "structured_outputs: 'structured_outputs' must be an object"},
             {R"("structured_outputs":{"whitespace_pattern":" "})", "structured_outputs: 'structured_outputs.whitespace_pattern' is not supported"},
             {R"("structured_outputs":{"structural_tag":{}})", "structured_outputs: 'structured_outputs.structural_tag' is not supported"},
             {R"("structured_outputs":{"json_object":false})", "structured_outputs: 'structured_outputs.json_object' must be true"},
             {R"("guided_whitespace_pattern":" ")", "guided_whitespace_pattern: "},
             {R"("guided_json":[1])", "guided_json: 'guided_json' must be an object"},
             {R"("guided_json":"{not json")", "guided_json: 'guided_json' must be a JSON schema"},
             {R"("guided_json":"[1]")", "guided_json: 'guided_json' must be a JSON schema"},
             {R"("guided_regex":3)", "guided_regex: 'guided_regex' must be a string"},
             {R"("guided_regex":"(a)\\1")", "guided_regex: 'pattern' \"(a)\\1\" uses a backreference"},
             {R"("guided_regex":"a{5000}")", "guided_regex: 'pattern' \"a{5000}\" has a repeat count above the limit"},
             {R"("guided_choice":[])", "guided_choice: the list of choices is empty"},
             {R"("guided_choice":"a")", "guided_choice: 'guided_choice' must be an array of strings"},
             {R"("guided_choice":["a",1])", "guided_choice: 'guided_choice' must hold strings only"},
             {R"("structured_outputs":{"choice":[null]})", "structured_outputs: 'structured_outputs.choice' must hold strings only"},
             {R"("guided_grammar":{})", "guided_grammar: 'guided_grammar' must be a string"},
         }) {
        for (bool chat : {true, false}) {
            const std::string err = error_of(c.fields, chat);
            EXPECT_EQ(err.rfind(c.error_starts, 0), 0u) << c.fields << " -> " << err;
        }
    }
    // response_format "text" asks for nothing, so it combines.
    EXPECT_EQ(constraint_of(R"("response_format":{"type":"text"},"guided_choice":["a"])").kind, Kind::Prebuilt);
}

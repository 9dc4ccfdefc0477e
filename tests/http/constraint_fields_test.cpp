// The request fields that constrain the output, as parsed (compiling them
// is Service's job; see structured_output_e2e_test.cpp).
#include <gtest/gtest.h>

#include "parse/native_request.hpp"
#include "parse/openai_request.hpp"

using namespace eh::http;
using namespace eh::service;
using Kind = OutputConstraint::Kind;

namespace {

const RequestLimits kLimits;

std::string error_of(const std::string& body, bool chat) {
    try {
        parse_openai_request(body, chat, kLimits);
    } catch (const RequestError& e) {
        return e.field() + ": " + e.what();
    }
    return "";
}

}  // namespace

TEST(ConstraintFields, ResponseFormatKinds) {
    const std::string chat = R"({"messages":[{"role":"user","content":"x"}],)";
    EXPECT_EQ(parse_openai_request(chat + R"("response_format":{"type":"text"}})", true, kLimits).gen.constraint.kind, Kind::None);
    EXPECT_EQ(parse_openai_request(chat + R"("response_format":null})", true, kLimits).gen.constraint.kind, Kind::None);
    auto obj = parse_openai_request(chat + R"("response_format":{"type":"json_object"}})", true, kLimits);
    EXPECT_EQ(obj.gen.constraint.kind, Kind::JsonObject);
    EXPECT_EQ(obj.gen.constraint.field, "response_format");
    auto sch = parse_openai_request(R"({"prompt":"p","response_format":{"type":"json_schema","json_schema":
        {"name":"n","strict":true,"schema":{"type": "object", "properties": {"a": {"type": "string"}}}}}})", false, kLimits);
    EXPECT_EQ(sch.gen.constraint.kind, Kind::JsonSchema);
    EXPECT_EQ(sch.gen.constraint.text, R"({"type":"object","properties":{"a":{"type":"string"}}})");
}

TEST(ConstraintFields, ResponseFormatErrorsNameTheField) {
    const std::string p = R"({"prompt":"p","response_format":)";
    for (const char* bad : {R"("json")", R"({})", R"({"type":"yaml"})", R"({"type":"json_schema"})",
                            R"({"type":"json_schema","json_schema":{"name":"n"}})",
                            R"({"type":"json_schema","json_schema":{"schema":[1]}})",
                            R"({"type":"json_schema","json_schema":{"schema":{},"strict":"yes"}})"}) {
        const std::string err = error_of(p + bad + "}", false);
        EXPECT_EQ(err.rfind("response_format", 0), 0u) << bad << " -> " << err;
    }
}

TEST(ConstraintFields, NativeGrammarAndSchema) {
    auto g = parse_execute_request(R"({"job_id":"a","prompt":"p","grammar":"root ::= \"x\"\n"})", kLimits);
    EXPECT_EQ(g.constraint.kind, Kind::Grammar);
    EXPECT_EQ(g.constraint.text, "root ::= \"x\"\n");
    EXPECT_EQ(g.constraint.field, "grammar");
    auto s = parse_execute_request(R"({"job_id":"a","prompt":"p","json_schema":{"enum":[1,2]}})", kLimits);
    EXPECT_EQ(s.constraint.kind, Kind::JsonSchema);
    EXPECT_EQ(s.constraint.text, R"({"enum":[1,2]})");
    EXPECT_EQ(parse_execute_request(R"({"job_id":"a","prompt":"p"})", kLimits).constraint.kind, Kind::None);
    EXPECT_THROW(parse_execute_request(R"({"job_id":"a","prompt":"p","grammar":1})", kLimits), RequestError);
    EXPECT_THROW(parse_execute_request(R"({"job_id":"a","prompt":"p","json_schema":"x"})", kLimits), RequestError);
    EXPECT_THROW(parse_execute_request(R"({"job_id":"a","prompt":"p","grammar":"","json_schema":{}})", kLimits), RequestError);
}

// Validation of request bodies: every rule names its field.
#include <gtest/gtest.h>

#include "parse/native_request.hpp"
#include "parse/openai_request.hpp"

using namespace eh::http;
using namespace eh::service;

namespace {

std::string field_of(const std::string& body) {
    try {
        parse_execute_request(body, RequestLimits{});
    } catch (const RequestError& e) {
        return e.field() + ": " + e.what();
    }
    return "ok";
}

}  // namespace

TEST(ExecuteRequest, ParsesEveryField) {
    auto r = parse_execute_request(
        R"({"job_id":"j","prompt":"hi","max_tokens":5,"temperature":0,"top_p":0.5,"top_k":3,"min_p":0.1,)"
        R"("repetition_penalty":1.1,"stop":["a","b"],"seed":18446744073709551615})",
        {});
    EXPECT_EQ(r.job_id, "j");
    EXPECT_EQ(*r.max_tokens, 5u);
    EXPECT_EQ(r.sampling.temperature, 0);
    EXPECT_EQ(r.sampling.top_k, 3);
    EXPECT_EQ(r.stop.size(), 2u);
    EXPECT_EQ(*r.sampling.seed, 18446744073709551615ull);
}

// The worker contract's output_mode: recorded as named, other strings
// ignored, never a reason to refuse; a non-string is a typed field's 400.
TEST(ExecuteRequest, OutputModeIsRecordedAndUnknownValuesIgnored) {
    for (const char* mode : {"text", "json", "edits"}) {
        auto r = parse_execute_request(std::string(R"({"job_id":"j","prompt":"hi","output_mode":")") + mode + "\"}", {});
        EXPECT_EQ(r.output_mode, mode);
    }
    EXPECT_EQ(parse_execute_request(R"({"job_id":"j","prompt":"hi","output_mode":"diff"})", {}).output_mode, "");
    EXPECT_EQ(parse_execute_request(R"({"job_id":"j","prompt":"hi"})", {}).output_mode, "");
    EXPECT_THROW(parse_execute_request(R"({"job_id":"j","prompt":"hi","output_mode":3})", {}), RequestError);
}

TEST(ExecuteRequest, EachRuleNamesItsField) {
    struct Case { const char* body; const char* starts; };
    const Case cases[] = {
        {R"({"prompt":"x"})", "job_id: 'job_id' is required"},
        {R"({"job_id":"","prompt":"x"})", "job_id: 'job_id' must not be empty"},
        {R"({"job_id":1,"prompt":"x"})", "job_id: 'job_id' must be a string, not integer"},
        {R"({"job_id":"j"})", "prompt: 'prompt' is required"},
        {R"({"job_id":"j","prompt":""})", "prompt: 'prompt' must not be empty"},
        {R"({"job_id":"j","prompt":"a\u0000b"})", "prompt: 'prompt' contains a NUL"},
        {R"({"job_id":"j","prompt":"x","max_tokens":0})", "max_tokens: 'max_tokens' must be between 1 and 16777216; got 0"},
        {R"({"job_id":"j","prompt":"x","max_tokens":16777217})", "max_tokens: 'max_tokens' must be between 1 and 16777216"},
        {R"({"job_id":"j","prompt":"x","max_tokens":1.5})", "max_tokens: 'max_tokens' must be an integer"},
        {R"({"job_id":"j","prompt":"x","max_tokens":"5"})", "max_tokens: 'max_tokens' must be an integer, not string"},
        {R"({"job_id":"j","prompt":"x","temperature":2.5})", "temperature: 'temperature' must be in [0, 2]"},
        {R"({"job_id":"j","prompt":"x","temperature":-0.1})", "temperature:"},
        {R"({"job_id":"j","prompt":"x","top_p":1.5})", "top_p:"},
        {R"({"job_id":"j","prompt":"x","top_k":-1})", "top_k:"},
        {R"({"job_id":"j","prompt":"x","min_p":2})", "min_p:"},
        {R"({"job_id":"j","prompt":"x","repetition_penalty":0})", "repetition_penalty: 'repetition_penalty' must be in (0, 2]"},
        {R"({"job_id":"j","prompt":"x","stop":["a","b","c","d","e"]})", "stop: 'stop' has more than 4 strings"},
        {R"({"job_id":"j","prompt":"x","stop":[""]})", "stop: 'stop[0]' must not be empty"},
        {R"({"job_id":"j","prompt":"x","stop":[1]})", "stop: 'stop[0]' must be a string"},
        {R"({"job_id":"j","prompt":"x","seed":-1})", "seed: 'seed' must be a non-negative integer"},
        {R"({"job_id":"j","prompt":"x","seed":1e30})", "seed:"},
        {R"({"job_id":"j","prompt":"x","bogus":1})", "bogus: unknown field 'bogus'"},
        {R"({"job_id":"j","job_id":"k","prompt":"x"})", "job_id: duplicate field 'job_id'"},
        {R"([1,2])", ": request body must be a JSON object, not array"},
        {R"({"job_id":"j",)", ": malformed JSON"},
        {"", ": request body is empty"},
    };
    for (const auto& c : cases) {
        std::string got = field_of(c.body);
        EXPECT_EQ(got.rfind(c.starts, 0), 0u) << "body " << c.body << "\n got " << got;
    }
}

TEST(ExecuteRequest, PenaltiesAndLogitBias) {
    RequestLimits lim;
    auto r = parse_execute_request(
        R"({"job_id":"a","prompt":"p","presence_penalty":0.5,"frequency_penalty":-1,"logit_bias":{"7":-100,"42":2.5}})", lim);
    EXPECT_DOUBLE_EQ(r.sampling.presence_penalty, 0.5);
    EXPECT_DOUBLE_EQ(r.sampling.frequency_penalty, -1.0);
    ASSERT_EQ(r.sampling.logit_bias.size(), 2u);
    EXPECT_EQ(r.sampling.logit_bias[0], (std::pair<int32_t, float>{7, -100.0f}));
    EXPECT_EQ(r.sampling.logit_bias[1], (std::pair<int32_t, float>{42, 2.5f}));
    EXPECT_TRUE(r.sampling.needs_batched_engine());
    EXPECT_FALSE(parse_execute_request(R"({"job_id":"a","prompt":"p"})", lim).sampling.needs_batched_engine());
    for (auto [body, starts] : std::vector<std::pair<std::string, std::string>>{
             {R"({"job_id":"a","prompt":"p","presence_penalty":2.5})", "presence_penalty: 'presence_penalty' must be in [-2, 2]"},
             {R"({"job_id":"a","prompt":"p","logit_bias":[1]})", "logit_bias: 'logit_bias' must be an object"},
             {R"({"job_id":"a","prompt":"p","logit_bias":{"x":1}})", "logit_bias: 'logit_bias' keys must be token ids"},
             {R"({"job_id":"a","prompt":"p","logit_bias":{"-1":1}})", "logit_bias: 'logit_bias' keys must be token ids"},
             {R"({"job_id":"a","prompt":"p","logit_bias":{"99999999999":1}})", "logit_bias: 'logit_bias' keys must be token ids"},
             {R"({"job_id":"a","prompt":"p","logit_bias":{"1":101}})", "logit_bias: 'logit_bias' values must be between -100 and 100"},
             {R"({"job_id":"a","prompt":"p","logit_bias":{"1":"a"}})", "logit_bias: 'logit_bias' values must be numbers"}}) {
        std::string got = field_of(body);
        EXPECT_EQ(got.rfind(starts, 0), 0u) << body << "\n got " << got;
    }
    lim.max_logit_bias = 2;
    EXPECT_THROW(parse_execute_request(R"({"job_id":"a","prompt":"p","logit_bias":{"1":1,"2":1,"3":1}})", lim), RequestError);
}

TEST(ExecuteRequest, PromptLengthCountsCharactersNotBytes) {
    RequestLimits lim;
    lim.max_prompt_chars = 3;
    EXPECT_NO_THROW(parse_execute_request(R"({"job_id":"j","prompt":"\u00e9\u00e9\u00e9"})", lim));
    EXPECT_THROW(parse_execute_request(R"({"job_id":"j","prompt":"abcd"})", lim), RequestError);
}

// By default only the context limits a prompt (in tokens, when it is
// submitted): a 100,000-character prompt parses.
TEST(ExecuteRequest, PromptsHaveNoCharacterCapByDefault) {
    const std::string prompt(100000, 'a');
    EXPECT_NO_THROW(parse_execute_request(R"({"job_id":"j","prompt":")" + prompt + R"("})", RequestLimits{}));
}

TEST(ExecuteRequest, InvalidUtf8IsMalformed) {
    std::string body = "{\"job_id\":\"j\",\"prompt\":\"\xC3\x28\"}";
    EXPECT_NE(field_of(body).find("malformed JSON"), std::string::npos);
}

TEST(OpenAIRequest, ChatAndCompletionsFields) {
    auto c = parse_openai_request(
        R"({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],)"
        R"("max_completion_tokens":7,"stream":true,"stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":2})",
        true, {});
    EXPECT_EQ(c.messages.size(), 1u);
    EXPECT_EQ(c.messages[0].content, "hi");
    EXPECT_EQ(*c.gen.max_tokens, 7u);
    EXPECT_TRUE(c.stream && c.include_usage && c.logprobs);
    EXPECT_EQ(c.gen.top_logprobs, 2);
    auto p = parse_openai_request(R"({"model":"m","prompt":"x","unknown_field":1})", false, {});
    EXPECT_EQ(*p.gen.max_tokens, 16u);  // OpenAI's default
    EXPECT_THROW(parse_openai_request(R"({"messages":[{"role":"wizard","content":"x"}]})", true, {}), RequestError);
    EXPECT_THROW(parse_openai_request(R"({"messages":[]})", true, {}), RequestError);
    EXPECT_THROW(parse_openai_request(R"({"prompt":"x","n":17})", false, {}), RequestError);
    EXPECT_THROW(parse_openai_request(R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})", true, {}),
                 RequestError);
}

TEST(RequestContext, ExecuteParsesNCtx) {
    RequestLimits lim;
    auto r = parse_execute_request(R"({"job_id":"a","prompt":"p","n_ctx":8192})", lim);
    ASSERT_TRUE(r.n_ctx);
    EXPECT_EQ(*r.n_ctx, 8192u);
    EXPECT_FALSE(parse_execute_request(R"({"job_id":"a","prompt":"p"})", lim).n_ctx);
    for (const char* bad : {R"({"job_id":"a","prompt":"p","n_ctx":0})", R"({"job_id":"a","prompt":"p","n_ctx":"9"})",
                            R"({"job_id":"a","prompt":"p","n_ctx":16777217})"}) {
        try {
            parse_execute_request(bad, lim);
            FAIL() << bad;
        } catch (const RequestError& e) {
            EXPECT_EQ(e.field(), "n_ctx") << bad;
        }
    }
}

namespace {

// "field: message" of the RequestError a parser throws, "ok" if none.
template <class Parse>
std::string error_text(Parse parse) {
    try {
        parse();
    } catch (const RequestError& e) {
        return e.field() + ": " + e.what();
    }
    return "ok";
}

}  // namespace

// Two values for one key: a gateway in front (Python, JavaScript: last wins)
// and this parser (simdjson: first wins) would read different requests, so
// a repeated key is refused at every depth, not only at the top.
TEST(DuplicateKeys, RefusedAtEveryDepthWithThePath) {
    auto openai = [](std::string body, bool chat = true) {
        return error_text([&] { parse_openai_request(body, chat, RequestLimits{}); });
    };
    EXPECT_EQ(openai(R"({"messages":[{"role":"system","role":"user","content":"hi"}]})"),
              "messages: duplicate field 'messages[0].role'");
    // Keys compare after unescaping: "r\u006fle" is "role".
    EXPECT_EQ(openai(R"({"messages":[{"role":"user","content":"a"},{"role":"user","r\u006fle":"system","content":"b"}]})"),
              "messages: duplicate field 'messages[1].role'");
    EXPECT_EQ(openai(R"({"messages":[{"role":"user","content":[{"type":"text","text":"a","text":"b"}]}]})"),
              "messages: duplicate field 'messages[0].content[0].text'");
    EXPECT_EQ(openai(R"({"prompt":"x","logit_bias":{"7":1,"7":-100}})", false), "logit_bias: duplicate field 'logit_bias.7'");
    EXPECT_EQ(openai(R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema",)"
                     R"("json_schema":{"name":"n","schema":{"type":"object","properties":{"a":{"type":"string","type":"integer"}}}}}})"),
              "response_format: duplicate field 'response_format.json_schema.schema.properties.a.type'");
    EXPECT_EQ(openai(R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f",)"
                     R"("parameters":{"type":"object","properties":{"p":{},"p":{}}}}}]})"),
              "tools: duplicate field 'tools[0].function.parameters.properties.p'");
    // The top level keeps its message.
    EXPECT_EQ(openai(R"({"model":"a","model":"b","prompt":"x"})", false), "model: duplicate field 'model'");

    auto execute = [](std::string body) { return error_text([&] { parse_execute_request(body, RequestLimits{}); }); };
    EXPECT_EQ(execute(R"({"job_id":"j","prompt":"x","json_schema":{"anyOf":[{"const":1},{"const":2,"const":3}]}})"),
              "json_schema: duplicate field 'json_schema.anyOf[1].const'");
    EXPECT_EQ(execute(R"({"job_id":"j","prompt":"x","stop":["a"],"logit_bias":{"1":1,"2":2,"1":3}})"),
              "logit_bias: duplicate field 'logit_bias.1'");
    // The same key in sibling objects, or at two depths, is no duplicate.
    EXPECT_EQ(openai(R"({"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},)"
                     R"({"role":"user","content":[{"type":"text","text":"c"},{"type":"text","text":"d"}]}]})"),
              "ok");
    EXPECT_EQ(execute(R"({"job_id":"j","prompt":"x","json_schema":{"type":"object","properties":{"type":{"type":"string"}}}})"),
              "ok");
}

// The scan keeps its own stack: a duplicate under simdjson's deepest
// nesting is found without recursion, and the path says where.
TEST(DuplicateKeys, DeepNestingIsScannedWithoutRecursion) {
    const int depth = 1000;
    std::string deep;
    for (int i = 0; i < depth; ++i) deep += "[";
    deep += R"({"k":1,"k":2})";
    for (int i = 0; i < depth; ++i) deep += "]";
    std::string got = error_text([&] {
        parse_execute_request(R"({"job_id":"j","prompt":"x","json_schema":{"enum":)" + deep + "}}", RequestLimits{});
    });
    std::string want_path = "json_schema.enum";
    for (int i = 0; i < depth; ++i) want_path += "[0]";
    EXPECT_EQ(got, "json_schema: duplicate field '" + want_path + ".k'");
}

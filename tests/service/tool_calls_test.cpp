// The chat output parsers (Hermes <tool_call> blocks, gpt-oss harmony) on
// injected text: whole and split at every byte, malformed calls as
// content; the template message shape; forced tool calls as a constraint.
// (The tool request fields, as parsed: tests/http/tool_request_test.cpp.)
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "eh/service/chat_output.hpp"
#include "eh/service/chat_prompt.hpp"
#include "eh/service/constraint_cache.hpp"
#include "eh/service/request.hpp"

using namespace eh;
using namespace eh::service;

namespace {

// A parse folded into one result, so whole and streamed runs compare.
struct Result {
    std::string content, reasoning;
    std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
    std::vector<std::string> ids;
    bool opens_ok = true;  // every CallOpen came before its CallArgs, indexes in order

    void add(const ChatPieces& ps) {
        for (const auto& p : ps) {
            switch (p.kind) {
            case ChatPiece::Kind::Content: content += p.text; break;
            case ChatPiece::Kind::Reasoning: reasoning += p.text; break;
            case ChatPiece::Kind::CallOpen:
                opens_ok = opens_ok && p.index == calls.size() && p.id.rfind("call_", 0) == 0 && p.id.size() == 29;
                calls.push_back({p.name, ""});
                ids.push_back(p.id);
                break;
            case ChatPiece::Kind::CallArgs:
                opens_ok = opens_ok && p.index + 1 == calls.size();
                if (p.index < calls.size()) calls[p.index].second += p.text;
                break;
            }
        }
    }
};

Result parse(ToolFormat f, std::string_view text, ChatParseOptions o = {true, true}, size_t chunk = 0) {
    auto p = make_chat_output_parser(f, o);
    Result r;
    if (chunk == 0) {
        r.add(p->feed(text));
    } else {
        for (size_t i = 0; i < text.size(); i += chunk) r.add(p->feed(text.substr(i, chunk)));
    }
    r.add(p->finish());
    EXPECT_EQ(p->calls(), r.calls.size());
    return r;
}

// Same result whether the text comes whole, a byte at a time or in 3s and 7s.
Result parse_all_ways(ToolFormat f, std::string_view text, ChatParseOptions o = {true, true}) {
    Result whole = parse(f, text, o);
    for (size_t chunk : {1, 3, 7}) {
        Result r = parse(f, text, o, chunk);
        EXPECT_EQ(r.content, whole.content) << "chunk " << chunk;
        EXPECT_EQ(r.reasoning, whole.reasoning) << "chunk " << chunk;
        EXPECT_EQ(r.calls, whole.calls) << "chunk " << chunk;
        EXPECT_TRUE(r.opens_ok);
    }
    EXPECT_TRUE(whole.opens_ok);
    return whole;
}

using Calls = std::vector<std::pair<std::string, std::string>>;

TEST(HermesParser, OneCall) {
    auto r = parse_all_ways(ToolFormat::Hermes,
                            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>");
    EXPECT_EQ(r.content, "");
    EXPECT_EQ(r.calls, (Calls{{"get_weather", R"({"city":"Paris","days":2})"}}));
}

TEST(HermesParser, TextThenTwoCallsArgumentOrderKept) {
    auto r = parse_all_ways(ToolFormat::Hermes,
                            "Let me check both.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"z\": 1, \"a\": [true, null]}}\n"
                            "</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": \"{\\\"q\\\": \\\"x\\\"}\"}\n</tool_call>\n");
    EXPECT_EQ(r.content, "Let me check both.");
    EXPECT_EQ(r.calls, (Calls{{"a", R"({"z":1,"a":[true,null]})"}, {"b", R"({"q": "x"})"}}));
    EXPECT_NE(r.ids[0], r.ids[1]);
}

TEST(HermesParser, ParallelFalseKeepsTheFirstCall) {
    auto r = parse_all_ways(ToolFormat::Hermes,
                            "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call><tool_call>{\"name\":\"b\",\"arguments\":{}}</tool_call>",
                            {true, false});
    EXPECT_EQ(r.calls, (Calls{{"a", "{}"}}));
}

TEST(HermesParser, MalformedBlocksAreContent) {
    for (std::string bad : {"<tool_call>\n{\"name\": \"f\" \"arguments\": {}}\n</tool_call>",  // bad JSON
                            "<tool_call>{\"arguments\": {}}</tool_call>",                          // no name
                            "<tool_call>{\"name\": 3}</tool_call>",                                // name not a string
                            "<tool_call>[1,2]</tool_call>",                                        // not an object
                            "<tool_call>{\"name\": \"f\", \"arguments\": 5}</tool_call>",          // bad arguments
                            "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{}\""}) {          // never closed
        auto r = parse_all_ways(ToolFormat::Hermes, "ok " + bad);
        EXPECT_TRUE(r.calls.empty()) << bad;
        EXPECT_EQ(r.content, "ok " + bad);
    }
}

// OpenAI streams a call's arguments as the model writes them: a block that
// starts {"name": "<offered>", "arguments": { is a call from its '{' on,
// and each byte of the arguments leaves the parser as soon as it cannot be
// the start of </tool_call>.
TEST(HermesParser, ArgumentsStreamAsTheyArrive) {
    const std::string text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa ris<\", \"n\": [1, {\"d\": 2}]}}\n</tool_call>";
    auto p = make_chat_output_parser(ToolFormat::Hermes, {true, true, {"get_weather"}});
    Result r;
    const size_t args_at = text.find("{\"city");
    for (size_t i = 0; i < text.size(); ++i) {
        r.add(p->feed(text.substr(i, 1)));
        if (i + 1 == args_at) EXPECT_TRUE(r.calls.empty()) << "no call before its arguments begin";
        if (i == args_at) {
            ASSERT_EQ(r.calls.size(), 1u);
            EXPECT_EQ(r.calls[0].first, "get_weather");
            EXPECT_EQ(r.calls[0].second, "{");
        }
        if (i + 1 == text.find("ris<"))
            EXPECT_EQ(r.calls[0].second, "{\"city\":\"Pa ") << "whitespace inside strings is kept";
        if (i + 1 == text.find("}}\n</tool_call>") + 1) EXPECT_EQ(r.calls[0].second, R"({"city":"Pa ris<","n":[1,{"d":2}]})");
    }
    r.add(p->finish());
    EXPECT_EQ(r.calls, (Calls{{"get_weather", R"({"city":"Pa ris<","n":[1,{"d":2}]})"}}));
    EXPECT_EQ(r.content, "");
    EXPECT_TRUE(r.opens_ok);
}

// Once a block's start made it a call, the call stands: arguments that are
// not valid JSON are passed as written (tool_choice required/named makes
// them valid by construction), and a block cut off (max_tokens) keeps the
// arguments written so far. Text after the arguments' closing brace up to
// </tool_call> is dropped.
TEST(HermesParser, StreamedCallsStandOnceStarted) {
    auto bad = parse_all_ways(ToolFormat::Hermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": }\n</tool_call>");
    EXPECT_EQ(bad.calls, (Calls{{"f", R"({"x":})"}}));
    auto cut = parse_all_ways(ToolFormat::Hermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": [1, 2");
    EXPECT_EQ(cut.calls, (Calls{{"f", R"({"x":[1,2)"}}));
    EXPECT_EQ(cut.content, "");
    auto closed_inside = parse_all_ways(ToolFormat::Hermes, "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": </tool_call> after");
    EXPECT_EQ(closed_inside.calls, (Calls{{"f", R"({"x":)"}}));
    EXPECT_EQ(closed_inside.content, "after");
    auto trailing = parse_all_ways(ToolFormat::Hermes, "<tool_call>{\"name\": \"f\", \"arguments\": {}, \"extra\": 1}</tool_call>");
    EXPECT_EQ(trailing.calls, (Calls{{"f", "{}"}}));
    EXPECT_EQ(trailing.content, "");
    // Past 1,024 bytes a block's start is not read as the usual one: the
    // block waits for its end, then is read whole.
    const std::string far = "<tool_call>" + std::string(1100, ' ') + "{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>";
    EXPECT_EQ(parse_all_ways(ToolFormat::Hermes, far).calls, (Calls{{"f", R"({"a":1})"}}));
}

TEST(HermesParser, PlainTextIsUntouched) {
    const std::string text = "a < b, <tool and <tool_cal are text;  trailing space \n";
    auto r = parse_all_ways(ToolFormat::Hermes, text);
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.calls.empty());
}

TEST(HermesParser, CallsOfFunctionsNotOfferedAreContent) {
    const std::string text = "<tool_call>{\"name\":\"rm_rf\",\"arguments\":{}}</tool_call>";
    ChatParseOptions o{true, true, {"get_weather"}};
    auto r = parse_all_ways(ToolFormat::Hermes, text, o);
    EXPECT_TRUE(r.calls.empty());
    EXPECT_EQ(r.content, text);
    auto ok = parse_all_ways(ToolFormat::Hermes, "<tool_call>{\"name\":\"get_weather\",\"arguments\":{}}</tool_call>", o);
    EXPECT_EQ(ok.calls.size(), 1u);
}

TEST(HermesParser, WithoutToolsEverythingIsContent) {
    const std::string text = "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>";
    auto r = parse_all_ways(ToolFormat::Hermes, text, {false, true});
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.calls.empty());
}

TEST(HarmonyParser, AnalysisThenFinal) {
    auto r = parse_all_ways(ToolFormat::Harmony,
                            "<|channel|>analysis<|message|>User greets. Reply.<|end|><|start|>assistant<|channel|>final"
                            "<|message|>Hello! How can I help?");
    EXPECT_EQ(r.reasoning, "User greets. Reply.");
    EXPECT_EQ(r.content, "Hello! How can I help?");
    EXPECT_TRUE(r.calls.empty());
}

TEST(HarmonyParser, ToolCallRecipientAfterOrBeforeTheChannel) {
    for (std::string header : {"<|channel|>commentary to=functions.get_weather <|constrain|>json",
                               " to=functions.get_weather<|channel|>commentary json"}) {
        auto r = parse_all_ways(ToolFormat::Harmony,
                                "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant" + header +
                                    "<|message|>{\"city\":\"Paris\"}<|call|>");
        EXPECT_EQ(r.reasoning, "Need weather.") << header;
        EXPECT_EQ(r.content, "") << header;
        EXPECT_EQ(r.calls, (Calls{{"get_weather", R"({"city":"Paris"})"}})) << header;
    }
}

TEST(HarmonyParser, MarkupNeverLeaks) {
    // Cut inside a header (max_tokens), a final answer ending with <|return|>,
    // a commentary preamble (content).
    auto cut = parse_all_ways(ToolFormat::Harmony, "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|chan");
    EXPECT_EQ(cut.reasoning, "think");
    EXPECT_EQ(cut.content, "");
    auto ret = parse_all_ways(ToolFormat::Harmony, "<|channel|>final<|message|>Done.<|return|>");
    EXPECT_EQ(ret.content, "Done.");
    auto pre = parse_all_ways(ToolFormat::Harmony, "<|channel|>commentary<|message|>Checking.<|end|>");
    EXPECT_EQ(pre.content, "Checking.");
}

TEST(HarmonyParser, CallOfAFunctionNotOfferedIsContent) {
    auto r = parse_all_ways(ToolFormat::Harmony, "<|channel|>commentary to=functions.rm_rf json<|message|>{}<|call|>",
                            {true, true, {"get_weather"}});
    EXPECT_TRUE(r.calls.empty());
    EXPECT_EQ(r.content, "{}");
}

TEST(HarmonyParser, CallWithoutToolsOfferedIsContent) {
    auto r = parse_all_ways(ToolFormat::Harmony, "<|channel|>commentary to=functions.f json<|message|>{}<|call|>",
                            {false, true});
    EXPECT_TRUE(r.calls.empty());
    EXPECT_EQ(r.content, "{}");
}

TEST(HarmonyParser, TextWithoutHarmonyIsContent) {
    auto r = parse_all_ways(ToolFormat::Harmony, "just words, no channels");
    EXPECT_EQ(r.content, "just words, no channels");
    std::string long_text(3000, 'x');
    auto l = parse_all_ways(ToolFormat::Harmony, long_text);
    EXPECT_EQ(l.content, long_text);
    // A <|message|> just inside and just past the header bound (found by
    // fuzz_tool_calls: the whole text took a far marker as a header's end
    // while a stream had already given up on the header).
    for (size_t n : {1000u, 1010u, 1014u, 1015u, 1016u, 1020u, 1100u}) {
        SCOPED_TRACE("header of " + std::to_string(n) + " bytes");
        const std::string text = "<|start|>assistant" + std::string(n - 18, 'h') + "<|message|>body<|end|>";
        parse_all_ways(ToolFormat::Harmony, text);
    }
}

TEST(TemplateMessages, ShapeTransformersTemplatesExpect) {
    std::vector<ChatMessage> msgs(3);
    msgs[0].role = "user";
    msgs[0].content = "Weather?";
    msgs[1].role = "assistant";
    msgs[1].tool_calls = {{"call_1", "get_weather", R"({"unit":"c","city":"Paris"})"}, {"", "f", "not json"}};
    msgs[1].reasoning = "Need a tool.";
    msgs[2].role = "tool";
    msgs[2].content = "21C";
    msgs[2].tool_call_id = "call_1";
    EXPECT_EQ(template_messages_json(msgs),
              R"([{"role":"user","content":"Weather?"},)"
              R"({"role":"assistant","content":"","thinking":"Need a tool.","tool_calls":[)"
              R"({"type":"function","function":{"name":"get_weather","arguments":{"unit":"c","city":"Paris"}},"id":"call_1"},)"
              R"({"type":"function","function":{"name":"f","arguments":"not json"}}]},)"
              R"({"role":"tool","content":"21C","tool_call_id":"call_1"}])");
}

TEST(ToolFormat, FromTheTemplateText) {
    EXPECT_EQ(tool_format_of_template("{{- '<tool_call>\\n' }}...{{- '</tool_call>' }}"), ToolFormat::Hermes);
    EXPECT_EQ(tool_format_of_template("<|start|>assistant to=functions.x<|channel|>commentary<|call|>"), ToolFormat::Harmony);
    EXPECT_EQ(tool_format_of_template("{% for m in messages %}<|user|>{{ m.content }}{% endfor %}"), ToolFormat::None);
}

// A chat request offering `tools` (name and parameters schema, "" for
// none) with `choice` (Named: the first tool), as the parsers give it.
ChatRequest offering(const std::vector<std::pair<std::string, std::string>>& tools,
                     ChatToolRequest::Choice choice = ChatToolRequest::Choice::Required) {
    ChatRequest r;
    nlohmann::json as_json = nlohmann::json::array();
    for (const auto& [name, schema] : tools) {
        r.tools.tools.push_back({name, schema});
        nlohmann::json fn = {{"name", name}};
        if (!schema.empty()) fn["parameters"] = nlohmann::json::parse(schema);
        as_json.push_back({{"type", "function"}, {"function", fn}});
    }
    r.tools.tools_json = as_json.dump();
    r.tools.choice = choice;
    if (choice == ChatToolRequest::Choice::Named) r.tools.named = tools.at(0).first;
    return r;
}

const std::pair<std::string, std::string> kWeather = {
    "get_weather", R"({"type":"object","properties":{"city":{"type":"string"}}})"};

}  // namespace

TEST(ToolConstraint, ForcedCallsBecomeAConstraint) {
    auto r = offering({kWeather});
    r.gen.prompt = "P";
    constrain_tool_call(r, ToolFormat::Hermes, ByteCodec());
    EXPECT_EQ(r.gen.constraint.kind, OutputConstraint::Kind::Prebuilt);
    EXPECT_EQ(r.gen.constraint.field, "tool_choice");
    ASSERT_TRUE(r.gen.constraint.grammar);
    EXPECT_EQ(r.gen.prompt, "P");  // Hermes: nothing prefilled
    auto h = offering({kWeather}, ChatToolRequest::Choice::Named);
    h.gen.prompt = "P";
    constrain_tool_call(h, ToolFormat::Harmony, ByteCodec());
    EXPECT_EQ(h.tools.prefill, "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>");
    EXPECT_EQ(h.gen.prompt, "P" + h.tools.prefill);
    EXPECT_NE(h.gen.constraint.text, r.gen.constraint.text);  // cache keys differ with the grammar
    // Two tools, "required", harmony: the header is prefilled up to the
    // name; the output is the name, the rest of the header and the
    // arguments (ByteCodec has no control tokens: the markup is text).
    auto two = offering({kWeather, {"b", ""}});
    two.gen.prompt = "P";
    constrain_tool_call(two, ToolFormat::Harmony, ByteCodec());
    EXPECT_EQ(two.tools.prefill, "<|channel|>commentary to=functions.");
    EXPECT_EQ(two.gen.prompt, "P<|channel|>commentary to=functions.");
    ASSERT_TRUE(two.gen.constraint.grammar);
    // A parameters schema with a keyword the grammar cannot enforce names it.
    auto bad = offering({{"f", R"({"type":"object","properties":{"z":{"type":"array","contains":{},"minContains":2}}})"}});
    try {
        constrain_tool_call(bad, ToolFormat::Hermes, ByteCodec());
        FAIL();
    } catch (const RequestError& e) {
        EXPECT_EQ(e.field(), "tools");
        EXPECT_NE(std::string(e.what()).find("minContains"), std::string::npos) << e.what();
    }
}

namespace {

// Bytes as tokens 0-255, plus harmony's header markup as control tokens
// (they add no output text; decode_with_control writes them), and <|call|>
// ending generation: how gpt-oss's vocabulary looks to the mask.
class HarmonyControlCodec : public ByteCodec {
public:
    static constexpr int32_t kConstrain = 256, kMessage = 257, kCall = 258;
    HarmonyControlCodec() : ByteCodec(259, kCall) {}
    std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special = false,
                                std::span<const TextSpan> literal = {}) const override {
        if (parse_special)
            for (int32_t id : {kConstrain, kMessage, kCall})
                if (text == special(id)) return {id};
        return ByteCodec::encode(text, add_special, parse_special, literal);
    }
    std::string token_bytes(int32_t t) const override { return t >= 256 ? "" : ByteCodec::token_bytes(t); }
    std::string decode_with_control(std::span<const int32_t> tokens) const override {
        std::string out;
        for (int32_t t : tokens) out += t >= 256 ? special(t) : ByteCodec::token_bytes(t);
        return out;
    }

private:
    static std::string special(int32_t id) {
        return id == kConstrain ? "<|constrain|>" : id == kMessage ? "<|message|>" : "<|call|>";
    }
};

bool allowed(const constrain::Mask& m, int32_t id) { return (m[size_t(id) / 32] >> (id % 32)) & 1u; }

}  // namespace

// tool_choice "required" with several tools on a harmony model: the output
// after the prefilled "to=functions." is a tool's name, then the header's
// control tokens (which the mask allows as themselves, never as their text
// spelled in bytes), then arguments matching that tool's schema.
TEST(ToolConstraint, HarmonyRequiredWithSeveralToolsWritesTheHeaderControlTokens) {
    auto codec = std::make_shared<HarmonyControlCodec>();
    auto r = offering({kWeather, {"get_time", R"({"type":"object","properties":)"
                                              R"({"zone":{"type":"string","enum":["UTC"]}},"required":["zone"],)"
                                              R"("additionalProperties":false})"}});
    constrain_tool_call(r, ToolFormat::Harmony, *codec);
    EXPECT_EQ(r.tools.prefill, "<|channel|>commentary to=functions.");
    ConstraintCache cache(codec, codec->vocab_size());
    constrain::Matcher m(cache.get(r.gen.constraint));
    EXPECT_FALSE(allowed(*m.mask(), HarmonyControlCodec::kMessage));
    for (char c : std::string("get_time ")) ASSERT_TRUE(m.accept(int32_t(uint8_t(c)))) << c;
    auto mask = m.mask();
    EXPECT_TRUE(allowed(*mask, HarmonyControlCodec::kConstrain));
    EXPECT_FALSE(allowed(*mask, '<')) << "the markup is the control token, not its text";
    ASSERT_TRUE(m.accept(HarmonyControlCodec::kConstrain));
    for (char c : std::string("json")) ASSERT_TRUE(m.accept(int32_t(uint8_t(c))));
    EXPECT_TRUE(allowed(*m.mask(), HarmonyControlCodec::kMessage));
    ASSERT_TRUE(m.accept(HarmonyControlCodec::kMessage));
    EXPECT_FALSE(m.accept(HarmonyControlCodec::kMessage)) << "a control token only where the grammar names it";
    for (char c : std::string(R"({"zone":"UTC"})")) ASSERT_TRUE(m.accept(int32_t(uint8_t(c)))) << c;
    EXPECT_TRUE(m.complete());
    EXPECT_TRUE(allowed(*m.mask(), HarmonyControlCodec::kCall));
    // The output, decoded with its control tokens after the prefill, parses
    // as the call.
    auto p = make_chat_output_parser(ToolFormat::Harmony, {true, true, {"get_weather", "get_time"}});
    Result res;
    res.add(p->feed(r.tools.prefill + "get_time <|constrain|>json<|message|>{\"zone\":\"UTC\"}"));
    res.add(p->finish());
    EXPECT_EQ(res.calls, (Calls{{"get_time", R"({"zone":"UTC"})"}}));
    // A JSON schema's grammar never allows a control token, even inside a
    // string where its text would fit.
    OutputConstraint schema;
    schema.kind = OutputConstraint::Kind::JsonSchema;
    schema.text = R"({"type":"object","properties":{"s":{"type":"string"}}})";
    schema.field = "response_format";
    constrain::Matcher s(cache.get(schema));
    for (char c : std::string(R"({"s":")")) ASSERT_TRUE(s.accept(int32_t(uint8_t(c))));
    EXPECT_TRUE(allowed(*s.mask(), '<'));
    EXPECT_FALSE(allowed(*s.mask(), HarmonyControlCodec::kMessage));
}

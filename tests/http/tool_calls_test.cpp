// The chat output parsers (Hermes <tool_call> blocks, gpt-oss harmony) on
// injected text: whole and split at every byte, malformed calls as
// content; the template message shape; the tool request fields.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>

#include "eh/service/chat_output.hpp"
#include "eh/service/request.hpp"
#include "eh/service/chat_prompt.hpp"

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
    for (std::string bad : {"<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": }\n</tool_call>",  // bad JSON
                            "<tool_call>{\"arguments\": {}}</tool_call>",                          // no name
                            "<tool_call>{\"name\": 3}</tool_call>",                                // name not a string
                            "<tool_call>[1,2]</tool_call>",                                        // not an object
                            "<tool_call>{\"name\": \"f\", \"arguments\": 5}</tool_call>",          // bad arguments
                            "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}"}) {               // never closed
        auto r = parse_all_ways(ToolFormat::Hermes, "ok " + bad);
        EXPECT_TRUE(r.calls.empty()) << bad;
        EXPECT_EQ(r.content, "ok " + bad);
    }
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

// ---- request fields ---------------------------------------------------------

const char* kTool = R"({"type":"function","function":{"name":"get_weather","description":"d",)"
                    R"("parameters":{"type":"object","properties":{"city":{"type":"string"}}}}})";

OpenAIRequest chat(const std::string& extra, const std::string& messages = R"([{"role":"user","content":"x"}])") {
    return parse_openai_request(R"({"messages":)" + messages + (extra.empty() ? "" : "," + extra) + "}", true, {});
}

std::string error_of(const std::string& extra, const std::string& messages = R"([{"role":"user","content":"x"}])") {
    try {
        chat(extra, messages);
    } catch (const RequestError& e) {
        return e.field() + ": " + e.what();
    }
    return "";
}

TEST(ToolRequest, ToolsAndChoices) {
    auto r = chat(std::string(R"("tools":[)") + kTool + "]");
    ASSERT_EQ(r.tools.tools.size(), 1u);
    EXPECT_EQ(r.tools.tools[0].name, "get_weather");
    EXPECT_EQ(r.tools.tools[0].parameters_json, R"({"type":"object","properties":{"city":{"type":"string"}}})");
    EXPECT_EQ(r.tools.choice, ChatToolRequest::Choice::Auto);
    EXPECT_TRUE(r.tools.enabled());
    EXPECT_FALSE(r.tools.forced());
    EXPECT_EQ(nlohmann::json::parse(r.tools.tools_json)[0]["function"]["name"], "get_weather");
    auto none = chat(std::string(R"("tool_choice":"none","tools":[)") + kTool + "]");
    EXPECT_FALSE(none.tools.enabled());
    auto named = chat(std::string(R"("tool_choice":{"type":"function","function":{"name":"get_weather"}},"parallel_tool_calls":false,"tools":[)") + kTool + "]");
    EXPECT_EQ(named.tools.choice, ChatToolRequest::Choice::Named);
    EXPECT_TRUE(named.tools.forced());
    EXPECT_FALSE(named.tools.parallel);
    EXPECT_EQ(chat(R"("reasoning_effort":"high")").tools.reasoning_effort, "high");
}

TEST(ToolRequest, BadFieldsAre400NamingThem) {
    const std::string tools = std::string(R"("tools":[)") + kTool + "]";
    EXPECT_NE(error_of(R"("tools":{})").find("'tools' must be an array"), std::string::npos);
    EXPECT_NE(error_of(R"("tools":[{"type":"retrieval"}])").find("'tools[0].type' must be \"function\""), std::string::npos);
    EXPECT_NE(error_of(R"("tools":[{"type":"function","function":{"name":"a b"}}])").find("'tools[0].function.name'"), std::string::npos);
    EXPECT_NE(error_of(R"("tools":[{"type":"function","function":{"name":"a","parameters":[]}}])").find("parameters' must be an object"), std::string::npos);
    EXPECT_NE(error_of(tools + "," + tools.substr(0, 0) + R"("tool_choice":"maybe")").find("'tool_choice' must be"), std::string::npos);
    EXPECT_NE(error_of(R"("tool_choice":"required")").find("needs 'tools'"), std::string::npos);
    EXPECT_NE(error_of(tools + R"(,"tool_choice":{"type":"function","function":{"name":"other"}})").find("is not one of 'tools'"), std::string::npos);
    EXPECT_NE(error_of(R"("reasoning_effort":"max")").find("reasoning_effort"), std::string::npos);
    EXPECT_NE(error_of(R"("functions":[])").find("deprecated"), std::string::npos);
    std::string many = R"("tools":[)";
    for (int i = 0; i < 129; ++i) many += (i ? "," : "") + std::string(R"({"type":"function","function":{"name":"f)") + std::to_string(i) + "\"}}";
    EXPECT_NE(error_of(many + "]").find("more than 128"), std::string::npos);
}

TEST(ToolRequest, HistoryMessages) {
    auto r = chat("", R"([{"role":"user","content":"w?"},
        {"role":"assistant","content":null,"reasoning_content":"think","tool_calls":[{"id":"call_9","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
        {"role":"tool","tool_call_id":"call_9","content":"21C"}])");
    ASSERT_EQ(r.messages.size(), 3u);
    ASSERT_EQ(r.messages[1].tool_calls.size(), 1u);
    EXPECT_EQ(r.messages[1].tool_calls[0].id, "call_9");
    EXPECT_EQ(r.messages[1].tool_calls[0].name, "get_weather");
    EXPECT_EQ(r.messages[1].tool_calls[0].arguments, R"({"city":"Paris"})");
    EXPECT_EQ(r.messages[1].reasoning, "think");
    EXPECT_EQ(r.messages[1].content, "");
    EXPECT_EQ(r.messages[2].tool_call_id, "call_9");
    EXPECT_NE(error_of("", R"([{"role":"tool","content":"x"}])").find("tool_call_id' is required"), std::string::npos);
    EXPECT_NE(error_of("", R"([{"role":"assistant","tool_calls":[{"type":"function","function":{"arguments":"{}"}}]}])")
                  .find("tool_calls[0].function.name' is required"), std::string::npos);
    EXPECT_NE(error_of("", R"([{"role":"assistant","tool_calls":{}}])").find("must be an array"), std::string::npos);
}

}  // namespace

// The request side of the transformers vectors: an OpenAI request carrying
// the recorded tool history (arguments as JSON strings, reasoning as
// reasoning_content) becomes exactly the messages and tools transformers
// rendered, so the byte-for-byte template test covers what clients send.
TEST(ToolRequest, HistoryBecomesTheMessagesTransformersRendered) {
    using ojson = nlohmann::ordered_json;
    std::ifstream in(EH_CHAT_VECTORS_FILE);
    ASSERT_TRUE(in) << EH_CHAT_VECTORS_FILE;
    ojson root = ojson::parse(in);
    size_t checked = 0;
    for (const auto& c : root["cases"]) {
        const std::string name = c["name"];
        if (name != "tool_history" && name != "parallel_tool_calls" && name != "tool_reasoning") continue;
        ojson msgs = c["messages"];
        for (auto& m : msgs) {
            if (m.contains("thinking")) {
                m["reasoning_content"] = m["thinking"];
                m.erase("thinking");
            }
            if (m.contains("tool_calls"))
                for (auto& call : m["tool_calls"]) call["function"]["arguments"] = call["function"]["arguments"].dump();
        }
        ojson body = {{"messages", msgs}, {"tools", c["tools"]}};
        auto r = parse_openai_request(body.dump(), true, {});
        EXPECT_EQ(ojson::parse(template_messages_json(r.messages)), c["messages"]) << name;
        EXPECT_EQ(ojson::parse(r.tools.tools_json), c["tools"]) << name;
        ++checked;
    }
    EXPECT_GE(checked, 6u);
}

TEST(ToolConstraint, ForcedCallsBecomeAConstraint) {
    const std::string tools = std::string(R"("tools":[)") + kTool + "]";
    auto r = chat(tools + R"(,"tool_choice":"required")");
    r.gen.prompt = "P";
    constrain_tool_call(r, ToolFormat::Hermes);
    EXPECT_EQ(r.gen.constraint.kind, OutputConstraint::Kind::Prebuilt);
    EXPECT_EQ(r.gen.constraint.field, "tool_choice");
    ASSERT_TRUE(r.gen.constraint.grammar);
    EXPECT_EQ(r.gen.prompt, "P");  // Hermes: nothing prefilled
    auto h = chat(tools + R"(,"tool_choice":{"type":"function","function":{"name":"get_weather"}})");
    h.gen.prompt = "P";
    constrain_tool_call(h, ToolFormat::Harmony);
    EXPECT_EQ(h.tools.prefill, "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>");
    EXPECT_EQ(h.gen.prompt, "P" + h.tools.prefill);
    EXPECT_NE(h.gen.constraint.text, r.gen.constraint.text);  // cache keys differ with the grammar
    // Two tools, "required", harmony: the header cannot be prefilled.
    auto two = chat(R"("tools":[)" + std::string(kTool) + R"(,{"type":"function","function":{"name":"b"}}],"tool_choice":"required")");
    EXPECT_THROW(constrain_tool_call(two, ToolFormat::Harmony), RequestError);
    // A parameters schema outside the supported subset names the keyword.
    auto bad = chat(R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"z":{"type":"string","pattern":"^a"}}}}}],"tool_choice":"required")");
    try {
        constrain_tool_call(bad, ToolFormat::Hermes);
        FAIL();
    } catch (const RequestError& e) {
        EXPECT_EQ(e.field(), "tools");
        EXPECT_NE(std::string(e.what()).find("pattern"), std::string::npos) << e.what();
    }
}

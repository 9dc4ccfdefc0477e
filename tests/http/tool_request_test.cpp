// The tool-calling fields of an OpenAI chat request as parsed
// (parse/tool_fields.cpp): tools, tool_choice, parallel_tool_calls,
// reasoning_effort and the tool history in messages; every field that
// breaks a rule is a 400 naming it.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>

#include "eh/service/chat_prompt.hpp"
#include "parse/openai_request.hpp"

using namespace eh::http;
using namespace eh::service;

namespace {

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


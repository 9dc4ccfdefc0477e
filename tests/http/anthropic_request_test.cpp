// The Anthropic Messages request's tool fields, parsed in process: tools and
// tool_choice become the chat request's tool fields, tool_use / tool_result
// blocks become the same messages an OpenAI request with tool_calls / tool
// messages gives (so one template rendering serves both), and every block
// or field that cannot be honoured is a 400 naming it.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "anthropic_output.hpp"
#include "eh/service/chat_prompt.hpp"
#include "parse/anthropic_request.hpp"
#include "parse/openai_request.hpp"

using namespace eh::http;
using namespace eh::service;
using nlohmann::json;

namespace {

const json kTool = {{"name", "get_weather"},
                    {"description", "Weather now"},
                    {"input_schema", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}};

json body(json messages, json extra = json::object()) {
    json b = {{"model", "m"}, {"max_tokens", 8}, {"messages", std::move(messages)}};
    for (auto& [k, v] : extra.items()) b[k] = v;
    return b;
}

std::string error_of(const json& b) {
    try {
        parse_anthropic_request(b.dump(), {});
    } catch (const RequestError& e) {
        return e.field() + ": " + e.what();
    }
    return "";
}

const json kUser = json::array({{{"role", "user"}, {"content", "Weather in Paris?"}}});

}  // namespace

TEST(AnthropicRequest, ToolsBecomeFunctionTools) {
    auto r = parse_anthropic_request(body(kUser, {{"tools", {kTool}}}).dump(), {});
    ASSERT_EQ(r.tools.tools.size(), 1u);
    EXPECT_EQ(r.tools.tools[0].name, "get_weather");
    EXPECT_EQ(json::parse(r.tools.tools[0].parameters_json), kTool["input_schema"]);
    EXPECT_EQ(r.tools.choice, ChatToolRequest::Choice::Auto);
    EXPECT_TRUE(r.tools.enabled());
    // The template gets OpenAI's shape, as transformers passes tools.
    EXPECT_EQ(json::parse(r.tools.tools_json),
              json::parse(R"([{"type":"function","function":{"name":"get_weather","description":"Weather now",)"
                          R"("parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])"));
}

TEST(AnthropicRequest, ToolChoiceMapsOntoOpenAIs) {
    using C = ChatToolRequest::Choice;
    auto choice = [](json tc) { return parse_anthropic_request(body(kUser, {{"tools", {kTool}}, {"tool_choice", tc}}).dump(), {}).tools; };
    EXPECT_EQ(choice({{"type", "auto"}}).choice, C::Auto);
    EXPECT_EQ(choice({{"type", "none"}}).choice, C::None);
    EXPECT_FALSE(choice({{"type", "none"}}).enabled());
    auto any = choice({{"type", "any"}});
    EXPECT_EQ(any.choice, C::Required);
    EXPECT_TRUE(any.forced());
    EXPECT_TRUE(any.parallel);
    auto named = choice({{"type", "tool"}, {"name", "get_weather"}, {"disable_parallel_tool_use", true}});
    EXPECT_EQ(named.choice, C::Named);
    EXPECT_EQ(named.named, "get_weather");
    EXPECT_FALSE(named.parallel);
}

// The same conversation sent both ways becomes the same messages, so the
// chat template renders tool history identically for both APIs.
TEST(AnthropicRequest, ToolHistoryBecomesTheMessagesOpenAIsGives) {
    json anthropic = json::array({
        {{"role", "user"}, {"content", "Weather in Paris and Rome?"}},
        {{"role", "assistant"},
         {"content", json::array({{{"type", "text"}, {"text", "Checking."}},
                                  {{"type", "tool_use"}, {"id", "toolu_1"}, {"name", "get_weather"}, {"input", {{"city", "Paris"}}}},
                                  {{"type", "tool_use"}, {"id", "toolu_2"}, {"name", "get_weather"}, {"input", {{"city", "Rome"}}}}})}},
        {{"role", "user"},
         {"content", json::array({{{"type", "tool_result"}, {"tool_use_id", "toolu_1"}, {"content", "sunny"}},
                                  {{"type", "tool_result"}, {"tool_use_id", "toolu_2"},
                                   {"content", json::array({{{"type", "text"}, {"text", "no "}}, {{"type", "text"}, {"text", "data"}}})},
                                   {"is_error", true}},
                                  {{"type", "text"}, {"text", "And tomorrow?"}}})}}});
    json openai = json::array({
        {{"role", "user"}, {"content", "Weather in Paris and Rome?"}},
        {{"role", "assistant"},
         {"content", "Checking."},
         {"tool_calls", json::array({{{"id", "toolu_1"}, {"type", "function"},
                                      {"function", {{"name", "get_weather"}, {"arguments", R"({"city":"Paris"})"}}}},
                                     {{"id", "toolu_2"}, {"type", "function"},
                                      {"function", {{"name", "get_weather"}, {"arguments", R"({"city":"Rome"})"}}}}})}},
        {{"role", "tool"}, {"tool_call_id", "toolu_1"}, {"content", "sunny"}},
        {{"role", "tool"}, {"tool_call_id", "toolu_2"}, {"content", "Error: no data"}},
        {{"role", "user"}, {"content", "And tomorrow?"}}});
    auto a = parse_anthropic_request(body(anthropic, {{"system", "Be brief."}}).dump(), {});
    json with_system = openai;
    with_system.insert(with_system.begin(), json::object({{"role", "system"}, {"content", "Be brief."}}));
    auto o = parse_openai_request(json{{"messages", with_system}}.dump(), true, {});
    EXPECT_EQ(template_messages_json(a.messages), template_messages_json(o.messages));
    ASSERT_EQ(a.messages.size(), 6u);
    EXPECT_EQ(a.messages[2].tool_calls.size(), 2u);
}

TEST(AnthropicRequest, ToolFieldsThatCannotBeHonouredAre400) {
    auto with = [](json extra) { return error_of(body(kUser, extra)); };
    auto msgs = [](json m) { return error_of(body(m)); };
    EXPECT_NE(with({{"tools", {{{"type", "web_search_20250305"}, {"name", "web_search"}}}}}).find("\"web_search_20250305\" is not supported"),
              std::string::npos);
    EXPECT_NE(with({{"tools", {{{"name", "f"}}}}}).find("'tools[0].input_schema' is required"), std::string::npos);
    EXPECT_NE(with({{"tools", {{{"name", "f"}, {"input_schema", "x"}}}}}).find("'tools[0].input_schema' must be an object"),
              std::string::npos);
    EXPECT_NE(with({{"tools", {{{"name", "a b"}, {"input_schema", json::object()}}}}}).find("'tools[0].name'"), std::string::npos);
    EXPECT_NE(with({{"tools", {kTool, kTool}}}).find("defined twice"), std::string::npos);
    EXPECT_NE(with({{"tools", {kTool}}, {"tool_choice", "any"}}).find("'tool_choice' must be an object"), std::string::npos);
    EXPECT_NE(with({{"tools", {kTool}}, {"tool_choice", {{"type", "required"}}}}).find("'tool_choice.type' must be"),
              std::string::npos);
    EXPECT_NE(with({{"tools", {kTool}}, {"tool_choice", {{"type", "tool"}, {"name", "other"}}}}).find("is not one of 'tools'"),
              std::string::npos);
    EXPECT_NE(with({{"tool_choice", {{"type", "any"}}}}).find("needs 'tools'"), std::string::npos);
    json many = json::array();
    for (int i = 0; i < 129; ++i) many.push_back({{"name", "f" + std::to_string(i)}, {"input_schema", json::object()}});
    EXPECT_NE(with({{"tools", many}}).find("more than 128"), std::string::npos);

    const json use = {{"type", "tool_use"}, {"id", "t"}, {"name", "f"}, {"input", json::object()}};
    const json result = {{"type", "tool_result"}, {"tool_use_id", "t"}, {"content", "1"}};
    EXPECT_NE(msgs({{{"role", "user"}, {"content", {use}}}}).find("\"tool_use\" belongs in assistant messages"), std::string::npos);
    EXPECT_NE(msgs({{{"role", "user"}, {"content", "q"}}, {{"role", "assistant"}, {"content", {result}}}, {{"role", "user"}, {"content", "x"}}})
                  .find("\"tool_result\" belongs in user messages"),
              std::string::npos);
    json no_input = use;
    no_input.erase("input");
    EXPECT_NE(msgs({{{"role", "user"}, {"content", "q"}}, {{"role", "assistant"}, {"content", {no_input}}}, {{"role", "user"}, {"content", "x"}}})
                  .find("'messages[1].content[0].input' is required"),
              std::string::npos);
    json no_id = result;
    no_id.erase("tool_use_id");
    EXPECT_NE(msgs({{{"role", "user"}, {"content", {no_id}}}}).find("'messages[0].content[0].tool_use_id' is required"),
              std::string::npos);
    json empty_id = result;
    empty_id["tool_use_id"] = "";
    EXPECT_NE(msgs({{{"role", "user"}, {"content", {empty_id}}}}).find("'messages[0].content[0].tool_use_id' must not be empty"),
              std::string::npos);
    json empty_use_id = use;
    empty_use_id["id"] = "";
    EXPECT_NE(msgs({{{"role", "user"}, {"content", "q"}}, {{"role", "assistant"}, {"content", {empty_use_id}}}, {{"role", "user"}, {"content", "x"}}})
                  .find("'messages[1].content[0].id' must not be empty"),
              std::string::npos);
    json image_result = result;
    image_result["content"] = {{{"type", "image"}}};
    EXPECT_NE(msgs({{{"role", "user"}, {"content", {image_result}}}}).find("\"image\" is not supported"), std::string::npos);
    EXPECT_NE(msgs({{{"role", "user"}, {"content", {{{"type", "thinking"}, {"thinking", "x"}}}}}})
                  .find("\"thinking\" belongs in assistant messages"),
              std::string::npos);
    EXPECT_NE(msgs({{{"role", "user"}, {"content", {{{"type", "document"}}}}}}).find("\"document\" is not supported"),
              std::string::npos);
}

// One walker reads both APIs' message arrays: the same limits and shapes,
// each API's roles.
TEST(ChatMessages, BothAPIsShareTheArrayRules) {
    json many = json::array();
    for (int i = 0; i < 257; ++i) many.push_back({{"role", "user"}, {"content", "x"}});
    EXPECT_NE(error_of(body(many)).find("'messages' has more than 256 entries"), std::string::npos);
    auto openai_error = [](const json& messages) {
        try {
            parse_openai_request(json{{"messages", messages}}.dump(), true, {});
        } catch (const RequestError& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    EXPECT_NE(openai_error(many).find("'messages' has more than 256 entries"), std::string::npos);
    for (const json& bad : {json::array({1}), json::array({{{"content", "x"}}}), json::array(), json("x")}) {
        const std::string a = error_of(body(bad)), o = openai_error(bad);
        EXPECT_FALSE(a.empty()) << bad.dump();
        EXPECT_EQ(a.substr(a.find(": ") + 2), o) << bad.dump();
    }
    EXPECT_NE(error_of(body({{{"role", "tool"}, {"content", "x"}}})).find("'messages[0].role' must be user or assistant; got 'tool'"),
              std::string::npos);
    EXPECT_NE(openai_error({{{"role", "bot"}, {"content", "x"}}})
                  .find("'messages[0].role' must be one of system, developer, user, assistant, tool; got 'bot'"),
              std::string::npos);
}

TEST(AnthropicRequest, ToolUseIdsTakeAnthropicsPrefix) {
    const std::string call = new_tool_call_id();
    const std::string id = anthropic_tool_use_id(call);
    EXPECT_EQ(id.rfind("toolu_", 0), 0u);
    EXPECT_EQ(id.substr(6), call.substr(5));
}

// Extended thinking: enabled with a budget asks for a reasoning effort and
// thinking blocks; the budget's rules are Anthropic's (at least 1,024, less
// than max_tokens); history thinking blocks are the assistant's reasoning,
// redacted ones are left out.
TEST(AnthropicRequest, ThinkingPicksTheEffortAndHistoryKeepsTheReasoning) {
    auto with_thinking = [](json thinking, int max_tokens) {
        json b = body(kUser, {{"thinking", thinking}});
        b["max_tokens"] = max_tokens;
        return b;
    };
    auto r = parse_anthropic_request(with_thinking({{"type", "enabled"}, {"budget_tokens", 2048}}, 4096).dump(), {});
    EXPECT_TRUE(r.thinking);
    EXPECT_EQ(r.tools.reasoning_effort, "low");
    EXPECT_EQ(parse_anthropic_request(with_thinking({{"type", "enabled"}, {"budget_tokens", 8000}}, 9000).dump(), {})
                  .tools.reasoning_effort,
              "medium");
    EXPECT_EQ(parse_anthropic_request(with_thinking({{"type", "enabled"}, {"budget_tokens", 16384}}, 20000).dump(), {})
                  .tools.reasoning_effort,
              "high");
    auto off = parse_anthropic_request(with_thinking({{"type", "disabled"}}, 64).dump(), {});
    EXPECT_FALSE(off.thinking);
    EXPECT_EQ(off.tools.reasoning_effort, "");
    EXPECT_NE(error_of(with_thinking({{"type", "enabled"}, {"budget_tokens", 1000}}, 4096)).find("budget_tokens"),
              std::string::npos);
    EXPECT_NE(error_of(with_thinking({{"type", "enabled"}}, 4096)).find("'thinking.budget_tokens' is required"),
              std::string::npos);
    EXPECT_NE(error_of(with_thinking({{"type", "enabled"}, {"budget_tokens", 4096}}, 4096)).find("less than 'max_tokens'"),
              std::string::npos);
    EXPECT_NE(error_of(with_thinking({{"type", "auto"}}, 64)).find("\"enabled\" or \"disabled\""), std::string::npos);
    EXPECT_NE(error_of(with_thinking("yes", 64)).find("thinking"), std::string::npos);

    json history = {{{"role", "user"}, {"content", "q"}},
                    {{"role", "assistant"},
                     {"content", {{{"type", "thinking"}, {"thinking", "Paris is in France."}, {"signature", "abc"}},
                                  {{"type", "redacted_thinking"}, {"data", "opaque"}},
                                  {{"type", "text"}, {"text", "Paris."}}}}},
                    {{"role", "user"}, {"content", "and?"}}};
    auto h = parse_anthropic_request(body(history).dump(), {});
    ASSERT_EQ(h.messages.size(), 3u);
    EXPECT_EQ(h.messages[1].reasoning, "Paris is in France.");
    EXPECT_EQ(h.messages[1].content, "Paris.");
}

// A harmony model's analysis channel: a thinking block (streamed as
// thinking_delta) before the answer's text when thinking is on; left out
// when it is off.
TEST(AnthropicOutput, ReasoningBecomesAThinkingBlockWhenAskedFor) {
    const std::string out = "<|channel|>analysis<|message|>Think first.<|end|><|start|>assistant<|channel|>final"
                            "<|message|>Answer.";
    AnthropicOutput on(ToolFormat::Harmony, {}, "", true);
    std::string events = on.events(out);
    events += on.finish_events();
    const json c = on.content();
    ASSERT_EQ(c.size(), 2u) << c.dump();
    EXPECT_EQ(c[0], json({{"type", "thinking"}, {"thinking", "Think first."}, {"signature", ""}}));
    EXPECT_EQ(c[1], json({{"type", "text"}, {"text", "Answer."}}));
    EXPECT_NE(events.find("\"thinking_delta\""), std::string::npos) << events;
    EXPECT_LT(events.find("\"thinking_delta\""), events.find("\"text_delta\""));

    AnthropicOutput off(ToolFormat::Harmony, {}, "", false);
    off.add(out);
    off.finish();
    EXPECT_EQ(off.content(), json::array({{{"type", "text"}, {"text", "Answer."}}}));

    // Only reasoning: the answer still has its (empty) text block.
    AnthropicOutput only(ToolFormat::Harmony, {}, "", true);
    only.add("<|channel|>analysis<|message|>Hmm");
    only.finish();
    const json oc = only.content();
    ASSERT_EQ(oc.size(), 2u) << oc.dump();
    EXPECT_EQ(oc[0]["type"], "thinking");
    EXPECT_EQ(oc[1], json({{"type", "text"}, {"text", ""}}));
}

// A repeated key inside a content block or a tool's input_schema is a 400
// naming the path, as at the top level (nlohmann's dump cannot write one,
// so these bodies are raw text).
TEST(AnthropicRequest, DuplicateKeysAreRefusedAtEveryDepth) {
    auto error_raw = [](const std::string& b) {
        try {
            parse_anthropic_request(b, {});
        } catch (const RequestError& e) {
            return e.field() + ": " + e.what();
        }
        return std::string("ok");
    };
    EXPECT_EQ(error_raw(R"({"model":"m","max_tokens":8,"messages":[{"role":"user","content":)"
                        R"([{"type":"text","text":"a","type":"image"}]}]})"),
              "messages: duplicate field 'messages[0].content[0].type'");
    EXPECT_EQ(error_raw(R"({"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}],)"
                        R"("tools":[{"name":"t","input_schema":{"type":"object","properties":{"a":{},"a":{}}}}]})"),
              "tools: duplicate field 'tools[0].input_schema.properties.a'");
    EXPECT_EQ(error_raw(R"({"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}],)"
                        R"("system":[{"type":"text","text":"a"},{"type":"text","text":"b"}]})"),
              "ok");
}

// The Responses API in process: its request parser (input items become the
// same messages a chat request with tool_calls / tool messages gives, so one
// template rendering serves both; what cannot be honoured is a 400 naming
// the field), its output items and their event sequence, and the bounded
// response store (LRU over a count and a byte total, scoped per key).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>

#include "eh/service/chat_prompt.hpp"
#include "parse/openai_request.hpp"
#include "parse/responses_request.hpp"
#include "responses_output.hpp"
#include "responses_store.hpp"

using namespace eh::http;
using namespace eh::service;
using nlohmann::json;

namespace {

const json kTool = {{"type", "function"},
                    {"name", "get_weather"},
                    {"description", "Weather now"},
                    {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}};

json body(json input, json extra = json::object()) {
    json b = {{"model", "m"}, {"input", std::move(input)}};
    for (auto& [k, v] : extra.items()) b[k] = v;
    return b;
}

ResponsesRequest parse(const json& b, RequestLimits limits = {}) { return parse_responses_request(b.dump(), limits); }

std::string error_of(const json& b, RequestLimits limits = {}) {
    try {
        parse(b, limits);
    } catch (const RequestError& e) {
        return e.field() + ": " + e.what();
    }
    return "";
}

}  // namespace

TEST(ResponsesRequest, StringInputIsOneUserMessage) {
    auto r = parse(body("Hello", {{"instructions", "Be brief."}, {"max_output_tokens", 7}, {"temperature", 0.5}}));
    ASSERT_EQ(r.input.size(), 1u);
    EXPECT_EQ(r.input[0].role, "user");
    EXPECT_EQ(r.input[0].content, "Hello");
    EXPECT_EQ(r.instructions, "Be brief.");
    EXPECT_TRUE(r.messages.empty()) << "the route composes them";
    EXPECT_EQ(r.gen.max_tokens, 7u);
    EXPECT_DOUBLE_EQ(r.gen.sampling.temperature, 0.5);
    EXPECT_EQ(r.gen.origin, "responses");
    EXPECT_EQ(r.gen.job_id.rfind("resp_", 0), 0u);
    EXPECT_EQ(r.gen.job_id.size(), 5u + 32u);
    EXPECT_TRUE(r.store);
    EXPECT_FALSE(r.stream);
    EXPECT_EQ(r.echo["instructions"], "Be brief.");
    EXPECT_EQ(r.echo["max_output_tokens"], 7);
    EXPECT_EQ(r.echo["text"], (json{{"format", {{"type", "text"}}}}));
    EXPECT_EQ(r.echo["tool_choice"], "auto");
    EXPECT_EQ(r.echo["tools"], json::array());
}

// Input items give the messages the chat route gives for the same
// conversation: one template rendering serves both APIs.
TEST(ResponsesRequest, InputItemsAreTheChatRoutesMessages) {
    const json items = json::parse(R"([
        {"role":"system","content":"Be brief."},
        {"type":"message","role":"user","content":[{"type":"input_text","text":"Weather in "},{"type":"input_text","text":"Paris?"}]},
        {"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"Need the weather."}]},
        {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Checking.","annotations":[]}]},
        {"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},
        {"type":"function_call","call_id":"call_2","name":"get_weather","arguments":"{\"city\":\"Lyon\"}"},
        {"type":"function_call_output","call_id":"call_1","output":"sunny"},
        {"type":"function_call_output","call_id":"call_2","output":[{"type":"input_text","text":"rain"}]},
        {"role":"user","content":"Thanks"}])");
    auto r = parse(body(items));
    const json chat = json::parse(R"([
        {"role":"system","content":"Be brief."},
        {"role":"user","content":"Weather in Paris?"},
        {"role":"assistant","content":"Checking.","reasoning_content":"Need the weather.","tool_calls":[
            {"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},
            {"id":"call_2","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Lyon\"}"}}]},
        {"role":"tool","tool_call_id":"call_1","content":"sunny"},
        {"role":"tool","tool_call_id":"call_2","content":"rain"},
        {"role":"user","content":"Thanks"}])");
    auto o = parse_openai_request(json{{"messages", chat}}.dump(), true, {});
    EXPECT_EQ(template_messages_json(r.input), template_messages_json(o.messages));
}

// A function_call after a reasoning item, or with nothing before it, starts
// its own assistant turn; one right after an assistant message joins it.
TEST(ResponsesRequest, FunctionCallsJoinTheirTurn) {
    auto r = parse(body(json::parse(R"([
        {"role":"user","content":"x"},
        {"type":"reasoning","summary":[{"type":"summary_text","text":"think"}]},
        {"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},
        {"type":"function_call_output","call_id":"c1","output":"1"},
        {"type":"function_call","call_id":"c2","name":"f","arguments":"{}"}])")));
    ASSERT_EQ(r.input.size(), 4u);
    EXPECT_EQ(r.input[1].role, "assistant");
    EXPECT_EQ(r.input[1].reasoning, "think") << "the summary when there is no content";
    ASSERT_EQ(r.input[1].tool_calls.size(), 1u);
    EXPECT_EQ(r.input[2].role, "tool");
    EXPECT_EQ(r.input[3].role, "assistant");
    ASSERT_EQ(r.input[3].tool_calls.size(), 1u);
    EXPECT_EQ(r.input[3].tool_calls[0].id, "c2");
}

TEST(ResponsesRequest, ToolsTextFormatAndReasoning) {
    auto r = parse(body("x", {{"tools", {kTool}},
                             {"tool_choice", {{"type", "function"}, {"name", "get_weather"}}},
                             {"parallel_tool_calls", false},
                             {"reasoning", {{"effort", "low"}, {"summary", "auto"}}}}));
    ASSERT_EQ(r.tools.tools.size(), 1u);
    EXPECT_EQ(r.tools.choice, ChatToolRequest::Choice::Named);
    EXPECT_EQ(r.tools.named, "get_weather");
    EXPECT_FALSE(r.tools.parallel);
    EXPECT_EQ(r.tools.reasoning_effort, "low");
    EXPECT_EQ(json::parse(r.tools.tools_json),
              json::parse(R"([{"type":"function","function":{"name":"get_weather","description":"Weather now",)"
                          R"("parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])"));
    EXPECT_EQ(r.echo["tools"], json::array({kTool}));
    EXPECT_EQ(r.echo["reasoning"], (json{{"effort", "low"}, {"summary", nullptr}}));

    const json schema = {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}};
    auto s = parse(body("x", {{"text", {{"format", {{"type", "json_schema"}, {"name", "n"}, {"schema", schema}, {"strict", true}}}}}}));
    EXPECT_EQ(s.gen.constraint.kind, OutputConstraint::Kind::JsonSchema);
    EXPECT_EQ(json::parse(s.gen.constraint.text), schema);
    EXPECT_EQ(s.gen.constraint.field, "text");
    EXPECT_EQ(s.echo["text"]["format"]["name"], "n");
    auto o = parse(body("x", {{"text", {{"format", {{"type", "json_object"}}}}}}));
    EXPECT_EQ(o.gen.constraint.kind, OutputConstraint::Kind::JsonObject);
    EXPECT_FALSE(parse(body("x", {{"text", {{"format", {{"type", "text"}}}}}})).gen.constraint.active());
}

TEST(ResponsesRequest, RefusalsNameTheField) {
    struct Case {
        json body;
        const char* says;
    };
    const std::vector<Case> cases = {
        {json{{"model", "m"}}, "input: 'input' is required"},
        {body(json::array()), "input: 'input' must not be empty"},
        {body(5), "input: 'input' must be a string or an array"},
        {body(json::array({{{"role", "tool"}, {"content", "x"}}})), "'input[0].role' must be one of"},
        {body(json::array({{{"role", "user"}, {"content", {{{"type", "input_image"}, {"image_url", "u"}}}}}})),
         "input: 'input[0].content[0].type' \"input_image\" is not supported"},
        {body(json::array({{{"type", "web_search_call"}, {"id", "w"}}})), "input: 'input[0].type' \"web_search_call\" is not supported"},
        {body(json::array({{{"type", "item_reference"}, {"id", "w"}}})), "\"item_reference\" is not supported"},
        {body(json::array({{{"content", "x"}}})), "'input[0].type' is required"},
        {body(json::array({{{"role", "user"}, {"content", "x"}}, {{"type", "reasoning"}, {"summary", json::array()}}})),
         "'input[1]': a reasoning item must be followed by"},
        {body(json::array({{{"type", "reasoning"}, {"summary", json::array()}}, {{"role", "user"}, {"content", "x"}}})),
         "'input[0]': a reasoning item must be followed by"},
        {body(json::array({{{"type", "function_call"}, {"call_id", ""}, {"name", "f"}, {"arguments", "{}"}}})),
         "'input[0].call_id' must not be empty"},
        {body(json::array({{{"type", "function_call_output"}, {"call_id", "c"}}})), "'input[0].output' is required"},
        {body("x", {{"tools", {{{"type", "web_search"}}}}}), "tools: 'tools[0].type' \"web_search\" is not supported"},
        {body("x", {{"tools", {{{"type", "function"}}}}}), "tools: 'tools[0].name' is required"},
        {body("x", {{"tool_choice", "required"}}), "tool_choice: "},
        {body("x", {{"tools", {kTool}}, {"tool_choice", {{"type", "function"}, {"name", "other"}}}}), "'other' is not one of"},
        {body("x", {{"tools", {kTool}}, {"tool_choice", {{"type", "file_search"}}}}), "\"file_search\" is not supported"},
        {body("x", {{"tools", {kTool}}, {"tool_choice", "required"}, {"text", {{"format", {{"type", "json_object"}}}}}}),
         "tool_choice: 'tool_choice' \"required\" or a function cannot be combined"},
        {body("x", {{"text", {{"format", {{"type", "json_schema"}}}}}}), "text: 'text.format.schema' is required"},
        {body("x", {{"text", {{"format", {{"type", "xml"}}}}}}), "text: 'text.format.type' must be"},
        {body("x", {{"text", {{"verbosity", "low"}}}}), "text: 'text.verbosity' is not supported"},
        {body("x", {{"reasoning", {{"effort", "minimal"}}}}), "reasoning: 'reasoning.effort' must be"},
        {body("x", {{"background", true}}), "background: 'background': true is not supported"},
        {body("x", {{"conversation", "conv_1"}}), "conversation: 'conversation' is not supported"},
        {body("x", {{"prompt", {{"id", "p"}}}}), "prompt: 'prompt' is not supported"},
        {body("x", {{"top_logprobs", 2}}), "top_logprobs: "},
        {body("x", {{"truncation", "auto"}}), "truncation: 'truncation' must be \"disabled\""},
        {body("x", {{"include", {"message.output_text.logprobs"}}}), "include: 'include' value"},
        {body("x", {{"metadata", {{"k", 1}}}}), "metadata: 'metadata' values must be strings"},
        {body("x", {{"max_output_tokens", 0}}), "max_output_tokens: "},
        {body("x", {{"temperature", 3}}), "temperature: "},
        {body("x", {{"previous_response_id", "resp_1/../x"}}), "previous_response_id: "},
        {body("x", {{"previous_response_id", ""}}), "previous_response_id: "},
        {body("x", {{"instructions", 3}}), "instructions: 'instructions' must be a string"},
        {body("x", {{"stream", "yes"}}), "stream: "},
    };
    for (const auto& c : cases) {
        SCOPED_TRACE(c.body.dump());
        const std::string e = error_of(c.body);
        EXPECT_NE(e.find(c.says), std::string::npos) << e;
    }
    // Accepted: background false, truncation disabled, the reasoning
    // include, string metadata, the fields only echoed or ignored.
    EXPECT_EQ(error_of(body("x", {{"background", false}, {"truncation", "disabled"},
                                  {"include", {"reasoning.encrypted_content"}}, {"metadata", {{"k", "v"}}},
                                  {"user", "u"}, {"prompt_cache_key", "k"}, {"store", false}, {"stream", true}})),
              "");
}

TEST(ResponsesRequest, InputItemsAreCounted) {
    RequestLimits limits;
    limits.max_messages = 3;
    json items = json::array();
    for (int i = 0; i < 4; ++i) items.push_back({{"role", "user"}, {"content", "x"}});
    EXPECT_NE(error_of(body(items), limits).find("'input' has more than 3 items"), std::string::npos);
    items.erase(items.begin());
    EXPECT_EQ(error_of(body(items), limits), "");
}

// ---- output ----------------------------------------------------------------------

namespace {

struct Event {
    std::string type;
    json data;
};
std::vector<Event> events_of(const std::string& sse) {
    std::vector<Event> out;
    size_t pos = 0;
    while ((pos = sse.find("event: ", pos)) != std::string::npos) {
        const size_t nl = sse.find('\n', pos);
        const std::string type = sse.substr(pos + 7, nl - pos - 7);
        const size_t data = sse.find("data: ", nl) + 6;
        const size_t end = sse.find('\n', data);
        out.push_back({type, json::parse(sse.substr(data, end - data))});
        pos = end;
    }
    return out;
}

}  // namespace

TEST(ResponsesOutput, TextIsOneMessageItemWithTheDocumentedEvents) {
    ResponsesOutput out(ToolFormat::None, {});
    std::string sse = out.event("response.created", json::object());
    for (const char* piece : {"Hel", "lo", "!"}) sse += out.events(piece);
    sse += out.finish_events(false);
    auto evs = events_of(sse);
    std::vector<std::string> types;
    for (size_t i = 0; i < evs.size(); ++i) {
        types.push_back(evs[i].type);
        EXPECT_EQ(evs[i].data["type"], evs[i].type);
        EXPECT_EQ(evs[i].data["sequence_number"], i);
    }
    const std::vector<std::string> want = {"response.created", "response.output_item.added", "response.content_part.added",
                                           "response.output_text.delta", "response.output_text.delta",
                                           "response.output_text.delta", "response.output_text.done",
                                           "response.content_part.done", "response.output_item.done"};
    EXPECT_EQ(types, want);
    const json added = evs[1].data["item"];
    EXPECT_EQ(added["type"], "message");
    EXPECT_EQ(added["status"], "in_progress");
    EXPECT_EQ(added["content"], json::array());
    EXPECT_EQ(evs[2].data["part"], (json{{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}));
    EXPECT_EQ(evs[3].data["item_id"], added["id"]);
    EXPECT_EQ(evs[3].data["delta"], "Hel");
    EXPECT_EQ(evs[6].data["text"], "Hello!");
    const json done = evs[8].data["item"];
    EXPECT_EQ(done["status"], "completed");
    EXPECT_EQ(done["content"][0]["text"], "Hello!");
    EXPECT_EQ(out.output(), json::array({done}));
    EXPECT_EQ(out.message().content, "Hello!");
}

TEST(ResponsesOutput, HermesCallIsAFunctionCallItem) {
    ResponsesOutput out(ToolFormat::Hermes, {true, true, {"get_weather"}});
    std::string sse = out.events("Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ");
    sse += out.events("{\"city\": \"Paris\"}}\n</tool_call>");
    sse += out.finish_events(false);
    auto evs = events_of(sse);
    std::vector<std::string> types;
    std::string args;
    for (const auto& e : evs) {
        types.push_back(e.type);
        if (e.type == "response.function_call_arguments.delta") args += e.data["delta"].get<std::string>();
    }
    ASSERT_GE(evs.size(), 8u);
    // The message closes before the call's item opens.
    auto at = [&](const std::string& t) { return std::find(types.begin(), types.end(), t) - types.begin(); };
    EXPECT_LT(at("response.output_item.done"), at("response.function_call_arguments.delta"));
    EXPECT_EQ(types.back(), "response.output_item.done");
    EXPECT_EQ(types[types.size() - 2], "response.function_call_arguments.done");
    const json items = out.output();
    ASSERT_EQ(items.size(), 2u);
    EXPECT_EQ(items[0]["type"], "message");
    EXPECT_EQ(items[1]["type"], "function_call");
    EXPECT_EQ(items[1]["name"], "get_weather");
    EXPECT_EQ(json::parse(items[1]["arguments"].get<std::string>()), (json{{"city", "Paris"}}));
    EXPECT_EQ(json::parse(args), (json{{"city", "Paris"}}));
    const std::string call_id = items[1]["call_id"];
    EXPECT_EQ(call_id.rfind("call_", 0), 0u);
    EXPECT_EQ(items[1]["id"].get<std::string>(), "fc_" + call_id.substr(5));
    EXPECT_EQ(evs[at("response.function_call_arguments.done")].data["arguments"], items[1]["arguments"]);
    auto m = out.message();
    ASSERT_EQ(m.tool_calls.size(), 1u);
    EXPECT_EQ(m.tool_calls[0].id, call_id);
    EXPECT_EQ(out.calls(), 1u);
}

TEST(ResponsesOutput, HarmonyReasoningIsAReasoningItem) {
    ResponsesOutput out(ToolFormat::Harmony, {});
    std::string sse = out.events("<|channel|>analysis<|message|>Greet back.<|end|>");
    sse += out.events("<|start|>assistant<|channel|>final<|message|>Hello there!");
    sse += out.finish_events(false);
    std::vector<std::string> types;
    for (const auto& e : events_of(sse)) types.push_back(e.type);
    EXPECT_EQ(types[0], "response.output_item.added");
    EXPECT_EQ(types[1], "response.content_part.added");
    EXPECT_EQ(types[2], "response.reasoning_text.delta");
    EXPECT_NE(std::find(types.begin(), types.end(), "response.reasoning_text.done"), types.end());
    const json items = out.output();
    ASSERT_EQ(items.size(), 2u);
    EXPECT_EQ(items[0]["type"], "reasoning");
    EXPECT_EQ(items[0]["content"], json::parse(R"([{"type":"reasoning_text","text":"Greet back."}])"));
    EXPECT_EQ(items[0]["summary"], json::array());
    EXPECT_EQ(items[1]["content"][0]["text"], "Hello there!");
    EXPECT_EQ(out.reasoning(), "Greet back.");
    EXPECT_EQ(out.message().reasoning, "Greet back.");
}

TEST(ResponsesOutput, NothingIsAnEmptyMessageAndACutOneIsIncomplete) {
    ResponsesOutput none(ToolFormat::None, {});
    none.finish(false);
    EXPECT_EQ(none.output().size(), 1u);
    EXPECT_EQ(none.output()[0]["content"][0]["text"], "");
    ResponsesOutput cut(ToolFormat::None, {});
    cut.add("Once upon");
    cut.finish(true);
    EXPECT_EQ(cut.output()[0]["status"], "incomplete");
    EXPECT_EQ(cut.output()[0]["content"][0]["text"], "Once upon");
}

// ---- store -----------------------------------------------------------------------

namespace {

StoredResponse stored(const std::string& scope, const std::string& text) {
    ChatMessage m;
    m.role = "user";
    m.content = text;
    return {scope, "{}", {m}};
}

}  // namespace

TEST(ResponseStore, LeastRecentlyUsedGoFirstPastTheCount) {
    ResponseStore s(2, 1 << 20);
    EXPECT_TRUE(s.put("a", stored("", "1")));
    EXPECT_TRUE(s.put("b", stored("", "2")));
    ASSERT_NE(s.get("a", ""), nullptr);  // a is now more recent than b
    EXPECT_TRUE(s.put("c", stored("", "3")));
    EXPECT_EQ(s.size(), 2u);
    EXPECT_EQ(s.get("b", ""), nullptr);
    ASSERT_NE(s.get("a", ""), nullptr);
    EXPECT_EQ(s.get("a", "")->conversation[0].content, "1");
    ASSERT_NE(s.get("c", ""), nullptr);
}

TEST(ResponseStore, BytesAreBounded) {
    const StoredResponse one = stored("", std::string(1000, 'x'));
    const size_t cost = ResponseStore::cost("a", one);
    ResponseStore s(100, 2 * cost + cost / 2);
    EXPECT_TRUE(s.put("a", one));
    EXPECT_TRUE(s.put("b", one));
    EXPECT_EQ(s.bytes(), 2 * cost);
    EXPECT_TRUE(s.put("c", one));
    EXPECT_EQ(s.size(), 2u);
    EXPECT_EQ(s.get("a", ""), nullptr);
    EXPECT_LE(s.bytes(), 2 * cost + cost / 2);
    // One larger than the whole budget is not kept, and evicts nothing.
    EXPECT_FALSE(s.put("big", stored("", std::string(3 * cost, 'y'))));
    EXPECT_EQ(s.size(), 2u);
    EXPECT_EQ(s.get("big", ""), nullptr);
    ResponseStore none(0, 1 << 20);
    EXPECT_FALSE(none.put("a", one));
}

TEST(ResponseStore, ScopedPerKey) {
    ResponseStore s(10, 1 << 20);
    s.put("a", stored("key1", "secret"));
    EXPECT_EQ(s.get("a", "key2"), nullptr);
    EXPECT_EQ(s.get("a", ""), nullptr);
    EXPECT_FALSE(s.erase("a", "key2"));
    ASSERT_NE(s.get("a", "key1"), nullptr);
    EXPECT_TRUE(s.erase("a", "key1"));
    EXPECT_EQ(s.get("a", "key1"), nullptr);
    EXPECT_EQ(s.size(), 0u);
    EXPECT_EQ(s.bytes(), 0u);
}

// A full store evicts from the scope holding the most: one API key's burst
// pushes out its own oldest responses, not another key's.
TEST(ResponseStore, OneKeysTrafficEvictsItsOwnFirst) {
    ResponseStore s(4, 1 << 20);
    EXPECT_TRUE(s.put("a", stored("key1", "kept")));
    for (int i = 1; i <= 6; ++i) EXPECT_TRUE(s.put("b" + std::to_string(i), stored("key2", "burst")));
    EXPECT_EQ(s.size(), 4u);
    ASSERT_NE(s.get("a", "key1"), nullptr);  // before: the store's oldest, evicted first
    EXPECT_EQ(s.get("b1", "key2"), nullptr);
    EXPECT_EQ(s.get("b3", "key2"), nullptr);
    EXPECT_NE(s.get("b4", "key2"), nullptr);
    EXPECT_NE(s.get("b6", "key2"), nullptr);
}

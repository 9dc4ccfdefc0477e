// Tool calling and reasoning over real HTTP: stories260K carrying Qwen2.5's
// and gpt-oss's real chat templates, served by the test engine scripted
// (EH_TEST_ENGINE_SCRIPT) to write a given text, so the output parsers, the
// OpenAI shapes (whole and streamed) and the 400s run end to end.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "engine_host_process.hpp"
#include "model_fixtures.hpp"

using namespace eh::test;
using nlohmann::json;

namespace {

std::string qwen_template() {
    std::ifstream f(std::string(EH_TESTDATA_DIR) + "/tokenizers/qwen2.5/tokenizer_config.json");
    return json::parse(f)["chat_template"];
}
std::string gptoss_template() {
    std::ifstream f(std::string(EH_TESTDATA_DIR) + "/tokenizers/gpt-oss-20b/chat_template.jinja");
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

const char* kTools = R"([{"type":"function","function":{"name":"get_weather","description":"Weather now",)"
                     R"("parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}])";

// stories260K with `tmpl`, writing `text`.
struct TemplatedHost {
    TemplatedModel model;
    ScriptedHost scripted;
    TemplatedHost(const std::string& tmpl, const std::string& text, std::vector<std::string> args = {})
        : model(tmpl), scripted(model.path, text, std::move(args)) {}
    EngineHost* operator->() { return scripted.host.get(); }
};

json chat(EngineHost& h, const std::string& extra, int* status = nullptr) {
    auto r = h.post("/v1/chat/completions",
                    R"({"messages":[{"role":"user","content":"Weather in Paris?"}],"max_tokens":200)" + extra + "}");
    if (status) *status = r.status;
    return json::parse(r.body, nullptr, false);
}

// The streamed chunks folded back into one message, checking OpenAI's
// delta rules on the way.
struct Folded {
    std::string content, reasoning, finish;
    json calls = json::array();
    size_t argument_fragments = 0;  // non-empty arguments deltas
};
Folded stream(EngineHost& h, const std::string& extra) {
    auto r = h.post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"Weather in Paris?"}],"max_tokens":200,"stream":true)" +
                                                extra + "}");
    EXPECT_EQ(r.status, 200) << r.body;
    Folded f;
    for (const auto& ev : parse_sse(r.body)) {
        if (ev.data == "[DONE]") break;
        json c = json::parse(ev.data);
        const json& ch = c["choices"][0];
        if (!ch["finish_reason"].is_null()) f.finish = ch["finish_reason"];
        const json& d = ch["delta"];
        if (d.contains("content") && d["content"].is_string()) f.content += d["content"].get<std::string>();
        if (d.contains("reasoning_content")) f.reasoning += d["reasoning_content"].get<std::string>();
        if (d.contains("tool_calls"))
            for (const json& tc : d["tool_calls"]) {
                const size_t i = tc["index"];
                if (tc.contains("id")) {  // the first delta of a call: id, type, name, empty arguments
                    EXPECT_EQ(i, f.calls.size());
                    EXPECT_EQ(tc["type"], "function");
                    EXPECT_EQ(tc["function"]["arguments"], "");
                    f.calls.push_back({{"id", tc["id"]}, {"name", tc["function"]["name"]}, {"arguments", ""}});
                } else {
                    EXPECT_LT(i, f.calls.size());
                    EXPECT_FALSE(tc["function"].contains("name"));
                    if (!tc["function"]["arguments"].get<std::string>().empty()) ++f.argument_fragments;
                    f.calls[i]["arguments"] = f.calls[i]["arguments"].get<std::string>() + tc["function"]["arguments"].get<std::string>();
                }
            }
    }
    return f;
}

TEST(ToolCallsServe, QwenHermesCallWholeAndStreamed) {
    TemplatedHost s(qwen_template(), "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
    ASSERT_TRUE(s->running()) << s->log();
    int status = 0;
    json j = chat(*s.scripted.host, std::string(R"(,"tools":)") + kTools, &status);
    ASSERT_EQ(status, 200) << j.dump();
    const json& m = j["choices"][0]["message"];
    EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
    ASSERT_EQ(m["tool_calls"].size(), 1u) << j.dump();
    EXPECT_EQ(m["tool_calls"][0]["type"], "function");
    EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_EQ(json::parse(m["tool_calls"][0]["function"]["arguments"].get<std::string>()), json({{"city", "Paris"}}));
    const std::string id = m["tool_calls"][0]["id"];
    EXPECT_EQ(id.rfind("call_", 0), 0u);
    // SPM: the first piece's space prefix is part of the model's text.
    EXPECT_EQ(m["content"], " Let me look.");

    Folded f = stream(*s.scripted.host, std::string(R"(,"tools":)") + kTools);
    EXPECT_EQ(f.finish, "tool_calls");
    EXPECT_EQ(f.content, " Let me look.");
    ASSERT_EQ(f.calls.size(), 1u);
    EXPECT_EQ(f.calls[0]["name"], "get_weather");
    EXPECT_EQ(f.calls[0]["arguments"], m["tool_calls"][0]["function"]["arguments"]);
    // The arguments stream as the model writes them (one token at a time
    // here), not in one piece at the end.
    EXPECT_GT(f.argument_fragments, 3u);

    // Without tools (or with tool_choice none) the same text is content.
    json plain = chat(*s.scripted.host, std::string(R"(,"tool_choice":"none","tools":)") + kTools);
    EXPECT_EQ(plain["choices"][0]["finish_reason"], "stop");
    EXPECT_FALSE(plain["choices"][0]["message"].contains("tool_calls"));
    EXPECT_NE(plain["choices"][0]["message"]["content"].get<std::string>().find("<tool_call>"), std::string::npos);
}

TEST(ToolCallsServe, QwenToolHistoryRendersThroughTheTemplate) {
    TemplatedHost s(qwen_template(), "It is sunny.", {"--log-content"});
    const std::string body = std::string(R"({"max_tokens":20,"tools":)") + kTools + R"(,"messages":[
        {"role":"user","content":"Weather in Paris?"},
        {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
        {"role":"tool","tool_call_id":"call_1","content":"sunny"}]})";
    auto r = s->post("/v1/chat/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    std::string prompt;
    for (const auto& e : s->log_events())
        if (e.value("event", "") == "execute_start") prompt = e.value("prompt", "");
    EXPECT_NE(prompt.find("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
                          "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>"),
              std::string::npos)
        << prompt;
    EXPECT_NE(prompt.find("# Tools"), std::string::npos);
}

TEST(ToolCallsServe, GptOssReasoningAndCall) {
    TemplatedHost s(gptoss_template(),
                   "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
                   "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}",
                   {"--log-content"});
    ASSERT_TRUE(s->running()) << s->log();
    int status = 0;
    json j = chat(*s.scripted.host, std::string(R"(,"reasoning_effort":"low","tools":)") + kTools, &status);
    ASSERT_EQ(status, 200) << j.dump();
    const json& m = j["choices"][0]["message"];
    EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
    EXPECT_EQ(m["reasoning_content"], "Need the weather.");
    EXPECT_TRUE(m["content"].is_null());
    ASSERT_EQ(m["tool_calls"].size(), 1u);
    EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Paris\"}");
    bool low = false;
    for (const auto& e : s->log_events())
        if (e.value("event", "") == "execute_start") low = e.value("prompt", "").find("Reasoning: low") != std::string::npos;
    EXPECT_TRUE(low) << "reasoning_effort reaches the template";

    Folded f = stream(*s.scripted.host, std::string(R"(,"tools":)") + kTools);
    EXPECT_EQ(f.reasoning, "Need the weather.");
    EXPECT_EQ(f.content, "");
    EXPECT_EQ(f.finish, "tool_calls");
    ASSERT_EQ(f.calls.size(), 1u);
    EXPECT_EQ(f.calls[0]["arguments"], "{\"city\":\"Paris\"}");
}

TEST(ToolCallsServe, GptOssFinalAnswerHasNoMarkup) {
    TemplatedHost s(gptoss_template(), "<|channel|>analysis<|message|>Greet back.<|end|><|start|>assistant<|channel|>final<|message|>Hello there!");
    json j = chat(*s.scripted.host, "");
    EXPECT_EQ(j["choices"][0]["message"]["content"], "Hello there!");
    EXPECT_EQ(j["choices"][0]["message"]["reasoning_content"], "Greet back.");
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
    Folded f = stream(*s.scripted.host, "");
    EXPECT_EQ(f.content, "Hello there!");
    EXPECT_EQ(f.reasoning, "Greet back.");
}

// The official npm clients' scripts (tests/http/openai-client; `npm ci`
// there installs the clients, as CI does): why one cannot run, "" when it can.
std::string node_client_missing(const std::string& package) {
    const std::filesystem::path dir = std::filesystem::path(EH_HTTP_TEST_DIR) / "openai-client";
    if (!std::filesystem::exists(dir / "node_modules" / package))
        return package + " npm package not installed: run `npm ci` in " + dir.string();
    if (std::system("node --version > /dev/null 2>&1") != 0) return "node is not installed";
    return "";
}
// Runs `script` against the server on `port`; it prints {"ok":true,...} when every check passed.
void expect_node_client_passes(const std::string& script, int port) {
    const std::filesystem::path dir = std::filesystem::path(EH_HTTP_TEST_DIR) / "openai-client";
    auto [rc, out] = run_command("node " + (dir / script).string() + " http://127.0.0.1:" + std::to_string(port) + " 2>&1");
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("\"ok\":true"), std::string::npos) << out;
}

TEST(ToolCallsServe, OfficialNodeClient) {
    if (auto why = node_client_missing("openai"); !why.empty()) GTEST_SKIP() << why;
    TemplatedHost s(qwen_template(), "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
    expect_node_client_passes("tools.mjs", s->port());
}

// A real model (stories260K on the CPU reference engine, with Qwen2.5's
// template) offered tools: its output is whatever it is (a story, no call),
// but the request runs end to end and the stream folds to the same answer.
TEST(ToolCallsServe, RealModelSmoke) {
    TemplatedModel m(qwen_template());
    EngineHost h({}, {}, true, EH_PLUGIN_DIR, m.path);
    ASSERT_TRUE(h.running()) << h.log();
    const std::string extra = std::string(R"(,"temperature":0,"seed":1,"tools":)") + kTools;
    int status = 0;
    json j = chat(h, extra, &status);
    ASSERT_EQ(status, 200) << j.dump();
    const json& msg = j["choices"][0]["message"];
    Folded f = stream(h, extra);
    EXPECT_EQ(f.finish, j["choices"][0]["finish_reason"]);
    if (msg["content"].is_string()) EXPECT_EQ(f.content, msg["content"]);
    EXPECT_EQ(f.calls.size(), msg.contains("tool_calls") ? msg["tool_calls"].size() : 0u);
}

// tool_choice "required" / named on a real model (stories260K on the CPU
// reference engine, which takes the allowed-token mask): whatever the
// model would have written, the output is a call of an offered function
// whose arguments match its schema.
TEST(ToolCallsServe, ForcedCallsAreValidCallsOnARealModel) {
    // (gpt-oss's template needs each tool's description.)
    const std::string tools = R"([{"type":"function","function":{"name":"get_weather","description":"w","parameters":{"type":"object",)"
                              R"("properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city","days"],)"
                              R"("additionalProperties":false}}},{"type":"function","function":{"name":"get_time","description":"t",)"
                              R"("parameters":{"type":"object","properties":{"zone":{"type":"string","enum":["UTC","CET"]}},)"
                              R"("required":["zone"],"additionalProperties":false}}}])";
    auto check_call = [](const json& call) {
        const std::string name = call["function"]["name"];
        json args = json::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
        ASSERT_TRUE(args.is_object()) << call.dump();
        if (name == "get_weather") {
            EXPECT_TRUE(args["city"].is_string() && args["days"].is_number_integer() && args.size() == 2) << args.dump();
        } else {
            ASSERT_EQ(name, "get_time");
            EXPECT_TRUE(args["zone"] == "UTC" || args["zone"] == "CET") << args.dump();
        }
    };
    for (const auto& [tmpl, label] : {std::pair{qwen_template(), "qwen"}, std::pair{gptoss_template(), "gpt-oss"}}) {
        TemplatedModel m(tmpl);
        EngineHost h({}, {}, true, EH_PLUGIN_DIR, m.path);
        ASSERT_TRUE(h.running()) << h.log();
        for (int seed = 0; seed < 3; ++seed) {
            const std::string named = R"(,"tool_choice":{"type":"function","function":{"name":"get_time"}},"temperature":1,"seed":)" +
                                      std::to_string(seed) + R"(,"tools":)" + tools;
            int status = 0;
            json j = chat(h, named, &status);
            ASSERT_EQ(status, 200) << label << " " << j.dump();
            const json& msg = j["choices"][0]["message"];
            EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls") << label << " " << j.dump();
            ASSERT_EQ(msg["tool_calls"].size(), 1u) << label << " " << j.dump();
            EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_time");
            check_call(msg["tool_calls"][0]);
            Folded f = stream(h, named);
            EXPECT_EQ(f.finish, "tool_calls");
            ASSERT_EQ(f.calls.size(), 1u) << label;
            EXPECT_EQ(f.calls[0]["name"], "get_time");
        }
        if (std::string(label) == "qwen") {
            for (int seed = 0; seed < 3; ++seed) {
                json j = chat(h, R"(,"tool_choice":"required","temperature":1,"seed":)" + std::to_string(seed) + R"(,"tools":)" + tools);
                const json& msg = j["choices"][0]["message"];
                ASSERT_GE(msg["tool_calls"].size(), 1u) << j.dump();
                for (const json& c : msg["tool_calls"]) check_call(c);
            }
        } else {  // harmony: one call per answer, of either tool
            for (int seed = 0; seed < 3; ++seed) {
                int status = 0;
                json j = chat(h, R"(,"tool_choice":"required","temperature":1,"seed":)" + std::to_string(seed) +
                                     R"(,"tools":)" + tools, &status);
                ASSERT_EQ(status, 200) << j.dump();
                const json& msg = j["choices"][0]["message"];
                EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls") << j.dump();
                ASSERT_EQ(msg["tool_calls"].size(), 1u) << j.dump();
                check_call(msg["tool_calls"][0]);
            }
        }
    }
}

TEST(ToolCallsServe, ForcedCallOnAnEngineWithoutMasksIs400) {
    TemplatedModel m(qwen_template());
    EngineHost h({}, {}, true, std::string(EH_TEST_PLUGIN_DIR) + "/good", m.path);  // a 1.0 engine: no masks
    int status = 0;
    json j = chat(h, std::string(R"(,"tool_choice":"required","tools":)") + kTools, &status);
    EXPECT_EQ(status, 400) << j.dump();
    EXPECT_EQ(j["error"]["param"], "tool_choice") << j.dump();
    // Anthropic's any: the same refusal, in Anthropic's shape.
    const std::string tools = R"([{"name":"get_weather","input_schema":{"type":"object"}}])";
    auto r = h.post("/v1/messages", R"({"model":"m","max_tokens":8,"tool_choice":{"type":"any"},"tools":)" + tools +
                                        R"(,"messages":[{"role":"user","content":"x"}]})");
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_EQ(json::parse(r.body)["error"]["type"], "invalid_request_error") << r.body;
}

TEST(ToolCallsServe, ModelWithoutToolFormatIs400) {
    EngineHost h;  // stories260K: no chat template, so no tool format
    int status = 0;
    json j = chat(h, std::string(R"(,"tools":)") + kTools, &status);
    EXPECT_EQ(status, 400);
    EXPECT_NE(j["error"]["message"].get<std::string>().find("has no tool-call format"), std::string::npos) << j.dump();
    auto r = h.post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"},
        {"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},
        {"role":"tool","tool_call_id":"c","content":"1"}]})");
    EXPECT_EQ(r.status, 400);
    EXPECT_NE(r.body.find("no tool-call format"), std::string::npos) << r.body;
    // tool_choice none with tools is fine: nothing is offered.
    EXPECT_EQ(h.post("/v1/chat/completions", R"({"max_tokens":2,"tool_choice":"none","messages":[{"role":"user","content":"x"}],"tools":)" +
                                                 std::string(kTools) + "}").status,
              200);
}

// ---- Anthropic /v1/messages tool use -----------------------------------------

const json kAnthropicTools = json::parse(R"([{"name":"get_weather","description":"Weather now",)"
                                         R"("input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}])");

json anthropic_body(json extra = json::object()) {
    json b = {{"model", "claude-test"}, {"max_tokens", 200},
              {"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}}};
    for (auto& [k, v] : extra.items()) b[k] = v;
    return b;
}

// A streamed message folded back into its content blocks, checking
// Anthropic's event order on the way.
struct AnthropicFolded {
    json blocks = json::array();
    json stop_reason;
    std::vector<std::string> names;
    size_t json_deltas = 0;
};
AnthropicFolded anthropic_stream(EngineHost& h, json b) {
    b["stream"] = true;
    auto r = h.post("/v1/messages", b.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    AnthropicFolded f;
    int open = -1;
    std::vector<std::string> partial;
    for (const auto& ev : parse_sse(r.body)) {
        json d = json::parse(ev.data);
        f.names.push_back(ev.event);
        EXPECT_EQ(d["type"], ev.event);
        if (ev.event == "content_block_start") {
            EXPECT_EQ(open, -1) << "a block starts only after the previous one stopped";
            open = d["index"];
            EXPECT_EQ(size_t(open), f.blocks.size());
            f.blocks.push_back(d["content_block"]);
            partial.push_back("");
        } else if (ev.event == "content_block_delta") {
            EXPECT_EQ(d["index"], open);
            const json& delta = d["delta"];
            if (delta["type"] == "text_delta") {
                EXPECT_EQ(f.blocks[size_t(open)]["type"], "text");
                f.blocks[size_t(open)]["text"] = f.blocks[size_t(open)]["text"].get<std::string>() + delta["text"].get<std::string>();
            } else {
                EXPECT_EQ(delta["type"], "input_json_delta");
                EXPECT_EQ(f.blocks[size_t(open)]["type"], "tool_use");
                partial[size_t(open)] += delta["partial_json"].get<std::string>();
                ++f.json_deltas;
            }
        } else if (ev.event == "content_block_stop") {
            EXPECT_EQ(d["index"], open);
            if (f.blocks[size_t(open)]["type"] == "tool_use") {
                EXPECT_EQ(f.blocks[size_t(open)]["input"], json::object()) << "the start carries an empty input";
                f.blocks[size_t(open)]["input"] = json::parse(partial[size_t(open)]);
            }
            open = -1;
        } else if (ev.event == "message_delta") {
            EXPECT_EQ(open, -1);
            f.stop_reason = d["delta"]["stop_reason"];
        }
    }
    return f;
}

TEST(AnthropicToolUse, HermesCallIsAToolUseBlockWholeAndStreamed) {
    TemplatedHost s(qwen_template(), "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
    ASSERT_TRUE(s->running()) << s->log();
    auto r = s->post("/v1/messages", anthropic_body({{"tools", kAnthropicTools}}).dump());
    ASSERT_EQ(r.status, 200) << r.body;
    json m = json::parse(r.body);
    EXPECT_EQ(m["stop_reason"], "tool_use");
    ASSERT_EQ(m["content"].size(), 2u) << r.body;
    EXPECT_EQ(m["content"][0], (json{{"type", "text"}, {"text", " Let me look."}}));
    const json& use = m["content"][1];
    EXPECT_EQ(use["type"], "tool_use");
    EXPECT_EQ(use["name"], "get_weather");
    EXPECT_EQ(use["input"], (json{{"city", "Paris"}}));
    const std::string id = use["id"];
    EXPECT_EQ(id.rfind("toolu_", 0), 0u);
    EXPECT_EQ(id.size(), 30u);

    AnthropicFolded f = anthropic_stream(*s.scripted.host, anthropic_body({{"tools", kAnthropicTools}}));
    EXPECT_EQ(f.stop_reason, "tool_use");
    ASSERT_EQ(f.blocks.size(), 2u);
    EXPECT_EQ(f.blocks[0], m["content"][0]);
    EXPECT_EQ(f.blocks[1]["name"], "get_weather");
    EXPECT_EQ(f.blocks[1]["input"], use["input"]);
    EXPECT_GT(f.json_deltas, 3u) << "input_json_delta pieces as the arguments are written";
    ASSERT_GE(f.names.size(), 4u);
    EXPECT_EQ(f.names[0], "message_start");
    EXPECT_EQ(f.names[1], "content_block_start");
    EXPECT_EQ(f.names[2], "ping");
    EXPECT_EQ(f.names.back(), "message_stop");

    // Without tools (or tool_choice none) the same text is a text block.
    for (json extra : {json::object(), json{{"tools", kAnthropicTools}, {"tool_choice", {{"type", "none"}}}}}) {
        json plain = json::parse(s->post("/v1/messages", anthropic_body(extra).dump()).body);
        EXPECT_EQ(plain["stop_reason"], "end_turn");
        ASSERT_EQ(plain["content"].size(), 1u);
        EXPECT_NE(plain["content"][0]["text"].get<std::string>().find("<tool_call>"), std::string::npos);
    }
}

// Blocks follow the model's order: text, a call, text again.
TEST(AnthropicToolUse, TextAfterACallIsANewTextBlock) {
    TemplatedHost s(qwen_template(), "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>\nThen more.");
    json m = json::parse(s->post("/v1/messages", anthropic_body({{"tools", kAnthropicTools}}).dump()).body);
    ASSERT_EQ(m["content"].size(), 2u) << m.dump();
    EXPECT_EQ(m["content"][0]["type"], "tool_use");
    EXPECT_EQ(m["content"][0]["input"], json::object());
    EXPECT_EQ(m["content"][1], (json{{"type", "text"}, {"text", "Then more."}}));
    EXPECT_EQ(m["stop_reason"], "tool_use");
    AnthropicFolded f = anthropic_stream(*s.scripted.host, anthropic_body({{"tools", kAnthropicTools}}));
    ASSERT_EQ(f.blocks.size(), 2u);
    f.blocks[0].erase("id");  // a new id per message
    m["content"][0].erase("id");
    EXPECT_EQ(f.blocks, m["content"]);
}

// On harmony models the channels are split for Anthropic clients too: the
// final answer is the text, the analysis channel (a thinking block, which
// is not served) is left out, and no markup leaks.
TEST(AnthropicToolUse, GptOssChannelsAreSplit) {
    TemplatedHost s(gptoss_template(),
                    "<|channel|>analysis<|message|>Greet back.<|end|><|start|>assistant<|channel|>final<|message|>Hello there!");
    json m = json::parse(s->post("/v1/messages", anthropic_body().dump()).body);
    EXPECT_EQ(m["content"], json::parse(R"([{"type":"text","text":"Hello there!"}])")) << m.dump();
    EXPECT_EQ(m["stop_reason"], "end_turn");
    AnthropicFolded f = anthropic_stream(*s.scripted.host, anthropic_body());
    EXPECT_EQ(f.blocks, m["content"]);
}

// Tool history sent the Anthropic way renders exactly the prompt the same
// history sent the OpenAI way does.
TEST(AnthropicToolUse, ToolHistoryRendersAsOpenAIsDoes) {
    TemplatedHost s(qwen_template(), "It is sunny.", {"--log-content"});
    json anthropic = anthropic_body(
        {{"tools", kAnthropicTools},
         {"messages",
          {{{"role", "user"}, {"content", "Weather in Paris?"}},
           {{"role", "assistant"},
            {"content", {{{"type", "tool_use"}, {"id", "toolu_1"}, {"name", "get_weather"}, {"input", {{"city", "Paris"}}}}}}},
           {{"role", "user"}, {"content", {{{"type", "tool_result"}, {"tool_use_id", "toolu_1"}, {"content", "sunny"}}}}}}}});
    // (nlohmann::json sorts keys; the server keeps them as sent.)
    const std::string tools = R"([{"type":"function","function":{"name":"get_weather","description":"Weather now","parameters":)" +
                              kAnthropicTools[0]["input_schema"].dump() + "}}]";
    const std::string openai = std::string(R"({"max_tokens":200,"tools":)") + tools + R"(,"messages":[
        {"role":"user","content":"Weather in Paris?"},
        {"role":"assistant","content":null,"tool_calls":[{"id":"toolu_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
        {"role":"tool","tool_call_id":"toolu_1","content":"sunny"}]})";
    auto prompt = [&] {
        std::string p;
        for (const auto& e : s->log_events())
            if (e.value("event", "") == "execute_start") p = e.value("prompt", "");
        return p;
    };
    auto a = s->post("/v1/messages", anthropic.dump());
    ASSERT_EQ(a.status, 200) << a.body;
    const std::string from_anthropic = prompt();
    ASSERT_EQ(s->post("/v1/chat/completions", openai).status, 200);
    const std::string from_openai = prompt();
    EXPECT_EQ(from_anthropic, from_openai);
    EXPECT_NE(from_anthropic.find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"),
              std::string::npos) << from_anthropic;
    EXPECT_NE(from_anthropic.find("<tool_response>\nsunny\n</tool_response>"), std::string::npos) << from_anthropic;
    // count_tokens takes the same tools and history.
    json count = anthropic;
    count.erase("max_tokens");
    auto c = s->post("/v1/messages/count_tokens", count.dump());
    ASSERT_EQ(c.status, 200) << c.body;
    EXPECT_EQ(json::parse(c.body)["input_tokens"], json::parse(a.body)["usage"]["input_tokens"]);
}

// tool_choice any / tool on a real model (stories260K on the CPU reference
// engine, which takes the mask): whatever it would have written, the answer
// is a tool_use block of an offered tool whose input matches its schema.
// The Anthropic API has no seed, so sampling is random: `any` runs greedy
// (get_weather's free-form string could otherwise outrun max_tokens now and
// then, a truncated call being the right answer to that), the named tool,
// whose input is bounded by its enum, at temperature 1, twice.
TEST(AnthropicToolUse, AnyAndToolChoicesForceACallOnARealModel) {
    const json tools = json::parse(R"([{"name":"get_weather","description":"w","input_schema":{"type":"object",)"
                                   R"("properties":{"city":{"type":"string"}},"required":["city"],"additionalProperties":false}},)"
                                   R"({"name":"get_time","description":"t","input_schema":{"type":"object","properties":)"
                                   R"({"zone":{"type":"string","enum":["UTC","CET"]}},"required":["zone"],"additionalProperties":false}}])");
    for (const auto& [tmpl, label] : {std::pair{qwen_template(), "qwen"}, std::pair{gptoss_template(), "gpt-oss"}}) {
        SCOPED_TRACE(label);
        TemplatedModel m(tmpl);
        EngineHost h({}, {}, true, EH_PLUGIN_DIR, m.path);
        ASSERT_TRUE(h.running()) << h.log();
        for (const json& choice : {json{{"type", "any"}, {"disable_parallel_tool_use", true}},
                                   json{{"type", "tool"}, {"name", "get_time"}}}) {
            const bool bounded = choice["type"] == "tool";
            for (int round = 0; round < (bounded ? 2 : 1); ++round) {
                json b = anthropic_body({{"tools", tools}, {"tool_choice", choice}, {"temperature", bounded ? 1 : 0}});
                b["metadata"] = {{"user_id", "u"}};
                auto r = h.post("/v1/messages", b.dump());
                ASSERT_EQ(r.status, 200) << r.body;
                json msg = json::parse(r.body);
                EXPECT_EQ(msg["stop_reason"], "tool_use") << r.body;
                json uses = json::array();
                for (const json& block : msg["content"])
                    if (block["type"] == "tool_use") uses.push_back(block);
                ASSERT_EQ(uses.size(), 1u) << r.body;
                const json& input = uses[0]["input"];
                if (choice["type"] == "tool") EXPECT_EQ(uses[0]["name"], "get_time");
                if (uses[0]["name"] == "get_time") {
                    EXPECT_TRUE(input["zone"] == "UTC" || input["zone"] == "CET") << input.dump();
                } else {
                    ASSERT_EQ(uses[0]["name"], "get_weather");
                    EXPECT_TRUE(input["city"].is_string() && input.size() == 1) << input.dump();
                }
                AnthropicFolded f = anthropic_stream(h, b);
                EXPECT_EQ(f.stop_reason, "tool_use");
                size_t streamed_uses = 0;
                for (const json& block : f.blocks) streamed_uses += block["type"] == "tool_use";
                EXPECT_EQ(streamed_uses, 1u);
            }
        }
    }
}

TEST(AnthropicToolUse, ModelWithoutToolFormatIs400) {
    EngineHost h;  // stories260K: no chat template, so no tool format
    auto r = h.post("/v1/messages", anthropic_body({{"tools", kAnthropicTools}}).dump());
    EXPECT_EQ(r.status, 400);
    json e = json::parse(r.body);
    EXPECT_EQ(e["error"]["type"], "invalid_request_error");
    EXPECT_NE(e["error"]["message"].get<std::string>().find("has no tool-call format"), std::string::npos) << r.body;
}

TEST(AnthropicToolUse, OfficialNodeClient) {
    if (auto why = node_client_missing("@anthropic-ai/sdk"); !why.empty()) GTEST_SKIP() << why;
    TemplatedHost s(qwen_template(), "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
    expect_node_client_passes("anthropic_tools.mjs", s->port());
}

}  // namespace

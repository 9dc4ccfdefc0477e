// The Anthropic Messages API over real HTTP: stories260K through the CPU
// reference plugin (a real model and tokenizer), and the test engine where
// a behaviour must be forced (EOS, a timeout mid-stream, loading).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>

#include "engine_host_process.hpp"
#include "model_fixtures.hpp"

using namespace eh::test;
using nlohmann::json;

namespace {

EngineHost& stories_host() {
    static EngineHost host({}, {}, true, EH_PLUGIN_DIR);
    return host;
}

json request(int max_tokens, bool stream = false) {
    return {{"model", "claude-test"},
            {"max_tokens", max_tokens},
            {"temperature", 0},
            {"system", "You tell short stories."},
            {"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}},
            {"metadata", {{"user_id", "u-1"}}},
            {"stream", stream}};
}

json error_of(const HttpResponse& r) {
    json j = json::parse(r.body, nullptr, false);
    EXPECT_TRUE(j.is_object()) << r.body;
    EXPECT_EQ(j.value("type", ""), "error") << r.body;
    return j.is_object() ? j["error"] : json();
}

// The events of a streamed message, each checked to carry its own name as "type".
std::vector<std::pair<std::string, json>> events_of(const HttpResponse& r) {
    std::vector<std::pair<std::string, json>> out;
    for (const auto& e : parse_sse(r.body)) {
        json d = json::parse(e.data);
        EXPECT_EQ(d["type"], e.event == "error" ? "error" : e.event) << e.data;
        out.push_back({e.event, d});
    }
    return out;
}

}  // namespace

TEST(Anthropic, MessageHasAnthropicsShape) {
    auto& h = stories_host();
    ASSERT_GT(h.port(), 0) << h.log();
    auto r = h.post("/v1/messages", request(12).dump());
    ASSERT_EQ(r.status, 200) << r.body;
    json m = json::parse(r.body);
    EXPECT_EQ(m["id"].get<std::string>().rfind("msg_", 0), 0u);
    EXPECT_EQ(m["type"], "message");
    EXPECT_EQ(m["role"], "assistant");
    EXPECT_EQ(m["model"], "claude-test");  // echoed, as Anthropic does
    ASSERT_EQ(m["content"].size(), 1u);
    EXPECT_EQ(m["content"][0]["type"], "text");
    EXPECT_FALSE(m["content"][0]["text"].get<std::string>().empty());
    EXPECT_EQ(m["stop_reason"], "max_tokens");
    EXPECT_TRUE(m["stop_sequence"].is_null());
    EXPECT_EQ(m["usage"]["output_tokens"], 12);
    // input_tokens is what count_tokens says for the same messages.
    json count_req = request(12);
    count_req.erase("max_tokens");
    auto c = h.post("/v1/messages/count_tokens", count_req.dump());
    ASSERT_EQ(c.status, 200) << c.body;
    EXPECT_EQ(json::parse(c.body)["input_tokens"], m["usage"]["input_tokens"]);
    EXPECT_GT(m["usage"]["input_tokens"].get<int>(), 5);
}

TEST(Anthropic, StreamedEventsInOrderAndSameTextAsNotStreamed) {
    auto& h = stories_host();
    json whole = json::parse(h.post("/v1/messages", request(16).dump()).body);
    auto r = h.post("/v1/messages", request(16, true).dump());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_NE(r.header("content-type").find("text/event-stream"), std::string::npos);
    auto evs = events_of(r);
    ASSERT_GE(evs.size(), 7u) << r.body;
    EXPECT_EQ(evs[0].first, "message_start");
    EXPECT_EQ(evs[1].first, "content_block_start");
    EXPECT_EQ(evs[2].first, "ping");
    EXPECT_EQ(evs[evs.size() - 3].first, "content_block_stop");
    EXPECT_EQ(evs[evs.size() - 2].first, "message_delta");
    EXPECT_EQ(evs[evs.size() - 1].first, "message_stop");
    const json& start = evs[0].second["message"];
    EXPECT_EQ(start["id"].get<std::string>().rfind("msg_", 0), 0u);
    EXPECT_EQ(start["role"], "assistant");
    EXPECT_TRUE(start["content"].empty());
    EXPECT_TRUE(start["stop_reason"].is_null());
    EXPECT_EQ(start["usage"]["input_tokens"], whole["usage"]["input_tokens"]);
    EXPECT_EQ(evs[1].second["content_block"], (json{{"type", "text"}, {"text", ""}}));
    std::string text;
    for (size_t i = 3; i + 3 < evs.size(); ++i) {
        ASSERT_EQ(evs[i].first, "content_block_delta");
        EXPECT_EQ(evs[i].second["index"], 0);
        EXPECT_EQ(evs[i].second["delta"]["type"], "text_delta");
        text += evs[i].second["delta"]["text"].get<std::string>();
    }
    EXPECT_EQ(text, whole["content"][0]["text"].get<std::string>());
    const json& delta = evs[evs.size() - 2].second;
    EXPECT_EQ(delta["delta"]["stop_reason"], "max_tokens");
    EXPECT_TRUE(delta["delta"]["stop_sequence"].is_null());
    EXPECT_EQ(delta["usage"]["output_tokens"], 16);
}

TEST(Anthropic, StopSequenceEndsTheMessageAndIsNamed) {
    auto& h = stories_host();
    const std::string text = json::parse(h.post("/v1/messages", request(24).dump()).body)["content"][0]["text"];
    ASSERT_GT(text.size(), 12u);
    const std::string stop = text.substr(text.size() / 2, 3);
    json req = request(24);
    req["stop_sequences"] = {"never-in-this-story", stop};
    for (bool stream : {false, true}) {
        SCOPED_TRACE(stream);
        req["stream"] = stream;
        auto r = h.post("/v1/messages", req.dump());
        ASSERT_EQ(r.status, 200) << r.body;
        json stop_info;
        std::string got;
        if (stream) {
            for (auto& [name, d] : events_of(r)) {
                if (name == "content_block_delta") got += d["delta"]["text"].get<std::string>();
                if (name == "message_delta") stop_info = d["delta"];
            }
        } else {
            json m = json::parse(r.body);
            got = m["content"][0]["text"];
            stop_info = m;
        }
        EXPECT_EQ(stop_info["stop_reason"], "stop_sequence");
        EXPECT_EQ(stop_info["stop_sequence"], stop);
        EXPECT_EQ(got, text.substr(0, text.find(stop)));
    }
}

TEST(Anthropic, SystemAndContentBlocksEqualTheirStringForms) {
    auto& h = stories_host();
    json blocks = {{"model", "m"},
                   {"system", {{{"type", "text"}, {"text", "You tell "}}, {{"type", "text"}, {"text", "short stories."}}}},
                   {"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Once upon a time"}}}}}}}};
    json strings = {{"model", "m"},
                    {"system", "You tell short stories."},
                    {"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}}};
    json no_system = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}}};
    auto count = [&](const json& j) {
        auto r = h.post("/v1/messages/count_tokens", j.dump());
        EXPECT_EQ(r.status, 200) << r.body;
        return json::parse(r.body)["input_tokens"].get<int>();
    };
    EXPECT_EQ(count(blocks), count(strings));
    EXPECT_GT(count(strings), count(no_system));
}

TEST(Anthropic, ErrorsHaveAnthropicsShape) {
    auto& h = stories_host();
    struct Case {
        const char* name;
        std::string body;
        const char* says;
    };
    json base = request(8);
    auto without = [&](const char* k) {
        json j = base;
        j.erase(k);
        return j.dump();
    };
    auto with = [&](const char* k, json v) {
        json j = base;
        j[k] = v;
        return j.dump();
    };
    const std::vector<Case> cases = {
        {"not json", "{", "JSON"},
        {"no max_tokens", without("max_tokens"), "'max_tokens' is required"},
        {"no model", without("model"), "'model' is required"},
        {"no messages", without("messages"), "'messages' is required"},
        {"max_tokens 0", with("max_tokens", 0), "max_tokens"},
        {"temperature above 1", with("temperature", 1.5), "temperature"},
        {"system role in messages", with("messages", {{{"role", "system"}, {"content", "x"}}}), "'system'"},
        {"image block without a source", with("messages", {{{"role", "user"}, {"content", {{{"type", "image"}}}}}}),
         "'messages[0].content[0].source' is required"},
        {"image block in an assistant message",
         with("messages", {{{"role", "user"}, {"content", "a"}}, {{"role", "assistant"}, {"content", {{{"type", "image"}}}}},
                           {{"role", "user"}, {"content", "b"}}}),
         "\"image\" is not supported"},
        {"final assistant", with("messages", {{{"role", "user"}, {"content", "a"}}, {{"role", "assistant"}, {"content", "b"}}}),
         "final assistant"},
        {"tool without input_schema", with("tools", json::array({{{"name", "f"}}})), "'tools[0].input_schema' is required"},
        {"server tool", with("tools", json::array({{{"type", "bash_20250124"}, {"name", "bash"}}})), "is not supported"},
        {"thinking budget below 1024", with("thinking", {{"type", "enabled"}, {"budget_tokens", 100}}), "budget_tokens"},
        {"stop_sequences not array", with("stop_sequences", "x"), "stop_sequences"},
    };
    for (const auto& c : cases) {
        SCOPED_TRACE(c.name);
        auto r = h.post("/v1/messages", c.body);
        EXPECT_EQ(r.status, 400) << r.body;
        json e = error_of(r);
        EXPECT_EQ(e["type"], "invalid_request_error");
        EXPECT_NE(e["message"].get<std::string>().find(c.says), std::string::npos) << r.body;
    }
    auto unauth = EngineHost({"--api-key", "ak"}, {}, true, EH_PLUGIN_DIR);
    auto no_key = unauth.post("/v1/messages", base.dump());
    EXPECT_EQ(no_key.status, 401);
    EXPECT_EQ(error_of(no_key)["type"], "authentication_error");
    EXPECT_EQ(unauth.post("/v1/messages", base.dump(), {{"x-api-key", "ak"}}).status, 200);
    EXPECT_EQ(unauth.post("/v1/messages", base.dump(), {{"Authorization", "Bearer ak"}}).status, 200);
    EXPECT_EQ(unauth.post("/v1/messages/count_tokens", without("max_tokens"), {{"x-api-key", "ak"}}).status, 200);
}

// A message whose text looks like the model's control tokens is tokenized
// as text (the template's own markup is not): "</s>" twice in a message is
// more than the 2 tokens it would be as control tokens.
TEST(Anthropic, MessageTextThatLooksLikeControlTokensStaysText) {
    TemplatedModel m("{% for m in messages %}<s>{{ m.content }}</s>{% endfor %}", stories_model());
    EngineHost h({}, {}, true, std::string(EH_TEST_PLUGIN_DIR) + "/good", m.path);
    ASSERT_GT(h.port(), 0) << h.log();
    auto count = [&](const std::string& text) {
        json body = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", text}}}}};
        auto r = h.post("/v1/messages/count_tokens", body.dump());
        EXPECT_EQ(r.status, 200) << r.body;
        return json::parse(r.body)["input_tokens"].get<int>();
    };
    const int markup = count("");  // "<s></s>": the template's control tokens
    EXPECT_LE(markup, 3);
    EXPECT_GT(count("</s></s>") - markup, 2);
}

TEST(Anthropic, EndTurnOnEndOfGeneration) {
    EngineHost h({}, {{"EH_TEST_ENGINE_EOS_AFTER", "3"}});
    auto r = h.post("/v1/messages", request(50).dump());
    ASSERT_EQ(r.status, 200) << r.body;
    json m = json::parse(r.body);
    EXPECT_EQ(m["stop_reason"], "end_turn");
    EXPECT_LT(m["usage"]["output_tokens"].get<int>(), 50);
}

TEST(Anthropic, ErrorMidStreamIsAnErrorEvent) {
    EngineHost h({"--inference-timeout-sec", "1"}, {{"EH_TEST_ENGINE_DELAY_MS", "20"}});
    auto r = h.post("/v1/messages", request(1000, true).dump());  // 20 s of decoding, 1 s allowed
    ASSERT_EQ(r.status, 200) << r.body;
    auto evs = events_of(r);
    ASSERT_FALSE(evs.empty());
    EXPECT_EQ(evs.front().first, "message_start");
    EXPECT_EQ(evs.back().first, "error") << r.body;
    EXPECT_EQ(evs.back().second["error"]["type"], "api_error");
    EXPECT_FALSE(evs.back().second["error"]["message"].get<std::string>().empty());
}

TEST(Anthropic, LoadingIsOverloadedError) {
    EngineHost h({}, {{"EH_TEST_ENGINE_LOAD_DELAY_MS", "3000"}}, false);
    ASSERT_GT(h.port(), 0) << h.log();
    auto r = h.post("/v1/messages", request(4).dump());
    EXPECT_EQ(r.status, 503) << r.body;
    EXPECT_EQ(error_of(r)["type"], "overloaded_error");
}

// The official @anthropic-ai/sdk npm client (tests/http/openai-client/
// anthropic.mjs; `npm ci` there installs it, as CI does) against a server
// that requires a key: create, the SDK's stream helper, raw events,
// countTokens and its typed errors.
TEST(Anthropic, OfficialNodeClientRoundTrip) {
    std::filesystem::path dir = std::filesystem::path(EH_HTTP_TEST_DIR) / "openai-client";
    if (!std::filesystem::exists(dir / "node_modules" / "@anthropic-ai" / "sdk"))
        GTEST_SKIP() << "@anthropic-ai/sdk npm package not installed: run `npm ci` in " << dir.string();
    if (std::system("node --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "node is not installed";
    EngineHost h({"--api-key", "sdk-key"}, {}, true, EH_PLUGIN_DIR);
    ASSERT_GT(h.port(), 0) << h.log();
    std::string cmd = "node " + (dir / "anthropic.mjs").string() + " http://127.0.0.1:" + std::to_string(h.port()) +
                      " sdk-key 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    int rc = pclose(p);
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("\"ok\":true"), std::string::npos) << out;
}

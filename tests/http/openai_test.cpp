// The OpenAI-compatible API: raw HTTP checks of the wire format, and a round
// trip through the official `openai` npm client when it is installed
// (tests/http/openai-client: `npm ci`).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>

#include "engine_host_process.hpp"

using namespace eh::test;
using nlohmann::json;

namespace {

EngineHost& host() {
    static EngineHost h({}, {{"EH_TEST_ENGINE_DELAY_MS", "1"}});
    return h;
}

const char* kChat = R"({"model":"x","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}],)"
                    R"("max_tokens":6,"temperature":0,"seed":5)";

}  // namespace

TEST(OpenAI, ModelsListsTheServedModel) {
    json j = json::parse(host().get("/v1/models").body);
    EXPECT_EQ(j["object"], "list");
    ASSERT_EQ(j["data"].size(), 1u);
    EXPECT_EQ(j["data"][0]["id"], "stories260K");
    EXPECT_EQ(j["data"][0]["object"], "model");
}

TEST(OpenAI, ChatNonStreaming) {
    auto r = host().post("/v1/chat/completions", std::string(kChat) + "}");
    ASSERT_EQ(r.status, 200) << r.body;
    json j = json::parse(r.body);
    EXPECT_EQ(j["object"], "chat.completion");
    EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
    EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(j["usage"]["completion_tokens"], 6);
    EXPECT_EQ(j["usage"]["total_tokens"], j["usage"]["prompt_tokens"].get<int>() + 6);
}

TEST(OpenAI, ChatStreamingEndsWithDoneAndUsage) {
    auto r = host().post("/v1/chat/completions", std::string(kChat) + R"(,"stream":true,"stream_options":{"include_usage":true}})");
    ASSERT_EQ(r.status, 200);
    auto evs = parse_sse(r.body);
    ASSERT_GE(evs.size(), 4u);
    EXPECT_EQ(evs.back().data, "[DONE]");
    json first = json::parse(evs.front().data);
    EXPECT_EQ(first["object"], "chat.completion.chunk");
    EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
    json usage = json::parse(evs[evs.size() - 2].data);
    EXPECT_TRUE(usage["choices"].empty());
    EXPECT_EQ(usage["usage"]["completion_tokens"], 6);
    json fin = json::parse(evs[evs.size() - 3].data);
    EXPECT_EQ(fin["choices"][0]["finish_reason"], "length");
    // Same text as the non-streaming answer.
    std::string text;
    for (size_t i = 0; i + 1 < evs.size(); ++i) {
        json c = json::parse(evs[i].data);
        if (!c["choices"].empty() && c["choices"][0]["delta"].contains("content"))
            text += c["choices"][0]["delta"]["content"].get<std::string>();
    }
    json whole = json::parse(host().post("/v1/chat/completions", std::string(kChat) + "}").body);
    EXPECT_EQ(text, whole["choices"][0]["message"]["content"]);
}

TEST(OpenAI, LogprobsInBothShapes) {
    auto r = host().post("/v1/completions", R"({"prompt":"Once upon","max_tokens":4,"temperature":0,"logprobs":2})");
    ASSERT_EQ(r.status, 200) << r.body;
    json j = json::parse(r.body);
    EXPECT_EQ(j["object"], "text_completion");
    auto lp = j["choices"][0]["logprobs"];
    EXPECT_EQ(lp["tokens"].size(), 4u);
    EXPECT_EQ(lp["token_logprobs"].size(), 4u);
    EXPECT_EQ(lp["top_logprobs"][0].size(), 2u);
    auto c = host().post("/v1/chat/completions", std::string(kChat) + R"(,"logprobs":true,"top_logprobs":1})");
    json cj = json::parse(c.body);
    EXPECT_EQ(cj["choices"][0]["logprobs"]["content"].size(), 6u);
    EXPECT_EQ(cj["choices"][0]["logprobs"]["content"][0]["top_logprobs"].size(), 1u);
}

// The test engine is a 1.0 plugin: its sampler cannot take biases or
// OpenAI penalties, so they are refused rather than ignored.
TEST(OpenAI, BiasAndPenaltiesOnAnEngineWithoutThemAre400) {
    for (const char* extra : {R"("logit_bias":{"5":10})", R"("presence_penalty":1)", R"("frequency_penalty":0.5)"}) {
        auto r = host().post("/v1/chat/completions", std::string(kChat) + "," + extra + "}");
        EXPECT_EQ(r.status, 400) << extra << " " << r.body;
        EXPECT_NE(r.body.find("runs no batched steps"), std::string::npos) << r.body;
    }
}

// An error ends the stream as an error object, then `data: [DONE]` like
// every OpenAI stream: clients (and gateways) read to [DONE].
TEST(OpenAI, MidStreamErrorIsADataFrameThenDone) {
    EngineHost h({"--inference-timeout-sec", "1"}, {{"EH_TEST_ENGINE_DELAY_MS", "20"}});
    auto r = h.post("/v1/chat/completions",
                    R"({"messages":[{"role":"user","content":"x"}],"max_tokens":2000,"stream":true})");
    auto evs = parse_sse(r.body);
    ASSERT_GE(evs.size(), 2u);
    EXPECT_EQ(evs.back().data, "[DONE]");
    json last = json::parse(evs[evs.size() - 2].data);
    EXPECT_EQ(last["error"]["code"], "INFERENCE_TIMEOUT");
}

TEST(OpenAI, OfficialNodeClientRoundTrip) {
    std::filesystem::path dir = std::filesystem::path(EH_HTTP_TEST_DIR) / "openai-client";
    if (!std::filesystem::exists(dir / "node_modules" / "openai"))
        GTEST_SKIP() << "openai npm package not installed: run `npm ci` in " << dir.string();
    if (std::system("node --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "node is not installed";
    std::string cmd = "node " + (dir / "roundtrip.mjs").string() + " http://127.0.0.1:" + std::to_string(host().port()) + " 2>&1";
    auto [rc, out] = run_command(cmd);
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("\"ok\":true"), std::string::npos) << out;
}

// Issue 26 items 1 and 2 end to end: stories260K re-written with a hostile
// tokenizer.chat_template, served by the real engine-host.
#include <gtest/gtest.h>

#include <chrono>

#include "engine_host_process.hpp"
#include "model_fixtures.hpp"

using namespace eh::test;

namespace {

const char* kChat = R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":3})";

const char* kNestingError = "chat template line 1: nesting deeper than 200 levels";

// The error every chat route answers for a rejected template: never a plain
// transcript the model was not trained on.
void expect_unusable(const HttpResponse& r) {
    EXPECT_EQ(r.status, 400) << r.body;
    const nlohmann::json j = nlohmann::json::parse(r.body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r.body;
    EXPECT_EQ(j["error"].value("code", ""), "CHAT_TEMPLATE_UNUSABLE") << r.body;
    const std::string message = j["error"].value("message", "");
    EXPECT_NE(message.find(kNestingError), std::string::npos) << r.body;
    EXPECT_NE(message.find("--chat-template-file"), std::string::npos) << r.body;
}

// Issue 26 item 1: a template past the parser's nesting limit is refused at
// load with an error event and /health says so; serve still starts, chat
// routes answer CHAT_TEMPLATE_UNUSABLE, the routes that need no template
// work.
TEST(HostileTemplateServe, DeeplyNestedTemplateIsALoadErrorAndChatIsRefused) {
    TemplatedModel m("{{ " + std::string(10000, '(') + "1" + std::string(10000, ')') + " }}");
    EngineHost h({}, {}, true, std::string(EH_TEST_PLUGIN_DIR) + "/good", m.path);
    ASSERT_TRUE(h.running()) << h.log();
    bool logged = false, ready_says = false;
    for (const auto& e : h.log_events()) {
        if (e.value("event", "") == "chat_template_rejected")
            logged = e.value("level", "") == "error" && e.value("code", "") == "CHAT_TEMPLATE_UNUSABLE" &&
                     e.value("message", "").find(kNestingError) != std::string::npos;
        if (e.value("event", "") == "ready") ready_says = e.value("chat_template", "") == "rejected";
    }
    EXPECT_TRUE(logged) << h.log();
    EXPECT_TRUE(ready_says) << h.log();

    auto health = h.get("/health");
    EXPECT_EQ(health.status, 200) << health.body;  // completions still serve
    const nlohmann::json t = nlohmann::json::parse(health.body)["chat_template"];
    EXPECT_EQ(t.value("status", ""), "rejected") << health.body;
    EXPECT_EQ(t.value("source", ""), "model") << health.body;
    EXPECT_NE(t.value("error", "").find(kNestingError), std::string::npos) << health.body;
    const nlohmann::json caps = nlohmann::json::parse(h.get("/capabilities").body);
    EXPECT_EQ(caps["workloads"], nlohmann::json({"generate", "tokenize", "detokenize"}));

    expect_unusable(h.post("/v1/chat/completions", kChat));
    expect_unusable(h.post("/v1/chat/completions",
                           R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true})"));
    // Tools: the template's reason, not "no tool-call format".
    expect_unusable(h.post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":3,
        "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]})"));
    const std::string anthropic = R"({"model":"m","max_tokens":3,"messages":[{"role":"user","content":"hi"}]})";
    for (const char* route : {"/v1/messages", "/v1/messages/count_tokens"}) {
        auto r = h.post(route, anthropic);
        EXPECT_EQ(r.status, 400) << route << " " << r.body;
        EXPECT_NE(r.body.find(kNestingError), std::string::npos) << route << " " << r.body;
        EXPECT_NE(r.body.find("--chat-template-file"), std::string::npos) << route << " " << r.body;
    }

    EXPECT_EQ(h.post("/v1/completions", R"({"prompt":"Once","max_tokens":3})").status, 200);
    auto ex = h.post("/execute", R"({"job_id":"j1","prompt":"Once","max_tokens":3})");
    EXPECT_EQ(ex.status, 200);
    EXPECT_NE(ex.body.find("event: end"), std::string::npos) << ex.body;
    EXPECT_EQ(h.stop(), 0);
}

TEST(HostileTemplateServe, RunawayTemplateLoopAnswersAndShutsDown) {
    TemplatedModel m("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}");
    EngineHost h({}, {}, true, std::string(EH_TEST_PLUGIN_DIR) + "/good", m.path);
    ASSERT_TRUE(h.running()) << h.log();
    auto t0 = std::chrono::steady_clock::now();
    auto r = h.post("/v1/chat/completions", kChat);
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_NE(r.body.find("evaluation exceeded"), std::string::npos) << r.body;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
    EXPECT_EQ(h.stop(SIGTERM, 10000), 0);
}

}  // namespace

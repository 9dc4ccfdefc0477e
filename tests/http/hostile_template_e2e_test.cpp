// Issue 26 items 1 and 2 end to end: stories260K re-written with a hostile
// tokenizer.chat_template, served by the real engine-host.
#include <gtest/gtest.h>

#include <chrono>

#include "engine_host_process.hpp"
#include "model_fixtures.hpp"

using namespace eh::test;

namespace {

const char* kChat = R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":3})";

TEST(HostileTemplateServe, DeeplyNestedTemplateDoesNotCrashTheServer) {
    TemplatedModel m("{{ " + std::string(10000, '(') + "1" + std::string(10000, ')') + " }}");
    EngineHost h({}, {}, true, std::string(EH_TEST_PLUGIN_DIR) + "/good", m.path);
    ASSERT_TRUE(h.running()) << h.log();
    // The template is refused at load, with the reason in the log; chat falls
    // back to the plain transcript.
    bool logged = false;
    for (const auto& e : h.log_events())
        if (e.value("event", "") == "chat_template_rejected")
            logged = e.value("message", "").find("nesting deeper than 200 levels") != std::string::npos;
    EXPECT_TRUE(logged) << h.log();
    auto r = h.post("/v1/chat/completions", kChat);
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_TRUE(h.running());
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

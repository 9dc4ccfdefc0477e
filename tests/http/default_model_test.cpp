// The model the repository ships (models/tinytales.gguf, trained by
// tools/train-default-model) loads through the CPU reference plugin and
// answers with recognisable text. Needs nothing outside the clone.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "engine_host_process.hpp"

using nlohmann::json;
using namespace eh::test;

namespace {

EngineHost& shipped() {
    static EngineHost h({"--log-format", "text"}, {}, true, EH_PLUGIN_DIR, EH_DEFAULT_MODEL);
    return h;
}

size_t count(const std::string& s, const std::string& what) {
    size_t n = 0;
    for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
    return n;
}

}  // namespace

TEST(DefaultModel, FileIsTheSmallOneTheReadmePromises) {
    EXPECT_LE(std::filesystem::file_size(EH_DEFAULT_MODEL), 16u << 20);
}

TEST(DefaultModel, LoadsOnTheCpuReferencePlugin) {
    EngineHost& h = shipped();
    ASSERT_GT(h.port(), 0) << h.log();
    json health = json::parse(h.get("/health").body);
    EXPECT_EQ(health["status"], "healthy") << health.dump();
    EXPECT_EQ(health["model"], "tinytales");
    EXPECT_EQ(health["plugin"]["name"], "cpu-reference");
    EXPECT_EQ(health["tokenizer_kind"], "gguf-spm");
    EXPECT_EQ(health["vocab_size"], 1468);
    EXPECT_EQ(health["context_length"], 512);
}

// The model learned from ids that tools/train-default-model/spm_bpe.py
// made; engine-host's tokenizer must give the same ids for the same text
// (tokenizer_check.json: generated samples, odd spacing, non-ASCII).
TEST(DefaultModel, TokenizesAsItWasTrained) {
    EngineHost& h = shipped();
    auto r = h.post("/tokenize", json{{"text", "Once upon a time"}, {"add_special", true}}.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["tokens"], json::parse("[1, 553, 552, 320, 467]"));

    std::ifstream f(std::string(EH_TRAIN_DIR) + "/tokenizer_check.json");
    const json cases = json::parse(f);
    ASSERT_GE(cases.size(), 30u);
    for (const auto& c : cases) {
        auto t = h.post("/tokenize", json{{"text", c["text"]}, {"add_special", false}}.dump());
        ASSERT_EQ(t.status, 200) << t.body;
        EXPECT_EQ(json::parse(t.body)["tokens"], c["ids"]) << c["text"];
    }
}

TEST(DefaultModel, ChatAnswersWithTheRequestedStory) {
    EngineHost& h = shipped();
    json req = {{"messages", {{{"role", "user"}, {"content", "Tell me a story about a shy owl named Milo."}}}},
                {"max_tokens", 300}, {"temperature", 0}};
    auto r = h.post("/v1/chat/completions", req.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    json choice = json::parse(r.body)["choices"][0];
    const std::string text = choice["message"]["content"];
    EXPECT_EQ(choice["finish_reason"], "stop") << text;  // it ends its story by itself
    EXPECT_NE(text.find("shy owl named Milo"), std::string::npos) << text;
    EXPECT_GE(count(text, "Milo"), 3u) << text;
    EXPECT_GE(count(text, ". "), 5u) << text;  // sentences, not a loop of one phrase
    EXPECT_EQ(text.back(), '.') << text;
}

TEST(DefaultModel, ContinuesAStoryOpening) {
    EngineHost& h = shipped();
    auto r = h.post("/v1/completions", json{{"prompt", "Once upon a time"}, {"max_tokens", 300}, {"temperature", 0}}.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    json choice = json::parse(r.body)["choices"][0];
    const std::string text = choice["text"];
    EXPECT_EQ(text.rfind(", ", 0), 0u) << text;  // "Once upon a time, there was ..." or ", a little ..."
    EXPECT_NE(text.find(" named "), std::string::npos) << text;
    EXPECT_GE(count(text, ". "), 5u) << text;
    EXPECT_EQ(choice["finish_reason"], "stop") << text;
}

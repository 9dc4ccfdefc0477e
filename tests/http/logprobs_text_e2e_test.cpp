// Logprob token text on the SentencePiece (llama-spm) and byte-level BPE
// (gpt-2) vocabularies: each token's text is the bytes it adds to the output
// (an SPM piece keeps its leading space, a bare-space token is " ", a
// byte-fallback or partial-character token carries its exact bytes with
// U+FFFD as its text), and text_offset counts code points of the output.
// The test engine is scripted to write a known text with each vocabulary.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine_host_process.hpp"
#include "model_fixtures.hpp"

using namespace eh::test;
using nlohmann::json;

namespace {

const std::string kText = "Once, there was  a café 🦙 x";

std::string vocab(const std::string& name) { return std::string(EH_TESTDATA_DIR) + "/vocab/" + name + ".gguf"; }

size_t code_points(const std::string& s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
}

// Checks the legacy and chat shapes against the output text `expected`.
void check_logprobs(EngineHost& h, const std::string& expected) {
    auto r = h.post("/v1/completions", R"({"prompt":"hi","max_tokens":40,"temperature":0,"logprobs":1})");
    ASSERT_EQ(r.status, 200) << r.body;
    json j = json::parse(r.body);
    const std::string text = j["choices"][0]["text"];
    EXPECT_EQ(text, expected);
    const json& lp = j["choices"][0]["logprobs"];
    auto c = h.post("/v1/chat/completions",
                    R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":40,"temperature":0,"logprobs":true})");
    ASSERT_EQ(c.status, 200) << c.body;
    const json content = json::parse(c.body)["choices"][0]["logprobs"]["content"];
    ASSERT_EQ(content.size(), lp["tokens"].size());
    // The bytes of all tokens are the output; each offset is where its
    // token's first character starts.
    std::string bytes;
    for (size_t i = 0; i < content.size(); ++i) {
        std::string tb;
        for (int b : content[i]["bytes"]) tb.push_back(char(b));
        const bool valid = code_points(tb) == code_points(std::string(content[i]["token"])) &&
                           content[i]["token"].get<std::string>() == tb;
        if (!valid) EXPECT_NE(content[i]["token"].get<std::string>().find("\xEF\xBF\xBD"), std::string::npos) << i;
        EXPECT_EQ(lp["tokens"][i], content[i]["token"]) << i;
        // A token starting inside a character points at that character.
        size_t complete = bytes.size();
        while (complete > 0 && (static_cast<unsigned char>(bytes[complete - 1]) & 0xC0) == 0x80) --complete;
        if (complete > 0 && static_cast<unsigned char>(bytes[complete - 1]) >= 0xC0) {
            --complete;  // a lead byte whose character is not complete yet
            const unsigned char lead = static_cast<unsigned char>(bytes[complete]);
            const size_t len = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
            if (bytes.size() - complete >= len) complete = bytes.size();
        }
        EXPECT_EQ(lp["text_offset"][i], code_points(bytes.substr(0, complete))) << i << " " << lp.dump();
        bytes += tb;
    }
    EXPECT_EQ(bytes, expected);
}

TEST(LogprobsText, SentencePieceKeepsSpacesAndBytes) {
    ScriptedHost h(vocab("ggml-vocab-llama-spm"), kText);
    ASSERT_TRUE(h->running()) << h->log();
    // The model's first piece is "▁Once": its space is output.
    check_logprobs(*h, " " + kText);
    json j = json::parse(h->post("/v1/completions", R"({"prompt":"hi","max_tokens":40,"logprobs":0})").body);
    const json& tokens = j["choices"][0]["logprobs"]["tokens"];
    ASSERT_GE(tokens.size(), 6u);
    EXPECT_EQ(tokens[0], " Once");
    EXPECT_EQ(tokens[1], ",");
    EXPECT_EQ(tokens[2], " there");
    EXPECT_EQ(tokens[3], " was");
    EXPECT_EQ(tokens[4], " ");  // the bare "▁" piece
    EXPECT_EQ(tokens[5], " a");
    EXPECT_EQ(j["choices"][0]["logprobs"]["text_offset"][1], 5);
    EXPECT_EQ(j["choices"][0]["logprobs"]["text_offset"][2], 6);
}

TEST(LogprobsText, ByteLevelBpe) {
    // The test engine serves llama only: the gpt-2 vocabulary under that name.
    RewrittenModel m(vocab("ggml-vocab-gpt-2"), {{"general.architecture", eh::model::GgufValue::string("llama")}});
    ScriptedHost h(m.path, kText);
    ASSERT_TRUE(h->running()) << h->log();
    check_logprobs(*h, kText);
    json j = json::parse(h->post("/v1/completions", R"({"prompt":"hi","max_tokens":40,"logprobs":0})").body);
    const json& tokens = j["choices"][0]["logprobs"]["tokens"];
    ASSERT_GE(tokens.size(), 4u);
    EXPECT_EQ(tokens[0], "Once");
    EXPECT_EQ(tokens[2], " there");
}

}  // namespace

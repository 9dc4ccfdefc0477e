// Speculative decoding through the server on the CPU reference: greedy text
// is the same with --spec-ngram and with --draft-model as without, for
// stories260K and the built-in TinyTales, one request and several at once;
// /health and /metrics say what ran; the flags' limits and a draft model of
// another vocabulary are refused by name.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>
#include <thread>
#include <vector>

#include "engine_host_process.hpp"

using nlohmann::json;
using namespace eh::test;

namespace {

std::string tinytales() { return std::string(EH_HTTP_TEST_DIR) + "/../../models/tinytales.gguf"; }

const std::vector<std::string> kPrompts = {
    "Once upon a time",
    "Tell me a story about a shy owl named Milo.",
    // a prompt that repeats itself, so prompt lookup has something to find
    "Lily had a red ball. Lily liked her red ball. One day Lily lost her red ball. Lily",
};

std::string complete(EngineHost& h, const std::string& prompt, int max_tokens = 64) {
    const json body = {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
    auto r = h.post("/v1/completions", body.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    if (r.status != 200) return {};
    return json::parse(r.body)["choices"][0]["text"].get<std::string>();
}

// Every prompt alone, then all of them at once.
std::vector<std::string> texts(EngineHost& h) {
    std::vector<std::string> out;
    for (const auto& p : kPrompts) out.push_back(complete(h, p));
    std::vector<std::string> together(kPrompts.size());
    std::vector<std::thread> ts;
    for (size_t i = 0; i < kPrompts.size(); ++i) ts.emplace_back([&, i] { together[i] = complete(h, kPrompts[i]); });
    for (auto& t : ts) t.join();
    out.insert(out.end(), together.begin(), together.end());
    return out;
}

double metric(EngineHost& h, const std::string& name) {
    const std::string body = h.get("/metrics").body;
    const size_t at = body.find("\n" + name + " ");
    EXPECT_NE(at, std::string::npos) << name;
    return at == std::string::npos ? -1 : std::stod(body.substr(at + name.size() + 2));
}

void same_text_with_speculation(const std::string& model) {
    EngineHost plain({"--log-format", "text"}, {}, true, EH_PLUGIN_DIR, model);
    ASSERT_GT(plain.port(), 0) << plain.log();
    EXPECT_EQ(json::parse(plain.get("/health").body)["speculation"], json({{"source", "off"}}));
    const std::vector<std::string> want = texts(plain);
    for (const auto& t : want) EXPECT_GT(t.size(), 20u);

    EngineHost ngram({"--log-format", "text", "--spec-ngram", "--spec-draft-max", "6"}, {}, true, EH_PLUGIN_DIR, model);
    ASSERT_GT(ngram.port(), 0) << ngram.log();
    const json hs = json::parse(ngram.get("/health").body)["speculation"];
    EXPECT_EQ(hs["source"], "ngram") << hs.dump();
    EXPECT_EQ(hs["draft_max"], 6);
    EXPECT_EQ(texts(ngram), want);
    EXPECT_GT(metric(ngram, "eh_spec_decode_num_drafts_total"), 0);
    EXPECT_GT(metric(ngram, "eh_spec_decode_num_accepted_tokens_total"), 0) << "the repeating prompt found nothing";

    // The model as its own draft: every draft is accepted.
    EngineHost draft({"--log-format", "text", "--draft-model", model}, {}, true, EH_PLUGIN_DIR, model);
    ASSERT_GT(draft.port(), 0) << draft.log();
    EXPECT_EQ(json::parse(draft.get("/health").body)["speculation"]["source"], "draft_model");
    EXPECT_EQ(texts(draft), want);
    EXPECT_EQ(metric(draft, "eh_spec_decode_acceptance_rate"), 1.0);
    EXPECT_GT(metric(draft, "eh_spec_decode_tokens_per_step"), 3.0);
    EXPECT_NE(draft.get("/metrics").body.find("vllm:spec_decode_num_accepted_tokens_total{"), std::string::npos);
}

}  // namespace

TEST(SpeculativeEndToEnd, Stories260KGreedyTextIsTheSameWithAndWithout) { same_text_with_speculation(stories_model()); }

TEST(SpeculativeEndToEnd, TinyTalesGreedyTextIsTheSameWithAndWithout) { same_text_with_speculation(tinytales()); }

// The engine process carries the drafts (wire version 4): prompt lookup
// runs there too, and the text is the one without.
TEST(SpeculativeEndToEnd, TheEngineProcessVerifiesToo) {
    EngineHost plain({"--log-format", "text"}, {}, true, EH_PLUGIN_DIR);
    ASSERT_GT(plain.port(), 0) << plain.log();
    EngineHost child({"--log-format", "text", "--engine-process", "--spec-ngram"}, {}, true, EH_PLUGIN_DIR);
    ASSERT_GT(child.port(), 0) << child.log();
    const json h = json::parse(child.get("/health").body);
    EXPECT_EQ(h["speculation"]["source"], "ngram") << h.dump();
    EXPECT_FALSE(h["engine"]["process"].is_null());
    for (const auto& p : kPrompts) EXPECT_EQ(complete(child, p), complete(plain, p)) << p;
    EXPECT_GT(metric(child, "eh_spec_decode_num_accepted_tokens_total"), 0);
}

// A plugin that does not verify (the test engine's session build): served
// as without, and /health says why.
TEST(SpeculativeEndToEnd, APluginThatDoesNotVerifyServesWithoutIt) {
    EngineHost h({"--log-format", "text", "--spec-ngram"});
    ASSERT_GT(h.port(), 0) << h.log();
    const json s = json::parse(h.get("/health").body)["speculation"];
    EXPECT_EQ(s["source"], "off") << s.dump();
    EXPECT_EQ(s["requested"], "ngram");
    EXPECT_NE(s["reason"].get<std::string>().find("does not verify"), std::string::npos) << s.dump();
    EXPECT_GT(complete(h, "Once upon a time").size(), 0u);
    EXPECT_NE(h.log().find("speculation_off"), std::string::npos);
}

TEST(SpeculativeEndToEnd, ADraftModelOfAnotherVocabularyIsRefusedByName) {
    EngineHost h({"--log-format", "text", "--draft-model", tinytales()}, {}, false, EH_PLUGIN_DIR);
    EXPECT_NE(h.wait_exit(), 0);
    EXPECT_NE(h.log().find("a draft model must share the served model's vocabulary"), std::string::npos) << h.log();
}

TEST(SpeculativeEndToEnd, BadFlagsAreUsageErrors) {
    const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
        {{"--spec-ngram", "--spec-draft-max", "0"}, "--spec-draft-max must be between 1 and 16"},
        {{"--spec-ngram", "--spec-draft-max", "17"}, "--spec-draft-max must be between 1 and 16"},
        {{"--spec-ngram", "--spec-ngram-max", "17"}, "--spec-ngram-max must be between 1 and 16"},
        {{"--spec-ngram", "--spec-ngram-min", "4"}, "--spec-ngram-min must be between 1 and --spec-ngram-max"},
        {{"--spec-ngram", "--spec-max-batch", "0"}, "--spec-max-batch must be at least 1"},
        {{"--spec-draft-max", "3"}, "--spec-draft-max needs --spec-ngram or --draft-model"},
        {{"--spec-ngram", "--draft-model", "x.gguf"}, "two draft sources"},
        {{"--draft-model", "x.gguf", "--spec-ngram-max", "2"}, "--spec-ngram-max is for --spec-ngram"},
        {{"--draft-model", "x.gguf", "--engine-process"}, "--draft-model cannot go with --engine-process"},
    };
    for (const auto& [args, msg] : cases) {
        std::vector<std::string> a = {"--log-format", "text"};
        a.insert(a.end(), args.begin(), args.end());
        EngineHost h(a, {}, false, EH_PLUGIN_DIR);
        EXPECT_EQ(h.wait_exit(), 2) << msg;
        EXPECT_NE(h.log().find(msg), std::string::npos) << h.log();
    }
}

// Qwen2.5-VL images through the whole product: engine-host forges the tiny
// Qwen2.5-VL profile (a qwen2vl text model with M-RoPE and a toy
// qwen2.5vl_merger tower, --mmproj-out) and serves it on the CPU reference
// with --mmproj. Each image is read at its own size (smart_resize to 28-pixel
// tiles): its token count follows its size, it changes the next-token
// log-probabilities, the same image gives the same bits and reuses the
// cached prefix, an image past 200:1 is a 400 that says why, and a
// projector of the other kind stops the start by name.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine_host_process.hpp"
#include "vision_test_util.hpp"

using nlohmann::json;
using namespace eh::test;
using namespace eh::test::vision;

namespace {

Forged& forged() {
    static Forged f("tiny-qwen2.5-vl-q4_k_m", "tiny-qwen2.5-vl");
    return f;
}

EngineHost& server() {
    static EngineHost h(serve_flags(forged(), "2048"), {}, true, EH_PLUGIN_DIR, forged().model);
    return h;
}

json chat_with(const std::vector<std::string>& urls, const std::string& text = "What is in this picture?") {
    return chat_request(urls, text);
}

json post_ok(EngineHost& h, const json& body) { return post_chat_ok(h, body); }


int prompt_tokens(const json& j) { return j["usage"]["prompt_tokens"]; }

}  // namespace

TEST(QwenVlEndToEnd, TokensFollowTheImageSize) {
    ASSERT_FALSE(forged().model.empty()) << "forge failed";
    ASSERT_GT(server().port(), 0) << server().log();
    EXPECT_NE(server().log().find("tile_pixels=28"), std::string::npos) << server().log();
    const int none = prompt_tokens(post_ok(server(), chat_with({})));
    // 100 x 60 pixels: 112 x 56 (4 x 2 tiles) between <|vision_start|> and <|vision_end|>.
    EXPECT_EQ(prompt_tokens(post_ok(server(), chat_with({png_data_url(100, 60, 1)}))) - none, 8 + 2);
    // 300 x 200: 308 x 196 (11 x 7 tiles).
    EXPECT_EQ(prompt_tokens(post_ok(server(), chat_with({png_data_url(300, 200, 2)}))) - none, 77 + 2);
    // 20 x 20 grows to the smallest, 56 x 56 (2 x 2).
    EXPECT_EQ(prompt_tokens(post_ok(server(), chat_with({png_data_url(20, 20, 3)}))) - none, 4 + 2);
    // Two images, each its own size.
    EXPECT_EQ(prompt_tokens(post_ok(server(), chat_with({png_data_url(100, 60, 1), png_data_url(20, 20, 3)}))) - none,
              8 + 2 + 4 + 2);
}

TEST(QwenVlEndToEnd, AnImageChangesTheLogitsAndTheSameImageTheSameBits) {
    ASSERT_GT(server().port(), 0) << server().log();
    const std::string a = png_data_url(120, 90, 4), b = png_data_url(120, 90, 5);
    const json text_only = post_ok(server(), chat_with({}));
    const json ja = post_ok(server(), chat_with({a}));
    const json jb = post_ok(server(), chat_with({b}));
    const json ja2 = post_ok(server(), chat_with({a}));
    EXPECT_NE(first_logprobs(ja), first_logprobs(jb));
    EXPECT_NE(first_logprobs(ja), first_logprobs(text_only));
    EXPECT_EQ(first_logprobs(ja), first_logprobs(ja2));
    // The same image again reuses the prefix through it (positions and all).
    EXPECT_GT(int(ja2["usage"]["prompt_tokens_details"]["cached_tokens"]), prompt_tokens(ja2) - 4) << ja2.dump();
}

TEST(QwenVlEndToEnd, AnImageIsNeverSplitAcrossSteps) {
    // Steps of 128 tokens: text of about 100 tokens before a 12 x 9 tile image
    // (108 tokens), so the first step would end inside it; the scheduler
    // stops that step before the image and puts it whole in the next.
    // Split, its grid positions and rows would go astray and the result
    // would differ from one whole prompt.
    ASSERT_GT(server().port(), 0) << server().log();
    EngineHost small({"--log-format", "text", "--mmproj", forged().mmproj, "--max-body-bytes", "4000000", "--ctx-size",
                      "2048", "--kv-cache-size-mb", "64", "--batch-tokens", "128", "--no-prefix-cache"},
                     {}, true, EH_PLUGIN_DIR, forged().model);
    ASSERT_GT(small.port(), 0) << small.log();
    std::string words;
    for (int i = 0; i < 50; ++i) words += "red blue ";
    json body = chat_with({png_data_url(336, 252, 9)});
    json& content = body["messages"][0]["content"];
    content.insert(content.begin(), json::object({{"type", "text"}, {"text", words}}));
    const json chunked = post_ok(small, body);
    ASSERT_GT(prompt_tokens(chunked), 128 + 16);
    EXPECT_EQ(first_logprobs(chunked), first_logprobs(post_ok(server(), body)));
}

TEST(QwenVlEndToEnd, AnthropicBlocksAndCountTokensFollowTheSize) {
    ASSERT_GT(server().port(), 0) << server().log();
    const std::string a = png_data_url(100, 60, 1);
    json body = {{"model", "m"}, {"max_tokens", 2},
                 {"messages", json::array({{{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "Hi"}}})}}})}};
    auto plain = server().post("/v1/messages/count_tokens", body.dump());
    ASSERT_EQ(plain.status, 200) << plain.body;
    body["messages"][0]["content"].push_back(
        {{"type", "image"}, {"source", {{"type", "base64"}, {"media_type", "image/png"}, {"data", a.substr(a.find(',') + 1)}}}});
    auto with = server().post("/v1/messages/count_tokens", body.dump());
    ASSERT_EQ(with.status, 200) << with.body;
    // 4 x 2 tiles and the two marks.
    EXPECT_EQ(int(json::parse(with.body)["input_tokens"]) - int(json::parse(plain.body)["input_tokens"]), 10);
    auto r = server().post("/v1/messages", body.dump());
    EXPECT_EQ(r.status, 200) << r.body.substr(0, 500);
}

TEST(QwenVlEndToEnd, RefusalsSayWhy) {
    ASSERT_GT(server().port(), 0) << server().log();
    auto r = server().post("/v1/chat/completions", chat_with({png_data_url(402, 2, 6)}).dump());
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_NE(r.body.find("more than 200 times its short side"), std::string::npos) << r.body;
}

TEST(QwenVlEndToEnd, AProjectorOfTheOtherKindStopsTheStart) {
    ASSERT_FALSE(forged().model.empty());
    // Gemma 3's toy projector beside the qwen2vl model.
    const std::string gm = forged().dir + "/gemma.gguf", gp = forged().dir + "/gemma-mmproj.gguf";
    const std::string cmd = std::string(EH_ENGINE_HOST) + " forge --like tiny-gemma-3-vision-q4_k_m --out " + gm +
                            " --mmproj-out " + gp + " --threads 2 > " + forged().dir + "/forge-gemma.log 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
    EngineHost q({"--log-format", "text", "--mmproj", gp, "--ctx-size", "1024", "--kv-cache-size-mb", "64"}, {}, false,
                 EH_PLUGIN_DIR, forged().model);
    EXPECT_NE(q.wait_exit(60000), 0) << q.log();
    EXPECT_NE(q.log().find("--mmproj"), std::string::npos) << q.log();
    // And the Qwen projector beside the Gemma 3 model.
    EngineHost g({"--log-format", "text", "--mmproj", forged().mmproj, "--ctx-size", "1024", "--kv-cache-size-mb", "64"},
                 {}, false, EH_PLUGIN_DIR, gm);
    EXPECT_NE(g.wait_exit(60000), 0) << g.log();
    EXPECT_NE(g.log().find("--mmproj"), std::string::npos) << g.log();
}

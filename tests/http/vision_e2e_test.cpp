// Images in through the whole product: engine-host forges the tiny Gemma 3
// vision profile (model + --mmproj-out) and serves it on the CPU reference
// with --mmproj; chat requests carry PNG data URLs (OpenAI image_url parts,
// Anthropic image blocks). An image changes the next-token log-probabilities
// and another image changes them again; the same image gives the same bits
// and reuses the cached prefix through it, another image does not; every
// refusal (remote URL, bad data, too many images, an image outside a user
// message, a server without --mmproj) is a 400 that says why.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine_host_process.hpp"
#include "vision_test_util.hpp"

using nlohmann::json;
using namespace eh::test;
using namespace eh::test::vision;

namespace {

Forged& forged() {
    static Forged f("tiny-gemma-3-vision-q4_k_m", "tiny-gemma3-vision");
    return f;
}

EngineHost& server() {
    static EngineHost h(serve_flags(forged(), "1024"), {}, true, EH_PLUGIN_DIR, forged().model);
    return h;
}

const char* kSystem =
    "You describe pictures for people who cannot see them. Say what is in the picture, the colours, the shapes and "
    "where things are, in plain short sentences, and nothing else.";

json chat_with(const std::vector<std::string>& urls, const std::string& text = "What is in this picture?") {
    return chat_request(urls, text, kSystem);
}

json post_ok(const json& body) { return post_chat_ok(server(), body); }

std::string refusal(EngineHost& h, const json& body, const std::string& path = "/v1/chat/completions") {
    auto r = h.post(path, body.dump());
    EXPECT_EQ(r.status, 400) << r.body.substr(0, 500);
    return r.body;
}


}  // namespace

TEST(VisionEndToEnd, AnImageChangesTheLogitsAndTheSameImageTheSameBits) {
    ASSERT_FALSE(forged().model.empty()) << "forge failed";
    ASSERT_GT(server().port(), 0) << server().log();
    const std::string a = png_data_url(80, 60, 1), b = png_data_url(80, 60, 2);
    const json text_only = post_ok({{"messages", json::array({{{"role", "user"}, {"content", "What is in this picture?"}}})},
                                    {"max_tokens", 2}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 5}});
    const json ja = post_ok(chat_with({a}));
    const json jb = post_ok(chat_with({b}));
    const json ja2 = post_ok(chat_with({a}));
    // 16 image tokens (the toy tower's) and the marks around them.
    EXPECT_GE(int(ja["usage"]["prompt_tokens"]) - int(post_ok(chat_with({}))["usage"]["prompt_tokens"]), 16);
    EXPECT_NE(first_logprobs(ja), first_logprobs(jb));
    EXPECT_NE(first_logprobs(ja), first_logprobs(text_only));
    EXPECT_EQ(first_logprobs(ja), first_logprobs(ja2));
    // The same image again reuses the prefix through it; another image
    // stops the reuse at its first token.
    const int cached_same = ja2["usage"]["prompt_tokens_details"]["cached_tokens"];
    const json jb2 = post_ok(chat_with({b}, "Describe it."));
    const json ja3 = post_ok(chat_with({a}, "Describe it."));
    const int cached_other = ja3["usage"]["prompt_tokens_details"]["cached_tokens"];
    EXPECT_GT(cached_same, int(ja2["usage"]["prompt_tokens"]) - 16) << ja2.dump();
    EXPECT_LT(cached_other, int(ja3["usage"]["prompt_tokens"]) - 16) << ja3.dump();
    EXPECT_GT(cached_same, cached_other);
    // Two images in one message.
    const json two = post_ok(chat_with({a, b}));
    EXPECT_GE(int(two["usage"]["prompt_tokens"]) - int(ja["usage"]["prompt_tokens"]), 16);
}

TEST(VisionEndToEnd, AnthropicImageBlocks) {
    ASSERT_GT(server().port(), 0) << server().log();
    const std::string a = png_data_url(40, 40, 3);
    const std::string data = a.substr(a.find(',') + 1);
    json body = {{"model", "m"}, {"max_tokens", 2}, {"temperature", 0},
                 {"messages", json::array({{{"role", "user"},
                                            {"content", json::array({{{"type", "image"},
                                                                      {"source", {{"type", "base64"}, {"media_type", "image/png"}, {"data", data}}}},
                                                                     {{"type", "text"}, {"text", "What is this?"}}})}}})}};
    auto r = server().post("/v1/messages", body.dump());
    EXPECT_EQ(r.status, 200) << r.body.substr(0, 1000);
    body["messages"][0]["content"][0]["source"] = {{"type", "url"}, {"url", "https://example.com/x.png"}};
    EXPECT_NE(refusal(server(), body, "/v1/messages").find("never downloads"), std::string::npos);
}

TEST(VisionEndToEnd, RefusalsSayWhy) {
    ASSERT_GT(server().port(), 0) << server().log();
    EXPECT_NE(refusal(server(), chat_with({"https://example.com/cat.png"})).find("never downloads"), std::string::npos);
    EXPECT_NE(refusal(server(), chat_with({"data:image/png;base64,AAAA"})).find("neither PNG nor JPEG"), std::string::npos);
    EXPECT_NE(refusal(server(), chat_with({"data:image/png;base64,A*AA"})).find("base64 is invalid"), std::string::npos);
    const std::string a = png_data_url(8, 8, 4);
    EXPECT_NE(refusal(server(), chat_with(std::vector<std::string>(9, a))).find("at most 8 images"), std::string::npos);
    json sys = chat_with({a});
    sys["messages"][0]["content"] = json::array({{{"type", "image_url"}, {"image_url", {{"url", a}}}}});
    EXPECT_NE(refusal(server(), sys).find("not supported here (text only)"), std::string::npos);
}

TEST(VisionEndToEnd, AServerWithoutMmprojRefusesImages) {
    ASSERT_FALSE(forged().model.empty());
    EngineHost plain({"--log-format", "text", "--ctx-size", "1024", "--kv-cache-size-mb", "64"}, {}, true, EH_PLUGIN_DIR,
                     forged().model);
    ASSERT_GT(plain.port(), 0) << plain.log();
    EXPECT_NE(refusal(plain, chat_with({png_data_url(8, 8, 5)})).find("--mmproj"), std::string::npos);
}

TEST(VisionEndToEnd, APluginWithoutImageCallsStopsTheStartByName) {
    ASSERT_FALSE(forged().model.empty());
    // The deterministic test engine has no ABI 1.6 image calls (as gpt-cuda).
    EngineHost h({"--log-format", "text", "--mmproj", forged().mmproj}, {}, false);
    EXPECT_NE(h.wait_exit(30000), 0) << h.log();
    EXPECT_NE(h.log().find("takes no images"), std::string::npos) << h.log();
    EXPECT_NE(h.log().find("--mmproj"), std::string::npos) << h.log();
}

TEST(VisionEndToEnd, AnImageIsNeverSplitAcrossSteps) {
    // Steps of 32 tokens: the prompt's second chunk would end inside the
    // image (its 16 tokens start past position 32); the scheduler stops the
    // chunk before the image and puts the image whole in the next step, so
    // the result is the one a single step gives. Split, its first tokens
    // would not see its last ones (they attend both ways) and the
    // log-probabilities would differ.
    ASSERT_GT(server().port(), 0) << server().log();
    EngineHost small({"--log-format", "text", "--mmproj", forged().mmproj, "--max-body-bytes", "4000000", "--ctx-size",
                      "1024", "--kv-cache-size-mb", "64", "--batch-tokens", "32", "--no-prefix-cache"},
                     {}, true, EH_PLUGIN_DIR, forged().model);
    ASSERT_GT(small.port(), 0) << small.log();
    const json body = chat_with({png_data_url(50, 70, 9)});
    auto r = small.post("/v1/chat/completions", body.dump());
    ASSERT_EQ(r.status, 200) << r.body.substr(0, 500);
    const json chunked = json::parse(r.body);
    ASSERT_GT(int(chunked["usage"]["prompt_tokens"]), 64);
    EXPECT_EQ(first_logprobs(chunked), first_logprobs(post_ok(body)));
}

TEST(VisionEndToEnd, EveryChoiceOfNSeesTheImage) {
    // One request at a time: the 2nd and 3rd choices start after the 1st has
    // finished, from the prefix cache or from scratch, and must still have
    // the image.
    ASSERT_GT(server().port(), 0) << server().log();
    EngineHost serial({"--log-format", "text", "--mmproj", forged().mmproj, "--max-body-bytes", "4000000", "--ctx-size",
                       "1024", "--kv-cache-size-mb", "64", "--parallel", "1"},
                      {}, true, EH_PLUGIN_DIR, forged().model);
    ASSERT_GT(serial.port(), 0) << serial.log();
    json body = chat_with({png_data_url(30, 30, 11)}, "Name one colour.");
    const json one = post_ok(body);
    body["n"] = 3;
    auto r = serial.post("/v1/chat/completions", body.dump());
    ASSERT_EQ(r.status, 200) << r.body.substr(0, 500);
    const json three = json::parse(r.body);
    ASSERT_EQ(three["choices"].size(), 3u);
    for (const auto& c : three["choices"]) {
        json single = three;
        single["choices"] = json::array({c});
        EXPECT_EQ(first_logprobs(single), first_logprobs(one));
    }
}

TEST(VisionEndToEnd, AnthropicCountTokensCountsTheImage) {
    ASSERT_GT(server().port(), 0) << server().log();
    const std::string a = png_data_url(40, 40, 12);
    json body = {{"model", "m"},
                 {"messages", json::array({{{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "Hi"}}})}}})}};
    auto plain = server().post("/v1/messages/count_tokens", body.dump());
    ASSERT_EQ(plain.status, 200) << plain.body;
    body["messages"][0]["content"].push_back(
        {{"type", "image"}, {"source", {{"type", "base64"}, {"media_type", "image/png"}, {"data", a.substr(a.find(',') + 1)}}}});
    auto with = server().post("/v1/messages/count_tokens", body.dump());
    ASSERT_EQ(with.status, 200) << with.body;
    EXPECT_GE(int(json::parse(with.body)["input_tokens"]) - int(json::parse(plain.body)["input_tokens"]), 16);
}

TEST(VisionEndToEnd, AModelThatCannotHoldImagesStopsTheStart) {
    ASSERT_FALSE(forged().model.empty());
    // A llama model: no image prompt form.
    EngineHost llama({"--log-format", "text", "--mmproj", forged().mmproj}, {}, false, EH_PLUGIN_DIR);
    EXPECT_NE(llama.wait_exit(30000), 0) << llama.log();
    EXPECT_NE(llama.log().find("images are taken for gemma3 and qwen2vl models only"), std::string::npos) << llama.log();
    // A Gemma 3 whose vocabulary has no image tokens (the plain tiny profile).
    const std::string plain = forged().dir + "/tiny-gemma3.gguf";
    const std::string cmd = std::string(EH_ENGINE_HOST) + " forge --like tiny-gemma-3-q4_k_m --out " + plain +
                            " --threads 2 > " + forged().dir + "/forge-plain.log 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
    EngineHost g({"--log-format", "text", "--mmproj", forged().mmproj, "--ctx-size", "1024", "--kv-cache-size-mb", "64"},
                 {}, false, EH_PLUGIN_DIR, plain);
    EXPECT_NE(g.wait_exit(60000), 0) << g.log();
    EXPECT_NE(g.log().find("has no '<image_soft_token>' control token"), std::string::npos) << g.log();
}

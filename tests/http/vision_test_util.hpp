// What the image end-to-end tests share: a vision profile forged by
// engine-host itself (model + --mmproj-out) into a temporary directory, the
// flags that serve it, PNG data URLs of seeded noise, chat requests that carry
// them, and the first token's top log-probabilities of a chat answer.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <openssl/evp.h>
#include <png.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "engine_host_process.hpp"

namespace eh::test::vision {

// `profile` forged into dir/<stem>.gguf and dir/mmproj.gguf; `model` is empty
// when the forge failed (its log is dir/forge.log).
struct Forged {
    std::string dir, model, mmproj;
    Forged(const std::string& profile, const std::string& stem) {
        std::random_device rd;
        dir = (std::filesystem::temp_directory_path() / ("eh-" + stem + "-" + std::to_string(rd()))).string();
        std::filesystem::create_directories(dir);
        model = dir + "/" + stem + ".gguf";
        mmproj = dir + "/mmproj.gguf";
        const std::string cmd = std::string(EH_ENGINE_HOST) + " forge --like " + profile + " --out " + model +
                                " --mmproj-out " + mmproj + " --threads 2 > " + dir + "/forge.log 2>&1";
        if (std::system(cmd.c_str()) != 0) model.clear();
    }
    ~Forged() {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
    }
    Forged(const Forged&) = delete;
    Forged& operator=(const Forged&) = delete;
};

// serve's flags for a forged profile with its projector.
inline std::vector<std::string> serve_flags(const Forged& f, const std::string& ctx_size) {
    return {"--log-format", "text", "--mmproj", f.mmproj, "--max-body-bytes", "4000000",
            "--ctx-size", ctx_size, "--kv-cache-size-mb", "64"};
}

// A chat request: `urls` as image_url parts before `text` in the user
// message (after a system message when `system` is given), greedy, two
// tokens, the top five log-probabilities.
inline nlohmann::json chat_request(const std::vector<std::string>& urls, const std::string& text,
                                   const std::string& system = "") {
    nlohmann::json content = nlohmann::json::array();
    for (const auto& u : urls) content.push_back({{"type", "image_url"}, {"image_url", {{"url", u}}}});
    content.push_back({{"type", "text"}, {"text", text}});
    nlohmann::json messages = nlohmann::json::array();
    if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
    messages.push_back({{"role", "user"}, {"content", content}});
    return {{"messages", messages}, {"max_tokens", 2}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 5}};
}

// POST /v1/chat/completions, expected to answer 200; its body.
inline nlohmann::json post_chat_ok(EngineHost& h, const nlohmann::json& body) {
    auto r = h.post("/v1/chat/completions", body.dump());
    EXPECT_EQ(r.status, 200) << r.body.substr(0, 2000);
    return nlohmann::json::parse(r.body);
}

// A w x h PNG of seeded random pixels as a data: URL.
inline std::string png_data_url(uint32_t w, uint32_t h, uint32_t seed) {
    std::vector<uint8_t> px(size_t(w) * h * 3);
    std::mt19937 rng(seed);
    for (auto& v : px) v = uint8_t(rng());
    png_image im;
    std::memset(&im, 0, sizeof(im));
    im.version = PNG_IMAGE_VERSION;
    im.width = w;
    im.height = h;
    im.format = PNG_FORMAT_RGB;
    png_alloc_size_t size = 0;
    png_image_write_to_memory(&im, nullptr, &size, 0, px.data(), 0, nullptr);
    std::string bytes(size, '\0');
    png_image_write_to_memory(&im, bytes.data(), &size, 0, px.data(), 0, nullptr);
    bytes.resize(size);
    std::string b64(4 * ((bytes.size() + 2) / 3) + 1, '\0');
    b64.resize(size_t(EVP_EncodeBlock(reinterpret_cast<unsigned char*>(b64.data()),
                                      reinterpret_cast<const unsigned char*>(bytes.data()), int(bytes.size()))));
    return "data:image/png;base64," + b64;
}

// The first generated token's top_logprobs values of a chat completion.
inline std::vector<double> first_logprobs(const nlohmann::json& j) {
    std::vector<double> out;
    for (const auto& t : j["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) out.push_back(t["logprob"]);
    return out;
}

}  // namespace eh::test::vision

// The whole product on a real trained model: engine-host serves
// stories260K through the CPU reference plugin over HTTP, and the greedy
// continuation must be the one Hugging Face transformers produced for the
// same weights (tests/reference/data/stories260K/reference.json, recorded
// on the GPU machine by tests/reference/make_reference.py).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>

#include "engine_host_process.hpp"

using nlohmann::json;
using namespace eh::test;

namespace {

json reference() {
    std::ifstream f(std::string(EH_HTTP_TEST_DIR) + "/../reference/data/stories260K/reference.json");
    return json::parse(f);
}

// Streams one greedy /execute and returns the concatenated text.
std::string greedy_text(EngineHost& h, const std::string& job, size_t max_tokens, json* started) {
    json body = {{"job_id", job}, {"prompt", "Once upon a time"}, {"max_tokens", max_tokens},
                 {"temperature", 0}, {"seed", 7}};
    auto r = h.post("/execute", body.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    std::string text;
    for (const auto& ev : parse_sse(r.body)) {
        json d = json::parse(ev.data);
        if (ev.event == "started") *started = d;
        if (ev.event == "token") text += d["t"].get<std::string>();
        if (ev.event == "error") ADD_FAILURE() << ev.data;
        if (ev.event == "end") {
            EXPECT_EQ(d["tokens_out"].get<size_t>(), max_tokens);
        }
    }
    return text;
}

}  // namespace

TEST(CpuReferenceEndToEnd, Stories260KGreedyMatchesTransformersOverHttp) {
    json ref = reference();
    const auto ids = ref["greedy_ids"].get<std::vector<int>>();
    const std::string expected = ref["greedy_text"];

    EngineHost h({"--log-format", "text"}, {}, true, EH_PLUGIN_DIR);
    ASSERT_GT(h.port(), 0) << h.log();
    json health = json::parse(h.get("/health").body);
    EXPECT_EQ(health["plugin"]["name"], "cpu-reference");

    // The host's tokenizer gives the prompt ids transformers was fed.
    auto tok = h.post("/tokenize", json{{"text", "Once upon a time"}, {"add_special", true}}.dump());
    ASSERT_EQ(tok.status, 200) << tok.body;
    EXPECT_EQ(json::parse(tok.body)["tokens"].get<std::vector<int>>(), ref["greedy_prompt"].get<std::vector<int>>())
        << tok.body;

    json started;
    std::string first = greedy_text(h, "stories-1", ids.size(), &started);
    EXPECT_EQ(started["prompt_tokens"].get<size_t>(), ref["greedy_prompt"].size());
    EXPECT_EQ(first, expected);
    // Same request, same device: the same text again.
    EXPECT_EQ(greedy_text(h, "stories-2", ids.size(), &started), first);
}

// --kv-cache-size-mb uses the KV cost the plugin states (ABI 1.1): the CPU
// reference keeps FP32 K and V, 2 x 5 layers x 4 kv heads x 8 dims x 4 bytes
// = 1280 bytes a token for stories260K, so 1 MiB holds 819 tokens (an FP16
// guess would have said 1638).
TEST(CpuReferenceEndToEnd, KvCacheSizeUsesThePluginsStatedCost) {
    EngineHost h({"--log-format", "text", "--kv-cache-size-mb", "1"}, {}, true, EH_PLUGIN_DIR);
    ASSERT_GT(h.port(), 0) << h.log();
    json health = json::parse(h.get("/health").body);
    EXPECT_EQ(health["context_length"], 819) << health.dump();
}

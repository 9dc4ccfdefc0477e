// The whole product on a real trained model: engine-host serves
// stories260K through the CPU reference plugin over HTTP, and the greedy
// continuation must be the one Hugging Face transformers produced for the
// same weights (tests/reference/data/stories260K/reference.json, recorded
// on the GPU machine by tests/reference/make_reference.py).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <thread>

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

// --kv-cache-size-mb sizes the KV pool by the cost the plugin states: the
// CPU reference keeps FP32 K and V, 2 x 5 layers x 4 kv heads x 8 dims x 4
// bytes = 1280 bytes a token for stories260K, in blocks of 16 tokens (20,480
// bytes), so 1 MiB holds 51 blocks = 816 tokens (an FP16 guess would have
// said twice that), and the context is what the pool holds.
TEST(CpuReferenceEndToEnd, KvCacheSizeUsesThePluginsStatedCost) {
    EngineHost h({"--log-format", "text", "--kv-cache-size-mb", "1"}, {}, true, EH_PLUGIN_DIR);
    ASSERT_GT(h.port(), 0) << h.log();
    json health = json::parse(h.get("/health").body);
    EXPECT_EQ(health["context_length"], 816) << health.dump();
    EXPECT_EQ(health["scheduler"]["kv_blocks_total"], 51) << health.dump();
    EXPECT_EQ(health["kv_cache_bytes"], 51 * 20480) << health.dump();
}

namespace {

struct Streamed {
    std::string text;
    int ends = 0, errors = 0;
};

Streamed stream(EngineHost& h, const std::string& job, const std::string& prompt, size_t max_tokens) {
    json body = {{"job_id", job}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"seed", 1}};
    auto r = h.post("/execute", body.dump());
    Streamed s;
    EXPECT_EQ(r.status, 200) << r.body;
    for (const auto& ev : parse_sse(r.body)) {
        if (ev.event == "token") s.text += json::parse(ev.data)["t"].get<std::string>();
        if (ev.event == "end") ++s.ends;
        if (ev.event == "error") ++s.errors;
    }
    return s;
}

}  // namespace

// Many clients at once through the batched ABI: every stream ends with
// exactly one terminal event and carries the text the same request gets
// alone (the CPU reference is batch invariant).
TEST(CpuReferenceEndToEnd, ConcurrentClientsGetTheirSoloTextWithOneTerminalEach) {
    EngineHost h({"--log-format", "text", "--parallel", "8", "--no-prefix-cache"}, {}, true, EH_PLUGIN_DIR);
    ASSERT_GT(h.port(), 0) << h.log();
    json health = json::parse(h.get("/health").body);
    EXPECT_EQ(health["scheduler"]["batched"], true) << health.dump();
    const std::vector<std::string> prompts = {"Once upon a time", "The little dog", "Lily wanted to", "Tom and Sue",
                                              "One day, a bird", "There was a big tree", "The sun was", "Mom said"};
    std::vector<std::string> solo;
    for (size_t i = 0; i < prompts.size(); ++i) solo.push_back(stream(h, "solo" + std::to_string(i), prompts[i], 24).text);
    std::vector<Streamed> got(prompts.size());
    std::vector<std::thread> clients;
    for (size_t i = 0; i < prompts.size(); ++i)
        clients.emplace_back([&, i] { got[i] = stream(h, "par" + std::to_string(i), prompts[i], 24); });
    for (auto& c : clients) c.join();
    for (size_t i = 0; i < prompts.size(); ++i) {
        EXPECT_EQ(got[i].ends, 1) << i;
        EXPECT_EQ(got[i].errors, 0) << i;
        EXPECT_EQ(got[i].text, solo[i]) << "prompt " << i;
    }
}

// A repeated prompt reuses the first one's KV blocks: the hit is counted
// and the text is unchanged.
TEST(CpuReferenceEndToEnd, PrefixReuseIsCountedAndChangesNothing) {
    EngineHost h({"--log-format", "text"}, {}, true, EH_PLUGIN_DIR);
    ASSERT_GT(h.port(), 0) << h.log();
    const std::string prompt =
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun with her dog.";
    Streamed a = stream(h, "first", prompt, 16);
    Streamed b = stream(h, "second", prompt, 16);
    EXPECT_EQ(a.text, b.text);
    const std::string m = h.get("/metrics").body;
    auto value = [&](const std::string& name) {
        auto p = m.find("\n" + name + " ");
        return p == std::string::npos ? -1.0 : std::stod(m.substr(p + name.size() + 2));
    };
    EXPECT_EQ(value("eh_prefix_cache_hits_total"), 1.0) << m;
    EXPECT_GE(value("eh_prefix_cache_hit_tokens_total"), 16.0) << m;
    EXPECT_GE(value("eh_num_requests_running"), 0.0) << m;
    EXPECT_GE(value("eh_kv_cache_usage_perc"), 0.0) << m;
}

// logit_bias reaches the sampler: +100 on one token makes it every token.
TEST(CpuReferenceEndToEnd, LogitBiasAndPenaltiesReachTheSampler) {
    EngineHost h({"--log-format", "text"}, {}, true, EH_PLUGIN_DIR);
    ASSERT_GT(h.port(), 0) << h.log();
    const int forced = 300;
    auto r = h.post("/v1/completions", json{{"prompt", "Once upon a time"}, {"max_tokens", 6}, {"temperature", 0},
                                            {"logit_bias", {{std::to_string(forced), 100}}}}.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const std::string text = json::parse(r.body)["choices"][0]["text"];
    auto d = h.post("/detokenize", json{{"tokens", std::vector<int>(6, forced)}}.dump());
    ASSERT_EQ(d.status, 200) << d.body;
    // (decoded alone, the first token's leading space is dropped)
    EXPECT_EQ(text, " " + json::parse(d.body)["text"].get<std::string>());
    // A strong frequency penalty changes a greedy continuation that repeats.
    auto plain = h.post("/v1/completions", json{{"prompt", "Once upon a time"}, {"max_tokens", 40}, {"temperature", 0}}.dump());
    auto pen = h.post("/v1/completions", json{{"prompt", "Once upon a time"}, {"max_tokens", 40}, {"temperature", 0},
                                              {"frequency_penalty", 2}}.dump());
    ASSERT_EQ(pen.status, 200) << pen.body;
    EXPECT_NE(json::parse(plain.body)["choices"][0]["text"], json::parse(pen.body)["choices"][0]["text"]);
    auto bad = h.post("/v1/completions", json{{"prompt", "x"}, {"logit_bias", {{"999999", 1}}}}.dump());
    EXPECT_EQ(bad.status, 400) << bad.body;
    EXPECT_NE(bad.body.find("outside the vocabulary"), std::string::npos) << bad.body;
}

// OpenAI's n: several samples of one prompt, the prompt computed once (the
// siblings fork its KV), every choice indexed, usage summed.
TEST(CpuReferenceEndToEnd, NChoicesShareThePromptAndStreamInterleaved) {
    EngineHost h({"--log-format", "text"}, {}, true, EH_PLUGIN_DIR);
    ASSERT_GT(h.port(), 0) << h.log();
    auto greedy = h.post("/v1/completions", json{{"prompt", "Once upon a time"}, {"max_tokens", 12}, {"temperature", 0},
                                                 {"n", 3}}.dump());
    ASSERT_EQ(greedy.status, 200) << greedy.body;
    json g = json::parse(greedy.body);
    ASSERT_EQ(g["choices"].size(), 3u) << g.dump();
    for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(g["choices"][i]["index"], i);
        EXPECT_EQ(g["choices"][i]["text"], g["choices"][0]["text"]) << "greedy samples are equal";
    }
    EXPECT_EQ(g["usage"]["completion_tokens"], 36) << g.dump();
    // Sampled with a seed: choice i uses seed + i, so they differ and repeat.
    json sampled = {{"prompt", "Once upon a time"}, {"max_tokens", 16}, {"temperature", 1}, {"seed", 11}, {"n", 3}};
    json s1 = json::parse(h.post("/v1/completions", sampled.dump()).body);
    json s2 = json::parse(h.post("/v1/completions", sampled.dump()).body);
    ASSERT_EQ(s1["choices"].size(), 3u) << s1.dump();
    EXPECT_EQ(s1["choices"], s2["choices"]);
    EXPECT_NE(s1["choices"][0]["text"], s1["choices"][1]["text"]);
    // Streamed: chunks of all three choices, each choice finishing once, one [DONE].
    auto st = h.post("/v1/chat/completions",
                     json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 8}, {"temperature", 0},
                          {"n", 3}, {"stream", true}, {"stream_options", {{"include_usage", true}}}}
                         .dump());
    ASSERT_EQ(st.status, 200) << st.body;
    std::map<int, int> finished;
    int done = 0, usage = 0;
    for (const auto& ev : parse_sse(st.body)) {
        if (ev.data == "[DONE]") {
            ++done;
            continue;
        }
        json c = json::parse(ev.data);
        if (c.contains("usage") && c["usage"].is_object()) {
            ++usage;
            EXPECT_EQ(c["usage"]["completion_tokens"], 24) << ev.data;
        }
        for (auto& ch : c["choices"])
            if (!ch["finish_reason"].is_null()) ++finished[ch["index"].get<int>()];
    }
    EXPECT_EQ(done, 1);
    EXPECT_EQ(usage, 1);
    EXPECT_EQ(finished, (std::map<int, int>{{0, 1}, {1, 1}, {2, 1}}));
    auto over = h.post("/v1/completions", json{{"prompt", "x"}, {"n", 17}}.dump());
    EXPECT_EQ(over.status, 400) << over.body;
}

// The prefix cache's host tier (--kv-host-bytes): a chat's earlier turns,
// evicted from a small KV pool by two other long prompts, are parked in host
// memory and copied back for the next turn, whose text is the one a server
// that recomputes them gives (the restored KV is the parked one, bit for
// bit); /metrics and /health count it.
namespace {

std::string story(const std::string& who, int sentences) {
    std::string s;
    for (int i = 0; i < sentences; ++i)
        s += who + " went to the park and saw a big red ball. " + who + " was happy and played all day. ";
    return s;
}

double metric(const std::string& m, const std::string& name) {
    auto p = m.find("\n" + name + " ");
    return p == std::string::npos ? -1.0 : std::stod(m.substr(p + name.size() + 2));
}

// The turns: a first prompt (164 tokens: 11 blocks of 16 with its output),
// two other prompts of ~470 tokens (30 blocks each) that push it out of a
// 51-block pool (the second needs the first's blocks and the first other's),
// then the first prompt's next turn. The last turn's text.
std::string chat_after_eviction(EngineHost& h) {
    const std::string first = story("Lily", 6);
    Streamed a = stream(h, "turn1", first, 8);
    EXPECT_EQ(a.errors, 0);
    EXPECT_EQ(stream(h, "other1", story("Tom", 16), 8).errors, 0);
    EXPECT_EQ(stream(h, "other2", story("Sue", 16), 8).errors, 0);
    Streamed b = stream(h, "turn2", first + a.text + " Then Lily", 16);
    EXPECT_EQ(b.errors, 0);
    return b.text;
}

}  // namespace

TEST(CpuReferenceEndToEnd, AnEvictedChatPrefixIsParkedInHostMemoryAndRestoredByCopy) {
    EngineHost off({"--log-format", "text", "--kv-cache-size-mb", "1"}, {}, true, EH_PLUGIN_DIR);
    ASSERT_GT(off.port(), 0) << off.log();
    const std::string recomputed = chat_after_eviction(off);
    const std::string m0 = off.get("/metrics").body;
    EXPECT_EQ(metric(m0, "eh_kv_host_tier_parks_total"), 0.0) << m0;
    EXPECT_EQ(metric(m0, "eh_kv_host_tier_budget_bytes"), 0.0) << m0;
    EXPECT_EQ(metric(m0, "eh_prefix_cache_hit_tokens_total"), 0.0) << m0;  // evicted: the last turn was computed

    EngineHost h({"--log-format", "text", "--kv-cache-size-mb", "1", "--kv-host-bytes", "8000000"}, {}, true,
                 EH_PLUGIN_DIR);
    ASSERT_GT(h.port(), 0) << h.log();
    EXPECT_EQ(chat_after_eviction(h), recomputed);
    const std::string m = h.get("/metrics").body;
    EXPECT_GE(metric(m, "eh_kv_host_tier_parks_total"), 1.0) << m;
    EXPECT_EQ(metric(m, "eh_kv_host_tier_restores_total"), 1.0) << m;
    EXPECT_GT(metric(m, "eh_kv_host_tier_restore_bytes_total"), 0.0) << m;
    EXPECT_GT(metric(m, "eh_kv_host_tier_park_bytes_total"), 0.0) << m;
    EXPECT_EQ(metric(m, "eh_kv_host_tier_budget_bytes"), 8000000.0) << m;
    EXPECT_LE(metric(m, "eh_kv_host_tier_used_bytes"), 8000000.0) << m;
    // The restored turns were reused, not computed: the hit covers them.
    EXPECT_GE(metric(m, "eh_prefix_cache_hit_tokens_total"), 100.0) << m;
    json health = json::parse(h.get("/health").body);
    EXPECT_EQ(health["kv_host_tier"]["requested_bytes"], 8000000) << health.dump();
    EXPECT_EQ(health["kv_host_tier"]["budget_bytes"], 8000000) << health.dump();
    EXPECT_EQ(health["kv_host_tier"]["restores"], 1) << health.dump();
    EXPECT_FALSE(health["kv_host_tier"].contains("reason")) << health.dump();
}

// A budget too small for any entry parks nothing: the chat is recomputed,
// the same text.
TEST(CpuReferenceEndToEnd, AHostTierTooSmallForAPrefixParksNothing) {
    EngineHost h({"--log-format", "text", "--kv-cache-size-mb", "1", "--kv-host-bytes", "1000"}, {}, true, EH_PLUGIN_DIR);
    ASSERT_GT(h.port(), 0) << h.log();
    chat_after_eviction(h);
    const std::string m = h.get("/metrics").body;
    EXPECT_EQ(metric(m, "eh_kv_host_tier_parks_total"), 0.0) << m;
    EXPECT_EQ(metric(m, "eh_kv_host_tier_restores_total"), 0.0) << m;
    EXPECT_EQ(metric(m, "eh_prefix_cache_hit_tokens_total"), 0.0) << m;
}

// Through an engine process the parked copies live in the child (protocol
// 6's Park, Unpark, DropParked): the same restore, the same text.
TEST(CpuReferenceEndToEnd, TheHostTierWorksThroughAnEngineProcess) {
    EngineHost off({"--log-format", "text", "--kv-cache-size-mb", "1"}, {}, true, EH_PLUGIN_DIR);
    ASSERT_GT(off.port(), 0) << off.log();
    const std::string recomputed = chat_after_eviction(off);
    EngineHost h({"--log-format", "text", "--engine-process", "--kv-cache-size-mb", "1", "--kv-host-bytes", "8000000"},
                 {}, true, EH_PLUGIN_DIR);
    ASSERT_GT(h.port(), 0) << h.log();
    EXPECT_EQ(chat_after_eviction(h), recomputed);
    const std::string m = h.get("/metrics").body;
    EXPECT_GE(metric(m, "eh_kv_host_tier_parks_total"), 1.0) << m;
    EXPECT_EQ(metric(m, "eh_kv_host_tier_restores_total"), 1.0) << m;
}

// An engine without prefix reuse (the test engine's session calls: one
// sequence, no fork) keeps the tier off and says why.
TEST(CpuReferenceEndToEnd, TheHostTierIsOffWithoutAPrefixCacheAndSaysWhy) {
    EngineHost h({"--log-format", "text", "--kv-host-bytes", "1000000"}, {}, true,
                 std::string(EH_TEST_PLUGIN_DIR) + "/good");
    ASSERT_GT(h.port(), 0) << h.log();
    json health = json::parse(h.get("/health").body);
    EXPECT_EQ(health["kv_host_tier"]["requested_bytes"], 1000000) << health.dump();
    EXPECT_EQ(health["kv_host_tier"]["budget_bytes"], 0) << health.dump();
    EXPECT_EQ(health["kv_host_tier"].value("reason", ""), "the prefix cache is off") << health.dump();
    EXPECT_NE(h.log().find("host_tier_off"), std::string::npos) << h.log();
}

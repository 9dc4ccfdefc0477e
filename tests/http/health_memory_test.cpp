// /health's memory fields and /execute's n_ctx through the real engine-host
// process with the test engine (which holds no device memory: every figure
// is 0, but each field must be there, typed, and consistent).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine_host_process.hpp"

using namespace eh::test;
using nlohmann::json;

TEST(HealthMemory, ReportsLiveModelAndKvFigures) {
    EngineHost h({"--ctx-size", "64"});
    auto r = h.get("/health");
    ASSERT_EQ(r.status, 200) << r.body;
    json j = json::parse(r.body);
    for (const char* k : {"vram_bytes_used", "vram_bytes_model", "kv_bytes_per_token", "kv_cache_bytes"})
        ASSERT_TRUE(j.contains(k) && j[k].is_number_unsigned()) << k << " in " << r.body;
    EXPECT_EQ(j["kv_cache_bytes"].get<uint64_t>(), 64 * j["kv_bytes_per_token"].get<uint64_t>());
    EXPECT_GE(j["vram_bytes_used"].get<uint64_t>(), j["vram_bytes_model"].get<uint64_t>());
    EXPECT_EQ(j["quant_kind"], "F32");
    EXPECT_EQ(j["resident"], false);  // a CPU engine: healthy, but no device-resident weights
    EXPECT_EQ(j["status"], "healthy");
}

// All sequences share the KV pool sized at start: a request's n_ctx may not
// exceed the server's, and the 400 says which flag to change.
TEST(HealthMemory, ExecuteMayNotAskForMoreContextThanTheServers) {
    EngineHost h({"--ctx-size", "64"});
    // "Once upon a time" + 200 tokens does not fit 64 ...
    auto small = h.post("/execute", R"({"job_id":"a","prompt":"Once upon a time","max_tokens":200})");
    EXPECT_EQ(small.status, 400) << small.body;
    // ... and a larger n_ctx for this job is refused, naming --ctx-size.
    auto big = h.post("/execute", R"({"job_id":"b","prompt":"Once upon a time","max_tokens":200,"n_ctx":256})");
    EXPECT_EQ(big.status, 400) << big.body;
    EXPECT_EQ(json::parse(big.body)["error"]["param"], "n_ctx") << big.body;
    EXPECT_NE(big.body.find("--ctx-size"), std::string::npos) << big.body;
    // Beyond the model's trained context: a 400 naming the field.
    auto over = h.post("/execute", R"({"job_id":"c","prompt":"Once upon a time","max_tokens":8,"n_ctx":16777216})");
    EXPECT_EQ(over.status, 400) << over.body;
    EXPECT_EQ(json::parse(over.body)["error"]["param"], "n_ctx") << over.body;
    // A smaller n_ctx runs in the server's context.
    auto ok = h.post("/execute", R"({"job_id":"d","prompt":"Once upon a time","max_tokens":8,"n_ctx":32,"temperature":0})");
    EXPECT_EQ(ok.status, 200) << ok.body;
    EXPECT_EQ(parse_sse(ok.body).back().event, "end") << ok.body;
    EXPECT_EQ(json::parse(h.get("/health").body)["context_length"], 64);
}

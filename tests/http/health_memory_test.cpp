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

TEST(HealthMemory, ExecuteRunsInItsOwnLargerContext) {
    EngineHost h({"--ctx-size", "64"});
    // "Once upon a time" + 200 tokens does not fit 64 ...
    auto small = h.post("/execute", R"({"job_id":"a","prompt":"Once upon a time","max_tokens":200})");
    EXPECT_EQ(small.status, 400) << small.body;
    // ... but does in a context of 256 for this job.
    auto r = sse_stream(h.port(), "/execute",
                        R"({"job_id":"b","prompt":"Once upon a time","max_tokens":200,"n_ctx":256,"temperature":0})",
                        [](const SseEvent&) { return true; });
    ASSERT_EQ(r.status, 200) << r.body;
    auto evs = parse_sse(r.body);
    ASSERT_FALSE(evs.empty());
    EXPECT_EQ(evs.back().event, "end") << evs.back().data;
    EXPECT_EQ(json::parse(evs.back().data)["tokens_out"], 200);
    // Beyond the model's trained context: a 400 naming the field.
    auto over = h.post("/execute", R"({"job_id":"c","prompt":"Once upon a time","max_tokens":8,"n_ctx":16777216})");
    EXPECT_EQ(over.status, 400) << over.body;
    EXPECT_EQ(json::parse(over.body)["error"]["param"], "n_ctx") << over.body;
    // The server's own context is unchanged.
    EXPECT_EQ(json::parse(h.get("/health").body)["context_length"], 64);
}

#include <gtest/gtest.h>

#include "eh/tools/bench.hpp"
#include "eh/tools/forge.hpp"
#include "eh/error.hpp"
#include "tools_test_util.hpp"

using namespace eh::tools;
using eh::tools::test::TempDir;

TEST(Bench, JsonSchemaOnCpuReference) {
    TempDir d;
    ForgeOptions f{"tiny-gpt2-q8_0", d.file("m.gguf"), 1, "", 2, {}};
    forge(f);
    BenchOptions o;
    o.plugins_dir = EH_PLUGIN_DIR;
    o.model = f.out;
    o.n_prompt = 16;
    o.n_gen = 4;
    o.reps = 2;
    o.threads = 2;
    auto rep = run_bench(o);
    auto j = to_json(rep);
    for (const char* k : {"model", "architecture", "quant", "model_bytes", "n_vocab", "n_prompt", "n_gen", "reps",
                          "results", "skipped"})
        EXPECT_TRUE(j.contains(k)) << k;
    EXPECT_EQ(j["quant"], "Q8_0");
    EXPECT_EQ(j["n_prompt"], 16);
    ASSERT_TRUE(j["results"].is_array());
    ASSERT_FALSE(j["results"].empty());
    bool saw_cpu = false;
    for (const auto& r : j["results"]) {
        for (const char* k : {"plugin", "plugin_version", "engine", "device_kind", "device_name", "ok"})
            EXPECT_TRUE(r.contains(k)) << k;
        if (r["plugin"] != "cpu-reference") continue;
        saw_cpu = true;
        ASSERT_TRUE(r["ok"].get<bool>()) << r.dump();
        for (const char* k : {"load_ms", "prefill_tokens_per_s", "decode_tokens_per_s", "ttft_ms", "itl_p50_ms",
                              "itl_p95_ms", "peak_device_bytes", "host_bytes"}) {
            ASSERT_TRUE(r.contains(k)) << k;
            EXPECT_TRUE(r[k].is_number()) << k;
        }
        EXPECT_GT(r["prefill_tokens_per_s"].get<double>(), 0);
        EXPECT_GT(r["decode_tokens_per_s"].get<double>(), 0);
        EXPECT_LE(r["itl_p50_ms"].get<double>(), r["itl_p95_ms"].get<double>());
        EXPECT_EQ(r["prefill_ms"].size(), 2u);  // one per counted repetition, warm-up excluded
    }
    EXPECT_TRUE(saw_cpu);
    EXPECT_NE(to_table(rep).find("cpu-reference"), std::string::npos);
}

TEST(Bench, NoPluginIsAnErrorNamingTheModel) {
    TempDir d;
    ForgeOptions f{"tiny-gpt2-q8_0", d.file("m.gguf"), 1, "", 2, {}};
    forge(f);
    BenchOptions o;
    o.plugins_dir = EH_PLUGIN_DIR;
    o.model = f.out;
    o.plugin = "no-such-plugin";
    try {
        run_bench(o);
        FAIL() << "expected an error";
    } catch (const eh::Error& e) {
        EXPECT_EQ(e.code(), eh::Code::NoPlugin);
        EXPECT_NE(std::string(e.what()).find("m.gguf"), std::string::npos);
    }
}

TEST(Bench, PromptAndPercentiles) {
    auto p = bench_prompt(512, 50257);
    ASSERT_EQ(p.size(), 512u);
    for (int32_t t : p) { EXPECT_GE(t, 0); EXPECT_LT(t, 50257); }
    EXPECT_EQ(p, bench_prompt(512, 50257));
    EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4, 5}, 50), 3);
    EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4, 5}, 100), 5);
    EXPECT_DOUBLE_EQ(percentile({10, 20}, 95), 19.5);
    EXPECT_DOUBLE_EQ(percentile({}, 50), 0);
}

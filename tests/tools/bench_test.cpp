#include <gtest/gtest.h>

#include <fmt/format.h>

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
    for (const char* k : {"model", "architecture", "quant", "model_bytes", "n_vocab", "n_prompt", "n_gen", "reps", "n_prompt_requested", "n_gen_requested", "context_length", "capped",
                          "results", "skipped"})
        EXPECT_TRUE(j.contains(k)) << k;
    EXPECT_EQ(j["quant"], "Q8_0");
    EXPECT_EQ(j["n_prompt"], 16);
    EXPECT_EQ(j["n_prompt_requested"], 16);
    EXPECT_FALSE(j["capped"].get<bool>());
    ASSERT_TRUE(j["results"].is_array());
    ASSERT_FALSE(j["results"].empty());
    bool saw_cpu = false;
    for (const auto& r : j["results"]) {
        for (const char* k : {"plugin", "plugin_version", "engine", "device_kind", "device_name", "ok"})
            EXPECT_TRUE(r.contains(k)) << k;
        if (r["plugin"] != "cpu-reference") continue;
        saw_cpu = true;
        ASSERT_TRUE(r["ok"].get<bool>()) << r.dump();
        for (const char* k : {"load_ms", "load_gb_per_s", "prefill_tokens_per_s", "decode_tokens_per_s", "ttft_ms", "itl_p50_ms",
                              "itl_p95_ms", "peak_device_bytes", "host_bytes"}) {
            ASSERT_TRUE(r.contains(k)) << k;
            EXPECT_TRUE(r[k].is_number()) << k;
        }
        EXPECT_GT(r["prefill_tokens_per_s"].get<double>(), 0);
        EXPECT_GT(r["decode_tokens_per_s"].get<double>(), 0);
        EXPECT_NEAR(r["load_gb_per_s"].get<double>(),
                    double(j["model_bytes"].get<uint64_t>()) / (r["load_ms"].get<double>() * 1e6), 1e-9);
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

// The stop callback (SIGINT/SIGTERM in the CLI) ends the run with CANCELLED,
// never a report: at once (the plugin's load polls it too), or a few steps in.
TEST(Bench, StopEndsTheRunWithCancelled) {
    TempDir d;
    ForgeOptions f{"tiny-gpt2-q8_0", d.file("m.gguf"), 1, "", 2, {}};
    forge(f);
    for (int after : {0, 3, 40}) {
        BenchOptions o;
        o.plugins_dir = EH_PLUGIN_DIR;
        o.plugin = "cpu-reference";
        o.model = f.out;
        o.n_prompt = 16;
        o.n_gen = 8;
        o.reps = 1000;  // far more than `after` polls
        o.threads = 1;
        int polls = 0;
        o.stop = [&] { return ++polls > after; };
        try {
            run_bench(o);
            ADD_FAILURE() << "expected CANCELLED after " << after << " polls";
        } catch (const eh::Error& e) {
            EXPECT_EQ(e.code(), eh::Code::Cancelled) << e.what();
        }
        EXPECT_LE(polls, after + 2) << "the run went on after the stop";
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

TEST(Bench, FitContext) {
    EXPECT_EQ(fit_context(512, 128, 0), std::make_pair(512u, 128u));      // unknown context: no cap
    EXPECT_EQ(fit_context(512, 128, 4096), std::make_pair(512u, 128u));   // fits
    EXPECT_EQ(fit_context(64, 63, 128), std::make_pair(64u, 63u));        // exactly fits (one spare slot)
    EXPECT_EQ(fit_context(512, 128, 128), std::make_pair(101u, 26u));     // scaled in proportion
    for (uint32_t ctx : {2u, 3u, 17u, 128u, 1000u})
        for (auto [p, n] : {std::pair{512u, 128u}, std::pair{1u, 5000u}, std::pair{5000u, 1u}}) {
            auto [pp, nn] = fit_context(p, n, ctx);
            EXPECT_GE(pp, 1u);
            EXPECT_GE(nn, 1u);
            EXPECT_LE(pp, p);
            EXPECT_LE(nn, n);
            EXPECT_LE(pp + nn + 1, std::max(ctx, 3u)) << ctx << " " << p << " " << n;
        }
}

// The defaults (-p 512 -n 128) on a model of 128 positions: capped, said so,
// and the run succeeds.
TEST(Bench, DefaultsAreCappedToSmallContext) {
    TempDir d;
    ForgeOptions f{"tiny-gpt2-q8_0", d.file("m.gguf"), 1, "", 2, {}};
    forge(f);
    BenchOptions o;
    o.plugins_dir = EH_PLUGIN_DIR;
    o.model = f.out;
    o.plugin = "cpu-reference";
    o.reps = 1;
    o.threads = 2;
    auto rep = run_bench(o);
    auto j = to_json(rep);
    EXPECT_EQ(j["context_length"], 128);
    EXPECT_EQ(j["n_prompt_requested"], 512);
    EXPECT_EQ(j["n_gen_requested"], 128);
    EXPECT_TRUE(j["capped"].get<bool>());
    EXPECT_LE(j["n_prompt"].get<uint32_t>() + j["n_gen"].get<uint32_t>() + 1, 128u);
    ASSERT_EQ(j["results"].size(), 1u);
    EXPECT_TRUE(j["results"][0]["ok"].get<bool>()) << j["results"][0].dump();
    const std::string table = to_table(rep);
    EXPECT_NE(table.find("requested -p 512 -n 128"), std::string::npos) << table;
    EXPECT_NE(table.find(fmt::format("pp{} t/s", rep.n_prompt)), std::string::npos) << table;
}

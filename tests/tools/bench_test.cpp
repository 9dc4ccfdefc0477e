#include <gtest/gtest.h>

#include <fmt/format.h>

#include "eh/tools/bench.hpp"
#include "eh/tools/forge.hpp"
#include "eh/error.hpp"
#include "tools_test_util.hpp"

using namespace eh::tools;
using eh::tools::test::TempDir;

namespace {

// Options that bench the tiny GPT-2 profile, forged into d (seed 1), with
// the built plugins.
BenchOptions on_tiny_gpt2(const TempDir& d) {
    ForgeOptions f{"tiny-gpt2-q8_0", d.file("m.gguf"), 1, "", 2, {}, ""};
    forge(f);
    BenchOptions o;
    o.plugins_dir = EH_PLUGIN_DIR;
    o.model = f.out;
    return o;
}

}  // namespace

TEST(Bench, JsonSchemaOnCpuReference) {
    TempDir d;
    BenchOptions o = on_tiny_gpt2(d);
    o.n_prompt = 16;
    o.n_gen = 4;
    o.reps = 2;
    o.threads = 2;
    auto rep = run_bench(o);
    auto j = to_json(rep);
    for (const char* k : {"model", "architecture", "quant", "model_bytes", "n_vocab", "n_prompt", "n_gen", "reps", "n_prompt_requested", "n_gen_requested", "context_length", "capped",
                          "path", "batch", "batch_tokens", "results", "skipped"})
        EXPECT_TRUE(j.contains(k)) << k;
    EXPECT_EQ(j["quant"], "Q8_0");
    EXPECT_EQ(j["n_prompt"], 16);
    EXPECT_EQ(j["n_prompt_requested"], 16);
    EXPECT_FALSE(j["capped"].get<bool>());
    ASSERT_TRUE(j["results"].is_array());
    ASSERT_FALSE(j["results"].empty());
    bool saw_cpu = false;
    for (const auto& r : j["results"]) {
        for (const char* k : {"plugin", "plugin_version", "engine", "device_kind", "device_name", "ok", "path"})
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
    BenchOptions o = on_tiny_gpt2(d);
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
    const BenchOptions forged = on_tiny_gpt2(d);
    for (int after : {0, 3, 40}) {
        BenchOptions o = forged;
        o.plugin = "cpu-reference";
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
    BenchOptions o = on_tiny_gpt2(d);
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

// ---- the step path (issue 46 item 2) ----
// tinytales (llama, 512 positions, in the repository) on the CPU reference;
// no timing is asserted, only what ran and the tokens it produced.

namespace {

BenchOptions tinytales(uint32_t p, uint32_t n) {
    BenchOptions o;
    o.plugins_dir = EH_PLUGIN_DIR;
    o.plugin = "cpu-reference";
    o.model = std::string(EH_SOURCE_DIR) + "/models/tinytales.gguf";
    o.n_prompt = p;
    o.n_gen = n;
    o.reps = 1;
    o.threads = 2;
    return o;
}

// The one result of `o` (one plugin), which must have succeeded.
BenchRun run_one(const BenchOptions& o) {
    BenchReport r = run_bench(o);
    EXPECT_EQ(r.runs.size(), 1u);
    if (r.runs.empty()) return {};
    EXPECT_EQ(r.runs[0].error, "");
    return r.runs[0];
}

void expect_usage_error(const BenchOptions& o, const char* what) {
    try {
        run_bench(o);
        ADD_FAILURE() << what << ": expected INVALID_REQUEST";
    } catch (const eh::Error& e) {
        EXPECT_EQ(e.code(), eh::Code::InvalidRequest) << what << ": " << e.what();
    }
}

}  // namespace

TEST(BenchStep, DefaultIsTheStepPathAndTheReportNamesIt) {
    BenchOptions o = tinytales(16, 4);
    BenchReport rep = run_bench(o);
    const auto j = to_json(rep);
    EXPECT_EQ(j["path"], "step");
    EXPECT_EQ(j["batch"], 1);
    EXPECT_EQ(j["batch_tokens"], 2048);
    ASSERT_EQ(j["results"].size(), 1u);
    const auto& r = j["results"][0];
    ASSERT_TRUE(r["ok"].get<bool>()) << r.dump();
    EXPECT_EQ(r["path"], "step");
    EXPECT_FALSE(r.contains("path_note"));
    EXPECT_EQ(r["batch"], 1);
    EXPECT_EQ(r["step_tokens"], 2048);
    EXPECT_TRUE(r["chained"].get<bool>());  // the CPU reference runs steps in two halves (ABI 1.3)
    EXPECT_EQ(r["prefill_steps"], 1);
    EXPECT_EQ(r["prefill_tokens"], 16);
    EXPECT_EQ(r["decode_tokens"], 4);
    EXPECT_EQ(r["tokens"].size(), 5u);  // the first token, then 4 decoded
    for (const char* k : {"prefill_tokens_per_s", "decode_tokens_per_s", "decode_tokens_per_s_per_seq", "ttft_ms",
                          "itl_p50_ms", "itl_p95_ms"})
        EXPECT_TRUE(r[k].is_number()) << k;
    const std::string table = to_table(rep);
    EXPECT_NE(table.find("path: step"), std::string::npos) << table;
    EXPECT_NE(table.find("| step "), std::string::npos) << table;
}

// Four sequences decode together: every count says four, and the aggregate
// rate is four sequences' tokens over the same time as one sequence's rate.
TEST(BenchStep, BatchOfFourDecodesTogether) {
    BenchOptions o = tinytales(16, 4);
    o.batch = 4;
    BenchReport rep = run_bench(o);
    const auto j = to_json(rep);
    EXPECT_EQ(j["batch"], 4);
    const auto& r = j["results"][0];
    ASSERT_TRUE(r["ok"].get<bool>()) << r.dump();
    EXPECT_EQ(r["batch"], 4);
    EXPECT_EQ(r["decode_tokens"], 4 * 4);
    EXPECT_EQ(r["prefill_tokens"], 4 * 16);
    EXPECT_EQ(r["prefill_steps"], 1);  // 64 prompt tokens share one step of 2048
    EXPECT_NEAR(r["decode_tokens_per_s"].get<double>(), 4 * r["decode_tokens_per_s_per_seq"].get<double>(),
                1e-6 * r["decode_tokens_per_s"].get<double>());
    EXPECT_NE(to_table(rep).find("tg/seq t/s"), std::string::npos);
}

// A prompt longer than a step is prefilled in chunks of --batch-tokens, and
// several sequences' chunks share a step; the tokens do not depend on either.
TEST(BenchStep, PrefillRunsInChunksOfBatchTokens) {
    BenchOptions o = tinytales(300, 4);
    o.batch_tokens = 128;
    const BenchRun chunked = run_one(o);
    EXPECT_EQ(chunked.path, "step");
    EXPECT_EQ(chunked.step_tokens, 128u);
    EXPECT_EQ(chunked.prefill_steps, 3u);  // 128 + 128 + 44
    o.batch_tokens = 2048;
    const BenchRun whole = run_one(o);
    EXPECT_EQ(whole.prefill_steps, 1u);
    ASSERT_EQ(chunked.tokens.size(), 5u);
    EXPECT_EQ(chunked.tokens, whole.tokens);

    // Three 40-token prompts in steps of 16: 120 tokens, 8 steps, a step
    // holding the end of one prompt and the start of the next.
    BenchOptions m = tinytales(40, 4);
    m.batch = 3;
    m.batch_tokens = 16;
    const BenchRun shared = run_one(m);
    EXPECT_EQ(shared.batch, 3u);
    EXPECT_EQ(shared.prefill_steps, 8u);
    m.batch = 1;
    m.batch_tokens = 2048;
    EXPECT_EQ(shared.tokens, run_one(m).tokens) << "sequence 0 decoded beside two others, after a shared prefill";
}

// Greedy sampling on both paths: the step path (chained or not, one sequence
// or several) produces the session path's tokens for the same prompt.
TEST(BenchStep, StepAndSessionPathsAgreeOnTheGreedyTokens) {
    BenchOptions o = tinytales(24, 8);
    o.path = BenchPath::Session;
    BenchReport srep = run_bench(o);
    ASSERT_EQ(srep.runs.size(), 1u);
    const BenchRun& session = srep.runs[0];
    ASSERT_EQ(session.error, "");
    EXPECT_EQ(session.path, "session");
    EXPECT_EQ(session.batch, 1u);
    ASSERT_EQ(session.tokens.size(), 9u);
    const auto sj = to_json(srep);
    EXPECT_EQ(sj["path"], "session");
    EXPECT_EQ(sj["results"][0]["path"], "session");
    EXPECT_FALSE(sj["results"][0].contains("chained"));
    EXPECT_NE(to_table(srep).find("path: session"), std::string::npos);

    o.path = BenchPath::Step;
    const BenchRun chained = run_one(o);
    EXPECT_TRUE(chained.chained);
    EXPECT_EQ(chained.tokens, session.tokens);

    o.chained_steps = false;
    const BenchRun plain = run_one(o);
    EXPECT_FALSE(plain.chained);
    EXPECT_EQ(plain.tokens, session.tokens);

    o.chained_steps = true;
    o.batch = 2;
    const BenchRun two = run_one(o);
    EXPECT_EQ(two.batch, 2u);
    EXPECT_EQ(two.tokens, session.tokens);
}

// A plugin without the batched calls (the test engine implements only the
// session calls) runs the session path under --path step, and says so.
TEST(BenchStep, APluginWithoutTheStepFallsBackToTheSessionPathAndSaysSo) {
    BenchOptions o = tinytales(16, 4);
    o.plugins_dir = std::string(EH_TEST_PLUGIN_DIR) + "/good";
    o.plugin = "";
    o.batch = 2;
    BenchReport rep = run_bench(o);
    ASSERT_EQ(rep.runs.size(), 1u);
    const BenchRun& r = rep.runs[0];
    ASSERT_EQ(r.error, "");
    EXPECT_EQ(r.path, "session");
    EXPECT_EQ(r.batch, 1u);
    EXPECT_NE(r.path_note.find("no batched step"), std::string::npos) << r.path_note;
    const auto j = to_json(rep);
    EXPECT_EQ(j["path"], "step");  // as asked
    EXPECT_EQ(j["results"][0]["path"], "session");
    EXPECT_EQ(j["results"][0]["decode_tokens"], 4);
    EXPECT_TRUE(j["results"][0].contains("path_note"));
    EXPECT_NE(to_table(rep).find("no batched step"), std::string::npos);
}

// Checked before the model is opened: the CLI maps INVALID_REQUEST to its
// usage exit status (2).
TEST(BenchStep, BadValuesAreUsageErrors) {
    BenchOptions o = tinytales(16, 4);
    o.model = "/no/such/model.gguf";
    auto with = [&](auto change) {
        BenchOptions x = o;
        change(x);
        return x;
    };
    expect_usage_error(with([](BenchOptions& x) { x.batch = 0; }), "--batch 0");
    expect_usage_error(with([](BenchOptions& x) { x.batch = 4097; }), "--batch 4097");
    expect_usage_error(with([](BenchOptions& x) { x.batch_tokens = 0; }), "--batch-tokens 0");
    expect_usage_error(with([](BenchOptions& x) { x.batch_tokens = 15; }), "--batch-tokens 15");
    expect_usage_error(with([](BenchOptions& x) { x.batch_tokens = 65537; }), "--batch-tokens 65537");
    expect_usage_error(with([](BenchOptions& x) {
                           x.batch = 32;
                           x.batch_tokens = 16;
                       }),
                       "--batch above --batch-tokens");
    expect_usage_error(with([](BenchOptions& x) {
                           x.path = BenchPath::Session;
                           x.batch = 2;
                       }),
                       "--path session --batch 2");
    EXPECT_EQ(parse_bench_path("step"), BenchPath::Step);
    EXPECT_EQ(parse_bench_path("session"), BenchPath::Session);
    EXPECT_THROW(parse_bench_path("batched"), eh::Error);
}

TEST(BenchStep, SequencesGetTheirOwnPrompts) {
    EXPECT_EQ(bench_prompt(64, 1468, 0), bench_prompt(64, 1468));
    EXPECT_NE(bench_prompt(64, 1468, 1), bench_prompt(64, 1468, 0));
    EXPECT_NE(bench_prompt(64, 1468, 2), bench_prompt(64, 1468, 1));
    for (int32_t t : bench_prompt(64, 512, 7)) {
        EXPECT_GE(t, 0);
        EXPECT_LT(t, 512);
    }
}

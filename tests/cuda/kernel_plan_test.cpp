// The load's options reader and the kernel plan (host code, no GPU).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include <engine_host/plugin_abi.hpp>
#include <ehcuda/kernel_plan.hpp>
#include <ehcuda/kernel_route.hpp>
#include <ehcuda/options.hpp>

namespace {

using ehcuda::GemvInput;
using ehcuda::KernelPlan;
using ehcuda::Options;

// The message of the INVALID_ARGUMENT `f` throws ("" if it throws nothing
// or another status).
template <class F>
std::string invalid(F&& f) {
    try {
        f();
    } catch (const ehp::Error& e) {
        return e.status() == EH_INVALID_ARGUMENT ? std::string(e.what()) : "status " + std::to_string(e.status());
    }
    return "";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(Options, AbsentBlankAndEmptyReadAsDefaults) {
    for (const char* json : {static_cast<const char*>(nullptr), "", "  \n", "{}"}) {
        const Options o(json);
        EXPECT_FALSE(o.has("x"));
        EXPECT_EQ(o.integer("x", 7, 0, 10), 7);
        EXPECT_TRUE(o.boolean("b", true));
        EXPECT_EQ(o.choice("c", 1, {"a", "b"}), 1);
        EXPECT_TRUE(o.keys().empty());
        EXPECT_NO_THROW(o.check_known({"y"}));
        EXPECT_FALSE(o.object("k").has("z"));
    }
}

TEST(Options, TypedGetters) {
    const Options o(R"({"n": 42, "neg": -3, "on": true, "mode": "off", "sub": {"k": 5}})");
    EXPECT_EQ(o.integer("n", 0, 0, 100), 42);
    EXPECT_EQ(o.integer("neg", 0, -5, 5), -3);
    EXPECT_TRUE(o.boolean("on", false));
    EXPECT_EQ(o.choice("mode", 0, {"auto", "on", "off"}), 2);
    const Options sub = o.object("sub");
    EXPECT_EQ(sub.integer("k", 0, 0, 9), 5);
    EXPECT_EQ(sub.where(), "options.sub");
    EXPECT_EQ(o.keys(), (std::vector<std::string>{"n", "neg", "on", "mode", "sub"}));
}

TEST(Options, BadTypesNameTheKey) {
    const Options o(R"({"n": "12", "f": 1.5, "b": 1, "c": 3, "big": 18446744073709551615, "o": [1]})");
    EXPECT_EQ(invalid([&] { o.integer("n", 0, 0, 100); }), "options: \"n\" must be an integer in [0, 100]");
    EXPECT_TRUE(has(invalid([&] { o.integer("f", 0, 0, 100); }), "\"f\" must be an integer"));
    EXPECT_TRUE(has(invalid([&] { o.integer("big", 0, 0, 100); }), "\"big\" must be an integer"));
    EXPECT_EQ(invalid([&] { o.boolean("b", false); }), "options: \"b\" must be true or false");
    EXPECT_EQ(invalid([&] { o.choice("c", 0, {"auto", "on", "off"}); }),
              "options: \"c\" must be one of \"auto\", \"on\", \"off\"");
    EXPECT_EQ(invalid([&] { o.object("o"); }), "options: \"o\" must be a JSON object");
}

TEST(Options, OutOfRangeAndUnknownChoice) {
    const Options o(R"({"n": 101, "m": -1, "c": "maybe"})");
    EXPECT_EQ(invalid([&] { o.integer("n", 0, 0, 100); }), "options: \"n\" must be an integer in [0, 100]");
    EXPECT_EQ(invalid([&] { o.integer("m", 0, 0, 100); }), "options: \"m\" must be an integer in [0, 100]");
    EXPECT_EQ(invalid([&] { o.choice("c", 0, {"on", "off"}); }), "options: \"c\" must be one of \"on\" or \"off\"");
}

TEST(Options, UnknownKeysAreRefusedByName) {
    const Options o(R"({"fp16_weights": "on", "fp16_weight": "off"})");
    EXPECT_EQ(invalid([&] { o.check_known({"fp16_weights", "upload_chunk_bytes"}); }),
              "options: unknown key \"fp16_weight\" (known: \"fp16_weights\", \"upload_chunk_bytes\")");
    EXPECT_NO_THROW(Options(R"({"a": 1})").check_known({"a", "b"}));
}

TEST(Options, NotAnObjectOrTooLong) {
    for (const char* bad : {"[1]", "1", "\"x\"", "{", "{\"a\":}", "null", "{} {}"})
        EXPECT_EQ(invalid([&] { Options o(bad); }), "options: not a JSON object") << bad;
    const std::string big = "{\"a\": \"" + std::string(Options::kMaxBytes, 'x') + "\"}";
    EXPECT_TRUE(has(invalid([&] { Options o(big.c_str()); }), "longer than"));
}

// ---- the plan

ehcuda::DeviceTraits h100() { return {9, 0, 132}; }
ehcuda::DeviceTraits a100() { return {8, 0, 108}; }

TEST(KernelPlan, ChosenFromDeviceAndRouting) {
    const KernelPlan p = ehcuda::choose_plan(h100(), false);
    EXPECT_EQ(p.gemv_input, GemvInput::Int16);
    EXPECT_TRUE(p.pdl);
    EXPECT_TRUE(p.gemv_bulk);
    // MoE routing takes the int16x2 input (gpt-cuda's models).
    EXPECT_EQ(ehcuda::choose_plan(h100(), true).gemv_input, GemvInput::Int16x2);
    // Before sm_90: no PDL, no bulk copy engine.
    const KernelPlan old = ehcuda::choose_plan(a100(), false);
    EXPECT_FALSE(old.pdl);
    EXPECT_FALSE(old.gemv_bulk);
}

TEST(KernelPlan, DefaultsAreTheMeasuredOnes) {
    // The values the kernels ran with as compile-time / environment defaults.
    const KernelPlan p;
    EXPECT_EQ(p.bulk_tile_kb, 8);
    EXPECT_EQ(p.bulk_warps, 0);
    EXPECT_EQ(p.bulk_ring_waves, 2);
    EXPECT_EQ(p.gemv_r4_rows, 8192);
    EXPECT_EQ(p.gemv_r2_rows, 4096);
    EXPECT_EQ(p.split_groups, 1536);
    EXPECT_EQ(p.split_rows, 2048);
    EXPECT_EQ(p.pair_slots, 2);
    EXPECT_EQ(p.attn_keys, 8);
    EXPECT_EQ(p.attn_min_chunk, 64);
    EXPECT_EQ(p.attn_group_min_keys, 2048);
    EXPECT_EQ(p.attn_early, 2);
    EXPECT_EQ(p.sink_min_chunk, 128);
    EXPECT_EQ(p.prefill_min_tokens, 16);
    // The batched steps' thresholds (batch.cpp's constants before they
    // moved into the plan).
    EXPECT_EQ(p.batch_gemv_per_token, 8);
    EXPECT_EQ(p.batch_gemv_per_token_mirrored, 2);
    EXPECT_EQ(p.batch_moe_grouped_max, 2048);  // a prefill step's experts in one grouped call
    EXPECT_EQ(p.moe_tile_pass_tokens, 64);
    EXPECT_EQ(p.moe_decode_pass_tokens, 16);
    EXPECT_EQ(p.allreduce_nccl_min_floats, 1 << 20);  // past 64 tokens of n_embd 8192 / 128 of 4096
    EXPECT_FALSE(p.allreduce_signals);  // event barriers until measured across GPUs
    EXPECT_EQ(ehcuda::choose_plan(h100(), true).batch_gemv_per_token, 8);
    EXPECT_TRUE(p.attn_pipe && p.moe_fused_route && p.gemv_mixed);
    // token groups of up to 3, decoded once, small inputs staged in each
    // block, long rows in slices (measured together); the RMSNorm in the
    // groups off until measured; int16x2 plans keep groups of two
    EXPECT_EQ(p.bulk_max_tokens, 3);
    EXPECT_TRUE(p.bulk_group_once);
    EXPECT_FALSE(p.bulk_group_norm);
    EXPECT_EQ(p.bulk_group_stage_cols, 1024);
    EXPECT_TRUE(p.bulk_group_kslice);
    // the one-token slice ring for long Q6_K rows: choose_plan turns it on
    // on sm_90 (it needs the bulk copy engine), off before
    EXPECT_EQ(p.bulk_slices, 0);
    EXPECT_EQ(ehcuda::choose_plan(h100(), false).bulk_slices, 1);
    EXPECT_EQ(ehcuda::choose_plan(h100(), true).bulk_slices, 1);
    EXPECT_EQ(ehcuda::choose_plan(a100(), false).bulk_slices, 0);
    EXPECT_EQ(p.bulk_slice_slots, 2);
    EXPECT_EQ(p.bulk_slice_rows, 0);
    EXPECT_EQ(p.bulk_slice_warps, 0);
    EXPECT_EQ(ehcuda::choose_plan(h100(), true).bulk_max_tokens, 2);
    EXPECT_EQ(ehcuda::choose_plan(h100(), false).bulk_max_tokens, 3);
}

TEST(KernelPlan, OptionsOverride) {
    KernelPlan p = ehcuda::choose_plan(h100(), false);
    const Options o(R"({"kernels": {"gemv_input": "float", "gemv_bulk": false, "attn_min_chunk": 12, "pair_rows": 4,
                                    "attn_pipe": false, "prefill_min_tokens": 0, "moe_router_kernel": false,
                                    "batch_moe_grouped_max": 64, "allreduce_nccl_min_floats": 0,
                                    "allreduce_signals": true, "moe_tile_pass_tokens": 0,
                                    "moe_decode_pass_tokens": 16, "bulk_group_once": true,
                                    "bulk_group_norm": true, "bulk_group_stage_cols": 512,
                                    "bulk_group_kslice": false, "bulk_slices": 1, "bulk_slice_slots": 4,
                                    "bulk_slice_rows": 2, "bulk_slice_warps": 8}})");
    ehcuda::apply_plan_options(p, o.object("kernels"));
    EXPECT_EQ(p.gemv_input, GemvInput::Float);
    EXPECT_FALSE(p.gemv_bulk);
    EXPECT_EQ(p.attn_min_chunk, 12);
    EXPECT_EQ(p.pair_rows, 4);
    EXPECT_FALSE(p.attn_pipe);
    EXPECT_EQ(p.prefill_min_tokens, 0);
    EXPECT_FALSE(p.moe_router_kernel);
    EXPECT_EQ(p.batch_moe_grouped_max, 64);
    EXPECT_EQ(p.moe_tile_pass_tokens, 0);
    EXPECT_EQ(p.moe_decode_pass_tokens, 16);
    EXPECT_TRUE(p.bulk_group_once);
    EXPECT_TRUE(p.bulk_group_norm);
    EXPECT_EQ(p.bulk_group_stage_cols, 512);
    EXPECT_FALSE(p.bulk_group_kslice);
    EXPECT_EQ(p.bulk_slices, 1);
    EXPECT_EQ(p.bulk_slice_slots, 4);
    EXPECT_EQ(p.bulk_slice_rows, 2);
    EXPECT_EQ(p.bulk_slice_warps, 8);
    EXPECT_EQ(p.allreduce_nccl_min_floats, 0);
    EXPECT_TRUE(p.allreduce_signals);
    EXPECT_EQ(p.batch_gemv_per_token, 8);  // the chosen value
    // Absent keys keep the chosen values.
    EXPECT_TRUE(p.pdl);
    EXPECT_EQ(p.attn_keys, 8);
}

TEST(KernelPlan, BadOptionsNameTheKey) {
    auto apply = [](const char* json) {
        KernelPlan p;
        ehcuda::apply_plan_options(p, Options(json).object("kernels"));
    };
    EXPECT_EQ(invalid([&] { apply(R"({"kernels": {"pair_slots": 5}})"); }),
              "options.kernels: \"pair_slots\" must be an integer in [0, 4]");
    EXPECT_EQ(invalid([&] { apply(R"({"kernels": {"batch_gemv_per_token": -1}})"); }),
              "options.kernels: \"batch_gemv_per_token\" must be an integer in [1, 65536]");
    EXPECT_EQ(invalid([&] { apply(R"({"kernels": {"moe_tile_pass_tokens": 65537}})"); }),
              "options.kernels: \"moe_tile_pass_tokens\" must be an integer in [0, 65536]");
    EXPECT_EQ(invalid([&] { apply(R"({"kernels": {"moe_decode_pass_tokens": 12}})"); }),
              "options.kernels: \"moe_decode_pass_tokens\" must be 8 or 16");
    EXPECT_EQ(invalid([&] { apply(R"({"kernels": {"batch_gemv_per_token_mirrored": 0}})"); }),
              "options.kernels: \"batch_gemv_per_token_mirrored\" must be an integer in [1, 65536]");
    EXPECT_EQ(invalid([&] { apply(R"({"kernels": {"bulk_warps": 6}})"); }),
              "options.kernels: \"bulk_warps\" must be 0, 4, 8 or 16");
    EXPECT_EQ(invalid([&] { apply(R"({"kernels": {"bulk_slices": 3}})"); }),
              "options.kernels: \"bulk_slices\" must be an integer in [0, 2]");
    EXPECT_EQ(invalid([&] { apply(R"({"kernels": {"bulk_slice_slots": 1}})"); }),
              "options.kernels: \"bulk_slice_slots\" must be an integer in [2, 4]");
    EXPECT_EQ(invalid([&] { apply(R"({"kernels": {"bulk_slice_rows": 3}})"); }),
              "options.kernels: \"bulk_slice_rows\" must be an integer in [0, 2]");
    EXPECT_EQ(invalid([&] { apply(R"({"kernels": {"bulk_slice_warps": 12}})"); }),
              "options.kernels: \"bulk_slice_warps\" must be 0, 4, 8 or 16");
    EXPECT_EQ(invalid([&] { apply(R"({"kernels": {"attn_keys": 16}})"); }),
              "options.kernels: \"attn_keys\" must be an integer in [4, 8]");
    EXPECT_EQ(invalid([&] { apply(R"({"kernels": {"attn_pipe": "no"}})"); }),
              "options.kernels: \"attn_pipe\" must be true or false");
    EXPECT_TRUE(has(invalid([&] { apply(R"({"kernels": {"attn_group_min_keys": -2}})"); }),
                    "options.kernels: \"attn_group_min_keys\" must be an integer in [-1, "));
    // The session path's keys went with it, and moe_mma_lean with the
    // MXFP4 passes' other kernel: unknown now, named as such.
    for (const char* gone : {"attn_splits", "attn_chunks", "kv_f16", "pipeline", "profile_decode", "moe_mma_lean"})
        EXPECT_TRUE(has(invalid([&] { apply((std::string(R"({"kernels": {")") + gone + R"(": 1}})").c_str()); }),
                        std::string("options.kernels: unknown key \"") + gone + "\""))
            << gone;
    EXPECT_TRUE(has(invalid([&] { apply(R"({"kernels": {"gemv_input": "int4"}})"); }),
                    "options.kernels: \"gemv_input\" must be one of \"float\", \"int16\", \"int8\", \"int16x2\""));
    EXPECT_TRUE(has(invalid([&] { apply(R"({"kernels": {"attn_split": 4}})"); }),
                    "options.kernels: unknown key \"attn_split\""));
    EXPECT_EQ(invalid([&] { apply(R"({"kernels": 3})"); }), "options: \"kernels\" must be a JSON object");
}

TEST(KernelPlan, EnvironmentOverrideIsOneVariable) {
    KernelPlan p;
    ::setenv("EHCUDA_PLAN", R"({"attn_early": 1, "pdl": false})", 1);
    ehcuda::apply_plan_env(p);
    EXPECT_EQ(p.attn_early, 1);
    EXPECT_FALSE(p.pdl);
    ::setenv("EHCUDA_PLAN", R"({"attn_early": 3})", 1);
    EXPECT_EQ(invalid([&] { ehcuda::apply_plan_env(p); }), "EHCUDA_PLAN: \"attn_early\" must be an integer in [0, 2]");
    ::unsetenv("EHCUDA_PLAN");
    KernelPlan q;
    ehcuda::apply_plan_env(q);
    EXPECT_EQ(q, KernelPlan{});
}

TEST(KernelPlan, ScopeInstallsAndRestores) {
    EXPECT_EQ(ehcuda::plan(), KernelPlan{});
    KernelPlan a, b;
    a.gemv_input = GemvInput::Int16x2;
    b.gemv_input = GemvInput::Float;
    {
        ehcuda::PlanScope sa(a);
        EXPECT_EQ(ehcuda::plan().gemv_input, GemvInput::Int16x2);
        {
            ehcuda::PlanScope sb(b);
            EXPECT_EQ(ehcuda::plan().gemv_input, GemvInput::Float);
        }
        EXPECT_EQ(ehcuda::plan().gemv_input, GemvInput::Int16x2);
    }
    EXPECT_EQ(ehcuda::plan(), KernelPlan{});
}

size_t bytes_per_row(uint32_t type, int cols) {
    const eh_type_traits t = eh_tensor_type_traits(type);
    return size_t(cols / int(t.block_elems)) * t.block_bytes;
}

ehcuda::GemvShape one(uint32_t type, int rows, int cols) {
    ehcuda::GemvShape g;
    g.type[0] = type;
    g.rows[0] = rows;
    g.cols = cols;
    g.row_bytes[0] = bytes_per_row(type, cols);
    return g;
}

// The route of a single-token matmul of `g`, as the load's log prints it.
std::string describe1(const KernelPlan& p, const ehcuda::DeviceTraits& dev, const ehcuda::GemvShape& g,
                      bool chunk_input = false) {
    ehcuda::MatmulShape m;
    m.g = g;
    m.chunk_input = chunk_input;
    return ehcuda::describe_route(p, m, ehcuda::route_matmul(p, dev, m));
}

// The register GEMV's choices from the matrix shape.
TEST(KernelPlan, RegisterLaunchFromShape) {
    const KernelPlan p;
    // Tall: 4 rows per warp; 4096..8191 rows: 2; fewer: 1.
    EXPECT_EQ(ehcuda::plan_register(p, 1, one(EH_TYPE_Q4_K, 16384, 4096)).rows_per_warp, 4);
    EXPECT_EQ(ehcuda::plan_register(p, 1, one(EH_TYPE_Q4_K, 4096, 4096)).rows_per_warp, 2);
    EXPECT_EQ(ehcuda::plan_register(p, 1, one(EH_TYPE_Q4_K, 3072, 3072)).rows_per_warp, 1);
    // Rows not a multiple of 4 stay at 2 or 1; several tokens: 1.
    EXPECT_EQ(ehcuda::plan_register(p, 1, one(EH_TYPE_Q8_0, 8194, 1024)).rows_per_warp, 2);
    EXPECT_EQ(ehcuda::plan_register(p, 4, one(EH_TYPE_Q4_K, 16384, 4096)).rows_per_warp, 1);
    // Qwen2.5-0.5B's ffn_down (896 x 4864): split K; its QKV (1152 x 896): no (K too short).
    EXPECT_TRUE(ehcuda::plan_register(p, 1, one(EH_TYPE_Q4_K, 896, 4864)).split_k);
    EXPECT_FALSE(ehcuda::plan_register(p, 1, one(EH_TYPE_Q4_K, 1152, 896)).split_k);
    // One token past split_rows rows: no split; several tokens: split by groups only.
    EXPECT_FALSE(ehcuda::plan_register(p, 1, one(EH_TYPE_Q4_K, 3072, 8192)).split_k);
    EXPECT_TRUE(ehcuda::plan_register(p, 2, one(EH_TYPE_Q4_K, 1024, 8192)).split_k);
}

// The bulk GEMV's choices from the matrix shape and the SM count.
TEST(KernelPlan, BulkLaunchFromShape) {
    const KernelPlan p = ehcuda::choose_plan(h100(), false);
    // Qwen2.5-0.5B's ffn_down: 896 rows of Q4_K over 4864: 1 row per tile
    // (896 rows < 32 warps x 132 SMs); 8-warp blocks would be 112, fewer
    // than the SMs, so 4 warps and 224 blocks.
    ehcuda::BulkLaunch b = ehcuda::plan_bulk(p, 132, one(EH_TYPE_Q4_K, 896, 4864));
    EXPECT_EQ(b.tr, 1);
    EXPECT_EQ(b.tiles, 896);
    EXPECT_EQ(b.warps, 4);
    EXPECT_EQ(b.blocks, 224);
    EXPECT_FALSE(b.ring);
    EXPECT_EQ(b.x_bytes, 4864 / 32 * 80);
    // A tied 151936 x 896 Q8_0 LM head: tiles of 8 rows (8 KB cap / 952 B
    // rows), many waves: the resident-grid form.
    b = ehcuda::plan_bulk(p, 132, one(EH_TYPE_Q8_0, 151936, 896));
    EXPECT_EQ(b.tr, 8);
    EXPECT_TRUE(b.ring);
    EXPECT_GT(b.warps, 0);
    // Ring off: the one-shot kernel, 8 warps (bulk_fit2) rather than 16.
    KernelPlan q = p;
    q.bulk_ring_waves = 0;
    b = ehcuda::plan_bulk(q, 132, one(EH_TYPE_Q8_0, 151936, 896));
    EXPECT_FALSE(b.ring);
    EXPECT_EQ(b.warps, 8);
    q.bulk_fit2 = false;
    EXPECT_EQ(ehcuda::plan_bulk(q, 132, one(EH_TYPE_Q8_0, 151936, 896)).warps, 16);
    // int16x2 stages 112 bytes per chunk.
    q.gemv_input = GemvInput::Int16x2;
    EXPECT_EQ(ehcuda::plan_bulk(q, 132, one(EH_TYPE_Q4_K, 896, 4864)).x_bytes, 4864 / 32 * 112);
    // Llama-3.1-8B's Q6_K LM head (128256 x 4096): the ring, 12 warps per
    // multiprocessor. Its Q6_K ffn_down (4096 x 14336): two buffers fit for 4
    // warps only, under kRingMinWarpsPerSm: the one-shot kernel, 8 warps.
    b = ehcuda::plan_bulk(p, 132, one(EH_TYPE_Q6_K, 128256, 4096));
    EXPECT_TRUE(b.ring);
    EXPECT_EQ(b.warps, 12);
    // (bulk_slices 1, sm_90's default, takes it as the slice ring instead)
    EXPECT_GT(ehcuda::plan_bulk(p, 132, one(EH_TYPE_Q6_K, 4096, 14336)).slots, 0);
    KernelPlan one_shot = p;
    one_shot.bulk_slices = 0;
    b = ehcuda::plan_bulk(one_shot, 132, one(EH_TYPE_Q6_K, 4096, 14336));
    EXPECT_FALSE(b.ring);
    EXPECT_EQ(b.slots, 0);
    EXPECT_EQ(b.warps, 8);
    EXPECT_EQ(b.blocks, 512);
    // Too wide an input for the shared memory: not taken.
    EXPECT_EQ(ehcuda::plan_bulk(p, 132, one(EH_TYPE_Q8_0, 64, 256 * 1024)).warps, 0);
}

TEST(KernelPlan, BulkTakesOnlyIntegerInputsOnSm90) {
    const KernelPlan p = ehcuda::choose_plan(h100(), false);
    EXPECT_FALSE(ehcuda::can_implement_bulk(p, h100(), one(EH_TYPE_Q4_K, 896, 896)));
    EXPECT_TRUE(ehcuda::can_implement_bulk(p, a100(), one(EH_TYPE_Q4_K, 896, 896)));
    EXPECT_TRUE(ehcuda::can_implement_bulk(p, h100(), one(EH_TYPE_F16, 896, 896)));
    EXPECT_TRUE(ehcuda::can_implement_bulk(p, h100(), one(EH_TYPE_MXFP4, 896, 896)));
    KernelPlan f = p;
    f.gemv_input = GemvInput::Int8;
    EXPECT_TRUE(ehcuda::can_implement_bulk(f, h100(), one(EH_TYPE_Q4_K, 896, 896)));
    f.gemv_input = GemvInput::Int16x2;
    EXPECT_FALSE(ehcuda::can_implement_bulk(f, h100(), one(EH_TYPE_Q4_K, 896, 896)));
}

// The load's log lines name the kernel and its parameters.
TEST(KernelPlan, LogLines) {
    const KernelPlan p = ehcuda::choose_plan(h100(), false);
    EXPECT_EQ(describe1(p, h100(), one(EH_TYPE_Q4_K, 896, 4864)),
              "Q4_K 896x4864: gemv_bulk_kernel: 1 rows/tile, 4 warps/block, 224 blocks, int16 input");
    // Before sm_90 the register kernel, with its split-K.
    EXPECT_EQ(describe1(ehcuda::choose_plan(a100(), false), a100(), one(EH_TYPE_Q4_K, 896, 4864)),
              "Q4_K 896x4864: gemv_kernel: 1 rows/warp, split-K over 4 warps, int16 input");
    // Float weights take the float input whatever the plan says.
    EXPECT_EQ(describe1(p, h100(), one(EH_TYPE_F16, 2304, 768)),
              "F16 2304x768: gemv_kernel: 1 rows/warp, float input");
    // Q, K, V of Q5_0 and Q8_0 (Qwen2.5's Q4_K_M): one mixed launch.
    ehcuda::GemvShape qkv = one(EH_TYPE_Q5_0, 896, 896);
    qkv.nseg = 3;
    qkv.type[1] = qkv.type[2] = EH_TYPE_Q8_0;
    qkv.rows[1] = qkv.rows[2] = 128;
    qkv.row_bytes[1] = qkv.row_bytes[2] = bytes_per_row(EH_TYPE_Q8_0, 896);
    const std::string l = describe1(p, h100(), qkv);
    EXPECT_TRUE(has(l, "Q5_0 896x896 + Q8_0 128x896 + Q8_0 128x896: gemv_bulk_kernel (mixed types)")) << l;
    // Mixed launches off: one launch per segment, each described.
    KernelPlan m = p;
    m.gemv_mixed = false;
    const std::string s = describe1(m, h100(), qkv);
    EXPECT_TRUE(has(s, "one launch per segment: Q5_0 896x896: gemv_bulk_kernel")) << s;
    EXPECT_TRUE(has(describe1(p, h100(), one(EH_TYPE_Q4_K, 896, 4864), true), "input chunks from the producer"));
    const std::string d = ehcuda::describe_plan(p, {9, 0, 132});
    EXPECT_TRUE(has(d, "sm_90, 132 SMs; GEMV input int16, bulk copy GEMV, PDL")) << d;
    EXPECT_TRUE(has(d, "decode attention 8 keys/warp round, splits of >= 64 keys (sinks: 128)")) << d;
}

}  // namespace

namespace {

TEST(KernelPlan, LogHasOneLinePerKindAndLaunch) {
    const KernelPlan p = ehcuda::choose_plan(h100(), false);
    std::vector<ehcuda::MatrixKind> mats;
    for (int layer = 0; layer < 4; ++layer) {
        mats.push_back({"attn_out", one(EH_TYPE_Q4_K, 896, 896), true, ""});
        // Q4_K_M: ffn_down in Q6_K on some layers.
        mats.push_back({"ffn_down", one(layer % 2 ? EH_TYPE_Q6_K : EH_TYPE_Q4_K, 896, 4864), true, ""});
        mats.push_back({"ffn_gate_up", one(EH_TYPE_Q4_K, 4864, 896), false, "gate_up_pair_kernel"});
    }
    const auto lines = ehcuda::plan_log(p, h100(), mats, {"attention: rope_attn_decode_kernel"});
    ASSERT_EQ(lines.size(), 6u);
    EXPECT_TRUE(has(lines[0], "kernel plan: sm_90"));
    EXPECT_EQ(lines[1], "attention: rope_attn_decode_kernel");
    EXPECT_TRUE(has(lines[2], "attn_out x4: Q4_K 896x896: gemv_bulk_kernel")) << lines[2];
    EXPECT_TRUE(has(lines[2], "input chunks from the producer")) << lines[2];
    EXPECT_TRUE(has(lines[3], "ffn_down x2: Q4_K 896x4864: gemv_bulk_kernel")) << lines[3];
    EXPECT_EQ(lines[4], "ffn_gate_up x4: Q4_K 4864x896: gate_up_pair_kernel");
    EXPECT_TRUE(has(lines[5], "ffn_down x2: Q6_K 896x4864: gemv_bulk_kernel")) << lines[5];
}

TEST(KernelPlan, LoadPlanAppliesOptionsThenEnvironment) {
    ::setenv("EHCUDA_PLAN", R"({"attn_min_chunk": 9})", 1);
    const KernelPlan p =
        ehcuda::load_plan(h100(), true, Options(R"({"kernels": {"attn_min_chunk": 3, "pair_slots": 1}})"));
    ::unsetenv("EHCUDA_PLAN");
    EXPECT_EQ(p.gemv_input, GemvInput::Int16x2);
    EXPECT_EQ(p.attn_min_chunk, 9);  // the environment last
    EXPECT_EQ(p.pair_slots, 1);
    EXPECT_EQ(ehcuda::load_plan(h100(), false, Options(nullptr)), ehcuda::choose_plan(h100(), false));
}

// A step's inputs go up on their own copy stream by default; the key puts
// them back on the step's stream (the A/B of docs/benchmarks.md).
TEST(KernelPlan, StepUploadAside) {
    KernelPlan p = ehcuda::choose_plan(h100(), false);
    EXPECT_TRUE(p.step_upload_aside);
    ehcuda::apply_plan_options(p, Options(R"({"kernels": {"step_upload_aside": false}})").object("kernels"));
    EXPECT_FALSE(p.step_upload_aside);
}

}  // namespace

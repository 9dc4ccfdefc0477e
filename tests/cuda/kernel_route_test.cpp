// The kernel route table (kernel_route.hpp), host code, no GPU: the routes of
// real models' matrices are those the separate choosers gave before the
// table (kernel_route_expected.inc, written down from them), a step's
// thresholds come from the plan, and each kernel's refusal says why.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <engine_host/plugin_abi.hpp>
#include <ehcuda/kernel_route.hpp>

namespace {

using ehcuda::DeviceTraits;
using ehcuda::GemvInput;
using ehcuda::GemvShape;
using ehcuda::KernelPlan;
using ehcuda::MatmulShape;
using ehcuda::RouteKernel;

#include "kernel_route_expected.inc"
#include "kernel_route_shapes.inc"

const DeviceTraits kH200{9, 0, 132};
const DeviceTraits kA100{8, 0, 108};

const RealShape& real(const std::string& model, const std::string& kind) {
    for (const RealShape& r : kRealShapes)
        if (model == r.model && kind == r.kind) return r;
    throw std::runtime_error("no shape " + model + " " + kind);
}

struct Variant {
    KernelPlan plan;
    DeviceTraits dev;
};

// The plans the expected routes were captured under: the chosen ones but
// for bulk_ring_waves, then 3 (RingFromTwoWaves checks today's 2), and
// bulk_slices, then 0.
KernelPlan captured_plan(const ehcuda::DeviceTraits& dev, bool moe) {
    KernelPlan p = ehcuda::choose_plan(dev, moe);
    p.bulk_ring_waves = 3;
    p.bulk_slices = 0;  // (captured before the slice ring; SliceRingOnlyWhenOn checks it)
    return p;
}

Variant variant(const std::string& name) {
    if (name == "h200") return {captured_plan(kH200, false), kH200};
    if (name == "h200x2") return {captured_plan(kH200, true), kH200};
    if (name == "a100") return {captured_plan(kA100, false), kA100};
    KernelPlan p = captured_plan(kH200, false);
    if (name == "float") p.gemv_input = GemvInput::Float;
    else if (name == "nomix") p.gemv_mixed = p.gemv_bulk = false;
    else if (name == "nogroups") p.bulk_max_tokens = 1;
    else if (name == "groups") p.bulk_max_tokens = ehcuda::kBulkMaxTokens;
    else throw std::runtime_error("no variant " + name);
    return {p, kH200};
}

MatmulShape mm(const GemvShape& g, int ntok, int prefill_min_tokens = 0) {
    MatmulShape m;
    m.g = g;
    m.ntok = ntok;
    m.prefill_min_tokens = prefill_min_tokens;
    return m;
}

// One token, every real shape under every plan variant: the route's text is
// what describe_gemv said (so the same kernels with the same parameters),
// with or without a prefill workspace attached.
TEST(KernelRoute, RealShapesRouteAsTheChoosersDid) {
    int checked = 0;
    for (const ExpectedOne& e : kExpectedOne) {
        const Variant v = variant(e.variant);
        const GemvShape g = shape_of(real(e.model, e.kind));
        for (int ws : {0, 9, 3}) {
            const MatmulShape m = mm(g, 1, ws);
            EXPECT_EQ(ehcuda::describe_route(v.plan, m, ehcuda::route_matmul(v.plan, v.dev, m)), e.route)
                << e.variant << " " << e.model << " " << e.kind << " workspace " << ws;
        }
        ++checked;
    }
    EXPECT_EQ(checked, 160);
}

// The default plan puts two-wave matrices on the resident grid (the ring
// form): Phi-3's gate|up and Qwen3-8B's ffn_down, which the captured plan
// (three waves) ran as one block per tile.
TEST(KernelRoute, RingFromTwoWaves) {
    KernelPlan p = ehcuda::choose_plan(kH200, false);
    EXPECT_EQ(p.bulk_ring_waves, 2);
    p.bulk_slices = 0;  // (the slice ring, sm_90's default, takes Qwen3-8B's ffn_down before the ring)
    for (const auto& [model, kind] : {std::pair{"Phi-3-mini", "ffn_gate_up"}, std::pair{"Qwen3-8B", "ffn_down"}}) {
        const ehcuda::MatmulRoute r = ehcuda::route_matmul(p, kH200, mm(shape_of(real(model, kind)), 1));
        const std::string text = ehcuda::describe_route(p, mm(shape_of(real(model, kind)), 1), r);
        EXPECT_NE(text.find("gemv_bulk_ring_kernel"), std::string::npos) << model << " " << kind << ": " << text;
        const ehcuda::MatmulRoute old = ehcuda::route_matmul(variant("h200").plan, kH200, mm(shape_of(real(model, kind)), 1));
        EXPECT_EQ(ehcuda::describe_route(variant("h200").plan, mm(shape_of(real(model, kind)), 1), old).find("ring"),
                  std::string::npos) << model << " " << kind;
    }
}

// With the bulk kernels' token groups off (bulk_max_tokens 1), token
// groups of 2, 4 and 8 take plan_register's rows per warp and split-K as
// before: one launch for one-type shapes.
TEST(KernelRoute, TokenGroupsKeepTheRegisterChoices) {
    int checked = 0;
    for (const ExpectedRegister& e : kExpectedRegister) {
        Variant v = variant(e.variant);
        v.plan.bulk_max_tokens = 1;
        const RealShape& r = real(e.model, e.kind);
        bool same = true;
        for (int s = 1; s < r.nseg; ++s) same &= r.type[s] == r.type[0];
        if (!same) continue;  // one launch per segment, each its own shape
        const ehcuda::MatmulRoute route = ehcuda::route_matmul(v.plan, v.dev, mm(shape_of(r), e.ntok));
        ASSERT_EQ(route.n, 1) << e.model << " " << e.kind;
        const ehcuda::KernelLaunch& k = route.launch[0];
        EXPECT_EQ(k.kernel, RouteKernel::Gemv);
        EXPECT_EQ(k.ntok, e.ntok);
        EXPECT_EQ(k.input, GemvInput::Float);  // several tokens: the float input
        EXPECT_EQ(k.reg.rows_per_warp, e.rows_per_warp) << e.variant << " " << e.model << " " << e.kind << " " << e.ntok;
        EXPECT_EQ(k.reg.split_k, e.split_k) << e.variant << " " << e.model << " " << e.kind << " " << e.ntok;
        ++checked;
    }
    EXPECT_GT(checked, 100);
}

TEST(KernelRoute, TokenCountsSplitIntoGroupsOfEightFourTwoOne) {
    const Variant v = variant("nogroups");
    const GemvShape g = shape_of(real("Phi-3-mini", "attn_output"));
    const ehcuda::MatmulRoute r7 = ehcuda::route_matmul(v.plan, v.dev, mm(g, 7));
    ASSERT_EQ(r7.n, 3);
    EXPECT_EQ(r7.launch[0].ntok, 4);
    EXPECT_EQ(r7.launch[1].ntok, 2);
    EXPECT_EQ(r7.launch[1].tok0, 4);
    // The last token alone: the bulk kernel, as a single-token call would.
    EXPECT_EQ(r7.launch[2].kernel, RouteKernel::GemvBulk);
    EXPECT_EQ(r7.launch[2].tok0, 6);
    // 8 tokens: one launch; 20 through gemv() directly: 2 x 8, then 4.
    EXPECT_EQ(ehcuda::route_matmul(v.plan, v.dev, mm(g, 8)).n, 1);
    const ehcuda::MatmulRoute r20 = ehcuda::route_gemv(v.plan, v.dev, mm(g, 20));
    ASSERT_EQ(r20.n, 2);
    EXPECT_EQ(r20.launch[0].reps, 2);
    EXPECT_EQ(r20.launch[1].tok0, 16);
    EXPECT_EQ(r20.launch[1].ntok, 4);
    // Mixed types over several tokens: per segment, each in token groups.
    const GemvShape qkv = shape_of(real("Llama-3.1-8B", "attn_qkv"));
    const ehcuda::MatmulRoute rq = ehcuda::route_matmul(v.plan, v.dev, mm(qkv, 3));
    ASSERT_EQ(rq.n, 6);
    EXPECT_EQ(rq.launch[4].seg0, 2);
    const std::string d = ehcuda::describe_route(v.plan, mm(qkv, 3), rq);
    EXPECT_NE(d.find("one launch per segment: Q4_K 4096x4096: 2 tokens: gemv_kernel"), std::string::npos) << d;
}

// Past 8 tokens, or from the workspace's threshold, the GEMM: cuBLAS when
// a workspace takes them, else the tensor-core kernel.
TEST(KernelRoute, ManyTokensTakeTheGemm) {
    const Variant v = variant("nogroups");
    const GemvShape g = shape_of(real("Qwen2.5-0.5B", "ffn_gate_up"));
    auto kernel = [&](int ntok, int ws) { return ehcuda::route_matmul(v.plan, v.dev, mm(g, ntok, ws)).launch[0].kernel; };
    EXPECT_EQ(kernel(9, 0), RouteKernel::Wmma);
    EXPECT_EQ(kernel(9, 16), RouteKernel::Wmma);
    EXPECT_EQ(kernel(8, 16), RouteKernel::Gemv);
    EXPECT_EQ(kernel(16, 16), RouteKernel::Cublas);
    EXPECT_EQ(kernel(3, 3), RouteKernel::Cublas);
    EXPECT_EQ(kernel(2, 3), RouteKernel::Gemv);
    // One token never: the workspace's threshold is at least 2.
    EXPECT_EQ(kernel(1, 1), RouteKernel::GemvBulk);
    // Inputs not in the fast form, or a fused norm over several tokens: the generic kernel.
    MatmulShape m = mm(g, 4);
    m.aligned = false;
    EXPECT_EQ(ehcuda::route_matmul(v.plan, v.dev, m).launch[0].kernel, RouteKernel::Generic);
    m = mm(g, 2);
    m.rms_norm = true;
    EXPECT_EQ(ehcuda::route_matmul(v.plan, v.dev, m).launch[0].kernel, RouteKernel::Generic);
    // Generic over mixed types: one launch per segment.
    m = mm(shape_of(real("Llama-3.1-8B", "attn_qkv")), 1);
    m.aligned = false;
    EXPECT_EQ(ehcuda::route_matmul(v.plan, v.dev, m).n, 3);
}

// A 512-token prefill step of Qwen2.5-0.5B as llama-cuda runs it with its
// FP16 mirror (the workspace from 3 tokens) and without (from 9): one call
// of all 512 tokens through cuBLAS for every matrix, the tied Q8_0 head too,
// as matmul() did at 90f80df (ntok > 8, the workspace enabled: gemm(), whose
// cuBLAS path takes it); no workspace: the tensor-core GEMM.
TEST(KernelRoute, PrefillStepTakesCublas) {
    const KernelPlan p = ehcuda::choose_plan(kH200, false);
    for (const RealShape& r : kRealShapes) {
        if (std::string(r.model) != "Qwen2.5-0.5B") continue;
        const GemvShape g = shape_of(r);
        for (bool mirrored : {true, false}) {
            const ehcuda::StepRoute s = ehcuda::route_step_matmul(p, kH200, g, 512, mirrored);
            EXPECT_FALSE(s.per_token) << r.kind;
            ASSERT_EQ(s.route.n, 1) << r.kind;
            EXPECT_EQ(s.route.launch[0].kernel, RouteKernel::Cublas) << r.kind << (mirrored ? " mirrored" : "");
            EXPECT_EQ(s.route.launch[0].ntok, 512);
            EXPECT_EQ(s.route.launch[0].nseg, g.nseg);
        }
        EXPECT_EQ(ehcuda::route_matmul(p, kH200, mm(g, 512)).launch[0].kernel, RouteKernel::Wmma) << r.kind;
    }
}

// A batched step: one token alone, 2 .. batch_gemv_per_token tokens one call
// each, more one GEMM; a model with FP16 mirrors from 3 tokens.
TEST(KernelRoute, StepThresholdsComeFromThePlan) {
    KernelPlan p = ehcuda::choose_plan(kH200, false);
    EXPECT_EQ(p.bulk_max_tokens, 3);  // token groups of up to three by default
    const GemvShape g = shape_of(real("Llama-3.1-8B", "ffn_down"));
    auto step = [&](int n, bool mirrored) { return ehcuda::route_step_matmul(p, kH200, g, n, mirrored); };
    EXPECT_EQ(step(3, true).route.launch[0].ntok, 3);
    EXPECT_EQ(step(4, true).route.launch[0].kernel, RouteKernel::Cublas);
    EXPECT_TRUE(step(4, false).per_token);
    p.bulk_max_tokens = ehcuda::kBulkMaxTokens;
    EXPECT_FALSE(step(1, false).per_token);
    EXPECT_EQ(step(1, false).route.launch[0].kernel, RouteKernel::GemvBulk);
    // 2 .. 8 tokens: the bulk kernels' token groups, one call (the down's
    // long rows: one sliced launch of all 8; whole rows: groups of 4).
    EXPECT_FALSE(step(8, false).per_token);
    EXPECT_EQ(step(8, false).route.launch[0].ntok, 8);
    p.bulk_group_kslice = false;
    EXPECT_EQ(step(8, false).route.launch[0].ntok + step(8, false).route.launch[0].tok0, 4);
    p.bulk_group_kslice = true;
    EXPECT_EQ(step(3, true).route.launch[0].kernel, RouteKernel::GemvBulk);
    EXPECT_EQ(step(3, true).route.launch[0].ntok, 3);
    EXPECT_FALSE(step(9, false).per_token);
    EXPECT_EQ(step(9, false).route.launch[0].kernel, RouteKernel::Cublas);
    EXPECT_EQ(step(64, false).route.launch[0].kernel, RouteKernel::Cublas);
    // Token groups off: one call per token, cuBLAS from 3 with mirrors.
    p.bulk_max_tokens = 1;
    EXPECT_TRUE(step(8, false).per_token);
    EXPECT_EQ(step(8, false).route.launch[0].ntok, 1);
    EXPECT_TRUE(step(2, true).per_token);
    EXPECT_EQ(step(3, true).route.launch[0].kernel, RouteKernel::Cublas);
    p.batch_gemv_per_token = 16;
    EXPECT_TRUE(step(9, false).per_token);
    EXPECT_EQ(ehcuda::step_per_token_max(p, true), 2);
}

// Each kernel's refusal names its reason.
TEST(KernelRoute, RefusalsSayWhy) {
    KernelPlan p = ehcuda::choose_plan(kH200, false);
    EXPECT_FALSE(ehcuda::can_implement_bulk(p, kH200, shape_of(real("Phi-3-mini", "attn_output")), 3));
    EXPECT_STREQ(ehcuda::can_implement_bulk(p, kH200, shape_of(real("Phi-3-mini", "attn_output")), 4).why,
                 "token groups of this many off in the plan (bulk_max_tokens)");
    p.bulk_max_tokens = ehcuda::kBulkMaxTokens;
    const GemvShape q4 = shape_of(real("Phi-3-mini", "attn_output"));
    EXPECT_FALSE(ehcuda::can_implement_bulk(p, kH200, q4));
    EXPECT_STREQ(ehcuda::can_implement_bulk(p, kA100, q4).why, "needs sm_90 (the bulk copy engine)");
    EXPECT_FALSE(ehcuda::can_implement_bulk(p, kH200, q4, 8));
    EXPECT_STREQ(ehcuda::can_implement_bulk(p, kH200, q4, 9).why, "more tokens than its token groups take");
    KernelPlan g4 = p;
    g4.bulk_max_tokens = 4;
    EXPECT_STREQ(ehcuda::can_implement_bulk(g4, kH200, q4, 5).why,
                 "token groups of this many off in the plan (bulk_max_tokens)");
    EXPECT_STREQ(ehcuda::can_implement_bulk_groups(p, kH200, mm(q4, 1)).why, "one token");
    EXPECT_STREQ(ehcuda::can_implement_bulk_groups(g4, kH200, mm(q4, 5)).why,
                 "more tokens than the plan's token groups (bulk_max_tokens)");
    MatmulShape rn = mm(q4, 2);
    rn.rms_norm = true;
    EXPECT_STREQ(ehcuda::can_implement_bulk_groups(p, kH200, rn).why, "a fused RMSNorm (bulk_group_norm off)");
    MatmulShape ci = mm(q4, 2);
    ci.chunk_input = true;
    EXPECT_STREQ(ehcuda::can_implement_bulk_groups(p, kH200, ci).why, "a producer's chunks (one token only)");
    KernelPlan gn = p;
    gn.bulk_group_norm = true;
    EXPECT_FALSE(ehcuda::can_implement_bulk_groups(gn, kH200, rn));
    EXPECT_STREQ(ehcuda::can_implement_bulk_groups(p, kH200, mm(shape_of(real("Qwen2.5-0.5B", "qkv_mixed_lowbit")), 2)).why,
                 "segments of different types outside the mixed launch");
    EXPECT_STREQ(ehcuda::can_implement_bulk_groups(p, kA100, mm(q4, 2)).why, "needs sm_90 (the bulk copy engine)");
    EXPECT_STREQ(ehcuda::can_implement_bulk(p, kH200, shape_of(real("gpt-oss-20b", "experts_mxfp4"))).why,
                 "MXFP4 weights");
    EXPECT_STREQ(ehcuda::can_implement_bulk(p, kH200, shape_of(real("GPT-2", "ffn_up_f16"))).why,
                 "a weight type without an integer dot product");
    KernelPlan f = p;
    f.gemv_input = GemvInput::Int8;
    EXPECT_STREQ(ehcuda::can_implement_bulk(f, kH200, q4).why, "input not int16 / int16x2");
    f = p;
    f.gemv_bulk = false;
    EXPECT_STREQ(ehcuda::can_implement_bulk(f, kH200, q4).why, "off in the plan (gemv_bulk)");
    GemvShape wide = q4;
    wide.rows[0] = 64;
    wide.cols = 256 * 1024;
    wide.row_bytes[0] = ehcuda::row_bytes(EH_TYPE_Q4_K, wide.cols);
    EXPECT_STREQ(ehcuda::can_implement_bulk(p, kH200, wide).why,
                 "the staged input and a tile per warp exceed its shared memory");

    const GemvShape low = shape_of(real("Qwen2.5-0.5B", "qkv_mixed_lowbit"));
    EXPECT_FALSE(ehcuda::can_implement_mixed(p, shape_of(real("Llama-3.1-8B", "attn_qkv")), 1));
    EXPECT_STREQ(ehcuda::can_implement_mixed(p, low, 1).why,
                 "a type outside the mixed launch (MXFP4, Q2_K, Q3_K, IQ4_NL, IQ4_XS, float)");
    EXPECT_STREQ(ehcuda::can_implement_mixed(p, low, 2).why, "more than one token");

    // The FFN pair: Phi-3's gate|up and down.
    const GemvShape gu = shape_of(real("Phi-3-mini", "ffn_gate_up"));
    const GemvShape down = shape_of(real("Phi-3-mini", "ffn_down"));
    EXPECT_FALSE(ehcuda::can_implement_pair(p, gu, &down));
    EXPECT_STREQ(ehcuda::can_implement_pair(variant("float").plan, gu, &down).why, "input not int16 / int16x2");
    EXPECT_STREQ(ehcuda::can_implement_pair(p, shape_of(real("Qwen2.5-0.5B", "ffn_gate_up")), &down).why,
                 "down does not read gate|up's rows");
    GemvShape mixed = gu;
    mixed.type[1] = EH_TYPE_Q6_K;
    EXPECT_STREQ(ehcuda::can_implement_pair(p, mixed).why, "gate and up of different types");

    MatmulShape m = mm(q4, 9);
    EXPECT_STREQ(ehcuda::can_implement_gemv(m).why, "more tokens than the GEMV's groups take");
    EXPECT_STREQ(ehcuda::can_implement_cublas(m).why, "no prefill workspace, or it is off");
    m = mm(q4, 4, 3);
    EXPECT_STREQ(ehcuda::can_implement_gemv(m).why, "the prefill workspace takes this many tokens");
    EXPECT_FALSE(ehcuda::can_implement_cublas(m));
    m = mm(q4, 2, 3);
    EXPECT_STREQ(ehcuda::can_implement_cublas(m).why, "fewer tokens than the workspace's threshold");
    EXPECT_FALSE(ehcuda::can_implement_gemv(m));
}

// The launch geometry the GPU launchers must use (route_launch_test.cpp
// checks them on the device): blocks, threads and shared bytes.
TEST(KernelRoute, LaunchGeometry) {
    const KernelPlan p = ehcuda::choose_plan(kA100, false);
    // Qwen2.5-0.5B's ffn_down before sm_90: split K, one row group a block,
    // int16 chunks of 80 bytes staged.
    const GemvShape down = shape_of(real("Qwen2.5-0.5B", "ffn_down"));
    ehcuda::KernelLaunch k = ehcuda::route_matmul(p, kA100, mm(down, 1)).launch[0];
    EXPECT_EQ(k.blocks, 896);
    EXPECT_EQ(k.threads, 128);
    EXPECT_EQ(k.smem, size_t(4864 / 32 * 80));
    // Float weights, one token: float chunks padded to 36 floats.
    k = ehcuda::route_matmul(p, kA100, mm(shape_of(real("GPT-2", "ffn_up_f16")), 1)).launch[0];
    EXPECT_EQ(k.smem, size_t(768 / 32 * 36 * 4));
    EXPECT_EQ(k.blocks, 3072 / 4);
    // Several tokens read the input in place.
    EXPECT_EQ(ehcuda::route_matmul(p, kA100, mm(down, 4)).launch[0].smem, 0u);
    // Chunk input: nothing staged.
    MatmulShape c = mm(down, 1);
    c.chunk_input = true;
    EXPECT_EQ(ehcuda::route_matmul(p, kA100, c).launch[0].smem, 0u);
    // The bulk kernel's block is its warps.
    const KernelPlan h = ehcuda::choose_plan(kH200, false);
    k = ehcuda::route_matmul(h, kH200, mm(down, 1)).launch[0];
    EXPECT_EQ(k.kernel, RouteKernel::GemvBulk);
    EXPECT_EQ(k.threads, 4 * 32);
    EXPECT_EQ(k.blocks, 224);
    EXPECT_EQ(k.smem, k.bulk.smem);
}

// 2 .. 8 tokens on sm_90: the bulk kernels' token groups, before the GEMM
// and before a step's one call per token: the widest group whose staged
// inputs fit shared memory, repeated, the rest after it.
TEST(KernelRoute, BulkTokenGroups) {
    const Variant v = variant("groups");
    auto route = [&](const char* model, const char* kind, int ntok, int ws = 0) {
        return ehcuda::route_matmul(v.plan, v.dev, mm(shape_of(real(model, kind)), ntok, ws));
    };
    // Qwen2.5-0.5B's gate|up, 5 tokens, even with a workspace from 3: one launch.
    ehcuda::MatmulRoute r = route("Qwen2.5-0.5B", "ffn_gate_up", 5, 3);
    ASSERT_EQ(r.n, 1);
    EXPECT_TRUE(r.launch[0].kernel == RouteKernel::GemvBulk || r.launch[0].kernel == RouteKernel::GemvBulkRing);
    EXPECT_EQ(r.launch[0].ntok, 5);
    EXPECT_EQ(r.launch[0].bulk.ntok, 5);
    EXPECT_EQ(r.launch[0].bulk.x_bytes, 5 * r.launch[0].bulk.x_stride);
    EXPECT_LE(r.launch[0].bulk.tr, ehcuda::kBulkGroupMaxRows);
    EXPECT_LE(r.launch[0].smem, ehcuda::kBulkMaxSmem);
    // Mixed Q4_K / Q6_K QKV: one launch of all three segments.
    r = route("Llama-3.1-8B", "attn_qkv", 4);
    ASSERT_EQ(r.n, 1);
    EXPECT_EQ(r.launch[0].nseg, 3);
    EXPECT_FALSE(r.launch[0].bulk.same);
    // Llama-3.1-8B's ffn_down (14336 inputs: 35 KB staged a token): 8 tokens
    // do not fit one group; repeated narrower groups cover all 8 in order.
    r = route("Llama-3.1-8B", "ffn_down", 8);
    ASSERT_GE(r.n, 1);
    int covered = 0;
    for (const ehcuda::KernelLaunch& k : r) {
        EXPECT_EQ(k.tok0, covered);
        EXPECT_LT(k.ntok, 8);
        EXPECT_LE(k.smem, ehcuda::kBulkMaxSmem);
        covered += k.ntok * k.reps;
    }
    EXPECT_EQ(covered, 8);
    // 9 tokens: past the groups, the GEMM.
    EXPECT_EQ(route("Qwen2.5-0.5B", "ffn_gate_up", 9, 3).launch[0].kernel, RouteKernel::Cublas);
    // Float weights: no integer dot product, the register kernel.
    EXPECT_EQ(route("GPT-2", "ffn_up_f16", 4).launch[0].kernel, RouteKernel::Gemv);
}

// bulk_group_once: token groups' tiles of at most kBulkOnceMaxRows rows
// (a lane keeps each row's decoded chunk and every row x token sum), the
// launch marked so (the kernels pick the lane = chunk form by it) and the
// route's text says it; one token and the plan's default keep the tiles
// as they were.
TEST(KernelRoute, GroupsDecodedOnce) {
    Variant v = variant("groups");
    v.plan.bulk_group_once = false;
    const GemvShape head = shape_of(real("Qwen2.5-0.5B", "output"));
    ehcuda::KernelLaunch k = ehcuda::route_matmul(v.plan, v.dev, mm(head, 5)).launch[0];
    EXPECT_FALSE(k.bulk.once);
    EXPECT_EQ(k.bulk.tr, 8);
    const std::string before = ehcuda::describe_route(v.plan, mm(head, 5), ehcuda::route_matmul(v.plan, v.dev, mm(head, 5)));
    EXPECT_EQ(before.find("weights decoded once"), std::string::npos) << before;
    v.plan.bulk_group_once = true;
    const ehcuda::MatmulRoute r = ehcuda::route_matmul(v.plan, v.dev, mm(head, 5));
    ASSERT_EQ(r.n, 1);
    EXPECT_TRUE(r.launch[0].bulk.once);
    EXPECT_EQ(r.launch[0].bulk.tr, ehcuda::kBulkOnceMaxRows);
    EXPECT_EQ(r.launch[0].bulk.tiles, (151936 + 3) / 4);
    const std::string after = ehcuda::describe_route(v.plan, mm(head, 5), r);
    EXPECT_NE(after.find("5 tokens: gemv_bulk_ring_kernel: 4 rows/tile"), std::string::npos) << after;
    EXPECT_NE(after.find(", weights decoded once"), std::string::npos) << after;
    // one token: the single-token tile, not marked
    k = ehcuda::route_matmul(v.plan, v.dev, mm(head, 1)).launch[0];
    EXPECT_FALSE(k.bulk.once);
    EXPECT_EQ(k.bulk.tr, 8);
    // every real shape's groups keep to the bound
    for (const RealShape& rs : kRealShapes)
        for (int n : {2, 5, 8})
            for (const ehcuda::KernelLaunch& l : ehcuda::route_matmul(v.plan, v.dev, mm(shape_of(rs), n)))
                if (l.ntok > 1 && (l.kernel == RouteKernel::GemvBulk || l.kernel == RouteKernel::GemvBulkRing)) {
                    EXPECT_TRUE(l.bulk.once) << rs.model << " " << rs.kind;
                    EXPECT_LE(l.bulk.tr, ehcuda::kBulkOnceMaxRows) << rs.model << " " << rs.kind;
                }
}

// bulk_group_norm: a fused RMSNorm of 2 .. 8 tokens runs as token groups
// (with the key off, the generic kernel as before: the batched step then
// normalises first), their inputs quantized once where the call's scratch
// holds the tokens' chunks and 1 / rms, else staged in each block.
// bulk_group_stage_cols: groups of fewer inputs stage them in each block.
TEST(KernelRoute, GroupsTakeTheNormAndStageSmallInputs) {
    Variant v = variant("groups");
    MatmulShape m = mm(shape_of(real("Llama-3.1-8B", "attn_qkv")), 5);
    m.rms_norm = true;
    m.token_scratch = size_t(16) * size_t(m.g.cols) * 2;  // a batched step's
    EXPECT_EQ(ehcuda::route_matmul(v.plan, v.dev, m).launch[0].kernel, RouteKernel::Generic);
    v.plan.bulk_group_norm = true;
    ehcuda::MatmulRoute r = ehcuda::route_matmul(v.plan, v.dev, m);
    ASSERT_EQ(r.n, 1);
    EXPECT_EQ(r.launch[0].ntok, 5);
    EXPECT_TRUE(r.launch[0].bulk.prequant);
    EXPECT_TRUE(r.launch[0].kernel == RouteKernel::GemvBulk || r.launch[0].kernel == RouteKernel::GemvBulkRing);
    // a group of 8 whose scratch holds 8 tokens' chunks but not their 1 / rms
    m.ntok = 8;
    m.token_scratch = ehcuda::bulk_group_scratch(r.launch[0].bulk, 8, false);
    r = ehcuda::route_matmul(v.plan, v.dev, m);
    EXPECT_EQ(r.launch[0].ntok, 8);
    EXPECT_FALSE(r.launch[0].bulk.prequant);
    m.token_scratch = ehcuda::bulk_group_scratch(r.launch[0].bulk, 8, true);
    EXPECT_TRUE(ehcuda::route_matmul(v.plan, v.dev, m).launch[0].bulk.prequant);
    // the inputs of 4096 columns staged in each block from 4097
    v.plan.bulk_group_stage_cols = 4097;
    EXPECT_FALSE(ehcuda::route_matmul(v.plan, v.dev, m).launch[0].bulk.prequant);
    v.plan.bulk_group_stage_cols = 4096;
    EXPECT_TRUE(ehcuda::route_matmul(v.plan, v.dev, m).launch[0].bulk.prequant);
    // one token keeps the single-token fold
    m.ntok = 1;
    r = ehcuda::route_matmul(v.plan, v.dev, m);
    EXPECT_FALSE(r.launch[0].bulk.prequant);
    EXPECT_EQ(r.launch[0].ntok, 1);
}

// bulk_group_kslice: a group over rows too long for two in a tile (Llama's
// ffn_down, 14336 inputs) is one launch of all its tokens, blocks of 8
// warps x 4 rows walking K in slices, instead of narrower groups of one
// row a tile (8 tokens: two groups of 4); only with the inputs quantized
// once, only for such rows, and with the weights decoded once.
TEST(KernelRoute, GroupsSliceLongRows) {
    Variant v = variant("groups");
    v.plan.bulk_group_once = true;
    v.plan.bulk_group_kslice = false;
    MatmulShape m = mm(shape_of(real("Llama-3.1-8B", "ffn_down")), 8);
    m.token_scratch = size_t(16) * size_t(m.g.cols) * 2;  // a batched step's
    ehcuda::MatmulRoute r = ehcuda::route_matmul(v.plan, v.dev, m);
    EXPECT_LT(r.launch[0].ntok, 8);  // narrower groups, as before
    EXPECT_EQ(r.launch[0].bulk.kslice, 0);
    v.plan.bulk_group_kslice = true;
    r = ehcuda::route_matmul(v.plan, v.dev, m);
    ASSERT_EQ(r.n, 1);
    const ehcuda::KernelLaunch& k = r.launch[0];
    EXPECT_EQ(k.kernel, RouteKernel::GemvBulk);
    EXPECT_EQ(k.ntok, 8);
    EXPECT_EQ(k.bulk.kslice, 64);  // 2048 inputs a slice
    EXPECT_EQ(k.bulk.tr, 4);
    EXPECT_EQ(k.threads, 8 * 32);
    EXPECT_EQ(k.blocks, 4096 / 32);
    EXPECT_TRUE(k.bulk.prequant && k.bulk.once);
    EXPECT_EQ(k.bulk.tile_stride, 8 * 210);  // a Q6_K row's 2048 inputs
    EXPECT_EQ(k.smem, size_t(2 * 8 * 64 * 80 + 8 * 2 * 4 * 8 * 210));
    EXPECT_LE(k.smem, ehcuda::kBulkMaxSmem);
    const std::string text = ehcuda::describe_route(v.plan, m, r);
    EXPECT_NE(text.find("8 tokens: gemv_bulk_kernel: 4 rows/tile, 8 warps/block, 128 blocks"), std::string::npos) << text;
    EXPECT_NE(text.find(", K in slices of 2048"), std::string::npos) << text;
    // 5 tokens: one launch too
    m.ntok = 5;
    r = ehcuda::route_matmul(v.plan, v.dev, m);
    ASSERT_EQ(r.n, 1);
    EXPECT_EQ(r.launch[0].ntok, 5);
    EXPECT_EQ(r.launch[0].bulk.x_bytes, 5 * 64 * 80);
    // without the scratch (or staged in each block): the whole-row groups
    m.token_scratch = 0;
    EXPECT_EQ(ehcuda::route_matmul(v.plan, v.dev, m).launch[0].bulk.kslice, 0);
    m.token_scratch = size_t(16) * size_t(m.g.cols) * 2;
    v.plan.bulk_group_stage_cols = 16384;
    EXPECT_EQ(ehcuda::route_matmul(v.plan, v.dev, m).launch[0].bulk.kslice, 0);
    v.plan.bulk_group_stage_cols = 0;
    // rows of 4096 inputs (two fit a tile): not sliced
    MatmulShape qkv = mm(shape_of(real("Llama-3.1-8B", "attn_output")), 8);
    qkv.token_scratch = m.token_scratch;
    EXPECT_EQ(ehcuda::route_matmul(v.plan, v.dev, qkv).launch[0].bulk.kslice, 0);
    // without bulk_group_once: not sliced
    v.plan.bulk_group_once = false;
    EXPECT_EQ(ehcuda::plan_bulk_slices(v.plan, 132, m.g, 8).warps, 0);
}

GemvShape one_segment(uint32_t type, int rows, int cols) {
    GemvShape g;
    g.type[0] = type;
    g.rows[0] = rows;
    g.row_bytes[0] = ehcuda::row_bytes(type, cols);
    g.cols = cols;
    return g;
}

// bulk_slices: the one-token slice ring only when on in the plan; under 1
// (sm_90's default) only for a Q6_K matrix of 12288+ inputs a row whose rows
// one wave of one-row warps holds (Gemma 3 12B's and Llama-3.1-8B's
// ffn_down, not Gemma 3 27B's 5376 rows nor Phi-3's 8192 inputs nor Q4_K),
// under 2 for every one-token bulk matmul, mixed-type QKV too; never for
// token groups, before sm_90 or where its predicate refuses, each refusal
// naming why.
TEST(KernelRoute, SliceRingOnlyWhenOn) {
    KernelPlan p = ehcuda::choose_plan(kH200, false);
    EXPECT_EQ(p.bulk_slices, 1);
    EXPECT_EQ(ehcuda::choose_plan(kA100, false).bulk_slices, 0);
    p.bulk_slices = 0;
    const GemvShape down = one_segment(EH_TYPE_Q6_K, 3840, 15360);  // Gemma 3 12B's ffn_down
    MatmulShape m = mm(down, 1);
    m.chunk_input = true;  // (its input: the FFN pair's chunks)
    auto first = [&](const KernelPlan& q, const MatmulShape& s) { return ehcuda::route_matmul(q, kH200, s).launch[0]; };
    EXPECT_EQ(first(p, m).bulk.slots, 0);  // off: the one-shot kernel, one row a tile
    EXPECT_EQ(first(p, m).bulk.tr, 1);
    EXPECT_STREQ(ehcuda::can_implement_slice_ring(p, down).why, "off in the plan (bulk_slices)");
    p.bulk_slices = 1;
    EXPECT_FALSE(ehcuda::can_implement_slice_ring(p, down));
    ehcuda::KernelLaunch k = first(p, m);
    EXPECT_EQ(k.kernel, RouteKernel::GemvBulk);
    EXPECT_EQ(k.bulk.slots, 2);
    EXPECT_EQ(k.bulk.tr, 1);
    EXPECT_EQ(k.bulk.tiles, 3840);
    EXPECT_EQ(k.bulk.tile_stride, 4 * 210 + 8 + 16);  // a slice of 1024 inputs, to 16 bytes, and its lead
    EXPECT_EQ(k.bulk.x_bytes, 480 * 80);
    EXPECT_EQ(k.bulk.warps, 16);  // two blocks a multiprocessor: 240 blocks, one wave
    EXPECT_EQ(k.blocks, 240);
    EXPECT_EQ(k.threads, 16 * 32);
    EXPECT_EQ(k.smem, size_t(480 * 80 + 16 * 2 * 864));
    EXPECT_EQ(ehcuda::describe_route(p, m, ehcuda::route_matmul(p, kH200, m)),
              "Q6_K 3840x15360: gemv_bulk_kernel (slice ring): 1 rows/warp, 16 warps/block, 240 blocks, int16 input, "
              "K in slices of 1024, 2 in flight a warp, input chunks from the producer");
    // the plan's slots, rows and warps
    p.bulk_slice_slots = 4;
    p.bulk_slice_rows = 2;
    p.bulk_slice_warps = 8;
    k = first(p, m);
    EXPECT_EQ(k.bulk.slots, 4);
    EXPECT_EQ(k.bulk.tr, 2);
    EXPECT_EQ(k.bulk.tiles, 1920);
    EXPECT_EQ(k.bulk.warps, 8);
    EXPECT_EQ(k.blocks, 240);
    EXPECT_EQ(k.smem, size_t(480 * 80 + 8 * 4 * 2 * 864));
    p.bulk_slice_slots = 2;
    p.bulk_slice_rows = 0;
    p.bulk_slice_warps = 0;
    // Llama-3.1-8B's ffn_down (the resident ring refused it: 4 warps a
    // multiprocessor) takes it too; its attn_output (three rows a tile)
    // keeps the one-shot kernel under 1, takes the ring under 2
    EXPECT_GT(first(p, mm(shape_of(real("Llama-3.1-8B", "ffn_down")), 1)).bulk.slots, 0);
    const GemvShape out = shape_of(real("Llama-3.1-8B", "attn_output"));
    EXPECT_EQ(first(p, mm(out, 1)).bulk.slots, 0);
    EXPECT_STREQ(ehcuda::can_implement_slice_ring(p, out).why,
                 "not one Q6_K matrix of 12288+ inputs a row (bulk_slices 1)");
    // under 1: not Q4_K rows that long, not Phi-3's 8192-input Q6_K rows,
    // not Gemma 3 27B's 5376 rows (more than one wave of one-row warps on
    // 132 multiprocessors) unless the plan names the rows a warp
    EXPECT_STREQ(ehcuda::can_implement_slice_ring(p, one_segment(EH_TYPE_Q4_K, 3840, 15360)).why,
                 "not one Q6_K matrix of 12288+ inputs a row (bulk_slices 1)");
    EXPECT_STREQ(ehcuda::can_implement_slice_ring(p, one_segment(EH_TYPE_Q6_K, 3072, 8192)).why,
                 "not one Q6_K matrix of 12288+ inputs a row (bulk_slices 1)");
    const GemvShape down27 = one_segment(EH_TYPE_Q6_K, 5376, 21504);
    EXPECT_FALSE(ehcuda::can_implement_slice_ring(p, down27));
    EXPECT_EQ(ehcuda::plan_bulk_slice_ring(p, 132, down27).warps, 0);
    EXPECT_EQ(first(p, mm(down27, 1)).bulk.slots, 0);
    EXPECT_GT(ehcuda::plan_bulk_slice_ring(p, 168, down27).warps, 0);  // one wave of 168 multiprocessors
    p.bulk_slice_rows = 2;
    EXPECT_EQ(ehcuda::plan_bulk_slice_ring(p, 132, down27).tr, 2);
    p.bulk_slice_rows = 0;
    // a tile that holds two rows (bulk_tile_kb 32) refuses them too
    KernelPlan big_tiles = p;
    big_tiles.bulk_tile_kb = 32;
    EXPECT_STREQ(ehcuda::can_implement_slice_ring(big_tiles, down).why,
                 "rows a tile holds two of (bulk_slices 1: long rows only)");
    p.bulk_slices = 2;
    k = first(p, mm(out, 1));
    EXPECT_EQ(k.bulk.slots, 2);
    EXPECT_EQ(k.bulk.warps, 16);
    EXPECT_EQ(k.blocks, 256);
    // Q4_K / Q4_K / Q6_K QKV in one launch: two rows a warp (6144 rows), the
    // widest slice's buffers, 8-warp blocks (24 warps on the busiest
    // multiprocessor against 32 at 16)
    const GemvShape qkv = shape_of(real("Llama-3.1-8B", "attn_qkv"));
    const ehcuda::MatmulRoute rq = ehcuda::route_matmul(p, kH200, mm(qkv, 1));
    ASSERT_EQ(rq.n, 1);
    EXPECT_FALSE(rq.launch[0].bulk.same);
    EXPECT_EQ(rq.launch[0].bulk.slots, 2);
    EXPECT_EQ(rq.launch[0].bulk.tr, 2);
    EXPECT_EQ(rq.launch[0].bulk.tiles, 3072);
    EXPECT_EQ(rq.launch[0].bulk.tile_stride, 864);
    EXPECT_EQ(rq.launch[0].bulk.warps, 8);
    EXPECT_NE(ehcuda::describe_route(p, mm(qkv, 1), rq).find("gemv_bulk_kernel (slice ring) (mixed types): 2 rows/warp"),
              std::string::npos);
    // a row of fewer slices than slots: as many slots as slices
    EXPECT_EQ(ehcuda::plan_bulk_slice_ring(p, 132, one_segment(EH_TYPE_Q8_0, 37, 96)).slots, 1);
    // an input too wide for shared memory: not taken, nor by plan_bulk
    const GemvShape wide = one_segment(EH_TYPE_Q8_0, 64, 196608);
    EXPECT_EQ(ehcuda::plan_bulk_slice_ring(p, 132, wide).warps, 0);
    EXPECT_EQ(ehcuda::plan_bulk(p, 132, wide).slots, 0);
    // token groups, sm_80, and what the predicate refuses
    EXPECT_EQ(first(p, mm(out, 2)).bulk.slots, 0);
    EXPECT_EQ(ehcuda::route_matmul(p, kA100, mm(out, 1)).launch[0].kernel, RouteKernel::Gemv);
    EXPECT_STREQ(ehcuda::can_implement_slice_ring(p, out, 2).why, "more than one token");
    EXPECT_STREQ(ehcuda::can_implement_slice_ring(p, one_segment(EH_TYPE_MXFP4, 64, 4096)).why, "MXFP4 weights");
    EXPECT_STREQ(ehcuda::can_implement_slice_ring(p, one_segment(EH_TYPE_F16, 64, 4096)).why,
                 "a weight type without an integer dot product");
    GemvShape low = qkv;
    low.type[2] = EH_TYPE_Q2_K;
    low.row_bytes[2] = ehcuda::row_bytes(EH_TYPE_Q2_K, low.cols);
    EXPECT_STREQ(ehcuda::can_implement_slice_ring(p, low).why, "segments of different types outside the mixed launch");
    GemvShape torn = out;
    torn.row_bytes[0] += 2;
    EXPECT_STREQ(ehcuda::can_implement_slice_ring(p, torn).why, "rows not whole blocks");
    KernelPlan fl = p;
    fl.gemv_input = GemvInput::Float;
    EXPECT_STREQ(ehcuda::can_implement_slice_ring(fl, out).why, "input not int16 / int16x2");
    KernelPlan x2 = ehcuda::choose_plan(kH200, true);  // int16x2 input takes it
    x2.bulk_slices = 2;
    EXPECT_EQ(first(x2, mm(out, 1)).bulk.slots, 2);
    EXPECT_EQ(first(x2, mm(out, 1)).bulk.x_bytes, 128 * 112);
    // every integer-path type but MXFP4, one at a time
    for (uint32_t t : {EH_TYPE_Q4_0, EH_TYPE_Q4_1, EH_TYPE_Q5_0, EH_TYPE_Q5_1, EH_TYPE_Q8_0, EH_TYPE_Q4_K, EH_TYPE_Q5_K,
                       EH_TYPE_Q6_K, EH_TYPE_Q2_K, EH_TYPE_Q3_K, EH_TYPE_IQ4_NL, EH_TYPE_IQ4_XS}) {
        const ehcuda::BulkLaunch b = ehcuda::plan_bulk_slice_ring(p, 132, one_segment(t, 1000, 4096));
        EXPECT_EQ(b.slots, 2) << ehp::type_name(t);
        EXPECT_EQ(size_t(b.tile_stride), (ehcuda::row_bytes(t, 1024) + 15) / 16 * 16 + 16) << ehp::type_name(t);
    }
}

// Routes for a step of N tokens, one line per matrix kind (inspect --kernels).
TEST(KernelRoute, StepLinesPerKind) {
    KernelPlan p = ehcuda::choose_plan(kH200, false);
    p.bulk_max_tokens = ehcuda::kBulkMaxTokens;
    std::vector<ehcuda::MatrixKind> mats;
    for (int layer = 0; layer < 2; ++layer) {
        mats.push_back({"attn_output", shape_of(real("Phi-3-mini", "attn_output")), true, ""});
        mats.push_back({"ffn_gate_up", shape_of(real("Phi-3-mini", "ffn_gate_up")), false, "gate_up_pair_kernel"});
    }
    const auto one = ehcuda::route_lines(p, kH200, mats, 1, false);
    ASSERT_EQ(one.size(), 2u);
    EXPECT_EQ(one[0],
              "attn_output x2: Q4_K 3072x3072: gemv_bulk_kernel: 1 rows/tile, 8 warps/block, 384 blocks, int16 input, "
              "input chunks from the producer");
    EXPECT_EQ(one[1], "ffn_gate_up x2: Q4_K 8192x3072 + Q4_K 8192x3072: gate_up_pair_kernel");
    const auto eight = ehcuda::route_lines(p, kH200, mats, 8, false);
    EXPECT_EQ(eight[0],
              "attn_output x2: Q4_K 3072x3072: 8 tokens: gemv_bulk_ring_kernel: 2 rows/tile, 8 warps/block, 192 blocks "
              "at most (resident), int16 input, inputs quantized once, weights decoded once");
    KernelPlan off = p;
    off.bulk_max_tokens = 1;
    EXPECT_EQ(ehcuda::route_lines(off, kH200, mats, 8, false)[0],
              "attn_output x2: 8 single-token calls (side streams), each Q4_K 3072x3072: gemv_bulk_kernel: 1 rows/tile, "
              "8 warps/block, 384 blocks, int16 input");
    const auto many = ehcuda::route_lines(p, kH200, mats, 64, false);
    EXPECT_EQ(many[1],
              "ffn_gate_up x2: Q4_K 8192x3072 + Q4_K 8192x3072: cuBLAS GEMM on FP16 weights (the model's mirror, else "
              "dequantized slabs), 64 tokens");
}

}  // namespace

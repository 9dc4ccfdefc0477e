// gpt-cuda's matrix list and the routes of its experts (expert_route.hpp,
// model_matrices.hpp's gpt_matrices), host code, no GPU: real models'
// shapes (gpt-oss-20b, Qwen3-30B-A3B, GPT-2 124M) from views that hold the
// tensors' types and dims only, and the grouped forms' thresholds from the
// plan as moe_grouped.cu and moe_grouped_mma.cu apply them.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <engine_host/plugin_abi.hpp>
#include <ehcuda/expert_route.hpp>
#include <ehcuda/model_matrices.hpp>

#include "../cpu_reference/synthetic_model.hpp"

namespace {

using ehcuda::ExpertLayer;
using ehcuda::GroupedForm;
using ehcuda::KernelPlan;
using ehcuda::StepMatrix;

const ehcuda::DeviceTraits kH200{9, 0, 132};

// gpt-cuda's plan (exact routing: int16x2 input).
KernelPlan gpt_plan() { return ehcuda::choose_plan(kH200, true); }

ExpertLayer gpt_oss_20b() {
    return {EH_TYPE_MXFP4, EH_TYPE_MXFP4, EH_TYPE_MXFP4, 32, 4, 2880, 2880, EH_TYPE_F32};
}
ExpertLayer qwen3_30b_a3b() { return {EH_TYPE_Q4_K, EH_TYPE_Q4_K, EH_TYPE_Q6_K, 128, 8, 2048, 768, EH_TYPE_F32}; }

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The text of the one line of `lines` for `kind` (there must be one).
std::string line_of(const std::vector<std::string>& lines, const std::string& kind) {
    std::string found;
    for (const std::string& l : lines)
        if (l.rfind(kind + " x", 0) == 0) {
            EXPECT_TRUE(found.empty()) << "two lines for " << kind;
            found = l;
        }
    EXPECT_FALSE(found.empty()) << "no line for " << kind;
    return found;
}

TEST(KernelRoute, ExpertFormsOfRealExperts) {
    const KernelPlan p = gpt_plan();
    for (const ExpertLayer& e : {gpt_oss_20b(), qwen3_30b_a3b()}) {
        const ehcuda::ExpertForms f = ehcuda::expert_forms(p, e);
        EXPECT_TRUE(f.decode && f.grouped && f.tensor_cores && f.router_kernel);
    }
    // Q5_K: the integer path, no tensor-core form; F16: no integer path,
    // so neither the one-token nor the grouped kernels.
    ExpertLayer q5 = qwen3_30b_a3b();
    q5.gate_type = q5.up_type = q5.down_type = EH_TYPE_Q5_K;
    EXPECT_TRUE(ehcuda::expert_forms(p, q5).grouped);
    EXPECT_FALSE(ehcuda::expert_forms(p, q5).tensor_cores);
    ExpertLayer f16 = q5;
    f16.gate_type = f16.up_type = f16.down_type = EH_TYPE_F16;
    EXPECT_FALSE(ehcuda::expert_forms(p, f16).decode);
    EXPECT_FALSE(ehcuda::expert_forms(p, f16).grouped);
    // A router the plan keeps on the GEMV, or one not in F32.
    KernelPlan off = p;
    off.moe_router_kernel = false;
    EXPECT_FALSE(ehcuda::expert_forms(off, gpt_oss_20b()).router_kernel);
    ExpertLayer q8_router = gpt_oss_20b();
    q8_router.router_type = EH_TYPE_Q8_0;
    EXPECT_FALSE(ehcuda::expert_forms(p, q8_router).router_kernel);
}

// The grouped form by a step's tokens: gpt-oss-20b's 32 experts, top-4,
// average N * 4 / 32 pairs; tiles from 64 (N = 512); MXFP4 gate|up passes
// of 64 tokens past 32 an expert, 32 past 16, else moe_decode_pass_tokens
// (16); down 32 past 16, else 16.
TEST(KernelRoute, GptOss20bExpertPassesByStepTokens) {
    const KernelPlan p = gpt_plan();
    const ExpertLayer e = gpt_oss_20b();
    const ehcuda::ExpertForms f = ehcuda::expert_forms(p, e);
    EXPECT_EQ(ehcuda::grouped_form(p, e, f, 8), GroupedForm::TensorCores);
    EXPECT_EQ(ehcuda::grouped_form(p, e, f, 511), GroupedForm::TensorCores);
    EXPECT_EQ(ehcuda::grouped_form(p, e, f, 512), GroupedForm::Tiles);
    const auto pass = [&](int ntok, bool gate_up) {
        return ehcuda::tensor_core_pass_tokens(p, EH_TYPE_MXFP4, gate_up, ntok * e.k, e.n_expert);
    };
    EXPECT_EQ(pass(64, true), 16);   // 8 an expert
    EXPECT_EQ(pass(64, false), 16);
    KernelPlan eight = p;
    eight.moe_decode_pass_tokens = 8;
    EXPECT_EQ(ehcuda::tensor_core_pass_tokens(eight, EH_TYPE_MXFP4, true, 64 * e.k, e.n_expert), 8);
    EXPECT_EQ(ehcuda::tensor_core_pass_tokens(p, EH_TYPE_Q4_K, true, 64 * e.k, e.n_expert), 8);  // (MXFP4's only)
    EXPECT_EQ(pass(136, true), 32);  // 17
    EXPECT_EQ(pass(136, false), 32);
    EXPECT_EQ(pass(264, true), 64);  // 33
    EXPECT_EQ(pass(264, false), 32);
    KernelPlan never = p;
    never.moe_tile_pass_tokens = 65536;
    EXPECT_EQ(ehcuda::grouped_form(never, e, f, 2048), GroupedForm::TensorCores);

    const std::string one = ehcuda::describe_expert_step(p, e, f, true, 1);
    EXPECT_EQ(one,
              "MXFP4 2880x2880 + MXFP4 2880x2880 an expert, 32 experts, top-4: moe_decode: gate_up_pair_kernel over the "
              "routed experts (register form, 8 warps of 4 rows of gate and of up, int16x2 input, the pre-norm inside), "
              "routing fused into it");
    EXPECT_EQ(ehcuda::describe_expert_step(p, e, f, false, 1),
              "MXFP4 2880x2880 an expert, 32 experts, top-4: moe_decode: down_decode_kernel (4 rows a block, its 4 "
              "warps sharing the slots), input chunks from the gate|up kernel");
    const std::string sixty_four = ehcuda::describe_expert_step(p, e, f, true, 64);
    EXPECT_TRUE(has(sixty_four, "moe_grouped after route_kernel (top-k): 64 x top-4 = 256 pairs, 8 an expert if spread "
                                "evenly (the form follows that average): tensor-core passes of 16 tokens an expert"))
        << sixty_four;
    EXPECT_TRUE(has(ehcuda::describe_expert_step(p, e, f, false, 512), "2048 pairs, 64 an expert if spread evenly "
                                                                       "(the form follows that average): tile form"));
    // Past batch_moe_grouped_max (2048) tokens: calls of that many, the last the rest.
    const std::string long_step = ehcuda::describe_expert_step(p, e, f, true, 4200);
    EXPECT_TRUE(has(long_step, "calls of 2048 tokens: 2048 x top-4 = 8192 pairs")) << long_step;
    EXPECT_TRUE(has(long_step, "the last call 104 x top-4 = 416 pairs, 13 an expert if spread evenly (the form follows "
                               "that average): tensor-core passes of 16 tokens"))
        << long_step;
}

// The tensor-core passes' widths by experts' average tokens, which
// moe_grouped_mma.cu's launch_rows takes from tensor_core_pass_tokens:
// the table, and that every width it can give, over the plan keys' range,
// is one of the widths launch_rows has kernels for (tensor_core_pass_kernel;
// any other it refuses at the launch).
TEST(KernelRoute, TensorCorePassTokensHaveKernels) {
    const KernelPlan p = gpt_plan();
    const auto pass = [](const KernelPlan& q, uint32_t type, bool gate_up, int per_expert) {
        return ehcuda::tensor_core_pass_tokens(q, type, gate_up, per_expert * 32 + 31, 32);
    };
    for (const int per : {0, 1, 8, 16}) {
        EXPECT_EQ(pass(p, EH_TYPE_MXFP4, true, per), 16) << per;
        EXPECT_EQ(pass(p, EH_TYPE_MXFP4, false, per), 16) << per;
        EXPECT_EQ(pass(p, EH_TYPE_Q4_K, true, per), 8) << per;
        EXPECT_EQ(pass(p, EH_TYPE_Q6_K, false, per), 8) << per;
    }
    for (const int per : {17, 32}) {
        EXPECT_EQ(pass(p, EH_TYPE_MXFP4, true, per), 32) << per;
        EXPECT_EQ(pass(p, EH_TYPE_MXFP4, false, per), 32) << per;
    }
    for (const int per : {33, 64, 5000}) {
        EXPECT_EQ(pass(p, EH_TYPE_MXFP4, true, per), 64) << per;
        EXPECT_EQ(pass(p, EH_TYPE_MXFP4, false, per), 32) << per;
    }
    for (const int per : {17, 33, 5000}) {
        EXPECT_EQ(pass(p, EH_TYPE_Q4_K, true, per), 48) << per;
        EXPECT_EQ(pass(p, EH_TYPE_Q6_K, false, per), 48) << per;
    }
    EXPECT_FALSE(ehcuda::tensor_core_pass_kernel(EH_TYPE_MXFP4, false, 64));
    EXPECT_FALSE(ehcuda::tensor_core_pass_kernel(EH_TYPE_Q4_K, true, 16));
    EXPECT_FALSE(ehcuda::tensor_core_pass_kernel(EH_TYPE_Q4_K, true, 64));
    EXPECT_FALSE(ehcuda::tensor_core_pass_kernel(EH_TYPE_Q5_K, true, 8));
    for (const int wide : {0, 1, 16, 65536})
        for (const int long_ : {0, 16, 32, 65536})
            for (const int decode : {8, 16}) {
                KernelPlan q = p;
                q.moe_wide_pass_tokens = wide;
                q.moe_long_pass_tokens = long_;
                q.moe_decode_pass_tokens = decode;
                for (const uint32_t type : {EH_TYPE_MXFP4, EH_TYPE_Q4_K, EH_TYPE_Q6_K})
                    for (const bool gate_up : {true, false})
                        for (const int n_expert : {1, 32, 128})
                            for (int pairs = 0; pairs <= 100 * n_expert; pairs += 1 + n_expert / 4) {
                                const int t = ehcuda::tensor_core_pass_tokens(q, type, gate_up, pairs, n_expert);
                                ASSERT_TRUE(ehcuda::tensor_core_pass_kernel(type, gate_up, t))
                                    << ehp::type_name(type) << (gate_up ? " gate|up" : " down") << ", " << pairs
                                    << " pairs over " << n_expert << ": " << t << " tokens a pass";
                            }
            }
}

// Qwen3-30B-A3B: 128 experts, top-8, Q4_K gate|up and Q6_K down (passes
// of 48 past 16 an expert), down_decode_kernel's 8 warps at one token.
TEST(KernelRoute, Qwen3MoeExpertPassesByStepTokens) {
    const KernelPlan p = gpt_plan();
    const ExpertLayer e = qwen3_30b_a3b();
    const ehcuda::ExpertForms f = ehcuda::expert_forms(p, e);
    EXPECT_TRUE(has(ehcuda::describe_expert_step(p, e, f, false, 1), "down_decode_kernel (8 rows a block, its 8 warps"));
    EXPECT_TRUE(has(ehcuda::describe_expert_step(p, e, f, true, 64),
                    "512 pairs, 4 an expert if spread evenly (the form follows that average): tensor-core passes of 8"));
    EXPECT_TRUE(has(ehcuda::describe_expert_step(p, e, f, false, 512),
                    "4096 pairs, 32 an expert if spread evenly (the form follows that average): tensor-core passes of 48"));
    EXPECT_EQ(ehcuda::grouped_form(p, e, f, 1023), GroupedForm::TensorCores);
    EXPECT_EQ(ehcuda::grouped_form(p, e, f, 1024), GroupedForm::Tiles);
    // Other experts: Q5_K the integer form; F16 the float kernels.
    ExpertLayer q5 = e;
    q5.gate_type = q5.up_type = q5.down_type = EH_TYPE_Q5_K;
    EXPECT_TRUE(has(ehcuda::describe_expert_step(p, q5, ehcuda::expert_forms(p, q5), true, 8),
                    "integer form (grouped_rows_kernel"));
    ExpertLayer f16 = e;
    f16.gate_type = f16.up_type = f16.down_type = EH_TYPE_F16;
    const ehcuda::ExpertForms ff = ehcuda::expert_forms(p, f16);
    EXPECT_TRUE(has(ehcuda::describe_expert_step(p, f16, ff, true, 1), ": moe_gate_up (float kernels"));
    EXPECT_TRUE(has(ehcuda::describe_expert_step(p, f16, ff, false, 64), "moe_prefill (cuBLAS"));
}

// A view of a real model's tensors (types and dims, no data).
struct View {
    cpuref_test::OwnedView v;
    explicit View(const std::string& arch) : v(arch) {}
    void t(const std::string& name, uint32_t type, std::vector<uint64_t> dims) { v.raw(name, type, std::move(dims), nullptr, 0); }
};

std::string blk(int i, const char* what) { return "blk." + std::to_string(i) + "." + what; }

void gpt_oss_20b_view(View& m) {
    const std::string a = "gpt-oss.";
    for (auto [k, n] : {std::pair{"block_count", 24}, {"embedding_length", 2880}, {"attention.head_count", 64},
                        {"attention.head_count_kv", 8}, {"attention.key_length", 64}, {"expert_count", 32},
                        {"expert_used_count", 4}})
        m.v.u32(a + k, uint64_t(n));
    m.t("token_embd.weight", EH_TYPE_Q8_0, {2880, 201088});
    m.t("output.weight", EH_TYPE_Q8_0, {2880, 201088});
    for (int i = 0; i < 24; ++i) {
        m.t(blk(i, "attn_q.weight"), EH_TYPE_Q8_0, {2880, 4096});
        m.t(blk(i, "attn_k.weight"), EH_TYPE_Q8_0, {2880, 512});
        m.t(blk(i, "attn_v.weight"), EH_TYPE_Q8_0, {2880, 512});
        m.t(blk(i, "attn_output.weight"), EH_TYPE_Q8_0, {4096, 2880});
        m.t(blk(i, "ffn_gate_inp.weight"), EH_TYPE_F32, {2880, 32});
        m.t(blk(i, "ffn_gate_exps.weight"), EH_TYPE_MXFP4, {2880, 2880, 32});
        m.t(blk(i, "ffn_up_exps.weight"), EH_TYPE_MXFP4, {2880, 2880, 32});
        m.t(blk(i, "ffn_down_exps.weight"), EH_TYPE_MXFP4, {2880, 2880, 32});
    }
}

TEST(KernelRoute, GptOss20bMatrixList) {
    View m("gpt-oss");
    gpt_oss_20b_view(m);
    const ehp::ModelView view(m.v.view());
    const KernelPlan p = gpt_plan();
    const std::vector<StepMatrix> mats = ehcuda::gpt_matrices(view, p, {});
    ASSERT_EQ(mats.size(), 24u * 5 + 1);
    const auto one = ehcuda::step_route_lines(p, kH200, mats, 1, false);
    ASSERT_EQ(one.size(), 6u);
    EXPECT_TRUE(has(line_of(one, "attn_qkv"), "attn_qkv x24: Q8_0 4096x2880 + Q8_0 512x2880 + Q8_0 512x2880: "));
    // head dim 64: the fused decode attention leaves attn_output's input as chunks
    EXPECT_TRUE(has(line_of(one, "attn_output"), "Q8_0 2880x4096: gemv_bulk_kernel"));
    EXPECT_TRUE(has(line_of(one, "attn_output"), "input chunks from the producer"));
    EXPECT_EQ(line_of(one, "ffn_gate_inp (router)"),
              "ffn_gate_inp (router) x24: F32 32x2880: router_decode_kernel (a block per expert row, pre-norm inside): "
              "logits");
    EXPECT_TRUE(has(line_of(one, "ffn_gate_up_exps"), "ffn_gate_up_exps x24: MXFP4 2880x2880 + MXFP4 2880x2880 an "
                                                      "expert, 32 experts, top-4: moe_decode: gate_up_pair_kernel"));
    EXPECT_TRUE(has(line_of(one, "ffn_down_exps"), "ffn_down_exps x24: MXFP4 2880x2880 an expert, 32 experts, top-4: "
                                                   "moe_decode: down_decode_kernel"));
    EXPECT_TRUE(has(line_of(one, "output"), "output x1: Q8_0 201088x2880: gemv_bulk"));
    // 8 tokens: the dense matrices one single-token call each (the F32
    // router on the register GEMV), the experts grouped; 64: cuBLAS.
    const auto eight = ehcuda::step_route_lines(p, kH200, mats, 8, false);
    EXPECT_TRUE(has(line_of(eight, "ffn_gate_inp (router)"), "8 single-token calls (side streams), each F32 32x2880: "
                                                             "gemv_kernel"));
    EXPECT_TRUE(has(line_of(eight, "ffn_gate_up_exps"), "moe_grouped after route_kernel (top-k): 8 x top-4 = 32 pairs"));
    const auto many = ehcuda::step_route_lines(p, kH200, mats, 64, false);
    EXPECT_TRUE(has(line_of(many, "attn_qkv"), "cuBLAS GEMM on FP16 weights"));
    EXPECT_TRUE(has(line_of(many, "ffn_down_exps"), "moe_grouped: 64 x top-4 = 256 pairs"));
    // The plugin's verdicts replace the shapes' where it passes them.
    ehcuda::GptMatrixOptions o;
    o.forms = [](int, const ExpertLayer&) { return ehcuda::ExpertForms{}; };
    const auto none = ehcuda::step_route_lines(p, kH200, ehcuda::gpt_matrices(view, p, o), 1, false);
    EXPECT_TRUE(has(line_of(none, "ffn_gate_up_exps"), ": moe_gate_up (float kernels"));
    EXPECT_TRUE(has(line_of(none, "ffn_gate_inp (router)"), "F32 32x2880: gemv_kernel"));
}

TEST(KernelRoute, Qwen3MoeMatrixListFusedGateUp) {
    // Qwen3-30B-A3B's shapes, its gate and up stored as one tensor
    View m("qwen3moe");
    const std::string a = "qwen3moe.";
    for (auto [k, n] : {std::pair{"block_count", 2}, {"embedding_length", 2048}, {"attention.head_count", 32},
                        {"attention.head_count_kv", 4}, {"attention.key_length", 128}, {"expert_count", 128},
                        {"expert_used_count", 8}})
        m.v.u32(a + k, uint64_t(n));
    m.t("token_embd.weight", EH_TYPE_Q4_K, {2048, 151936});
    for (int i = 0; i < 2; ++i) {
        m.t(blk(i, "attn_q.weight"), EH_TYPE_Q4_K, {2048, 4096});
        m.t(blk(i, "attn_k.weight"), EH_TYPE_Q4_K, {2048, 512});
        m.t(blk(i, "attn_v.weight"), EH_TYPE_Q6_K, {2048, 512});
        m.t(blk(i, "attn_output.weight"), EH_TYPE_Q4_K, {4096, 2048});
        m.t(blk(i, "ffn_gate_inp.weight"), EH_TYPE_F32, {2048, 128});
        m.t(blk(i, "ffn_gate_up_exps.weight"), EH_TYPE_Q4_K, {2048, 2 * 768, 128});
        m.t(blk(i, "ffn_down_exps.weight"), EH_TYPE_Q6_K, {768, 2048, 128});
    }
    const ehp::ModelView view(m.v.view());
    const KernelPlan p = gpt_plan();
    const auto lines = ehcuda::step_route_lines(p, kH200, ehcuda::gpt_matrices(view, p, {}), 512, false);
    EXPECT_TRUE(has(line_of(lines, "ffn_gate_up_exps"), "ffn_gate_up_exps x2: Q4_K 768x2048 + Q4_K 768x2048 an expert, "
                                                        "128 experts, top-8: moe_grouped"));
    EXPECT_TRUE(has(line_of(lines, "ffn_down_exps"), "Q6_K 2048x768 an expert"));
    EXPECT_TRUE(has(line_of(lines, "ffn_down_exps"), "tensor-core passes of 48 tokens"));
    EXPECT_TRUE(has(line_of(lines, "output"), "output x1: Q4_K 151936x2048: cuBLAS"));  // tied
    // A stack that is not one: named.
    m.v.find(blk(1, "ffn_down_exps.weight"))->dims[2] = 64;
    try {
        ehcuda::gpt_matrices(ehp::ModelView(m.v.view()), p, {});
        FAIL() << "no error";
    } catch (const ehp::Error& err) {
        EXPECT_EQ(err.status(), EH_MODEL_LOAD_FAILED);
        EXPECT_TRUE(has(err.what(), "blk.1.ffn_down_exps.weight' is not a stack of 128 experts")) << err.what();
    }
}

TEST(KernelRoute, Gpt2MatrixList) {
    // GPT-2 124M (F16): its fused attn_qkv one matrix, the MLP's up and down
    View m("gpt2");
    for (auto [k, n] : {std::pair{"block_count", 12}, {"embedding_length", 768}, {"attention.head_count", 12}})
        m.v.u32(std::string("gpt2.") + k, uint64_t(n));
    m.t("token_embd.weight", EH_TYPE_F16, {768, 50257});
    m.t("output.weight", EH_TYPE_F16, {768, 50257});
    for (int i = 0; i < 12; ++i) {
        m.t(blk(i, "attn_qkv.weight"), EH_TYPE_F16, {768, 2304});
        m.t(blk(i, "attn_output.weight"), EH_TYPE_F16, {768, 768});
        m.t(blk(i, "ffn_up.weight"), EH_TYPE_F16, {768, 3072});
        m.t(blk(i, "ffn_down.weight"), EH_TYPE_F16, {3072, 768});
    }
    const ehp::ModelView view(m.v.view());
    const KernelPlan p = gpt_plan();
    const auto one = ehcuda::step_route_lines(p, kH200, ehcuda::gpt_matrices(view, p, {}), 1, false);
    ASSERT_EQ(one.size(), 5u);
    EXPECT_EQ(one[0], "attn_qkv x12: F16 2304x768: gemv_kernel: 1 rows/warp, float input");
    EXPECT_EQ(one[1], "attn_output x12: F16 768x768: gemv_kernel: 1 rows/warp, float input");
    EXPECT_EQ(one[2], "ffn_up x12: F16 3072x768: gemv_kernel: 1 rows/warp, float input");
    // (768 rows of 3072 inputs: too few row groups, split-K)
    EXPECT_EQ(one[3], "ffn_down x12: F16 768x3072: gemv_kernel: 1 rows/warp, split-K over 4 warps, float input");
    EXPECT_EQ(one[4], "output x1: F16 50257x768: gemv_kernel: 1 rows/warp, float input");
    // gpt-cuda keeps cuBLAS from 9 tokens, mirrors or not
    const auto nine = ehcuda::step_route_lines(p, kH200, ehcuda::gpt_matrices(view, p, {}), 9, false);
    EXPECT_TRUE(has(nine[2], "ffn_up x12: F16 3072x768: cuBLAS GEMM")) << nine[2];
}

}  // namespace

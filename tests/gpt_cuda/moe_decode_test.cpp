// The single-token MoE decode kernels (moe_decode: integer dot products
// with int16x2 inputs, pre-norm folded into the staging, activations handed
// to the down kernel as int16x2 chunks) against a double-precision host
// reference and against the float per-pair kernels, for every expert type
// with an integer path (MXFP4 and the quantized matmul types), k = 1..10
// (8 and more: the down kernel's 8-warp shapes, both row counts),
// fused and separate gate/up, biases, with and without the folded RMSNorm;
// bitwise reproducibility; what moe_decode_supported refuses.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <engine_host/plugin_abi.hpp>
#include <engine_host/quant_blocks.hpp>
#include <ehcuda/device_memory.hpp>
#include <ehcuda/moe.hpp>

#include "gpu_test_util.hpp"
#include "../cuda/test_plan.hpp"
#include "ops.hpp"  // cpu-reference building blocks

namespace {

using namespace gpttest;

struct DecodeCase {
    uint32_t gu_type, down_type;
    int E, F, X, k;
    bool fused, norm;
};

std::string case_name(const ::testing::TestParamInfo<DecodeCase>& i) {
    const DecodeCase& c = i.param;
    return ehp::type_name(c.gu_type) + "_" + ehp::type_name(c.down_type) + "_E" + std::to_string(c.E) + "_F" +
           std::to_string(c.F) + "_k" + std::to_string(c.k) + (c.fused ? "_fused" : "_split") +
           (c.norm ? "_norm" : "_plain");
}

class MoeDecodeTest : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(MoeDecodeTest, MatchesHostReferenceAndFloatKernels) {
    REQUIRE_GPU();
    const DecodeCase C = GetParam();
    const int E = C.E, F = C.F, X = C.X, k = C.k;
    std::mt19937 rng(C.gu_type * 7 + C.down_type + uint32_t(k) * 131 + uint32_t(E));
    // gate|up: one fused tensor [X][2F][E] (gate rows first) or two [X][F][E].
    const auto gu = random_quant_rows(C.gu_type, rng, size_t(X) * 2 * F, size_t(E));
    const auto dn = random_quant_rows(C.down_type, rng, size_t(X) * E, size_t(F));
    const auto guf = dequant_rows(C.gu_type, gu, size_t(X) * 2 * F, size_t(E));
    const auto dnf = dequant_rows(C.down_type, dn, size_t(X) * E, size_t(F));
    const auto gub = randn(rng, size_t(X) * 2 * F, 0.1f), dnb = randn(rng, size_t(X) * E, 0.1f);
    const auto h0 = randn(rng, size_t(E));
    const auto nw = randn(rng, size_t(E), 0.3f);
    std::vector<float> normw(nw.size());
    for (size_t i = 0; i < nw.size(); ++i) normw[i] = 1.0f + nw[i];
    // distinct experts, weights summing to 1 (as moe_route leaves them)
    std::vector<int32_t> ids(static_cast<size_t>(X));
    for (int i = 0; i < X; ++i) ids[size_t(i)] = i;
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.resize(size_t(k));
    std::vector<float> wts(static_cast<size_t>(k));
    float wsum = 0;
    for (auto& w : wts) wsum += (w = 0.2f + float(rng() % 100) / 100.0f);
    for (auto& w : wts) w /= wsum;
    const float eps = 1e-5f;

    // Host reference in double.
    std::vector<double> xin(static_cast<size_t>(E));
    double ss = 0;
    for (float v : h0) ss += double(v) * v;
    const double sc = 1.0 / std::sqrt(ss / E + eps);
    for (int c = 0; c < E; ++c) xin[size_t(c)] = C.norm ? h0[size_t(c)] * sc * normw[size_t(c)] : h0[size_t(c)];
    std::vector<double> delta(size_t(E), 0.0);
    for (int s = 0; s < k; ++s) {
        const int e = ids[size_t(s)];
        std::vector<float> act(static_cast<size_t>(F));
        for (int r = 0; r < F; ++r) {
            double g = gub[size_t(e) * 2 * F + r], u = gub[size_t(e) * 2 * F + F + r];
            for (int c = 0; c < E; ++c) {
                g += double(guf[(size_t(e) * 2 * F + r) * E + c]) * xin[size_t(c)];
                u += double(guf[(size_t(e) * 2 * F + F + r) * E + c]) * xin[size_t(c)];
            }
            act[size_t(r)] = cpuref::swiglu_oai(float(g), float(u), 1.702f, 7.0f);
        }
        for (int r = 0; r < E; ++r) {
            double y = dnb[size_t(e) * E + r];
            for (int c = 0; c < F; ++c) y += double(dnf[(size_t(e) * E + r) * F + c]) * act[size_t(c)];
            delta[size_t(r)] += wts[size_t(s)] * y;
        }
    }

    auto dgu = dev_rows(C.gu_type, gu, size_t(X) * 2 * F, E), ddn = dev_rows(C.down_type, dn, size_t(X) * E, F);
    auto dgub = dev(gub), ddnb = dev(dnb), dh = dev(h0), dnw = dev(normw);
    auto dids = dev(ids), dwts = dev(wts);
    const GateUp gate_up = gate_up_mats(C.gu_type, gu, dgu, C.fused, X, F, E, dgub.as<float>());
    const ehcuda::ExpertMat &g = gate_up.gate, &u = gate_up.up;
    const auto d = expert_mat(C.down_type, E, F, ddn.get(), E, ddnb.as<float>(), E);
    ASSERT_TRUE(ehcuda::moe_decode_supported(g, u, d, k));

    ehcuda::DeviceBuffer scratch(ehcuda::moe_decode_scratch_bytes(k, F));
    ehcuda::MoeDecodeArgs a;
    set_moe_call(a, k, dids.as<int32_t>(), dwts.as<float>(), g, u, d, scratch, dh.as<float>());
    a.x = dh.as<float>();
    a.norm_w = C.norm ? dnw.as<float>() : nullptr;
    a.norm_eps = eps;
    ehcuda::moe_decode(a, nullptr);
    const auto got = host<float>(dh, size_t(E));

    double mx = 1e-12, err = 0;
    for (int r = 0; r < E; ++r) {
        mx = std::max(mx, std::fabs(delta[size_t(r)]));
        err = std::max(err, std::fabs(double(got[size_t(r)]) - h0[size_t(r)] - delta[size_t(r)]));
    }
    // FP32 accumulation noise; int16 inputs alone would be ~1e-5.
    EXPECT_LT(err / mx, 2e-6) << "max |delta| " << mx;

    // The float per-pair kernels on the same input (normalised on the host).
    std::vector<float> xn(static_cast<size_t>(E));
    for (int c = 0; c < E; ++c) xn[size_t(c)] = float(xin[size_t(c)]);
    auto dxn = dev(xn), dh_f = dev(h0);
    ehcuda::DeviceBuffer act(size_t(k) * F * 4);
    ehcuda::moe_gate_up(dxn.as<float>(), E, 1, k, dids.as<int32_t>(), g, u, 1.702f, 7.0f, act.as<float>(), nullptr);
    ehcuda::moe_down(act.as<float>(), 1, k, dids.as<int32_t>(), dwts.as<float>(), d, dh_f.as<float>(), E, nullptr);
    const auto got_f = host<float>(dh_f, size_t(E));
    double diff = 0;
    for (int r = 0; r < E; ++r) diff = std::max(diff, std::fabs(double(got[size_t(r)]) - got_f[size_t(r)]));
    EXPECT_LT(diff / mx, 4e-6) << "integer decode kernels vs float kernels";

    // Same inputs, same bits.
    auto dh2 = dev(h0);
    a.x = dh2.as<float>();
    a.h = dh2.as<float>();
    ehcuda::moe_decode(a, nullptr);
    EXPECT_EQ(std::memcmp(host<float>(dh2, size_t(E)).data(), got.data(), got.size() * 4), 0);
    if (k >= 8) {
        // The down kernel's other shape for 8+ experts (4 rows a block): each
        // (expert, row) sum is formed the same way, so the same bits.
        const int rows = ehtest::test_plan().moe_down_rows;
        ehtest::test_plan().moe_down_rows = rows == 8 ? 4 : 8;
        auto dh3 = dev(h0);
        a.x = dh3.as<float>();
        a.h = dh3.as<float>();
        ehcuda::moe_decode(a, nullptr);
        ehtest::test_plan().moe_down_rows = rows;
        EXPECT_EQ(std::memcmp(host<float>(dh3, size_t(E)).data(), got.data(), got.size() * 4), 0) << "moe_down_rows";
    }

    // The routing inside the expert kernel: router logits that rank `ids`
    // first (slots 0 and 1 tied: the lower index wins), then the others,
    // ties among them too. moe_route + moe_decode and moe_decode routing
    // for itself leave the same ids, weights and bits in h.
    std::vector<float> logits(static_cast<size_t>(X));
    for (int e = 0; e < X; ++e) logits[size_t(e)] = -5.0f - 0.25f * float(e % 3);
    for (int s = 0; s < k; ++s) logits[size_t(ids[size_t(s)])] = 3.0f - 0.5f * float(std::max(s, 1));
    auto dlog = dev(logits);
    ehcuda::DeviceBuffer rid(size_t(k) * 4), rwt(size_t(k) * 4), fid(size_t(k) * 4), fwt(size_t(k) * 4);
    ehcuda::moe_route(dlog.as<float>(), 1, X, k, rid.as<int32_t>(), rwt.as<float>(), nullptr);
    auto dh_r = dev(h0), dh_fused = dev(h0);
    ehcuda::MoeDecodeArgs ar = a;
    ar.x = ar.h = dh_r.as<float>();
    ar.ids = rid.as<int32_t>();
    ar.weights = rwt.as<float>();
    ehcuda::moe_decode(ar, nullptr);
    ehcuda::MoeDecodeArgs af = a;
    af.x = af.h = dh_fused.as<float>();
    af.ids = nullptr;
    af.weights = nullptr;
    af.logits = dlog.as<float>();
    af.n_expert = X;
    af.route_ids = fid.as<int32_t>();
    af.route_weights = fwt.as<float>();
    ehcuda::moe_decode(af, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto r_ids = host<int32_t>(rid, size_t(k)), f_ids = host<int32_t>(fid, size_t(k));
    const auto r_wts = host<float>(rwt, size_t(k)), f_wts = host<float>(fwt, size_t(k));
    EXPECT_EQ(r_ids, f_ids);
    EXPECT_EQ(std::memcmp(r_wts.data(), f_wts.data(), size_t(k) * 4), 0);
    EXPECT_EQ(std::memcmp(host<float>(dh_r, size_t(E)).data(), host<float>(dh_fused, size_t(E)).data(), size_t(E) * 4), 0)
        << "routing in the expert kernel vs moe_route";
    if (k >= 2) {
        EXPECT_EQ(f_ids[0], std::min(ids[0], ids[1])) << "tie: the lower index first";
    }
}

INSTANTIATE_TEST_SUITE_P(
    Types, MoeDecodeTest,
    ::testing::Values(
        // gpt-oss-20b's own shape: 90 chunks per row, top-4 of 32
        DecodeCase{EH_TYPE_MXFP4, EH_TYPE_MXFP4, 2880, 2880, 32, 4, true, true},
        DecodeCase{EH_TYPE_MXFP4, EH_TYPE_MXFP4, 2880, 2880, 32, 4, false, false},
        DecodeCase{EH_TYPE_MXFP4, EH_TYPE_MXFP4, 96, 96, 4, 1, true, true},
        DecodeCase{EH_TYPE_MXFP4, EH_TYPE_MXFP4, 320, 96, 6, 3, false, true},
        DecodeCase{EH_TYPE_Q8_0, EH_TYPE_Q8_0, 512, 256, 8, 2, true, true},
        DecodeCase{EH_TYPE_Q4_0, EH_TYPE_Q4_1, 512, 256, 8, 4, false, true},
        DecodeCase{EH_TYPE_Q5_0, EH_TYPE_Q5_1, 512, 256, 8, 2, true, false},
        DecodeCase{EH_TYPE_Q4_K, EH_TYPE_Q6_K, 512, 256, 8, 4, false, true},
        DecodeCase{EH_TYPE_Q5_K, EH_TYPE_Q4_K, 512, 256, 8, 2, true, true},
        DecodeCase{EH_TYPE_Q6_K, EH_TYPE_MXFP4, 512, 256, 8, 3, true, true},
        // Qwen3-30B-A3B's expert shape (2048 x 768, top-8; 9 experts here)
        // and more slots than the down kernel's 8 warps
        DecodeCase{EH_TYPE_Q4_K, EH_TYPE_Q6_K, 2048, 768, 9, 8, true, true},
        DecodeCase{EH_TYPE_Q4_K, EH_TYPE_Q4_K, 512, 256, 12, 10, false, false}),
    case_name);

TEST(MoeDecode, SupportedOnlyForIntegerPathTypesAndWholeChunks) {
    ehcuda::ExpertMat g;
    g.type = EH_TYPE_MXFP4;
    g.rows = 64;
    g.cols = 64;
    g.row_bytes = ehcuda::moe_row_bytes(EH_TYPE_MXFP4, 64);
    ehcuda::ExpertMat u = g, d = g;
    EXPECT_TRUE(ehcuda::moe_decode_supported(g, u, d, 4));
    EXPECT_FALSE(ehcuda::moe_decode_supported(g, u, d, 0));
    EXPECT_FALSE(ehcuda::moe_decode_supported(g, u, d, 33));
    ehcuda::ExpertMat f16 = g;
    f16.type = EH_TYPE_F16;
    EXPECT_FALSE(ehcuda::moe_decode_supported(f16, f16, d, 4));  // no integer path
    EXPECT_FALSE(ehcuda::moe_decode_supported(g, u, f16, 4));
    ehcuda::ExpertMat q8 = g;
    q8.type = EH_TYPE_Q8_0;
    EXPECT_FALSE(ehcuda::moe_decode_supported(g, q8, d, 4));  // gate and up of different types
    ehcuda::ExpertMat g48 = g, u48 = g, d48 = g;
    g48.rows = u48.rows = d48.cols = 48;  // n_ff not whole 32-row chunks
    EXPECT_FALSE(ehcuda::moe_decode_supported(g48, u48, d48, 4));
    EXPECT_EQ(ehcuda::moe_decode_scratch_bytes(4, 2880), size_t(4) * 90 * 112);
}

}  // namespace

// The grouped cuBLAS MoE prefill (moe_prefill) against the per-pair kernels
// (moe_gate_up + moe_down): top-4 of 32 experts, random routing, 64 and 300
// tokens, fused MXFP4 gate|up and separate gate/up of other types, biases,
// slabs smaller than an expert; bitwise reproducibility; and the refusal
// below the token threshold.
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <engine_host/plugin_abi.hpp>
#include <ehcuda/device_memory.hpp>
#include <ehcuda/moe.hpp>
#include <ehcuda/prefill_workspace.hpp>

#include "gpu_test_util.hpp"

namespace {

using namespace gpttest;

uint16_t half_bits(float f) {
    const __half h = __float2half(f);
    uint16_t b;
    std::memcpy(&b, &h, 2);
    return b;
}

// Random rows of `type` (MXFP4: exponents near 2^0; F16: N(0, 1); Q8_0:
// scale 1/32, every int8 code).
std::vector<uint8_t> random_rows(uint32_t type, std::mt19937& rng, size_t rows, size_t cols) {
    const size_t nb = rows * cols / 32;
    std::vector<uint8_t> b;
    if (type == EH_TYPE_MXFP4) {
        b.resize(nb * 17);
        for (size_t i = 0; i < nb; ++i) {
            b[i * 17] = uint8_t(120 + rng() % 8);
            for (int j = 1; j < 17; ++j) b[i * 17 + j] = uint8_t(rng());
        }
    } else if (type == EH_TYPE_F16) {
        b.resize(rows * cols * 2);
        std::normal_distribution<float> nd;
        for (size_t i = 0; i < rows * cols; ++i) {
            const uint16_t h = half_bits(nd(rng));
            std::memcpy(&b[2 * i], &h, 2);
        }
    } else {  // Q8_0
        b.resize(nb * 34);
        const uint16_t d = half_bits(1.0f / 32);
        for (size_t i = 0; i < nb; ++i) {
            std::memcpy(&b[i * 34], &d, 2);
            for (int j = 2; j < 34; ++j) b[i * 34 + j] = uint8_t(rng());
        }
    }
    return b;
}

struct MoeCase {
    int ntok;
    bool fused;
};

class MoePrefillTest : public ::testing::TestWithParam<MoeCase> {};

TEST_P(MoePrefillTest, MatchesPerPairKernels) {
    REQUIRE_GPU();
    const auto [ntok, fused] = GetParam();
    const int E = 256, F = 192, X = 32, k = 4;
    std::mt19937 rng(uint32_t(ntok * 2 + fused));
    const uint32_t tg = EH_TYPE_MXFP4, tu = fused ? EH_TYPE_MXFP4 : EH_TYPE_F16, td = fused ? EH_TYPE_MXFP4 : EH_TYPE_Q8_0;
    // fused: one [X][2F][E] tensor (gate rows, then up rows, per expert)
    const auto gq = random_rows(tg, rng, size_t(X) * (fused ? 2 : 1) * F, E);
    const auto uq = fused ? std::vector<uint8_t>() : random_rows(tu, rng, size_t(X) * F, E);
    const auto dq = random_rows(td, rng, size_t(X) * E, F);
    const auto gub = randn(rng, size_t(X) * 2 * F), dnb = randn(rng, size_t(X) * E);
    const auto x = randn(rng, size_t(ntok) * E, fused ? 0.05f : 0.02f);
    const auto logits = randn(rng, size_t(ntok) * X);
    const auto h0 = randn(rng, size_t(ntok) * E);

    auto dg = dev_rows(tg, gq, size_t(X) * (fused ? 2 : 1) * F, E);
    auto du = fused ? ehcuda::DeviceBuffer() : dev_rows(tu, uq, size_t(X) * F, E);
    auto dd = dev_rows(td, dq, size_t(X) * E, F);
    auto dgub = dev(gub), ddnb = dev(dnb), dx = dev(x), dl = dev(logits);
    ehcuda::ExpertMat g;
    g.data = dg.get();
    g.type = tg;
    g.rows = F;
    g.cols = E;
    g.row_bytes = ehcuda::moe_row_bytes(tg, E);
    g.expert_stride = g.row_bytes * (fused ? 2 : 1) * F;
    g.bias = dgub.as<float>();
    g.bias_stride = 2 * F;
    ehcuda::ExpertMat u = g;
    u.bias = dgub.as<float>() + F;
    if (fused) {
        u.row0 = F;
    } else {
        u.data = du.get();
        u.type = tu;
        u.row_bytes = ehcuda::moe_row_bytes(tu, E);
        u.expert_stride = u.row_bytes * F;
    }
    ehcuda::ExpertMat d;
    d.data = dd.get();
    d.type = td;
    d.rows = E;
    d.cols = F;
    d.row_bytes = ehcuda::moe_row_bytes(td, F);
    d.expert_stride = d.row_bytes * E;
    d.bias = ddnb.as<float>();
    d.bias_stride = E;

    cudaStream_t s = nullptr;
    ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
    ehcuda::DeviceBuffer ids(size_t(ntok) * k * 4), wts(size_t(ntok) * k * 4), act(size_t(ntok) * k * F * 4);
    ehcuda::moe_route(dl.as<float>(), ntok, X, k, ids.as<int32_t>(), wts.as<float>(), s);

    auto dh_ref = dev(h0);
    ehcuda::moe_gate_up(dx.as<float>(), E, ntok, k, ids.as<int32_t>(), g, u, 1.702f, 7.0f, act.as<float>(), s);
    ehcuda::moe_down(act.as<float>(), ntok, k, ids.as<int32_t>(), wts.as<float>(), d, dh_ref.as<float>(), E, s);
    const auto ref = host<float>(dh_ref, h0.size());

    ehcuda::PrefillShape shape;
    shape.max_tokens = ntok;
    shape.max_cols = E;
    shape.slab_bytes = 1;  // the minimum (64 rows of F + E): several slabs per expert
    shape.moe_experts = X;
    shape.moe_k = k;
    shape.moe_embd = E;
    shape.moe_ff = F;
    ehcuda::MemoryLedger ledger;
    ehcuda::PrefillWorkspace ws(shape, s, &ledger);
    EXPECT_EQ(ledger.bytes(), ws.device_bytes());
    std::vector<std::vector<float>> runs;
    for (int rep = 0; rep < 2; ++rep) {
        auto dh = dev(h0);
        ASSERT_TRUE(ehcuda::moe_prefill(&ws, dx.as<float>(), E, ntok, k, X, ids.as<int32_t>(), wts.as<float>(), g, u, d,
                                        1.702f, 7.0f, dh.as<float>(), E, s));
        ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
        runs.push_back(host<float>(dh, h0.size()));
    }
    EXPECT_EQ(ws.uses(), 2u);
    // Compare what the layer adds to h (h0 itself would hide errors).
    double mx = 1e-9, err = 0;
    for (size_t i = 0; i < h0.size(); ++i) {
        const double want = double(ref[i]) - h0[i], got = double(runs[0][i]) - h0[i];
        mx = std::max(mx, std::fabs(want));
        err = std::max(err, std::fabs(got - want));
    }
    EXPECT_LT(err / mx, 1e-2) << "ntok " << ntok << (fused ? " fused" : " separate");
    EXPECT_EQ(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * 4), 0) << "not reproducible";
    cudaStreamDestroy(s);
}

INSTANTIATE_TEST_SUITE_P(Shapes, MoePrefillTest,
                         ::testing::Values(MoeCase{64, true}, MoeCase{300, true}, MoeCase{64, false},
                                           MoeCase{300, false}),
                         [](const auto& info) {
                             std::string name = std::to_string(info.param.ntok);
                             name += info.param.fused ? "_fused" : "_separate";
                             return "n" + name;
                         });

TEST(MoePrefill, DeclinesBelowThresholdAndWithoutWorkspace) {
    REQUIRE_GPU();
    ehcuda::PrefillShape shape;
    shape.max_tokens = 64;
    shape.max_cols = 256;
    shape.moe_experts = 4;
    shape.moe_k = 2;
    shape.moe_embd = 256;
    shape.moe_ff = 64;
    ehcuda::PrefillWorkspace ws(shape, nullptr, nullptr);
    ehcuda::ExpertMat m;  // never read: both calls return before any launch
    m.data = &ws;
    m.type = EH_TYPE_MXFP4;
    m.rows = 64;
    m.cols = 256;
    m.row_bytes = ehcuda::moe_row_bytes(EH_TYPE_MXFP4, 256);
    EXPECT_FALSE(ehcuda::moe_prefill(nullptr, nullptr, 256, 32, 2, 4, nullptr, nullptr, m, m, m, 1.0f, 7.0f, nullptr, 256,
                                     nullptr));
    EXPECT_FALSE(ehcuda::moe_prefill(&ws, nullptr, 256, 8, 2, 4, nullptr, nullptr, m, m, m, 1.0f, 7.0f, nullptr, 256,
                                     nullptr));
    EXPECT_FALSE(ehcuda::moe_prefill(&ws, nullptr, 256, 65, 2, 4, nullptr, nullptr, m, m, m, 1.0f, 7.0f, nullptr, 256,
                                     nullptr)) << "more pairs than the workspace holds";
    EXPECT_EQ(ws.uses(), 0u);
}

}  // namespace

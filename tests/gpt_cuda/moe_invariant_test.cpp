// The batch-invariant MoE pieces (moe_invariant.hpp): a token's router
// logits and normalised input from moe_router_rows are the same bits in a
// call of one token and in calls of 3 to 2048 (every launch shape the call
// size picks), and as moe_router_decode's; one token's experts through
// moe_decode_mma are the same bits as that token's in moe_grouped's
// tensor-core passes (8-token, 16-token and wide passes, one_form) over a
// call of many tokens, the routing inside it moe_route's, against a double
// host reference too; its counters are left zero and a second run repeats
// it.
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <engine_host/plugin_abi.hpp>
#include <ehcuda/device_memory.hpp>
#include <ehcuda/kernel_plan.hpp>
#include <ehcuda/moe.hpp>
#include <ehcuda/moe_invariant.hpp>

#include "gpu_test_util.hpp"
#include "ops.hpp"  // cpu-reference building blocks

namespace {

using namespace gpttest;

size_t count_differing(const std::vector<float>& a, const float* b, size_t n) {
    size_t d = 0;
    for (size_t i = 0; i < n; ++i) d += std::memcmp(&a[i], &b[i], 4) != 0;
    return d;
}

// The router of `ntok` residual rows (row stride ldx): logits, xn, xn16.
struct RouterOut {
    std::vector<float> logits, xn;
    std::vector<uint16_t> xn16;
};
RouterOut route_rows(const ehcuda::DeviceBuffer& x, int ldx, int ntok, const ehcuda::DeviceBuffer& norm,
                     const ehcuda::DeviceBuffer& w, const float* bias, int n_expert, int cols, size_t row0 = 0) {
    ehcuda::DeviceBuffer lg(size_t(ntok) * n_expert * 4), xn(size_t(ntok) * cols * 4), x16(size_t(ntok) * cols * 2);
    ehcuda::MoeRouterRowsArgs a;
    a.x = x.as<float>() + row0 * ldx;
    a.ldx = ldx;
    a.ntok = ntok;
    a.norm_w = norm.as<float>();
    a.norm_eps = 1e-6f;
    a.w = w.as<float>();
    a.bias = bias;
    a.n_expert = n_expert;
    a.cols = cols;
    a.logits = lg.as<float>();
    a.xn = xn.as<float>();
    a.xn16 = x16.get();
    ehcuda::moe_router_rows(a, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return {host<float>(lg, size_t(ntok) * n_expert), host<float>(xn, size_t(ntok) * cols),
            host<uint16_t>(x16, size_t(ntok) * cols)};
}

struct RouterCase {
    int n_expert, cols;
    bool bias;
};

class MoeRouterRowsTest : public ::testing::TestWithParam<RouterCase> {};

TEST_P(MoeRouterRowsTest, SameBitsWhateverTheCallsSize) {
    REQUIRE_GPU();
    const RouterCase C = GetParam();
    const int X = C.n_expert, E = C.cols, ldx = E + 4, T = 2048;
    std::mt19937 rng(uint32_t(X * 7 + E));
    const auto x = randn(rng, size_t(T) * ldx, 3.0f), norm = randn(rng, size_t(E)), w = randn(rng, size_t(X) * E, 0.05f),
               b = randn(rng, size_t(X), 0.1f);
    auto dx = dev(x), dnorm = dev(norm), dw = dev(w), db = dev(b);
    const float* bias = C.bias ? db.as<float>() : nullptr;
    // Token t alone: the reference bits.
    std::vector<RouterOut> alone;
    const std::vector<int> probe{0, 1, 2, 5, 63, 64, 299, 1000, T - 1};
    for (int t : probe) alone.push_back(route_rows(dx, ldx, 1, dnorm, dw, bias, X, E, size_t(t)));
    // FP16 of the FP32 row is the FP16 row (as the grouped form's gather makes it).
    for (size_t p = 0; p < probe.size(); ++p)
        for (int c = 0; c < E; ++c)
            ASSERT_EQ(alone[p].xn16[size_t(c)], __half_as_ushort(__float2half_rn(alone[p].xn[size_t(c)])))
                << "token " << probe[p] << " column " << c;
    for (int ntok : {3, 17, 64, 300, T}) {
        const RouterOut all = route_rows(dx, ldx, ntok, dnorm, dw, bias, X, E);
        for (size_t p = 0; p < probe.size(); ++p) {
            const int t = probe[p];
            if (t >= ntok) continue;
            EXPECT_EQ(count_differing(alone[p].logits, all.logits.data() + size_t(t) * X, size_t(X)), 0u)
                << "logits of token " << t << " in a call of " << ntok;
            EXPECT_EQ(count_differing(alone[p].xn, all.xn.data() + size_t(t) * E, size_t(E)), 0u)
                << "normalised row of token " << t << " in a call of " << ntok;
        }
    }
    // moe_router_decode (the default decode step's router) gives the same logits.
    for (size_t p = 0; p < probe.size(); ++p) {
        ehcuda::DeviceBuffer lg(size_t(X) * 4), ids(32 * 4), wts(32 * 4), counter(4);
        ASSERT_EQ(cudaMemset(counter.get(), 0, 4), cudaSuccess);
        ehcuda::MoeRouterArgs r;
        r.x = dx.as<float>() + size_t(probe[p]) * ldx;
        r.norm_w = dnorm.as<float>();
        r.norm_eps = 1e-6f;
        r.w = dw.as<float>();
        r.bias = bias;
        r.n_expert = X;
        r.cols = E;
        r.k = 4;
        r.logits = lg.as<float>();
        r.ids = ids.as<int32_t>();
        r.weights = wts.as<float>();
        r.counter = counter.as<int>();
        ehcuda::moe_router_decode(r, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_EQ(count_differing(alone[p].logits, host<float>(lg, size_t(X)).data(), size_t(X)), 0u)
            << "moe_router_decode's logits of token " << probe[p];
    }
    // And they are the router's logits (double host reference).
    for (size_t p = 0; p < probe.size(); ++p) {
        const float* xr = &x[size_t(probe[p]) * ldx];
        double ss = 0;
        for (int c = 0; c < E; ++c) ss += double(xr[c]) * xr[c];
        const double inv = 1.0 / std::sqrt(ss / E + 1e-6);
        for (int e = 0; e < X; ++e) {
            double d = 0, mag = 0;
            for (int c = 0; c < E; ++c) {
                d += double(w[size_t(e) * E + c]) * xr[c] * inv * norm[size_t(c)];
                mag += std::fabs(double(w[size_t(e) * E + c]) * xr[c] * inv * norm[size_t(c)]);
            }
            if (C.bias) d += b[size_t(e)];
            EXPECT_NEAR(alone[p].logits[size_t(e)], d, 1e-5 * mag + 1e-6) << "token " << probe[p] << " expert " << e;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MoeRouterRowsTest,
                         ::testing::Values(RouterCase{128, 2048, false},  // Qwen3-30B-A3B
                                           RouterCase{32, 2880, true},    // gpt-oss-20b
                                           RouterCase{12, 96, true}),     // a partial group of 8 experts
                         [](const ::testing::TestParamInfo<RouterCase>& i) {
                             std::string n = "X";
                             n += std::to_string(i.param.n_expert);
                             n += "_E";
                             n += std::to_string(i.param.cols);
                             if (i.param.bias) n += "_bias";
                             return n;
                         });

struct MmaCase {
    uint32_t gu_type, down_type;
    int E, F, X, k, ntok;
    bool fused;
};

class MoeDecodeMmaTest : public ::testing::TestWithParam<MmaCase> {};

TEST_P(MoeDecodeMmaTest, SameBitsAsTheGroupedPasses) {
    REQUIRE_GPU();
    const MmaCase C = GetParam();
    const int E = C.E, F = C.F, X = C.X, k = C.k, T = C.ntok;
    std::mt19937 rng(C.gu_type * 3 + C.down_type * 5 + uint32_t(T));
    const auto gu = random_quant_rows(C.gu_type, rng, size_t(X) * 2 * F, size_t(E));
    const auto dn = random_quant_rows(C.down_type, rng, size_t(X) * E, size_t(F));
    const auto gub = randn(rng, size_t(X) * 2 * F, 0.1f), dnb = randn(rng, size_t(X) * E, 0.1f);
    const auto resid = randn(rng, size_t(T) * E, 2.0f), norm = randn(rng, size_t(E)),
               router = randn(rng, size_t(X) * E, 0.1f), h0 = randn(rng, size_t(T) * E);
    auto dgu = dev_rows(C.gu_type, gu, size_t(X) * 2 * F, E), ddn = dev_rows(C.down_type, dn, size_t(X) * E, F);
    auto dgub = dev(gub), ddnb = dev(dnb), dres = dev(resid), dnorm = dev(norm), drouter = dev(router);
    // fused: gate rows then up rows of each expert; else up is the same rows
    // as gate, read as a second matrix (the case's shapes allow either)
    const auto g = expert_mat(C.gu_type, F, E, dgu.get(), 2 * F, dgub.as<float>(), 2 * F);
    const auto u = expert_mat(C.gu_type, F, E, dgu.get(), 2 * F, dgub.as<float>() + F, 2 * F, C.fused ? F : 0);
    const auto d = expert_mat(C.down_type, E, F, ddn.get(), E, ddnb.as<float>(), E);
    ASSERT_TRUE(ehcuda::moe_decode_mma_supported(g, u, d, k, X));
    ASSERT_TRUE(ehcuda::moe_grouped_on_tensor_cores(g, u, d));

    // The whole call: router rows, moe_route, moe_grouped (one_form).
    ehcuda::DeviceBuffer lg(size_t(T) * X * 4), xn(size_t(T) * E * 4), x16(size_t(T) * E * 2);
    ehcuda::MoeRouterRowsArgs ra;
    ra.x = dres.as<float>();
    ra.ldx = E;
    ra.ntok = T;
    ra.norm_w = dnorm.as<float>();
    ra.norm_eps = 1e-6f;
    ra.w = drouter.as<float>();
    ra.n_expert = X;
    ra.cols = E;
    ra.logits = lg.as<float>();
    ra.xn = xn.as<float>();
    ra.xn16 = x16.get();
    ehcuda::moe_router_rows(ra, nullptr);
    ehcuda::DeviceBuffer ids(size_t(T) * k * 4), wts(size_t(T) * k * 4);
    ehcuda::moe_route(lg.as<float>(), T, X, k, ids.as<int32_t>(), wts.as<float>(), nullptr);
    ehcuda::DeviceBuffer scratch(ehcuda::moe_grouped_scratch_bytes(T, k, X, E, F));
    ehcuda::MoeGroupedArgs a =
        grouped_args(xn.as<float>(), T, k, X, ids.as<int32_t>(), wts.as<float>(), g, u, d, scratch, nullptr);
    a.one_form = true;
    std::vector<std::pair<std::string, std::vector<float>>> grouped;
    for (const auto& [name, wide, pass_tokens] :
         {std::tuple{"8-token passes", 65536, 8}, std::tuple{"wide passes", 0, 8},
          std::tuple{"16-token passes", 65536, 16}}) {
        ehcuda::KernelPlan p = ehcuda::plan();
        p.moe_wide_pass_tokens = wide;
        p.moe_decode_pass_tokens = pass_tokens;
        p.moe_long_pass_tokens = 65536;  // (gpt-cuda's batch_invariant load sets it: model.cpp)
        const ehcuda::PlanScope scope(p);
        auto dh = dev(h0);
        a.h = dh.as<float>();
        ehcuda::moe_grouped(a, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        grouped.emplace_back(name, host<float>(dh, size_t(T) * E));
    }
    const auto all_ids = host<int32_t>(ids, size_t(T) * k);
    const auto all_wts = host<float>(wts, size_t(T) * k);

    // Each token alone: its own router call, then moe_decode_mma routing
    // inside. Twice, for reproducibility and the counters' reset.
    const int nc = ehcuda::moe_decode_mma_counters(E);
    ehcuda::DeviceBuffer counters(size_t(nc) * 4), one_scratch(ehcuda::moe_decode_mma_scratch_bytes(k, E, F));
    ASSERT_EQ(cudaMemset(counters.get(), 0, counters.size()), cudaSuccess);
    std::vector<float> alone(size_t(T) * E);
    std::vector<int32_t> alone_ids(size_t(T) * k);
    std::vector<float> alone_wts(size_t(T) * k);
    for (int rep = 0; rep < 2; ++rep) {
        auto dh = dev(h0);
        ehcuda::DeviceBuffer lg1(size_t(X) * 4), x161(size_t(E) * 2), id1(size_t(T) * k * 4), w1(size_t(T) * k * 4);
        for (int t = 0; t < T; ++t) {
            ehcuda::MoeRouterRowsArgs r1 = ra;
            r1.x = dres.as<float>() + size_t(t) * E;
            r1.ntok = 1;
            r1.logits = lg1.as<float>();
            r1.xn = nullptr;
            r1.xn16 = x161.get();
            ehcuda::moe_router_rows(r1, nullptr);
            ehcuda::MoeDecodeMmaArgs m;
            set_moe_call(m, k, id1.as<int32_t>() + size_t(t) * k, w1.as<float>() + size_t(t) * k, g, u, d,
                         one_scratch, dh.as<float>() + size_t(t) * E);
            m.x16 = x161.get();
            m.n_expert = X;
            m.logits = lg1.as<float>();
            m.counters = counters.as<int>();
            ehcuda::moe_decode_mma(m, nullptr);
        }
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const auto got = host<float>(dh, size_t(T) * E);
        if (rep == 0) {
            alone = got;
            alone_ids = host<int32_t>(id1, size_t(T) * k);
            alone_wts = host<float>(w1, size_t(T) * k);
        } else {
            EXPECT_EQ(count_differing(alone, got.data(), got.size()), 0u) << "moe_decode_mma is not reproducible";
        }
        const auto left = host<int32_t>(counters, size_t(nc));
        EXPECT_EQ(std::count(left.begin(), left.end(), 0), nc) << "the counters are not left zero";
    }
    EXPECT_EQ(alone_ids, all_ids) << "the routing inside moe_decode_mma is not moe_route's";
    EXPECT_EQ(count_differing(alone_wts, all_wts.data(), all_wts.size()), 0u) << "routing weights differ";
    for (const auto& [name, out] : grouped) {
        for (int t = 0; t < T; ++t)
            EXPECT_EQ(count_differing(std::vector<float>(out.begin() + size_t(t) * E, out.begin() + size_t(t + 1) * E),
                                      alone.data() + size_t(t) * E, size_t(E)),
                      0u)
                << name << ": token " << t << " of " << T << " alone against in the call";
    }

    // Host reference (double) for the first and last tokens, from the
    // normalised rows and the routing the device used.
    const auto xnh = host<float>(xn, size_t(T) * E);
    const auto guf = dequant_rows(C.gu_type, gu, size_t(X) * 2 * F, size_t(E));
    const auto dnf = dequant_rows(C.down_type, dn, size_t(X) * E, size_t(F));
    for (int t : {0, T - 1}) {
        std::vector<double> delta(size_t(E), 0.0);
        for (int s = 0; s < k; ++s) {
            const int e = all_ids[size_t(t * k + s)];
            const int up0 = C.fused ? F : 0;
            std::vector<float> act(static_cast<size_t>(F));
            for (int r = 0; r < F; ++r) {
                double gv = gub[size_t(e) * 2 * F + r], uv = gub[size_t(e) * 2 * F + F + r];
                for (int c = 0; c < E; ++c) {
                    gv += double(guf[(size_t(e) * 2 * F + r) * E + c]) * xnh[size_t(t) * E + c];
                    uv += double(guf[(size_t(e) * 2 * F + up0 + r) * E + c]) * xnh[size_t(t) * E + c];
                }
                act[size_t(r)] = cpuref::swiglu_oai(float(gv), float(uv), 1.702f, 7.0f);
            }
            for (int r = 0; r < E; ++r) {
                double y = dnb[size_t(e) * E + r];
                for (int c = 0; c < F; ++c) y += double(dnf[(size_t(e) * E + r) * F + c]) * act[size_t(c)];
                delta[size_t(r)] += all_wts[size_t(t * k + s)] * y;
            }
        }
        double mx = 1e-12, err = 0;
        for (int r = 0; r < E; ++r) {
            const size_t i = size_t(t) * E + r;
            mx = std::max(mx, std::fabs(delta[size_t(r)]));
            err = std::max(err, std::fabs(double(alone[i]) - h0[i] - delta[size_t(r)]));
        }
        EXPECT_LT(err / mx, 4e-3) << "token " << t << ": max |delta| " << mx;
    }
}

INSTANTIATE_TEST_SUITE_P(
    Types, MoeDecodeMmaTest,
    ::testing::Values(
        // gpt-oss-20b's experts, a 64-sequence step
        MmaCase{EH_TYPE_MXFP4, EH_TYPE_MXFP4, 2880, 2880, 32, 4, 64, true},
        // Qwen3-30B-A3B's expert rows, fewer experts: a step of 40 (wide passes)
        MmaCase{EH_TYPE_Q4_K, EH_TYPE_Q6_K, 2048, 768, 24, 8, 40, false},
        MmaCase{EH_TYPE_Q6_K, EH_TYPE_Q4_K, 512, 256, 8, 2, 9, true},
        MmaCase{EH_TYPE_Q4_K, EH_TYPE_MXFP4, 512, 256, 6, 3, 5, true}),
    [](const ::testing::TestParamInfo<MmaCase>& i) {
        const MmaCase& c = i.param;
        return ehp::type_name(c.gu_type) + "_" + ehp::type_name(c.down_type) + "_E" + std::to_string(c.E) + "_T" +
               std::to_string(c.ntok);
    });

}  // namespace

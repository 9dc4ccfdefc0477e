// moe_route_decode (router GEMV + top-k in one launch, the last block
// routes) against the two launches it replaces: the single-token GEMV with
// the pre-norm folded in, then moe_route.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include <cuda_fp16.h>

#include <engine_host/plugin_abi.hpp>
#include <ehcuda/kernels.hpp>
#include <ehcuda/moe.hpp>

#include "gpu_test_util.hpp"

namespace gpttest {
namespace {

struct RouteCase {
    uint32_t type;  // F32 or F16 router rows
    int n_expert, k;
    bool bias;
};

class RouteDecodeTest : public ::testing::TestWithParam<RouteCase> {};

TEST_P(RouteDecodeTest, MatchesGemvThenRouteAndReplays) {
    REQUIRE_GPU();
    const RouteCase c = GetParam();
    const int cols = 2304;  // the GEMV splits K over 4 warps from 2048 inputs, as moe_route_decode does
    std::mt19937 rng(uint32_t(c.n_expert * 31 + c.k));
    const std::vector<float> wf = randn(rng, size_t(c.n_expert) * cols, 0.05f);
    std::vector<uint8_t> wbytes;
    size_t rb = 0;
    if (c.type == EH_TYPE_F32) {
        rb = size_t(cols) * 4;
        wbytes.resize(wf.size() * 4);
        std::memcpy(wbytes.data(), wf.data(), wbytes.size());
    } else {
        rb = size_t(cols) * 2;
        std::vector<__half> hv(wf.size());
        for (size_t i = 0; i < wf.size(); ++i) hv[i] = __float2half(wf[i]);
        wbytes.resize(hv.size() * 2);
        std::memcpy(wbytes.data(), hv.data(), wbytes.size());
    }
    const std::vector<float> x = randn(rng, size_t(cols), 3.0f), nw = randn(rng, size_t(cols), 0.1f),
                             bias = randn(rng, size_t(c.n_expert), 0.5f);
    std::vector<float> nw1(nw);
    for (auto& v : nw1) v += 1.0f;
    auto dw = dev(wbytes), dx = dev(x), dn = dev(nw1), db = dev(bias);
    ehcuda::DeviceBuffer logits_a(size_t(c.n_expert) * 4), logits_b(size_t(c.n_expert) * 4);
    ehcuda::DeviceBuffer ids_a(size_t(c.k) * 4), ids_b(size_t(c.k) * 4), w_a(size_t(c.k) * 4), w_b(size_t(c.k) * 4);
    ehcuda::DeviceBuffer counter(4);
    ASSERT_EQ(cudaMemset(counter.get(), 0, 4), cudaSuccess);
    const ehcuda::WeightRef router{dw.get(), c.type, c.n_expert, cols, rb};

    ehcuda::MatmulArgs m;
    m.seg[0].w = router;
    m.seg[0].bias = c.bias ? db.as<float>() : nullptr;
    m.cols = cols;
    m.x = dx.as<float>();
    m.ldx = cols;
    m.xmode = ehcuda::XMode::RmsNorm;
    m.norm_w = dn.as<float>();
    m.norm_eps = 1e-5f;
    m.y = logits_a.as<float>();
    m.ldy = c.n_expert;
    ehcuda::matmul(m, nullptr);
    ehcuda::moe_route(logits_a.as<float>(), 1, c.n_expert, c.k, ids_a.as<int32_t>(), w_a.as<float>(), nullptr);

    ASSERT_TRUE(ehcuda::moe_route_decode_supported(router, c.k));
    ehcuda::RouteDecodeArgs r;
    r.router = router;
    r.bias = c.bias ? db.as<float>() : nullptr;
    r.x = dx.as<float>();
    r.norm_w = dn.as<float>();
    r.norm_eps = 1e-5f;
    r.k = c.k;
    r.logits = logits_b.as<float>();
    r.ids = ids_b.as<int32_t>();
    r.weights = w_b.as<float>();
    r.counter = counter.as<uint32_t>();
    const auto la = host<float>(logits_a, size_t(c.n_expert));
    const auto ia = host<int32_t>(ids_a, size_t(c.k));
    const auto wa = host<float>(w_a, size_t(c.k));
    for (int rep = 0; rep < 3; ++rep) {  // the counter must come back to zero for the next launch
        ASSERT_EQ(cudaMemset(ids_b.get(), 0xFF, ids_b.size()), cudaSuccess);
        ehcuda::moe_route_decode(r, nullptr);
        ASSERT_EQ(cudaGetLastError(), cudaSuccess);
        const auto lb = host<float>(logits_b, size_t(c.n_expert));
        const auto ib = host<int32_t>(ids_b, size_t(c.k));
        const auto wb = host<float>(w_b, size_t(c.k));
        for (int e = 0; e < c.n_expert; ++e) ASSERT_EQ(lb[size_t(e)], la[size_t(e)]) << "logit " << e;
        for (int s = 0; s < c.k; ++s) {
            EXPECT_EQ(ib[size_t(s)], ia[size_t(s)]) << "slot " << s << " rep " << rep;
            EXPECT_EQ(wb[size_t(s)], wa[size_t(s)]) << "slot " << s << " rep " << rep;
        }
        EXPECT_EQ(host<uint32_t>(counter, 1)[0], 0u) << "counter not returned to zero";
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, RouteDecodeTest,
                         ::testing::Values(RouteCase{EH_TYPE_F32, 32, 4, true}, RouteCase{EH_TYPE_F32, 200, 8, false},
                                           RouteCase{EH_TYPE_F16, 128, 4, true}, RouteCase{EH_TYPE_F32, 5, 5, false}),
                         [](const auto& info) {
                             const RouteCase& c = info.param;
                             return std::string(c.type == EH_TYPE_F32 ? "f32" : "f16") + "_e" +
                                    std::to_string(c.n_expert) + "_k" + std::to_string(c.k) + (c.bias ? "_bias" : "");
                         });

TEST(RouteDecode, RefusesUnsupportedShapes) {
    const ehcuda::WeightRef ok{reinterpret_cast<const void*>(0x100), EH_TYPE_F32, 32, 64, 256};
    EXPECT_TRUE(ehcuda::moe_route_decode_supported(ok, 4));
    EXPECT_FALSE(ehcuda::moe_route_decode_supported(ok, 0));
    EXPECT_FALSE(ehcuda::moe_route_decode_supported(ok, 33));
    ehcuda::WeightRef big = ok;
    big.rows = 1025;
    EXPECT_FALSE(ehcuda::moe_route_decode_supported(big, 4)) << "more experts than routing handles";
    ehcuda::WeightRef odd = ok;
    odd.cols = 48;
    odd.row_bytes = 192;
    EXPECT_FALSE(ehcuda::moe_route_decode_supported(odd, 4)) << "cols not a multiple of 32";
    ehcuda::WeightRef few = ok;
    few.rows = 3;
    EXPECT_FALSE(ehcuda::moe_route_decode_supported(few, 4)) << "k above the expert count";
    ehcuda::RouteDecodeArgs r;
    r.router = ok;
    r.k = 4;
    EXPECT_THROW(ehcuda::moe_route_decode(r, nullptr), ehp::Error) << "missing buffers";
}

}  // namespace
}  // namespace gpttest

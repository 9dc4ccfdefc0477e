// The GPT kernels against float references on the host: MXFP4 dequant ->
// GEMV/GEMM (1 % relative), MoE routing (same experts, same weights as the
// CPU reference's route_top_k), the full expert path with the clamped
// SwiGLU, sink attention with a sliding window, LayerNorm and GELU.
#include <cuda_fp16.h>
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
#include <ehcuda/gpt_ops.hpp>
#include <ehcuda/kernels.hpp>
#include <ehcuda/moe.hpp>

#include "gpu_test_util.hpp"
#include "../cuda/test_plan.hpp"
#include "ops.hpp"  // cpu-reference building blocks

namespace {

using namespace gpttest;

double rel_err(const std::vector<float>& got, const std::vector<float>& want) {
    double mx = 1e-12, e = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        mx = std::max(mx, double(std::fabs(want[i])));
        e = std::max(e, double(std::fabs(got[i] - want[i])));
    }
    return e / mx;
}

// Random MXFP4 rows: exponents around 2^0, every nibble code.
std::vector<uint8_t> random_mxfp4(std::mt19937& rng, size_t rows, size_t cols) {
    std::vector<uint8_t> b(rows * cols / 32 * 17);
    for (size_t blk = 0; blk < b.size() / 17; ++blk) {
        b[blk * 17] = uint8_t(120 + rng() % 8);
        for (int j = 1; j < 17; ++j) b[blk * 17 + j] = uint8_t(rng());
    }
    return b;
}

std::vector<float> dequant(uint32_t type, const std::vector<uint8_t>& data, size_t rows, size_t cols) {
    std::vector<float> w(rows * cols);
    const size_t rb = ehp::quant::row_bytes(type, cols);
    for (size_t r = 0; r < rows; ++r) ehp::quant::dequantize_row(type, data.data() + r * rb, &w[r * cols], cols);
    return w;
}

TEST(GptKernels, Mxfp4DecodeMatchesHostBlocks) {
    REQUIRE_GPU();
    // Exponent edges (0 is the subnormal 2^-127) and all 256 byte values of
    // the code bytes; the last block is left out of the sums.
    std::mt19937 rng(1);
    const int cols = 32 * 16;
    std::vector<uint8_t> w(cols / 32 * 17);
    const uint8_t exps[16] = {0, 1, 100, 126, 127, 128, 130, 140, 110, 127, 127, 127, 127, 127, 127, 200};
    for (int b = 0; b < cols / 32; ++b) {
        w[b * 17] = exps[b];
        for (int j = 0; j < 16; ++j) w[b * 17 + 1 + j] = uint8_t(b * 16 + j);
    }
    const std::vector<float> ref = dequant(EH_TYPE_MXFP4, w, 1, cols);
    // x is one-hot at position `probe` of every block: y sums exactly the
    // decoded values at that position.
    for (int probe = 0; probe < 32; ++probe) {
        std::vector<float> x(cols, 0.0f);
        for (int b = 0; b < cols / 32; ++b) x[b * 32 + probe] = b == 15 ? 0.0f : 1.0f;
        double want = 0;
        for (int b = 0; b < 15; ++b) want += ref[b * 32 + probe];
        auto dw = dev_mxfp4(w, 1, cols), dx = dev(x);
        ehcuda::DeviceBuffer dy(64);
        ehcuda::ExpertMat m;
        m.data = dw.get();
        m.type = EH_TYPE_MXFP4;
        m.rows = 1;
        m.cols = cols;
        m.row_bytes = ehcuda::moe_row_bytes(EH_TYPE_MXFP4, cols);
        ehcuda::dense_gemv(dx.as<float>(), cols, 1, m, dy.as<float>(), 1, false, nullptr);
        const float got = host<float>(dy, 1)[0];
        EXPECT_NEAR(got, want, 1e-6 * std::max(1.0, std::fabs(want))) << "probe " << probe;
    }
}

TEST(GptKernels, Mxfp4GemvAndBatchedWithinOnePercent) {
    REQUIRE_GPU();
    std::mt19937 rng(2);
    const int rows = 96, cols = 2880;
    const auto w = random_mxfp4(rng, rows, cols);
    const auto wf = dequant(EH_TYPE_MXFP4, w, rows, cols);
    const auto bias = randn(rng, rows);
    for (int ntok : {1, 3, 40}) {
        const auto x = randn(rng, size_t(ntok) * cols);
        std::vector<float> want(size_t(ntok) * rows);
        for (int t = 0; t < ntok; ++t)
            for (int r = 0; r < rows; ++r) {
                double s = bias[r];
                for (int c = 0; c < cols; ++c) s += double(wf[size_t(r) * cols + c]) * x[size_t(t) * cols + c];
                want[size_t(t) * rows + r] = float(s);
            }
        auto dw = dev_mxfp4(w, rows, cols), dx = dev(x), db = dev(bias);
        ehcuda::DeviceBuffer dy(want.size() * 4);
        ehcuda::ExpertMat m;
        m.data = dw.get();
        m.type = EH_TYPE_MXFP4;
        m.rows = rows;
        m.cols = cols;
        m.row_bytes = ehcuda::moe_row_bytes(EH_TYPE_MXFP4, cols);
        m.bias = db.as<float>();
        ehcuda::dense_gemv(dx.as<float>(), cols, ntok, m, dy.as<float>(), rows, false, nullptr);
        const double e = rel_err(host<float>(dy, want.size()), want);
        EXPECT_LT(e, 0.01) << "ntok " << ntok;
        EXPECT_LT(e, 1e-4) << "ntok " << ntok << " (fp32 accumulation should be far inside 1%)";
    }
}

TEST(GptKernels, RoutingPicksTheReferenceExperts) {
    REQUIRE_GPU();
    std::mt19937 rng(3);
    const int ntok = 200, X = 32, k = 4;
    auto logits = randn(rng, size_t(ntok) * X);
    // ties: the lower index must win, as in the reference
    for (int t = 0; t < 20; ++t) logits[size_t(t) * X + 7] = logits[size_t(t) * X + 3] = 5.0f;
    auto dl = dev(logits);
    ehcuda::DeviceBuffer ids(size_t(ntok) * k * 4), wts(size_t(ntok) * k * 4);
    ehcuda::moe_route(dl.as<float>(), ntok, X, k, ids.as<int32_t>(), wts.as<float>(), nullptr);
    const auto gi = host<int32_t>(ids, size_t(ntok) * k);
    const auto gw = host<float>(wts, size_t(ntok) * k);
    for (int t = 0; t < ntok; ++t) {
        const auto ref = cpuref::route_top_k(&logits[size_t(t) * X], X, k);
        for (int s = 0; s < k; ++s) {
            EXPECT_EQ(gi[size_t(t) * k + s], ref[size_t(s)].first) << "token " << t << " slot " << s;
            EXPECT_NEAR(gw[size_t(t) * k + s], ref[size_t(s)].second, 1e-6) << "token " << t << " slot " << s;
        }
    }
}

// Many experts per lane (200 experts, k = 8), one token and a batch; NaN
// logits rank below every number (and among themselves by index).
TEST(GptKernels, RoutingScansEveryExpertAndRanksNaNLast) {
    REQUIRE_GPU();
    std::mt19937 rng(5);
    const int X = 200, k = 8;
    for (int ntok : {1, 37}) {
        auto logits = randn(rng, size_t(ntok) * X);
        for (int t = 0; t < ntok; ++t) {
            logits[size_t(t) * X + 0] = NAN;  // would win a plain first-index scan
            logits[size_t(t) * X + 199] = 9.0f;  // the last lane's last expert wins
            logits[size_t(t) * X + 77] = 9.0f;   // tie: 77 ranks before 199
        }
        auto dl = dev(logits);
        ehcuda::DeviceBuffer ids(size_t(ntok) * k * 4), wts(size_t(ntok) * k * 4);
        ehcuda::moe_route(dl.as<float>(), ntok, X, k, ids.as<int32_t>(), wts.as<float>(), nullptr);
        const auto gi = host<int32_t>(ids, size_t(ntok) * k);
        const auto gw = host<float>(wts, size_t(ntok) * k);
        for (int t = 0; t < ntok; ++t) {
            std::vector<float> row(logits.begin() + ptrdiff_t(t) * X, logits.begin() + ptrdiff_t(t + 1) * X);
            row[0] = -INFINITY;  // NaN last; no other -inf in the row
            const auto ref = cpuref::route_top_k(row.data(), X, k);
            EXPECT_EQ(gi[size_t(t) * k + 0], 77);
            EXPECT_EQ(gi[size_t(t) * k + 1], 199);
            for (int s = 0; s < k; ++s) {
                EXPECT_EQ(gi[size_t(t) * k + s], ref[size_t(s)].first) << "ntok " << ntok << " token " << t << " slot " << s;
                EXPECT_NEAR(gw[size_t(t) * k + s], ref[size_t(s)].second, 1e-6);
            }
        }
    }
}

// The one-token router kernel: logits of the RMS-normalized input against
// a double-precision host sum, then moe_route's selection of those logits
// (ranked on the host from the kernel's own logits, so a near tie cannot
// make the test flaky). Shapes: Qwen3-30B-A3B's 128 x 2048, gpt-oss's
// 32 x 2880 with a bias (rows past the registers' 2048 inputs), one
// expert, and a row narrower than one pass of the block; each launched
// twice (the counter is left zero for the next launch).
TEST(GptKernels, RouterDecodeMatchesHostAndRoutes) {
    REQUIRE_GPU();
    std::mt19937 rng(17);
    struct Shape {
        int n_expert, cols, k;
        bool bias;
    };
    for (const Shape sh : {Shape{128, 2048, 8, false}, Shape{32, 2880, 4, true}, Shape{1, 64, 1, false},
                           Shape{200, 36, 8, true}}) {
        const auto w = randn(rng, size_t(sh.n_expert) * sh.cols, 0.05f);
        const auto x = randn(rng, size_t(sh.cols), 3.0f);
        const auto g = randn(rng, size_t(sh.cols));
        const auto b = randn(rng, size_t(sh.n_expert));
        double ss = 0.0;
        for (float v : x) ss += double(v) * v;
        const double inv = 1.0 / std::sqrt(ss / sh.cols + 1e-6);
        auto dw = dev(w), dx = dev(x), dg = dev(g), db = dev(b);
        ehcuda::DeviceBuffer logits(size_t(sh.n_expert) * 4), ids(size_t(sh.k) * 4), wts(size_t(sh.k) * 4);
        auto counter = dev(std::vector<int32_t>{0});
        ehcuda::MoeRouterArgs a;
        a.x = dx.as<float>();
        a.norm_w = dg.as<float>();
        a.norm_eps = 1e-6f;
        a.w = dw.as<float>();
        a.bias = sh.bias ? db.as<float>() : nullptr;
        a.n_expert = sh.n_expert;
        a.cols = sh.cols;
        a.k = sh.k;
        a.logits = logits.as<float>();
        a.ids = ids.as<int32_t>();
        a.weights = wts.as<float>();
        a.counter = counter.as<int>();
        ASSERT_TRUE(ehcuda::moe_router_decode_supported(EH_TYPE_F32, sh.n_expert, sh.cols, sh.k));
        const std::string what = std::to_string(sh.n_expert) + " x " + std::to_string(sh.cols);
        for (int launch = 0; launch < 2; ++launch) {
            ehcuda::moe_router_decode(a, nullptr);
            const auto gl = host<float>(logits, size_t(sh.n_expert));
            for (int e = 0; e < sh.n_expert; ++e) {
                double want = sh.bias ? b[size_t(e)] : 0.0, mag = 0.0;
                for (int i = 0; i < sh.cols; ++i) {
                    const double t = double(w[size_t(e) * sh.cols + i]) * x[size_t(i)] * inv * g[size_t(i)];
                    want += t;
                    mag += std::fabs(t);
                }
                EXPECT_NEAR(gl[size_t(e)], want, 1e-5 * (mag + 1.0)) << what << " expert " << e;
            }
            const auto ref = cpuref::route_top_k(gl.data(), sh.n_expert, sh.k);
            const auto gi = host<int32_t>(ids, size_t(sh.k));
            const auto gw = host<float>(wts, size_t(sh.k));
            for (int s = 0; s < sh.k; ++s) {
                EXPECT_EQ(gi[size_t(s)], ref[size_t(s)].first) << what << " slot " << s;
                EXPECT_NEAR(gw[size_t(s)], ref[size_t(s)].second, 1e-6) << what << " slot " << s;
            }
            EXPECT_EQ(host<int32_t>(counter, 1)[0], 0) << what;
        }
        // Without ids (the expert kernel routes): the same logits, and the
        // counter neither counted nor reset.
        ehcuda::MoeRouterArgs lo = a;
        lo.ids = nullptr;
        const auto before = host<float>(logits, size_t(sh.n_expert));
        EXPECT_EQ(cudaMemset(logits.get(), 0, logits.size()), cudaSuccess);
        auto busy = dev(std::vector<int32_t>{5});
        lo.counter = busy.as<int>();
        ehcuda::moe_router_decode(lo, nullptr);
        EXPECT_EQ(std::memcmp(host<float>(logits, size_t(sh.n_expert)).data(), before.data(), before.size() * 4), 0) << what;
        EXPECT_EQ(host<int32_t>(busy, 1)[0], 5) << what;
    }
    // A row of a width the float4 loads cannot take, and more experts than
    // the selection scans, are refused.
    EXPECT_FALSE(ehcuda::moe_router_decode_supported(EH_TYPE_F32, 128, 2046, 8));
    EXPECT_FALSE(ehcuda::moe_router_decode_supported(EH_TYPE_F32, 1025, 2048, 8));
    EXPECT_FALSE(ehcuda::moe_router_decode_supported(EH_TYPE_F16, 128, 2048, 8));
}

// gate|up (fused tensor, gate rows first) + down, k of X experts, MXFP4,
// with biases, against the reference's per-expert loop.
TEST(GptKernels, MoeExpertsMatchHostReference) {
    REQUIRE_GPU();
    std::mt19937 rng(4);
    const int E = 256, F = 192, X = 6, k = 2, ntok = 11;
    const auto gu = random_mxfp4(rng, size_t(X) * 2 * F, E);
    const auto dn = random_mxfp4(rng, size_t(X) * E, F);
    const auto guf = dequant(EH_TYPE_MXFP4, gu, size_t(X) * 2 * F, E);
    const auto dnf = dequant(EH_TYPE_MXFP4, dn, size_t(X) * E, F);
    const auto gub = randn(rng, size_t(X) * 2 * F), dnb = randn(rng, size_t(X) * E);
    const auto x = randn(rng, size_t(ntok) * E, 0.05f);
    const auto logits = randn(rng, size_t(ntok) * X);
    auto h0 = randn(rng, size_t(ntok) * E);

    std::vector<float> want = h0;
    for (int t = 0; t < ntok; ++t) {
        for (auto [e, w] : cpuref::route_top_k(&logits[size_t(t) * X], X, k)) {
            std::vector<float> act(F);
            for (int r = 0; r < F; ++r) {
                double g = gub[size_t(e) * 2 * F + r], u = gub[size_t(e) * 2 * F + F + r];
                for (int c = 0; c < E; ++c) {
                    g += double(guf[(size_t(e) * 2 * F + r) * E + c]) * x[size_t(t) * E + c];
                    u += double(guf[(size_t(e) * 2 * F + F + r) * E + c]) * x[size_t(t) * E + c];
                }
                act[size_t(r)] = cpuref::swiglu_oai(float(g), float(u), 1.702f, 7.0f);
            }
            for (int r = 0; r < E; ++r) {
                double y = dnb[size_t(e) * E + r];
                for (int c = 0; c < F; ++c) y += double(dnf[(size_t(e) * E + r) * F + c]) * act[size_t(c)];
                want[size_t(t) * E + r] += float(w * y);
            }
        }
    }

    auto dgu = dev_mxfp4(gu, size_t(X) * 2 * F, E), ddn = dev_mxfp4(dn, size_t(X) * E, F);
    auto dgub = dev(gub), ddnb = dev(dnb), dx = dev(x), dl = dev(logits), dh = dev(h0);
    ehcuda::DeviceBuffer ids(size_t(ntok) * k * 4), wts(size_t(ntok) * k * 4), act(size_t(ntok) * k * F * 4);
    ehcuda::ExpertMat g;
    g.data = dgu.get();
    g.type = EH_TYPE_MXFP4;
    g.rows = F;
    g.cols = E;
    g.row_bytes = ehcuda::moe_row_bytes(EH_TYPE_MXFP4, E);
    g.expert_stride = g.row_bytes * 2 * F;
    g.bias = dgub.as<float>();
    g.bias_stride = 2 * F;
    ehcuda::ExpertMat u = g;
    u.row0 = F;
    u.bias = dgub.as<float>() + F;
    ehcuda::ExpertMat d;
    d.data = ddn.get();
    d.type = EH_TYPE_MXFP4;
    d.rows = E;
    d.cols = F;
    d.row_bytes = ehcuda::moe_row_bytes(EH_TYPE_MXFP4, F);
    d.expert_stride = d.row_bytes * E;
    d.bias = ddnb.as<float>();
    d.bias_stride = E;
    ehcuda::moe_route(dl.as<float>(), ntok, X, k, ids.as<int32_t>(), wts.as<float>(), nullptr);
    ehcuda::moe_gate_up(dx.as<float>(), E, ntok, k, ids.as<int32_t>(), g, u, 1.702f, 7.0f, act.as<float>(), nullptr);
    ehcuda::moe_down(act.as<float>(), ntok, k, ids.as<int32_t>(), wts.as<float>(), d, dh.as<float>(), E, nullptr);
    const auto got = host<float>(dh, want.size());
    EXPECT_LT(rel_err(got, want), 0.01);
    // The same inputs give the same bits (no atomics anywhere).
    auto dh2 = dev(h0);
    ehcuda::moe_down(act.as<float>(), ntok, k, ids.as<int32_t>(), wts.as<float>(), d, dh2.as<float>(), E, nullptr);
    EXPECT_EQ(std::memcmp(host<float>(dh2, want.size()).data(), got.data(), got.size() * 4), 0);
}

// A K and a V cache of n random values each, rounded to FP16 (k, v) and
// the same values as floats (kf, vf), for references that must read what
// the kernels read. Draws k[i], v[i] alternately.
struct HalfKV {
    std::vector<__half> k, v;
    std::vector<float> kf, vf;
};
HalfKV random_half_kv(std::mt19937& rng, size_t n) {
    HalfKV c{std::vector<__half>(n), std::vector<__half>(n), std::vector<float>(n), std::vector<float>(n)};
    for (size_t i = 0; i < n; ++i) {
        c.k[i] = __float2half(randn(rng, 1)[0]);
        c.v[i] = __float2half(randn(rng, 1)[0]);
        c.kf[i] = __half2float(c.k[i]);
        c.vf[i] = __half2float(c.v[i]);
    }
    return c;
}

// Sink attention over q (row stride ldq) and the FP16 (k16, v16) or FP32
// (k32, v32) cache, one query row per token from *pos, into out (row
// stride n_head * hd); window, sinks and splits left for the caller.
ehcuda::SinkAttnArgs sink_args(const float* q, int ldq, bool f32, const ehcuda::DeviceBuffer& k16,
                               const ehcuda::DeviceBuffer& v16, const ehcuda::DeviceBuffer& k32,
                               const ehcuda::DeviceBuffer& v32, int n_head, int n_kv, int hd, const int32_t* pos, float scale,
                               float* out) {
    ehcuda::SinkAttnArgs a;
    a.q = q;
    a.ldq = ldq;
    if (f32) {
        a.k_cache32 = k32.as<float>();
        a.v_cache32 = v32.as<float>();
    } else {
        a.k_cache = k16.as<__half>();
        a.v_cache = v16.as<__half>();
    }
    a.n_head = n_head;
    a.n_kv = n_kv;
    a.head_dim = hd;
    a.d_pos0 = pos;
    a.scale = scale;
    a.out = out;
    a.ldo = n_head * hd;
    return a;
}

// Prefill attention with sinks: hd 16 takes the one-block-per-query kernel,
// 64 and 128 the tensor-core one (a window shorter and one longer than a
// key tile's start offset), FP16 and FP32 caches.
TEST(GptKernels, SinkAttentionWithWindowMatchesReference) {
    REQUIRE_GPU();
    std::mt19937 rng(5);
    for (int hd : {16, 64, 128}) {
        const int n_head = 8, n_kv = 2, ctx = 90, ntok = 27;
        const int pos0 = ctx - ntok;
        const int kv_dim = n_kv * hd, q_dim = n_head * hd;
        // cache as FP16; the reference reads the same rounded values
        const HalfKV cache = random_half_kv(rng, size_t(ctx) * kv_dim);
        const std::vector<__half>& kc = cache.k;
        const std::vector<__half>& vc = cache.v;
        const std::vector<float>& kf = cache.kf;
        const std::vector<float>& vf = cache.vf;
        const auto q = randn(rng, size_t(ntok) * q_dim);
        const auto sinks = randn(rng, n_head);
        for (int win : {0, 5, 40}) {
            for (int with_sinks = 0; with_sinks < 2; ++with_sinks)
            for (bool f32 : {false, true}) {
                std::vector<float> want(size_t(ntok) * q_dim), scratch(static_cast<size_t>(ctx));
                const float scale = 1.0f / std::sqrt(float(hd));
                for (int t = 0; t < ntok; ++t)
                    for (int h = 0; h < n_head; ++h) {
                        const int pos = pos0 + t, g = h / (n_head / n_kv);
                        cpuref::attend_one(&q[size_t(t) * q_dim + size_t(h) * hd], &kf[size_t(g) * hd], &vf[size_t(g) * hd],
                                           size_t(kv_dim), size_t(hd), cpuref::window_start(pos, uint32_t(win)), pos, scale,
                                           with_sinks ? &sinks[size_t(h)] : nullptr, scratch.data(),
                                           &want[size_t(t) * q_dim + size_t(h) * hd]);
                    }
                auto dk = dev(kc), dv = dev(vc), dq = dev(q), ds = dev(sinks), dp = dev(std::vector<int32_t>{pos0});
                auto dk32 = dev(kf), dv32 = dev(vf);
                ehcuda::DeviceBuffer out(want.size() * 4);
                ehcuda::SinkAttnArgs a = sink_args(dq.as<float>(), q_dim, f32, dk, dv, dk32, dv32, n_head, n_kv, hd,
                                                   dp.as<int32_t>(), scale, out.as<float>());
                a.ntok = ntok;
                a.window = win;
                a.sinks = with_sinks ? ds.as<float>() : nullptr;
                ehcuda::attention_sinks(a, nullptr);
                // Head dims 64/128 run on the tensor cores: with an FP16
                // cache Q and the softmax weights are FP16 too (~3e-4 seen);
                // the FP32 cache keeps hi + lo parts (float32 level).
                const double tol = (hd == 16 || f32) ? 1e-4 : 1e-3;
                EXPECT_LT(rel_err(host<float>(out, want.size()), want), tol)
                    << "hd " << hd << " window " << win << " sinks " << with_sinks << " f32 " << f32;
            }
        }
    }
}

// The split decode kernels under the default plan and with splits of as few
// as 32 keys (KernelPlan::sink_min_chunk), so that warps with no keys,
// groups past a split's end, more than 16 splits to merge and window layers
// held to one split are all met; the plan is restored after.
template <class F>
void for_sink_chunk_plans(F&& f) {
    const ehcuda::KernelPlan saved = ehtest::test_plan();
    for (const int min_chunk : {saved.sink_min_chunk, 32}) {
        ehtest::test_plan().sink_min_chunk = min_chunk;
        SCOPED_TRACE("sink_min_chunk " + std::to_string(min_chunk));
        f();
    }
    ehtest::test_plan() = saved;
}

// Decode attention split over the keys (one kernel, the last block of a
// head merges the splits in order): against the reference at positions
// around the split boundaries, with and without window and sinks, FP32 and
// FP16 caches, 1..24 splits (more splits than keys too), head dims 64 and
// 128, under each chunk plan; the counters are back at zero after every
// launch, and a second launch gives the same bits.
TEST(GptKernels, SplitDecodeAttentionMatchesReference) {
    REQUIRE_GPU();
    for (int hd : {64, 128}) for_sink_chunk_plans([&] {
        SCOPED_TRACE("head dim " + std::to_string(hd));
        std::mt19937 rng(8);
        const int n_head = 8, n_kv = 2, ctx = 600;
        const int kv_dim = n_kv * hd, q_dim = n_head * hd;
        const HalfKV cache = random_half_kv(rng, size_t(ctx) * kv_dim);
        const std::vector<__half>& kh = cache.k;
        const std::vector<__half>& vh = cache.v;
        const std::vector<float>& kf = cache.kf;
        const std::vector<float>& vf = cache.vf;
        const auto q = randn(rng, size_t(q_dim));
        const auto sinks = randn(rng, n_head);
        auto dk = dev(kh), dv = dev(vh), dk32 = dev(kf), dv32 = dev(vf), dq = dev(q), ds = dev(sinks);
        for (int pos : {0, 31, 32, 33, 127, 128, 577, 599})
            for (int nsplit : {2, 3, 9, 16, 24})
                for (int win : {0, 128})
                    for (bool with_sinks : {false, true})
                        for (bool f32 : {false, true}) {
                            std::vector<float> want(static_cast<size_t>(q_dim)), scratch(static_cast<size_t>(ctx));
                            const float scale = 1.0f / std::sqrt(float(hd));
                            for (int h = 0; h < n_head; ++h) {
                                const int g = h / (n_head / n_kv);
                                cpuref::attend_one(&q[size_t(h) * hd], &kf[size_t(g) * hd], &vf[size_t(g) * hd], size_t(kv_dim),
                                                   size_t(hd), cpuref::window_start(pos, uint32_t(win)), pos, scale,
                                                   with_sinks ? &sinks[size_t(h)] : nullptr, scratch.data(), &want[size_t(h) * hd]);
                            }
                            auto dp = dev(std::vector<int32_t>{pos});
                            ehcuda::DeviceBuffer out(want.size() * 4), out2(want.size() * 4);
                            ehcuda::DeviceBuffer sc(ehcuda::attention_sink_scratch_floats(n_head, hd, nsplit) * 4);
                            auto cnt = dev(std::vector<int32_t>(size_t(n_head), 0));
                            ehcuda::SinkAttnArgs a = sink_args(dq.as<float>(), q_dim, f32, dk, dv, dk32, dv32, n_head, n_kv,
                                                               hd, dp.as<int32_t>(), scale, out.as<float>());
                            a.window = win;
                            a.sinks = with_sinks ? ds.as<float>() : nullptr;
                            a.nsplit = nsplit;
                            a.split_scratch = sc.as<float>();
                            a.split_counters = cnt.as<int>();
                            ehcuda::attention_sinks(a, nullptr);
                            const auto got = host<float>(out, want.size());
                            EXPECT_LT(rel_err(got, want), 1e-4) << "pos " << pos << " splits " << nsplit << " window " << win
                                                                << " sinks " << with_sinks << " f32 " << f32;
                            for (int c : host<int32_t>(cnt, size_t(n_head))) EXPECT_EQ(c, 0);
                            a.out = out2.as<float>();
                            ehcuda::attention_sinks(a, nullptr);
                            EXPECT_EQ(std::memcmp(host<float>(out2, want.size()).data(), got.data(), got.size() * 4), 0);
                        }
    });
}

// The fused decode kernel (RoPE + K/V store + split sink attention) against
// rope_table_store_kv + attention_sinks: the same output (to rounding: the
// new key is folded in another order), the same cache bytes at the new
// position and nothing else written, counters back at zero, the same bits
// twice. Full, partial and no rotation; NEOX and interleaved; windows,
// sinks, FP16 and FP32 caches, 1..16 splits, head dims 64 and 128 (whole-head
// NEOX rotation takes the kernel's register form), under each chunk plan.
TEST(GptKernels, FusedRopeSinkDecodeMatchesSeparateKernels) {
    REQUIRE_GPU();
    for (int hd : {64, 128}) for_sink_chunk_plans([&] {
        SCOPED_TRACE("head dim " + std::to_string(hd));
        std::mt19937 rng(9);
        const int n_head = 8, n_kv = 2, ctx = 600;
        const int kv_dim = n_kv * hd, q_dim = n_head * hd, ld = q_dim + 2 * kv_dim;
        const HalfKV cache = random_half_kv(rng, size_t(ctx) * kv_dim);
        const std::vector<__half>& kh = cache.k;
        const std::vector<__half>& vh = cache.v;
        const std::vector<float>& kf = cache.kf;
        const std::vector<float>& vf = cache.vf;
        const auto qkv = randn(rng, size_t(ld));
        const auto sinks = randn(rng, n_head);
        std::vector<float> inv_freq(size_t(hd / 2));
        for (size_t i = 0; i < inv_freq.size(); ++i) inv_freq[i] = std::pow(150000.0f, -2.0f * float(i) / float(hd));
        // QK-norm weights (Qwen3): the separate form runs head_rmsnorm first
        const auto q_norm = randn(rng, hd), k_norm = randn(rng, hd);
        auto dfreq = dev(inv_freq), ds = dev(sinks), dqn = dev(q_norm), dkn = dev(k_norm);
        int cases = 0;
        for (int pos : {0, 31, 33, 128, 577})
            for (int nsplit : {1, 3, 9, 16})
                for (int n_rot : {hd, 32, 0})
                    for (bool neox : {true, false})
                        for (bool f32 : {false, true}) {
                            const int win = (cases % 3 == 0) ? 128 : 0;
                            const bool with_sinks = cases % 2 == 0;
                            const bool qk_norm = cases / 2 % 2 == 1;
                            ++cases;
                            auto run = [&](bool fused, std::vector<float>& out, std::vector<uint8_t>& kc_bytes,
                                           std::vector<uint8_t>& vc_bytes) {
                                auto dq = dev(qkv), dp = dev(std::vector<int32_t>{pos});
                                auto dk = f32 ? dev(kf) : dev(kh), dv = f32 ? dev(vf) : dev(vh);
                                ehcuda::DeviceBuffer o(size_t(q_dim) * 4);
                                ehcuda::DeviceBuffer sc(ehcuda::attention_sink_scratch_floats(n_head, hd, nsplit) * 4);
                                auto cnt = dev(std::vector<int32_t>(size_t(n_head), 0));
                                ehcuda::RopeTableArgs r;
                                r.qkv = dq.as<float>();
                                r.ld = ld;
                                r.n_head = n_head;
                                r.n_kv = n_kv;
                                r.head_dim = hd;
                                r.n_rot = n_rot;
                                r.neox = neox;
                                r.inv_freq = dfreq.as<float>();
                                r.attn_factor = 1.25f;
                                r.d_pos0 = dp.as<int32_t>();
                                ehcuda::SinkAttnArgs a;
                                a.q = dq.as<float>();
                                a.ldq = ld;
                                if (f32) {
                                    r.k_cache32 = dk.as<float>();
                                    r.v_cache32 = dv.as<float>();
                                    a.k_cache32 = r.k_cache32;
                                    a.v_cache32 = r.v_cache32;
                                } else {
                                    r.k_cache = dk.as<__half>();
                                    r.v_cache = dv.as<__half>();
                                    a.k_cache = r.k_cache;
                                    a.v_cache = r.v_cache;
                                }
                                a.n_head = n_head;
                                a.n_kv = n_kv;
                                a.head_dim = hd;
                                a.d_pos0 = dp.as<int32_t>();
                                a.window = win;
                                a.scale = 0.125f;
                                a.sinks = with_sinks ? ds.as<float>() : nullptr;
                                a.out = o.as<float>();
                                a.ldo = q_dim;
                                a.nsplit = nsplit;
                                a.split_scratch = sc.as<float>();
                                a.split_counters = cnt.as<int>();
                                if (fused) {
                                    if (qk_norm) {
                                        r.q_norm = dqn.as<float>();
                                        r.k_norm = dkn.as<float>();
                                        r.norm_eps = 1e-6f;
                                        ehcuda::RopeTableArgs one = r;  // both weights or neither
                                        one.k_norm = nullptr;
                                        EXPECT_THROW(ehcuda::rope_sink_attention_decode(one, a, nullptr), ehp::Error);
                                    }
                                    ehcuda::rope_sink_attention_decode(r, a, nullptr);
                                } else {
                                    if (qk_norm) {
                                        ehcuda::head_rmsnorm(r.qkv, ld, n_head, n_kv, hd, dqn.as<float>(), dkn.as<float>(), 1,
                                                             1e-6f, nullptr);
                                        ehcuda::RopeTableArgs normed = r;  // the separate RoPE takes no norm weights
                                        normed.q_norm = dqn.as<float>();
                                        normed.k_norm = dkn.as<float>();
                                        EXPECT_THROW(ehcuda::rope_table_store_kv(normed, nullptr), ehp::Error);
                                    }
                                    ehcuda::rope_table_store_kv(r, nullptr);
                                    ehcuda::attention_sinks(a, nullptr);
                                }
                                out = host<float>(o, size_t(q_dim));
                                kc_bytes = host<uint8_t>(dk, kf.size() * (f32 ? 4 : 2));
                                vc_bytes = host<uint8_t>(dv, vf.size() * (f32 ? 4 : 2));
                                for (int c : host<int32_t>(cnt, size_t(n_head))) EXPECT_EQ(c, 0);
                            };
                            std::vector<float> want, got, got2;
                            std::vector<uint8_t> kw, vw, kg, vg, kg2, vg2;
                            run(false, want, kw, vw);
                            run(true, got, kg, vg);
                            run(true, got2, kg2, vg2);
                            const std::string what = "pos " + std::to_string(pos) + " splits " + std::to_string(nsplit) +
                                                     " n_rot " + std::to_string(n_rot) + " neox " + std::to_string(neox) +
                                                     " f32 " + std::to_string(f32) + " window " + std::to_string(win) +
                                                     " qk_norm " + std::to_string(qk_norm);
                            EXPECT_LT(rel_err(got, want), 1e-5) << what;
                            EXPECT_TRUE(kg == kw) << "K cache bytes differ: " << what;
                            EXPECT_TRUE(vg == vw) << "V cache bytes differ: " << what;
                            EXPECT_EQ(std::memcmp(got.data(), got2.data(), got.size() * 4), 0) << what;
                        }
    });
}

TEST(GptKernels, LayerNormAndGeluMatchReference) {
    REQUIRE_GPU();
    std::mt19937 rng(6);
    const int n = 768, ntok = 3;
    auto x = randn(rng, size_t(ntok) * n, 2.0f);
    for (auto& v : x) v += 3.0f;  // a mean far from 0
    const auto w = randn(rng, n), b = randn(rng, n);
    std::vector<float> want(x.size());
    for (int t = 0; t < ntok; ++t) cpuref::layer_norm(&x[size_t(t) * n], w.data(), b.data(), 1e-5f, n, &want[size_t(t) * n]);
    auto dx = dev(x), dw = dev(w), db = dev(b);
    ehcuda::DeviceBuffer out(x.size() * 4);
    ehcuda::layernorm(dx.as<float>(), n, dw.as<float>(), db.as<float>(), out.as<float>(), n, n, ntok, 1e-5f, nullptr);
    EXPECT_LT(rel_err(host<float>(out, x.size()), want), 1e-5);

    std::vector<float> g = x;
    for (auto& v : g) v = cpuref::gelu_tanh(v);
    ehcuda::gelu_tanh_inplace(dx.as<float>(), n, n, ntok, nullptr);
    EXPECT_LT(rel_err(host<float>(dx, x.size()), g), 1e-5);
}

}  // namespace

// The tiled prefill kernel holds K/V tiles in shared memory in the cache's
// own type: an FP32 cache of head dim 256 would not fit, so it is refused
// there (attention_sinks keeps such shapes on its one-block-per-query kernel).
TEST(GptKernels, TiledPrefillRefusesWhatItCannotHold) {
    ehcuda::AttnArgs a;
    a.n_head = 8;
    a.n_kv = 2;
    a.ntok = 4;
    float dummy = 0.0f;
    a.k_cache32 = &dummy;
    a.v_cache32 = &dummy;
    for (int hd : {64, 96, 128}) {
        a.head_dim = hd;
        EXPECT_TRUE(ehcuda::attention_prefill_takes(a)) << hd;
    }
    for (int hd : {16, 200, 256}) {
        a.head_dim = hd;
        EXPECT_FALSE(ehcuda::attention_prefill_takes(a)) << hd;
        EXPECT_THROW(ehcuda::attention_prefill(a, nullptr), ehp::Error) << hd;
    }
    a.k_cache32 = a.v_cache32 = nullptr;
    a.sinks = &dummy;
    a.head_dim = 256;
    EXPECT_TRUE(ehcuda::attention_prefill_takes(a));  // FP16 cache
    a.head_dim = 48;
    EXPECT_FALSE(ehcuda::attention_prefill_takes(a));  // the generic kernel has no sinks
}

// Split decode attention with out_chunks: `out` is unchanged, and a Q8_0
// output projection reading the chunks gives the bits it gives staging
// `out`, for gpt-cuda's int16x2 input and int16; the shapes that write no
// chunks (several queries, no split, misaligned) are refused.
TEST(GptKernels, SplitDecodeAttentionWritesProjectionChunks) {
    REQUIRE_GPU();
    std::mt19937 rng(21);
    const int hd = 64, n_head = 8, n_kv = 2, ctx = 600, pos = 577, nsplit = 9, rows = 40;
    const int kv_dim = n_kv * hd, q_dim = n_head * hd;
    const auto kf = randn(rng, size_t(ctx) * kv_dim), vf = randn(rng, size_t(ctx) * kv_dim);
    const auto q = randn(rng, size_t(2) * q_dim), sinks = randn(rng, n_head);
    auto dk = dev(kf), dv = dev(vf), dq = dev(q), ds = dev(sinks), dp = dev(std::vector<int32_t>{pos});
    ehcuda::DeviceBuffer sc(ehcuda::attention_sink_scratch_floats(n_head, hd, nsplit) * 4), none;
    auto cnt = dev(std::vector<int32_t>(size_t(n_head), 0));
    ehcuda::DeviceBuffer out(size_t(2) * q_dim * 4), chunks(size_t(q_dim) * 8);
    const auto wv = randn(rng, size_t(rows) * q_dim, 0.05f);
    const size_t rb = ehp::quant::row_bytes(EH_TYPE_Q8_0, q_dim);
    std::vector<uint8_t> wq(rb * rows);
    for (int r = 0; r < rows; ++r)
        ASSERT_TRUE(ehp::quant::quantize_row(EH_TYPE_Q8_0, &wv[size_t(r) * q_dim], wq.data() + rb * r, q_dim));
    auto dw = dev(wq);
    ehcuda::SinkAttnArgs a = sink_args(dq.as<float>(), q_dim, true, none, none, dk, dv, n_head, n_kv, hd, dp.as<int32_t>(),
                                       0.125f, out.as<float>());
    a.sinks = ds.as<float>();
    a.nsplit = nsplit;
    a.split_scratch = sc.as<float>();
    a.split_counters = cnt.as<int>();
    ehcuda::attention_sinks(a, nullptr);
    const auto want = host<float>(out, size_t(q_dim));
    const ehcuda::GemvInput was = ehcuda::gemv_input();
    for (auto in : {ehcuda::GemvInput::Int16x2, ehcuda::GemvInput::Int16}) {
        ehtest::set_gemv_input(in);
        a.out_chunks = chunks.get();
        ehcuda::attention_sinks(a, nullptr);
        const auto got = host<float>(out, size_t(q_dim));
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << "out differs with chunks";
        ehcuda::DeviceBuffer y1(rows * 4), y2(rows * 4);
        ehcuda::MatmulArgs m;
        m.seg[0].w = {dw.get(), EH_TYPE_Q8_0, rows, q_dim, rb};
        m.cols = q_dim;
        m.x = out.as<float>();
        m.ldx = q_dim;
        m.y = y1.as<float>();
        m.ldy = rows;
        ehcuda::matmul(m, nullptr);
        m.x = chunks.as<float>();
        m.xmode = ehcuda::XMode::Chunks;
        m.y = y2.as<float>();
        ehcuda::matmul(m, nullptr);
        const auto v1 = host<float>(y1, rows), v2 = host<float>(y2, rows);
        EXPECT_EQ(std::memcmp(v1.data(), v2.data(), v1.size() * 4), 0) << "chunks differ from staging out, input " << int(in);
    }
    auto bad = a;
    bad.ntok = 2;
    EXPECT_THROW(ehcuda::attention_sinks(bad, nullptr), ehp::Error);
    bad = a;
    bad.nsplit = 1;
    EXPECT_THROW(ehcuda::attention_sinks(bad, nullptr), ehp::Error);
    bad = a;
    bad.out_chunks = static_cast<char*>(chunks.get()) + 4;
    EXPECT_THROW(ehcuda::attention_sinks(bad, nullptr), ehp::Error);
    bad = a;
    bad.nsplit = 129;  // the merge stages at most 128 splits
    EXPECT_THROW(ehcuda::attention_sinks(bad, nullptr), ehp::Error);
    ehtest::set_gemv_input(ehcuda::GemvInput::Float);
    EXPECT_THROW(ehcuda::attention_sinks(a, nullptr), ehp::Error);
    ehtest::set_gemv_input(was);
    for (int c : host<int32_t>(cnt, size_t(n_head))) EXPECT_EQ(c, 0);
}

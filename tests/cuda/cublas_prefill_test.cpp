// The cuBLAS prefill path of matmul() (PrefillWorkspace set): every weight
// type against the host dequant reference with bias, SwiGLU input,
// accumulate and odd token counts; slabs smaller than a matrix;
// multi-segment calls (fused and gapped outputs, mixed types); the ledger;
// bitwise reproducibility; the model's FP16 mirror in place of the slab; and
// the fallback when no workspace is given.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>

#include <engine_host/plugin_abi.hpp>
#include <ehcuda/kernels.hpp>
#include <ehcuda/prefill_workspace.hpp>
#include <ehcuda/options.hpp>
#include <ehcuda/weight_mirror.hpp>

#include "gpu_util.hpp"
#include "host_reference.hpp"

namespace ehtest {
namespace {

const uint32_t kTypes[] = {EH_TYPE_F32,  EH_TYPE_F16,  EH_TYPE_BF16, EH_TYPE_Q4_0, EH_TYPE_Q4_1, EH_TYPE_Q5_0,
                           EH_TYPE_Q5_1, EH_TYPE_Q8_0, EH_TYPE_Q4_K, EH_TYPE_Q5_K, EH_TYPE_Q6_K,
                           EH_TYPE_Q2_K, EH_TYPE_Q3_K, EH_TYPE_IQ4_NL, EH_TYPE_IQ4_XS};

// A workspace whose slab holds 64 rows of 1024 columns (128 KiB): the
// 512-column, 200-row matrices below take two slabs.
ehcuda::PrefillShape small_shape() {
    ehcuda::PrefillShape s;
    s.max_tokens = 600;
    s.max_cols = 1024;
    s.slab_bytes = size_t(128) << 10;
    return s;
}

std::vector<float> dequant_all(uint32_t type, const std::vector<uint8_t>& w, int rows, int cols) {
    std::vector<float> wf(size_t(rows) * cols);
    const size_t rs = row_size(type, cols);
    for (int r = 0; r < rows; ++r) dequant_row(type, w.data() + rs * r, cols, wf.data() + size_t(r) * cols);
    return wf;
}

// Input row t as the matmul sees it (SwiGLU folded).
std::vector<double> input_row(const std::vector<float>& x, int t, int ldx, int cols, bool swiglu) {
    std::vector<double> v(static_cast<size_t>(cols));
    for (int k = 0; k < cols; ++k) {
        const double g = x[size_t(t) * ldx + k];
        v[size_t(k)] = swiglu ? g / (1 + std::exp(-g)) * x[size_t(t) * ldx + cols + k] : g;
    }
    return v;
}

struct Case {
    uint32_t type;
    int ntok;
};

class CublasPrefillTest : public ::testing::TestWithParam<Case> {};

TEST_P(CublasPrefillTest, MatchesHostDequantReference) {
    REQUIRE_GPU();
    const auto [type, ntok] = GetParam();
    // 17: plain input, bias, accumulate; 100: SwiGLU input, bias,
    // accumulate; 513: plain, no bias, overwrite (y starts as garbage).
    const bool swiglu = ntok == 100, accumulate = ntok != 513, with_bias = ntok != 513;
    const int cols = 512, rows = 200, pad = 8, ldy = rows + 2 * pad;
    std::mt19937 rng(type * 977 + ntok);
    const auto w = random_rows(type, rows, cols, rng);
    const auto wf = dequant_all(type, w, rows, cols);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int ldx = swiglu ? 2 * cols : cols;
    std::vector<float> x(static_cast<size_t>(ntok) * ldx), bias(static_cast<size_t>(rows)), y0(static_cast<size_t>(ntok) * ldy);
    for (auto& v : x) v = nd(rng);
    for (auto& v : bias) v = nd(rng);
    for (auto& v : y0) v = nd(rng);

    ehcuda::MemoryLedger ledger;
    cudaStream_t stream = nullptr;
    GPU_OK(cudaStreamCreate(&stream));
    {
        ehcuda::PrefillWorkspace ws(small_shape(), stream, &ledger);
        auto dw = to_device(w);
        auto dx = to_device(x);
        auto db = to_device(bias);
        auto dy = to_device(y0);
        ehcuda::MatmulArgs a;
        a.seg[0].w = {dw.get(), type, rows, cols, row_size(type, cols)};
        a.seg[0].bias = with_bias ? db.as<float>() : nullptr;
        a.seg[0].out_offset = pad;
        a.cols = cols;
        a.x = dx.as<float>();
        a.ldx = ldx;
        a.xmode = swiglu ? ehcuda::XMode::SwiGLU : ehcuda::XMode::Plain;
        a.y = dy.as<float>();
        a.ldy = ldy;
        a.accumulate = accumulate;
        a.ntok = ntok;
        a.prefill = &ws;
        ASSERT_NO_THROW(ehcuda::matmul(a, stream));
        GPU_OK(cudaStreamSynchronize(stream));
        EXPECT_EQ(ws.uses(), 1u) << "the cuBLAS path did not run";
        const auto y = to_host<float>(dy, y0.size());

        // Worst error of y against the host reference, relative to the summed
        // magnitudes; checks that nothing outside the output slots changed.
        const auto worst_error = [&](const std::vector<float>& out) {
            double worst = 0;
            for (int t = 0; t < ntok; ++t) {
                const auto xin = input_row(x, t, ldx, cols, swiglu);
                for (int r = 0; r < rows; ++r) {
                    double s = 0, mag = 0;
                    for (int k = 0; k < cols; ++k) {
                        const double p = wf[size_t(r) * cols + k] * xin[size_t(k)];
                        s += p;
                        mag += std::fabs(p);
                    }
                    const double base =
                        (accumulate ? y0[size_t(t) * ldy + pad + r] : 0.0) + (with_bias ? bias[size_t(r)] : 0.0);
                    worst = std::max(worst, std::fabs(out[size_t(t) * ldy + pad + r] - (base + s)) / (mag + 1e-3));
                }
                for (int r = 0; r < pad; ++r) {
                    EXPECT_EQ(out[size_t(t) * ldy + r], y0[size_t(t) * ldy + r]) << "wrote before its slot";
                    EXPECT_EQ(out[size_t(t) * ldy + pad + rows + r], y0[size_t(t) * ldy + pad + rows + r])
                        << "wrote after its slot";
                }
            }
            return worst;
        };
        const double worst = worst_error(y);
        // FP16 operands: ~1e-3 of the summed magnitudes.
        EXPECT_LT(worst, 1e-2) << ehp::type_name(type) << " ntok=" << ntok;

        // Same inputs, same bits.
        auto dy2 = to_device(y0);
        a.y = dy2.as<float>();
        ehcuda::matmul(a, stream);
        GPU_OK(cudaStreamSynchronize(stream));
        const auto y2 = to_host<float>(dy2, y0.size());
        EXPECT_EQ(std::memcmp(y.data(), y2.data(), y.size() * 4), 0) << "not reproducible";
        EXPECT_EQ(ledger.bytes(), ws.device_bytes());

        // The model's FP16 mirror in place of the slab. The stored weights are
        // zeroed once mirrored: a result that still matches came from the mirror.
        if (type != EH_TYPE_F16) {
            ehcuda::WeightMirror mirror;
            mirror.add(a.seg[0].w, stream, &ledger);
            GPU_OK(cudaStreamSynchronize(stream));
            ASSERT_EQ(mirror.bytes(), size_t(rows) * cols * sizeof(__half));
            EXPECT_EQ(ledger.bytes(), ws.device_bytes() + mirror.bytes());
            GPU_OK(cudaMemset(dw.get(), 0, w.size()));
            ws.set_mirror(&mirror);
            auto dy3 = to_device(y0);
            a.y = dy3.as<float>();
            ehcuda::matmul(a, stream);
            GPU_OK(cudaStreamSynchronize(stream));
            EXPECT_LT(worst_error(to_host<float>(dy3, y0.size())), 1e-2) << ehp::type_name(type) << " from the mirror";
            ws.set_mirror(nullptr);
        }
    }
    EXPECT_EQ(ledger.bytes(), 0u) << "workspace bytes not returned to the ledger";
    cudaStreamDestroy(stream);
}

std::vector<Case> cases() {
    std::vector<Case> v;
    for (uint32_t t : kTypes)
        for (int n : {17, 100, 513}) v.push_back({t, n});
    return v;
}

INSTANTIATE_TEST_SUITE_P(AllTypes, CublasPrefillTest, ::testing::ValuesIn(cases()),
                         [](const auto& info) {
                             return ehp::type_name(info.param.type) + "_n" + std::to_string(info.param.ntok);
                         });

// Three segments: Q|K adjacent in the output (one GEMM per slab), a gap
// before V, mixed types (one FP16, read in place), bias on one segment, and
// slabs that straddle segment boundaries.
// A run of rows inside a mirrored matrix (Phi-3's gate and up halves of one
// tensor) finds its own rows; other shapes, unmirrored matrices and FP16
// weights find none; adding twice keeps one copy.
TEST(WeightMirror, FindsRowRunsOfMirroredMatrices) {
    REQUIRE_GPU();
    const int rows = 96, cols = 256;
    const uint32_t type = EH_TYPE_Q4_K;
    std::mt19937 rng(7);
    const auto w = random_rows(type, rows, cols, rng);
    const auto wf = dequant_all(type, w, rows, cols);
    auto dw = to_device(w);
    auto other = to_device(w);
    const size_t rb = row_size(type, cols);
    ehcuda::MemoryLedger ledger;
    {
        ehcuda::WeightMirror m;
        const ehcuda::WeightRef whole{dw.get(), type, rows, cols, rb};
        m.add(whole, nullptr, &ledger);
        m.add(whole, nullptr, &ledger);
        GPU_OK(cudaDeviceSynchronize());
        EXPECT_EQ(m.count(), 1u);
        EXPECT_EQ(ledger.bytes(), size_t(rows) * cols * 2);
        const __half* base = m.find(whole);
        ASSERT_NE(base, nullptr);
        ehcuda::WeightRef up = whole;
        up.rows = rows / 2;
        up.data = static_cast<const uint8_t*>(dw.get()) + size_t(rows / 2) * rb;
        EXPECT_EQ(m.find(up), base + size_t(rows / 2) * cols);
        ehcuda::WeightRef past = up;
        past.rows = rows / 2 + 1;  // one row beyond the matrix
        EXPECT_EQ(m.find(past), nullptr);
        ehcuda::WeightRef skew = whole;
        skew.data = static_cast<const uint8_t*>(dw.get()) + 1;
        skew.rows = 1;
        EXPECT_EQ(m.find(skew), nullptr);
        EXPECT_EQ(m.find({other.get(), type, rows, cols, rb}), nullptr);
        EXPECT_EQ(ehcuda::WeightMirror::bytes_for({dw.get(), EH_TYPE_F16, rows, cols, size_t(cols) * 2}), 0u);
        // The copy holds the dequantized weights, rounded to FP16.
        std::vector<__half> h(size_t(rows) * cols);
        GPU_OK(cudaMemcpy(h.data(), base, h.size() * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < h.size(); ++i)
            ASSERT_NEAR(__half2float(h[i]), wf[i], std::fabs(wf[i]) * 1e-3 + 1e-6) << i;
    }
    EXPECT_EQ(ledger.bytes(), 0u);
}

// The load option and the auto rule (on up to a quarter of free memory).
TEST(WeightMirror, PolicyOptionAndAutoRule) {
    using ehcuda::MirrorPolicy;
    auto policy = [](const char* json) { return ehcuda::mirror_policy_option(ehcuda::Options(json)); };
    EXPECT_EQ(policy(nullptr), MirrorPolicy::Auto);
    EXPECT_EQ(policy("{}"), MirrorPolicy::Auto);
    EXPECT_EQ(policy(R"({"fp16_weights": "on"})"), MirrorPolicy::On);
    EXPECT_EQ(policy(R"({"upload_chunk_bytes": 65536, "fp16_weights":"off"})"), MirrorPolicy::Off);
    EXPECT_EQ(policy(R"({"fp16_weights": "auto"})"), MirrorPolicy::Auto);
    for (const char* bad : {R"({"fp16_weights": "yes"})", R"({"fp16_weights": 1})", R"({"fp16_weights")"}) {
        try {
            policy(bad);
            ADD_FAILURE() << bad << " was accepted";
        } catch (const ehp::Error& e) {
            EXPECT_EQ(e.status(), EH_INVALID_ARGUMENT) << bad;
        }
    }
    const size_t gib = size_t(1) << 30;
    EXPECT_TRUE(ehcuda::mirror_policy(MirrorPolicy::Auto, gib, 4 * gib).on);
    EXPECT_FALSE(ehcuda::mirror_policy(MirrorPolicy::Auto, gib + 1, 4 * gib).on);
    EXPECT_TRUE(ehcuda::mirror_policy(MirrorPolicy::On, 8 * gib, gib).on);
    EXPECT_FALSE(ehcuda::mirror_policy(MirrorPolicy::Off, 1, 100 * gib).on);
    EXPECT_FALSE(ehcuda::mirror_policy(MirrorPolicy::On, 0, gib).on);
    EXPECT_NE(ehcuda::mirror_policy(MirrorPolicy::Auto, gib, 4 * gib).why.find("1024 MiB"), std::string::npos);
}

TEST(CublasPrefill, MultiSegmentMixedTypesAndGaps) {
    REQUIRE_GPU();
    const int cols = 256, ntok = 100;
    const uint32_t types[3] = {EH_TYPE_Q4_K, EH_TYPE_Q4_K, EH_TYPE_F16};
    const int rows[3] = {300, 72, 72};
    const int offs[3] = {0, 300, 380};  // V starts 8 past K's end
    const int ldy = 460;
    std::mt19937 rng(21);
    ehcuda::PrefillShape shape = small_shape();
    shape.slab_bytes = size_t(1) << 20;  // every row in one slab: Q|K share one GEMM
    shape.max_cols = cols;
    cudaStream_t stream = nullptr;
    GPU_OK(cudaStreamCreate(&stream));
    ehcuda::MemoryLedger ledger;
    ehcuda::PrefillWorkspace ws(shape, stream, &ledger);
    for (int variant = 0; variant < 2; ++variant) {
        // variant 1: the smallest slab (64 rows of 256), so slabs split Q
        // and one straddles the Q/K boundary
        ehcuda::PrefillWorkspace* w = &ws;
        std::unique_ptr<ehcuda::PrefillWorkspace> tiny;
        if (variant == 1) {
            ehcuda::PrefillShape s2 = shape;
            s2.slab_bytes = 1;  // raised to the minimum, 64 rows of max_cols
            tiny = std::make_unique<ehcuda::PrefillWorkspace>(s2, stream, &ledger);
            w = tiny.get();
        }
        std::vector<ehcuda::DeviceBuffer> bufs;
        std::vector<std::vector<float>> wf(3);
        ehcuda::MatmulArgs a;
        std::vector<float> bias(static_cast<size_t>(rows[1]));
        std::normal_distribution<float> nd;
        for (auto& v : bias) v = nd(rng);
        auto db = to_device(bias);
        for (int s = 0; s < 3; ++s) {
            const auto wq = random_rows(types[s], rows[s], cols, rng);
            wf[size_t(s)] = dequant_all(types[s], wq, rows[s], cols);
            bufs.push_back(to_device(wq));
            a.seg[s].w = {bufs.back().get(), types[s], rows[s], cols, row_size(types[s], cols)};
            a.seg[s].out_offset = offs[s];
        }
        a.seg[1].bias = db.as<float>();
        a.nseg = 3;
        std::vector<float> x(static_cast<size_t>(cols) * ntok), y0(static_cast<size_t>(ldy) * ntok);
        for (auto& v : x) v = nd(rng);
        for (auto& v : y0) v = nd(rng);
        auto dx = to_device(x);
        auto dy = to_device(y0);
        a.cols = cols;
        a.x = dx.as<float>();
        a.ldx = cols;
        a.y = dy.as<float>();
        a.ldy = ldy;
        a.ntok = ntok;
        a.prefill = w;
        const uint64_t before = w->uses();
        ehcuda::matmul(a, stream);
        GPU_OK(cudaStreamSynchronize(stream));
        EXPECT_EQ(w->uses(), before + 1);
        const auto y = to_host<float>(dy, y0.size());
        for (int t = 0; t < ntok; ++t) {
            for (int s = 0; s < 3; ++s)
                for (int r = 0; r < rows[s]; ++r) {
                    double e = s == 1 ? bias[size_t(r)] : 0.0, mag = 0;
                    for (int k = 0; k < cols; ++k) {
                        const double p = wf[size_t(s)][size_t(r) * cols + k] * x[size_t(t) * cols + k];
                        e += p;
                        mag += std::fabs(p);
                    }
                    ASSERT_NEAR(y[size_t(t) * ldy + offs[s] + r], e, 1e-2 * (mag + 1e-3))
                        << "variant " << variant << " seg " << s << " row " << r << " tok " << t;
                }
            for (int r = 372; r < 380; ++r) ASSERT_EQ(y[size_t(t) * ldy + r], y0[size_t(t) * ldy + r]) << "gap written";
            for (int r = 452; r < ldy; ++r) ASSERT_EQ(y[size_t(t) * ldy + r], y0[size_t(t) * ldy + r]) << "tail written";
        }
    }
    cudaStreamDestroy(stream);
}

// Below min_tokens, or with no workspace, the WMMA kernel runs (and agrees).
TEST(CublasPrefill, ThresholdAndFallback) {
    REQUIRE_GPU();
    const int cols = 256, rows = 128;
    std::mt19937 rng(5);
    const auto wq = random_rows(EH_TYPE_Q8_0, rows, cols, rng);
    auto dw = to_device(wq);
    cudaStream_t stream = nullptr;
    GPU_OK(cudaStreamCreate(&stream));
    ehcuda::PrefillWorkspace ws(small_shape(), stream, nullptr);
    ws.set_min_tokens(32);
    for (int ntok : {9, 31, 32, 40}) {
        std::vector<float> x(static_cast<size_t>(cols) * ntok);
        std::normal_distribution<float> nd;
        for (auto& v : x) v = nd(rng);
        auto dx = to_device(x);
        ehcuda::DeviceBuffer y1(static_cast<size_t>(rows) * ntok * 4), y2(static_cast<size_t>(rows) * ntok * 4);
        ehcuda::MatmulArgs a;
        a.seg[0].w = {dw.get(), EH_TYPE_Q8_0, rows, cols, row_size(EH_TYPE_Q8_0, cols)};
        a.cols = cols;
        a.x = dx.as<float>();
        a.ldx = cols;
        a.ldy = rows;
        a.ntok = ntok;
        a.y = y1.as<float>();
        ehcuda::matmul(a, stream);  // no workspace: WMMA
        a.y = y2.as<float>();
        a.prefill = &ws;
        const uint64_t before = ws.uses();
        ehcuda::matmul(a, stream);
        GPU_OK(cudaStreamSynchronize(stream));
        EXPECT_EQ(ws.uses() - before, ntok >= 32 ? 1u : 0u) << "ntok " << ntok;
        const auto v1 = to_host<float>(y1, size_t(rows) * ntok), v2 = to_host<float>(y2, size_t(rows) * ntok);
        double mx = 1e-6, e = 0;
        for (size_t i = 0; i < v1.size(); ++i) {
            mx = std::max(mx, double(std::fabs(v1[i])));
            e = std::max(e, double(std::fabs(v1[i] - v2[i])));
        }
        EXPECT_LT(e / mx, 1e-3) << "ntok " << ntok;
    }
    cudaStreamDestroy(stream);
}

// Dense matmuls use an L2-sized part of the slab; a model without experts
// allocates only that part.
TEST(CublasPrefill, DenseSlabIsCappedAndOnlyMoeAllocatesMore) {
    REQUIRE_GPU();
    ehcuda::PrefillShape s;
    s.max_tokens = 64;
    s.max_cols = 1024;
    s.slab_bytes = size_t(8) << 20;
    s.dense_slab_bytes = size_t(1) << 20;
    ehcuda::MemoryLedger ledger;
    {
        ehcuda::PrefillWorkspace dense(s, nullptr, &ledger);
        EXPECT_EQ(dense.slab_halves(), size_t(512) << 10);
        EXPECT_EQ(dense.dense_slab_halves(), size_t(512) << 10);
        EXPECT_EQ(ledger.bytes(), dense.device_bytes());
    }
    s.moe_experts = 4;
    s.moe_k = 2;
    s.moe_embd = 1024;
    s.moe_ff = 512;
    ehcuda::PrefillWorkspace moe(s, nullptr, &ledger);
    EXPECT_EQ(moe.slab_halves(), size_t(4) << 20);
    EXPECT_EQ(moe.dense_slab_halves(), size_t(512) << 10);
    EXPECT_EQ(ledger.bytes(), moe.device_bytes());
}

}  // namespace
}  // namespace ehtest

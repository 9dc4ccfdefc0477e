// The generic matmul and attention kernels (shapes the fast kernels do not
// take: stories260K's 172-wide FFN rows and head dim 8) against plain host
// math in double precision.
#include <cuda_fp16.h>

#include <cmath>
#include <random>

#include <engine_host/plugin_abi.hpp>
#include <ehcuda/kernels.hpp>

#include "gpu_util.hpp"
#include "host_reference.hpp"

namespace ehtest {
namespace {

struct GenCase {
    uint32_t type;
    int cols, ntok;
    ehcuda::XMode mode;
    int nseg;
    int ldx_pad;  // extra floats per input row (odd: unaligned rows)
};

std::string case_name(const GenCase& c) {
    const char* m = c.mode == ehcuda::XMode::SwiGLU ? "swiglu" : c.mode == ehcuda::XMode::RmsNorm ? "rmsnorm" : "plain";
    return ehp::type_name(c.type) + "_c" + std::to_string(c.cols) + "_t" + std::to_string(c.ntok) + "_" + m + "_s" +
           std::to_string(c.nseg) + "_p" + std::to_string(c.ldx_pad);
}

class GenericMatmul : public ::testing::TestWithParam<GenCase> {};

TEST_P(GenericMatmul, MatchesHostReference) {
    REQUIRE_GPU();
    const GenCase c = GetParam();
    const int seg_rows[3] = {37, 70, 5};
    const int gap = 3;  // unwritten outputs between segments and at the start
    std::mt19937 rng(c.cols * 31 + c.ntok * 7 + c.nseg + int(c.mode) * 1000 + int(c.type) * 17);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int width = c.mode == ehcuda::XMode::SwiGLU ? 2 * c.cols : c.cols;
    const int ldx = width + c.ldx_pad;
    const size_t rs = row_size(c.type, c.cols);

    std::vector<std::vector<uint8_t>> w(size_t(c.nseg));
    std::vector<std::vector<float>> wf(size_t(c.nseg)), bias(size_t(c.nseg));
    std::vector<int> offs(size_t(c.nseg));
    int ldy = gap;
    for (int s = 0; s < c.nseg; ++s) {
        const int rows = seg_rows[s];
        w[size_t(s)] = random_rows(c.type, rows, c.cols, rng);
        wf[size_t(s)].resize(size_t(rows) * c.cols);
        for (int r = 0; r < rows; ++r)
            dequant_row(c.type, w[size_t(s)].data() + rs * r, c.cols, wf[size_t(s)].data() + size_t(r) * c.cols);
        if (s != 1) {  // one segment without bias
            bias[size_t(s)].resize(size_t(rows));
            for (auto& v : bias[size_t(s)]) v = nd(rng);
        }
        offs[size_t(s)] = ldy;
        ldy += rows + gap;
    }
    std::vector<float> x(size_t(c.ntok) * ldx), norm_w(size_t(c.cols)), y0(size_t(c.ntok) * ldy);
    for (auto& v : x) v = nd(rng);
    for (auto& v : norm_w) v = 1 + 0.2f * nd(rng);
    for (auto& v : y0) v = nd(rng);

    std::vector<ehcuda::DeviceBuffer> dw, db;
    ehcuda::MatmulArgs a;
    a.nseg = c.nseg;
    for (int s = 0; s < c.nseg; ++s) {
        dw.push_back(to_device(w[size_t(s)]));
        a.seg[s].w = {dw.back().get(), c.type, seg_rows[s], c.cols, rs};
        if (!bias[size_t(s)].empty()) {
            db.push_back(to_device(bias[size_t(s)]));
            a.seg[s].bias = db.back().as<float>();
        }
        a.seg[s].out_offset = offs[size_t(s)];
    }
    auto dx = to_device(x), dn = to_device(norm_w), dy = to_device(y0);
    a.cols = c.cols;
    a.x = dx.as<float>();
    a.ldx = ldx;
    a.xmode = c.mode;
    a.norm_w = dn.as<float>();
    a.norm_eps = 1e-5f;
    a.y = dy.as<float>();
    a.ldy = ldy;
    a.accumulate = c.nseg != 2;  // both store and residual-add forms
    a.ntok = c.ntok;
    EXPECT_TRUE(ehcuda::matmul_needs_generic(a));
    ASSERT_NO_THROW(ehcuda::matmul_generic(a, nullptr));
    auto y = to_host<float>(dy, y0.size());
    GPU_OK(cudaGetLastError());

    std::vector<bool> written(size_t(ldy), false);
    for (int t = 0; t < c.ntok; ++t) {
        const float* xr = x.data() + size_t(t) * ldx;
        std::vector<double> xin(size_t(c.cols));
        double ss = 0;
        for (int k = 0; k < c.cols; ++k) ss += double(xr[k]) * xr[k];
        const double sc = 1 / std::sqrt(ss / c.cols + 1e-5);
        for (int k = 0; k < c.cols; ++k) {
            const double g = xr[k];
            xin[size_t(k)] = c.mode == ehcuda::XMode::SwiGLU  ? g / (1 + std::exp(-g)) * xr[k + c.cols]
                             : c.mode == ehcuda::XMode::RmsNorm ? g * sc * norm_w[size_t(k)]
                                                                 : g;
        }
        for (int s = 0; s < c.nseg; ++s)
            for (int r = 0; r < seg_rows[s]; ++r) {
                double sum = 0, mag = 0;
                for (int k = 0; k < c.cols; ++k) {
                    const double p = wf[size_t(s)][size_t(r) * c.cols + k] * xin[size_t(k)];
                    sum += p;
                    mag += std::fabs(p);
                }
                if (!bias[size_t(s)].empty()) sum += bias[size_t(s)][size_t(r)];
                const size_t o = size_t(t) * ldy + offs[size_t(s)] + r;
                if (a.accumulate) sum += y0[o];
                written[size_t(offs[size_t(s)] + r)] = true;
                ASSERT_NEAR(y[o], sum, 1e-4 * (1 + mag + std::fabs(sum))) << "token " << t << " seg " << s << " row " << r;
            }
        for (int i = 0; i < ldy; ++i) {
            if (!written[size_t(i)]) {
                ASSERT_EQ(y[size_t(t) * ldy + i], y0[size_t(t) * ldy + i]) << "gap " << i << " written";
            }
        }
    }
}

std::vector<GenCase> generic_cases() {
    using M = ehcuda::XMode;
    std::vector<GenCase> v;
    for (uint32_t type : {EH_TYPE_F32, EH_TYPE_F16, EH_TYPE_BF16}) {
        v.push_back({type, 172, 1, M::Plain, 1, 0});
        v.push_back({type, 172, 1, M::SwiGLU, 1, 0});   // stories260K ffn_down, decode
        v.push_back({type, 172, 13, M::SwiGLU, 1, 0});  // ... and prefill
        v.push_back({type, 100, 1, M::RmsNorm, 2, 0});
        v.push_back({type, 100, 5, M::RmsNorm, 3, 1});  // fused norm over several tokens
        v.push_back({type, 37, 9, M::Plain, 3, 3});
        v.push_back({type, 64, 20, M::Plain, 2, 1});    // aligned width, odd stride
    }
    // Block types: whole blocks per row, reached through an odd stride.
    for (uint32_t type : {EH_TYPE_Q4_0, EH_TYPE_Q8_0, EH_TYPE_Q5_1})
        v.push_back({type, 96, 3, M::SwiGLU, 2, 1});
    v.push_back({EH_TYPE_Q4_K, 256, 2, M::RmsNorm, 1, 1});
    v.push_back({EH_TYPE_Q6_K, 512, 1, M::Plain, 2, 3});
    return v;
}

INSTANTIATE_TEST_SUITE_P(Shapes, GenericMatmul, ::testing::ValuesIn(generic_cases()),
                         [](const auto& i) { return case_name(i.param); });

TEST(GenericMatmulDispatch, OnlyUnusualShapesNeedIt) {
    static float buf[64];
    ehcuda::MatmulArgs a;
    a.cols = 64;
    a.ldx = 64;
    a.x = reinterpret_cast<const float*>(reinterpret_cast<uintptr_t>(buf + 4) & ~uintptr_t(15));
    a.ntok = 1;
    EXPECT_FALSE(ehcuda::matmul_needs_generic(a));
    a.xmode = ehcuda::XMode::RmsNorm;
    EXPECT_FALSE(ehcuda::matmul_needs_generic(a));
    a.ntok = 2;
    EXPECT_TRUE(ehcuda::matmul_needs_generic(a));
    a.ntok = 1;
    a.xmode = ehcuda::XMode::Plain;
    a.cols = 172;
    EXPECT_TRUE(ehcuda::matmul_needs_generic(a));
    a.cols = 64;
    a.ldx = 66;
    EXPECT_TRUE(ehcuda::matmul_needs_generic(a));
}

// Host attention over the FP16 cache, in double.
std::vector<double> host_attn(const std::vector<float>& q, int ldq, const std::vector<__half>& kc,
                              const std::vector<__half>& vc, int H, int KV, int hd, int pos0, int ntok, int window,
                              float scale) {
    std::vector<double> out(size_t(ntok) * H * hd);
    for (int t = 0; t < ntok; ++t)
        for (int h = 0; h < H; ++h) {
            const int g = h / (H / KV), qp = pos0 + t;
            const int k0 = window > 0 ? std::max(0, qp - window + 1) : 0;
            std::vector<double> s;
            double mx = -1e300;
            for (int j = k0; j <= qp; ++j) {
                double d = 0;
                for (int e = 0; e < hd; ++e)
                    d += double(q[size_t(t) * ldq + h * hd + e]) * __half2float(kc[(size_t(j) * KV + g) * hd + e]);
                s.push_back(d * scale);
                mx = std::max(mx, d * scale);
            }
            double z = 0;
            for (auto& v : s) z += (v = std::exp(v - mx));
            for (int e = 0; e < hd; ++e) {
                double acc = 0;
                for (int j = k0; j <= qp; ++j) acc += s[size_t(j - k0)] * __half2float(vc[(size_t(j) * KV + g) * hd + e]);
                out[(size_t(t) * H + h) * hd + e] = acc / z;
            }
        }
    return out;
}

struct GenAttnCase {
    int hd, H, KV, pos0, ntok, window;
};
class GenericAttention : public ::testing::TestWithParam<GenAttnCase> {};

TEST_P(GenericAttention, PrefillAndDecodeMatchHost) {
    REQUIRE_GPU();
    const auto c = GetParam();
    ASSERT_TRUE(ehcuda::attention_head_dim_supported(c.hd));
    ASSERT_FALSE(ehcuda::attention_head_dim_fast(c.hd));
    const int len = c.pos0 + c.ntok;
    std::mt19937 rng(c.hd * 7 + c.ntok + c.pos0);
    std::normal_distribution<float> nd(0.0f, 1.5f);
    // A few spare positions past the end: the kernel must not read them.
    std::vector<__half> kc(size_t(len + 5) * c.KV * c.hd), vc(kc.size());
    for (auto& v : kc) v = __float2half(nd(rng));
    for (auto& v : vc) v = __float2half(nd(rng));
    const int ldq = c.H * c.hd + 3;
    std::vector<float> q(size_t(c.ntok) * ldq);
    for (auto& v : q) v = nd(rng);
    auto dk = to_device(kc), dv = to_device(vc), dq = to_device(q);
    auto dpos = to_device(std::vector<int32_t>{c.pos0});
    const int ldo = c.H * c.hd + 5;
    std::vector<float> o0(size_t(c.ntok) * ldo, 7.0f);
    auto dout = to_device(o0);
    ehcuda::AttnArgs a;
    a.q = dq.as<float>();
    a.ldq = ldq;
    a.k_cache = dk.as<__half>();
    a.v_cache = dv.as<__half>();
    a.n_head = c.H;
    a.n_kv = c.KV;
    a.head_dim = c.hd;
    a.d_pos0 = dpos.as<int32_t>();
    a.ntok = c.ntok;
    a.window = c.window;
    a.scale = 1 / std::sqrt(float(c.hd));
    a.out = dout.as<float>();
    a.ldo = ldo;
    const auto ref = host_attn(q, ldq, kc, vc, c.H, c.KV, c.hd, c.pos0, c.ntok, c.window, a.scale);
    auto check = [&](const char* what) {
        auto got = to_host<float>(dout, o0.size());
        GPU_OK(cudaGetLastError());
        for (int t = 0; t < c.ntok; ++t) {
            for (int i = 0; i < c.H * c.hd; ++i) {
                const double r = ref[size_t(t) * c.H * c.hd + i];
                ASSERT_NEAR(got[size_t(t) * ldo + i], r, 1e-4 * (1 + std::fabs(r))) << what << " token " << t << " at " << i;
            }
            for (int i = c.H * c.hd; i < ldo; ++i) ASSERT_EQ(got[size_t(t) * ldo + i], 7.0f) << what << " wrote padding";
        }
    };
    ASSERT_NO_THROW(ehcuda::attention_prefill(a, nullptr));
    check("prefill");
    if (c.ntok == 1) {
        cudaMemcpy(dout.get(), o0.data(), o0.size() * 4, cudaMemcpyHostToDevice);
        const int nsplit = ehcuda::attention_decode_splits(uint32_t(len));
        ehcuda::DeviceBuffer scratch(ehcuda::attention_decode_scratch_floats(c.H, c.hd, nsplit) * 4);
        ASSERT_NO_THROW(ehcuda::attention_decode(a, scratch.as<float>(), nsplit, nullptr));
        check("decode");
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GenericAttention,
                         ::testing::Values(GenAttnCase{8, 8, 4, 0, 5, 0},     // stories260K prompt
                                           GenAttnCase{8, 8, 4, 204, 1, 0},   // ... its 200th decode step
                                           GenAttnCase{8, 8, 4, 0, 1, 0},     // first position
                                           GenAttnCase{16, 6, 2, 30, 40, 0},  // prefill past a filled cache
                                           GenAttnCase{16, 4, 1, 90, 1, 16},  // sliding window
                                           GenAttnCase{32, 8, 2, 3, 70, 0},
                                           GenAttnCase{32, 4, 4, 333, 1, 0},
                                           GenAttnCase{40, 4, 2, 10, 33, 20},  // dims over one lane each
                                           GenAttnCase{80, 2, 1, 64, 1, 0}),
                         [](const auto& i) {
                             const auto& p = i.param;
                             return "hd" + std::to_string(p.hd) + "_h" + std::to_string(p.H) + "_kv" + std::to_string(p.KV) +
                                    "_p" + std::to_string(p.pos0) + "_t" + std::to_string(p.ntok) + "_w" +
                                    std::to_string(p.window);
                         });

TEST(GenericAttentionLimits, HeadDimOverMaxIsRefused) {
    EXPECT_FALSE(ehcuda::attention_head_dim_supported(ehcuda::kAttentionMaxHeadDim + 1));
    EXPECT_FALSE(ehcuda::attention_head_dim_supported(0));
    ehcuda::AttnArgs a;
    a.head_dim = 512;
    a.n_head = a.n_kv = 1;
    EXPECT_THROW(ehcuda::attention_prefill(a, nullptr), ehp::Error);
}

}  // namespace
}  // namespace ehtest

// The tensor-core attention kernels against a float64 host reference: the
// prefill kernel (attention_prefill.cu, also against the CUDA-core
// attention_prefill_simt) and the query-group decode kernel
// (attention_decode_group.cu), over the shapes the models use: head dims 64
// (Qwen2.5, gpt-oss), 96 (Phi-3) and 128 (Llama); GQA ratios 1, 4, 7 and 8;
// sliding windows; gpt-oss's sinks on its FP32 cache; lengths of 1, under
// and over one query or key tile, and past 4,096 (decode: 16,384); chunked
// prefill (queries starting deep in the cache); with and without splitting
// the key range over blocks.
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <ehcuda/attention_decode_group.hpp>
#include <ehcuda/attention_paged.hpp>
#include <ehcuda/attention_prefill.hpp>
#include <ehcuda/check.hpp>
#include <ehcuda/kernels.hpp>

#include "gpu_util.hpp"

namespace ehtest {
namespace {

struct Case {
    const char* name;
    int hd, H, KV, pos0, ntok, window;
    bool f32_cache, sinks;
};

std::string case_name(const ::testing::TestParamInfo<Case>& i) { return i.param.name; }

// Rows the host reference checks: every row of short runs, a spread of
// rows (the first, the last, every 61st) of long ones.
std::vector<int> checked_rows(int ntok) {
    std::vector<int> r;
    for (int t = 0; t < ntok; ++t)
        if (ntok <= 300 || t % 61 == 0 || t >= ntok - 3 || t < 3) r.push_back(t);
    return r;
}

struct Inputs {
    std::vector<float> q, k, v, sinks;  // k, v as the kernel reads them (FP16-rounded for an FP16 cache)
    std::vector<__half> kh, vh;
    int ldq = 0;
};

Inputs make_inputs(const Case& c, uint32_t seed) {
    Inputs in;
    const int len = c.pos0 + c.ntok;
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.5f);
    in.ldq = (c.H + 2 * c.KV) * c.hd;  // a step's qkv row: [q | k | v]
    in.q.resize(size_t(c.ntok) * in.ldq);
    for (auto& x : in.q) x = nd(rng);
    in.k.resize(size_t(len) * c.KV * c.hd);
    in.v.resize(in.k.size());
    for (auto& x : in.k) x = nd(rng);
    for (auto& x : in.v) x = nd(rng);
    if (!c.f32_cache) {
        in.kh.resize(in.k.size());
        in.vh.resize(in.v.size());
        for (size_t i = 0; i < in.k.size(); ++i) {
            in.kh[i] = __float2half(in.k[i]);
            in.vh[i] = __float2half(in.v[i]);
            in.k[i] = __half2float(in.kh[i]);
            in.v[i] = __half2float(in.vh[i]);
        }
    }
    if (c.sinks) {
        in.sinks.resize(size_t(c.H));
        for (auto& x : in.sinks) x = nd(rng) + 2.0f;  // some sinks dominate their rows
    }
    return in;
}

// The inputs on the device and the AttnArgs that read them.
struct OnDevice {
    ehcuda::DeviceBuffer q, k, v, sinks, pos, out;
    ehcuda::AttnArgs a;
    OnDevice(const Case& c, const Inputs& in)
        : q(to_device(in.q)),
          k(c.f32_cache ? to_device(in.k) : to_device(in.kh)),
          v(c.f32_cache ? to_device(in.v) : to_device(in.vh)),
          sinks(to_device(c.sinks ? in.sinks : std::vector<float>{0.0f})),
          pos(to_device(std::vector<int32_t>{c.pos0})),
          out(size_t(c.ntok) * c.H * c.hd * 4) {
        a.q = q.as<float>();
        a.ldq = in.ldq;
        if (c.f32_cache) {
            a.k_cache32 = k.as<float>();
            a.v_cache32 = v.as<float>();
        } else {
            a.k_cache = k.as<__half>();
            a.v_cache = v.as<__half>();
        }
        a.n_head = c.H;
        a.n_kv = c.KV;
        a.head_dim = c.hd;
        a.d_pos0 = pos.as<int32_t>();
        a.ntok = c.ntok;
        a.window = c.window;
        a.scale = 1.0f / std::sqrt(float(c.hd));
        a.sinks = c.sinks ? sinks.as<float>() : nullptr;
        a.out = out.as<float>();
        a.ldo = c.H * c.hd;
    }
};

// float64 attention of the given rows; [row][H][hd].
std::vector<double> reference(const Case& c, const Inputs& in, const std::vector<int>& rows) {
    std::vector<double> out(rows.size() * c.H * c.hd);
    const double scale = 1.0 / std::sqrt(double(c.hd));
    std::vector<double> s;
    for (size_t ri = 0; ri < rows.size(); ++ri) {
        const int t = rows[ri], qp = c.pos0 + t;
        const int k0 = c.window > 0 ? std::max(0, qp - c.window + 1) : 0;
        for (int h = 0; h < c.H; ++h) {
            const int g = h / (c.H / c.KV);
            const float* q = in.q.data() + size_t(t) * in.ldq + size_t(h) * c.hd;
            s.assign(size_t(qp - k0 + 1), 0.0);
            double mx = c.sinks ? double(in.sinks[size_t(h)]) : -1e300;
            for (int j = k0; j <= qp; ++j) {
                const float* k = in.k.data() + (size_t(j) * c.KV + g) * c.hd;
                double d = 0;
                for (int e = 0; e < c.hd; ++e) d += double(q[e]) * k[e];
                s[size_t(j - k0)] = d * scale;
                mx = std::max(mx, d * scale);
            }
            double z = c.sinks ? std::exp(double(in.sinks[size_t(h)]) - mx) : 0.0;
            for (auto& x : s) z += (x = std::exp(x - mx));
            double* o = out.data() + (ri * c.H + h) * c.hd;
            for (int j = k0; j <= qp; ++j) {
                const float* v = in.v.data() + (size_t(j) * c.KV + g) * c.hd;
                for (int e = 0; e < c.hd; ++e) o[e] += s[size_t(j - k0)] * v[e];
            }
            for (int e = 0; e < c.hd; ++e) o[e] /= z;
        }
    }
    return out;
}

class PrefillAttention : public ::testing::TestWithParam<Case> {};

// ||got - ref|| / ||ref|| over the checked rows; every output element must
// have been written (the output is poisoned with NaN first).
TEST_P(PrefillAttention, MatchesFloat64ReferenceSplitOrNot) {
    REQUIRE_GPU();
    const Case c = GetParam();
    ASSERT_TRUE(ehcuda::attention_prefill_mma_takes(c.hd));
    const Inputs in = make_inputs(c, uint32_t(c.hd * 131 + c.ntok * 7 + c.pos0 + c.window));
    const std::vector<int> rows = checked_rows(c.ntok);
    const std::vector<double> ref = reference(c, in, rows);

    OnDevice d(c, in);
    ehcuda::AttnArgs& a = d.a;
    ehcuda::DeviceBuffer& dout = d.out;
    const size_t n_out = size_t(c.ntok) * c.H * c.hd;
    const size_t scratch_floats = ehcuda::attention_prefill_scratch_floats(c.hd);
    ehcuda::DeviceBuffer scratch(scratch_floats * 4);

    // An FP16 cache: FP16 Q and P on the tensor cores (~1e-3). An FP32
    // cache: hi + lo FP16 parts, float32-level agreement.
    const double tol = c.f32_cache ? 2e-5 : 2e-3;
    ehcuda::AttnSplitScratch sp;
    auto run = [&](const char* what, bool split, auto&& launch) -> std::vector<float> {
        sp = split ? ehcuda::AttnSplitScratch{scratch.as<float>(), scratch_floats} : ehcuda::AttnSplitScratch{};
        EXPECT_EQ(cudaMemset(dout.get(), 0xff, n_out * 4), cudaSuccess);  // NaN
        launch();
        EXPECT_EQ(cudaGetLastError(), cudaSuccess) << what;
        const auto got = to_host<float>(dout, n_out);
        const size_t nans = size_t(std::count_if(got.begin(), got.end(), [](float x) { return std::isnan(x); }));
        EXPECT_EQ(nans, 0u) << what << ": outputs unwritten or NaN";
        double num = 0, den = 0, worst = 0;
        for (size_t ri = 0; ri < rows.size(); ++ri)
            for (int e = 0; e < c.H * c.hd; ++e) {
                const double r = ref[ri * c.H * c.hd + e], g = got[size_t(rows[ri]) * c.H * c.hd + e];
                num += (g - r) * (g - r);
                den += r * r;
                worst = std::max(worst, std::fabs(g - r));
            }
        const double rel = std::sqrt(num / std::max(den, 1e-30));
        EXPECT_LT(rel, tol) << what << " (max abs error " << worst << ")";
        return got;
    };
    const int splits = ehcuda::attention_prefill_splits(c.ntok, c.H, scratch_floats, c.hd);
    const auto one = run("one split", false, [&] { ehcuda::attention_prefill(a, nullptr); });
    const auto many = run("split keys", true, [&] { ehcuda::attention_prefill(a, sp, nullptr); });
    if (splits == 1) {
        EXPECT_EQ(one, many) << "one split either way: the same bits";
    }
    if (!c.f32_cache) {
        // The same keys in a batched step's paged pool, blocks scattered
        // (AttnArgs::kv_table): the same bits, split or not.
        constexpr int B = ehcuda::kPagedBlockTokens;
        const int len = c.pos0 + c.ntok, nblk = (len + B - 1) / B;
        const size_t row = size_t(c.KV) * c.hd;
        std::vector<int32_t> ids(size_t(nblk + 3));
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), std::mt19937(uint32_t(len)));
        std::vector<__half> pk(ids.size() * B * row, __float2half(0.0f)), pv(pk.size(), __float2half(0.0f));
        for (int p = 0; p < len; ++p) {
            const size_t at = (size_t(ids[size_t(p / B)]) * B + size_t(p % B)) * row;
            std::copy_n(in.kh.begin() + ptrdiff_t(size_t(p) * row), row, pk.begin() + ptrdiff_t(at));
            std::copy_n(in.vh.begin() + ptrdiff_t(size_t(p) * row), row, pv.begin() + ptrdiff_t(at));
        }
        const ehcuda::DeviceBuffer dk = to_device(pk), dv = to_device(pv), dt = to_device(ids);
        ehcuda::AttnArgs pa = a;
        pa.k_cache = dk.as<__half>();
        pa.v_cache = dv.as<__half>();
        pa.kv_table = dt.as<int32_t>();
        EXPECT_EQ(run("paged pool", false, [&] { ehcuda::attention_prefill(pa, nullptr); }), one);
        EXPECT_EQ(run("paged pool, split keys", true, [&] { ehcuda::attention_prefill(pa, sp, nullptr); }), many);
    }
    if (!c.f32_cache) run("cuda-core kernel", false, [&] { ehcuda::attention_prefill_simt(a, nullptr); });
    std::printf("%s: %d split(s)\n", c.name, splits);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PrefillAttention,
    ::testing::Values(
        // Qwen2.5-0.5B: 14 heads over 2 KV heads, head dim 64.
        Case{"qwen_t1", 64, 14, 2, 0, 1, 0, false, false}, Case{"qwen_t17", 64, 14, 2, 0, 17, 0, false, false},
        Case{"qwen_t64", 64, 14, 2, 0, 64, 0, false, false}, Case{"qwen_t200_deep", 64, 14, 2, 913, 200, 0, false, false},
        Case{"qwen_t1_deep", 64, 14, 2, 4095, 1, 0, false, false},
        Case{"qwen_long_t4133", 64, 14, 2, 0, 4133, 0, false, false},
        Case{"qwen_chunk_t256_at_3840", 64, 14, 2, 3840, 256, 0, false, false},
        // Phi-3-mini: 32 heads, no GQA, head dim 96.
        Case{"phi3_t77", 96, 32, 32, 0, 77, 0, false, false}, Case{"phi3_t256_deep", 96, 32, 32, 1500, 256, 0, false, false},
        // Llama-style head dim 128, GQA 4, with and without a window.
        Case{"hd128_t129", 128, 8, 2, 5, 129, 0, false, false}, Case{"hd128_window100", 128, 8, 2, 300, 150, 100, false, false},
        // gpt-oss: 64 heads over 8, head dim 64, sinks; the sliding-window
        // layers (128) and the full ones, on its FP32 cache and on FP16.
        Case{"gptoss_full_f32_t300", 64, 64, 8, 0, 300, 0, true, true},
        Case{"gptoss_window_f32_t300", 64, 64, 8, 0, 300, 128, true, true},
        Case{"gptoss_window_f32_deep", 64, 64, 8, 700, 65, 128, true, true},
        Case{"gptoss_t1_f32_deep", 64, 64, 8, 333, 1, 0, true, true},
        Case{"gptoss_full_f16_t100", 64, 64, 8, 40, 100, 0, false, true},
        Case{"gptoss_window_f16_t200", 64, 64, 8, 0, 200, 128, false, true},
        // gpt2: 12 heads, head dim 64, no GQA.
        Case{"gpt2_t33", 64, 12, 12, 0, 33, 0, false, false}),
    case_name);

TEST(PrefillAttentionPlan, SplitsOnlyWhenTheGridIsSmall) {
    REQUIRE_GPU();
    const size_t s64 = ehcuda::attention_prefill_scratch_floats(64);
    // gpt-oss pp512: 8 query tiles x 64 heads already fill the GPU.
    EXPECT_EQ(ehcuda::attention_prefill_splits(512, 64, s64, 64), 1);
    // Qwen's 256-token chunks: 4 x 14 blocks are too few.
    EXPECT_GT(ehcuda::attention_prefill_splits(256, 14, s64, 64), 1);
    EXPECT_LE(ehcuda::attention_prefill_splits(1, 14, s64, 64), 16);
    // No scratch, or too little for two splits: one.
    EXPECT_EQ(ehcuda::attention_prefill_splits(256, 14, 0, 64), 1);
    EXPECT_EQ(ehcuda::attention_prefill_splits(256, 14, 4 * 14 * 64 * 66, 64), 1);
    // Dims the tensor-core kernel does not take never split.
    EXPECT_FALSE(ehcuda::attention_prefill_mma_takes(256));
    EXPECT_EQ(ehcuda::attention_prefill_splits(256, 14, s64, 256), 1);
}

// One token's attention for all query heads of a KV head at once
// (attention_decode_group): against float64, every output written, the same
// bits run to run, and one split (no scratch) within the same tolerance.
class DecodeGroupAttention : public ::testing::TestWithParam<Case> {};

TEST_P(DecodeGroupAttention, MatchesFloat64ReferenceSplitOrNot) {
    REQUIRE_GPU();
    const Case c = GetParam();
    ASSERT_EQ(c.ntok, 1);
    const Inputs in = make_inputs(c, uint32_t(c.hd * 17 + c.pos0 * 3 + c.window + c.H));
    const std::vector<double> ref = reference(c, in, {0});
    OnDevice d(c, in);
    ASSERT_TRUE(ehcuda::attention_decode_group_takes(d.a));
    const size_t n_out = size_t(c.H) * c.hd;
    const int nsplit = ehcuda::attention_decode_group_splits(ehcuda::kAttentionGroupMaxSplits, c.KV);
    ehcuda::DeviceBuffer scratch(size_t(c.H) * nsplit * (c.hd + 2) * 4);
    const double tol = c.f32_cache ? 2e-5 : 2e-3;
    auto run = [&](const char* what, int splits) {
        EXPECT_EQ(cudaMemset(d.out.get(), 0xff, n_out * 4), cudaSuccess);  // NaN
        ehcuda::attention_decode_group(d.a, splits > 1 ? scratch.as<float>() : nullptr, splits, nullptr);
        EXPECT_EQ(cudaGetLastError(), cudaSuccess) << what;
        const auto got = to_host<float>(d.out, n_out);
        double num = 0, den = 0, worst = 0;
        size_t nans = 0;
        for (size_t e = 0; e < n_out; ++e) {
            if (std::isnan(got[e])) ++nans;
            num += (got[e] - ref[e]) * (got[e] - ref[e]);
            den += ref[e] * ref[e];
            worst = std::max(worst, std::fabs(got[e] - ref[e]));
        }
        EXPECT_EQ(nans, 0u) << what << ": outputs unwritten or NaN";
        EXPECT_LT(std::sqrt(num / std::max(den, 1e-30)), tol) << what << " (max abs error " << worst << ")";
        return got;
    };
    const auto many = run("split keys", nsplit);
    EXPECT_EQ(run("split keys again", nsplit), many) << "run to run: the same bits";
    run("one split", 1);
    std::printf("%s: %d split(s) in the grid\n", c.name, nsplit);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, DecodeGroupAttention,
    ::testing::Values(
        // Qwen2.5-0.5B: 7 query heads per KV head; the first key, one tile,
        // one past it, deep (several tiles per split), the bench's depth.
        Case{"qwen_at0", 64, 14, 2, 0, 1, 0, false, false}, Case{"qwen_at63", 64, 14, 2, 63, 1, 0, false, false},
        Case{"qwen_at64", 64, 14, 2, 64, 1, 0, false, false}, Case{"qwen_at1000", 64, 14, 2, 1000, 1, 0, false, false},
        Case{"qwen_at16383", 64, 14, 2, 16383, 1, 0, false, false},
        Case{"qwen_window100_at300", 64, 14, 2, 300, 1, 100, false, false},
        // gpt-oss: 8 per KV head, sinks, FP32 cache (and FP16), full and
        // 128-key window layers.
        Case{"gptoss_f32_at5", 64, 64, 8, 5, 1, 0, true, true},
        Case{"gptoss_f32_at5000", 64, 64, 8, 5000, 1, 0, true, true},
        Case{"gptoss_f32_at16383", 64, 64, 8, 16383, 1, 0, true, true},
        Case{"gptoss_f32_window_at700", 64, 64, 8, 700, 1, 128, true, true},
        Case{"gptoss_f16_at3000", 64, 64, 8, 3000, 1, 0, false, true},
        // Head dims 96 and 128 (GQA 4), and a group of 16.
        Case{"hd96_group4_at777", 96, 32, 8, 777, 1, 0, false, false},
        Case{"hd128_group4_at4095", 128, 32, 8, 4095, 1, 0, false, false},
        Case{"hd64_group16_at300", 64, 32, 2, 300, 1, 0, false, false}),
    case_name);

// A batched step's rows through block tables (the paged form): rows of
// three sequences at several positions, against attention_paged (FP32
// math) on the same pools; with gpt-oss's sinks and window, and Qwen's
// shape; split over the keys and not.
TEST(DecodeGroupAttention, PagedRowsMatchThePagedKernel) {
    REQUIRE_GPU();
    struct Shape {
        int hd, H, KV, window;
        bool sinks;
    };
    for (const Shape sh : {Shape{64, 64, 8, 0, true}, Shape{64, 64, 8, 128, true}, Shape{64, 14, 2, 0, false},
                           Shape{128, 32, 8, 0, false}}) {
        constexpr int B = ehcuda::kPagedBlockTokens;
        const int lens[] = {40, 300, 1000};
        std::mt19937 rng(uint32_t(sh.H + sh.window));
        std::normal_distribution<float> nd(0.0f, 1.5f);
        const size_t row = size_t(sh.KV) * sh.hd;
        // Blocks of the three sequences, shuffled over the pool.
        int nblk = 0;
        for (int l : lens) nblk += (l + B - 1) / B;
        std::vector<int32_t> ids(size_t(nblk) + 5);
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), rng);
        std::vector<__half> kp(ids.size() * B * row), vp(kp.size());
        for (auto& x : kp) x = __float2half(nd(rng));
        for (auto& x : vp) x = __float2half(nd(rng));
        std::vector<int32_t> table_at, pos;
        int first = 0;
        for (int si = 0; si < 3; ++si) {
            for (int p : {0, lens[si] / 3, lens[si] - 2, lens[si] - 1}) {
                table_at.push_back(first);
                pos.push_back(p);
            }
            first += (lens[si] + B - 1) / B;
        }
        const int rows = int(pos.size());
        std::vector<float> q(size_t(rows) * (sh.H + 2 * sh.KV) * sh.hd), sinks(size_t(sh.H));
        for (auto& x : q) x = nd(rng);
        for (auto& x : sinks) x = nd(rng) + 2.0f;
        const ehcuda::DeviceBuffer dk = to_device(kp), dv = to_device(vp), dtab = to_device(ids), dq = to_device(q),
                                   dpos = to_device(pos), dat = to_device(table_at), dsinks = to_device(sinks);
        ehcuda::DeviceBuffer out_ref(size_t(rows) * sh.H * sh.hd * 4), out(out_ref.size());
        ehcuda::PagedAttnArgs a;
        a.q = dq.as<float>();
        a.ldq = (sh.H + 2 * sh.KV) * sh.hd;
        a.k_pool = dk.as<__half>();
        a.v_pool = dv.as<__half>();
        a.n_head = sh.H;
        a.n_kv = sh.KV;
        a.head_dim = sh.hd;
        a.ntok = rows;
        a.d_pos = dpos.as<int32_t>();
        a.d_table = dat.as<int32_t>();
        a.tables = dtab.as<int32_t>();
        a.window = sh.window;
        a.scale = 1.0f / std::sqrt(float(sh.hd));
        a.sinks = sh.sinks ? dsinks.as<float>() : nullptr;
        a.ldo = sh.H * sh.hd;
        a.out = out_ref.as<float>();
        ehcuda::attention_paged(a, nullptr);
        GPU_OK(cudaGetLastError());
        const auto ref = to_host<float>(out_ref, size_t(rows) * sh.H * sh.hd);
        ASSERT_TRUE(ehcuda::attention_decode_group_takes(a));
        const int nsplit = ehcuda::attention_decode_group_splits(ehcuda::kAttentionGroupMaxSplits, sh.KV, rows);
        ehcuda::DeviceBuffer scratch(size_t(rows) * sh.H * nsplit * (sh.hd + 2) * 4);
        a.out = out.as<float>();
        for (const int splits : {1, nsplit}) {
            GPU_OK(cudaMemset(out.get(), 0xff, out.size()));  // NaN
            ehcuda::attention_decode_group(a, scratch.as<float>(), splits, nullptr);
            GPU_OK(cudaGetLastError());
            const auto got = to_host<float>(out, ref.size());
            double num = 0, den = 0;
            size_t nans = 0;
            for (size_t e = 0; e < ref.size(); ++e) {
                nans += std::isnan(got[e]) ? 1 : 0;
                num += double(got[e] - ref[e]) * (got[e] - ref[e]);
                den += double(ref[e]) * ref[e];
            }
            EXPECT_EQ(nans, 0u) << "head dim " << sh.hd << ", " << splits << " split(s)";
            EXPECT_LT(std::sqrt(num / den), 2e-3) << "head dim " << sh.hd << ", window " << sh.window << ", " << splits
                                                   << " split(s)";
        }
    }
}

TEST(DecodeGroupAttentionPlan, TakesOnlyWhatItServes) {
    REQUIRE_GPU();
    Case c{"", 64, 14, 2, 10, 1, 0, false, false};
    const Inputs in = make_inputs(c, 1);
    OnDevice d(c, in);
    EXPECT_TRUE(ehcuda::attention_decode_group_takes(d.a));
    ehcuda::AttnArgs a = d.a;
    a.ntok = 2;
    EXPECT_FALSE(ehcuda::attention_decode_group_takes(a)) << "one token only";
    a = d.a;
    a.n_kv = a.n_head;
    EXPECT_FALSE(ehcuda::attention_decode_group_takes(a)) << "no GQA: the fused kernel reads each key once already";
    a = d.a;
    a.head_dim = 256;
    EXPECT_FALSE(ehcuda::attention_decode_group_takes(a));
    a = d.a;
    int32_t table = 0;
    a.kv_table = &table;
    EXPECT_FALSE(ehcuda::attention_decode_group_takes(a)) << "contiguous caches only";
    EXPECT_THROW(ehcuda::attention_decode_group(a, nullptr, 1, nullptr), ehp::Error);
    EXPECT_THROW(ehcuda::attention_decode_group(d.a, nullptr, 2, nullptr), ehp::Error) << "splits need scratch";
    EXPECT_LE(ehcuda::attention_decode_group_splits(1000, 1), ehcuda::kAttentionGroupMaxSplits);
    EXPECT_EQ(ehcuda::attention_decode_group_splits(4, 2), 4) << "never more than the caller's scratch holds";
}

// Rates, not assertions (run with --gtest_also_run_disabled_tests): one
// decode token's attention at depth, query-group kernel, as the fraction of
// the cache bytes it reads per second. CUDA events, median of 20.
TEST(DecodeGroupAttentionBench, DISABLED_CacheReadRate) {
    REQUIRE_GPU();
    const Case shapes[] = {
        {"qwen at 16383", 64, 14, 2, 16383, 1, 0, false, false},
        {"qwen at 4095", 64, 14, 2, 4095, 1, 0, false, false},
        {"gpt-oss f32 at 16383", 64, 64, 8, 16383, 1, 0, true, true},
        {"gpt-oss f16 at 16383", 64, 64, 8, 16383, 1, 0, false, true},
    };
    for (const Case& b : shapes) {
        const Inputs in = make_inputs(b, 5);
        OnDevice d(b, in);
        const int nsplit = ehcuda::attention_decode_group_splits(ehcuda::kAttentionGroupMaxSplits, b.KV);
        ehcuda::DeviceBuffer scratch(size_t(b.H) * nsplit * (b.hd + 2) * 4);
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        std::vector<float> ms;
        for (int i = 0; i < 23; ++i) {
            cudaEventRecord(e0);
            ehcuda::attention_decode_group(d.a, scratch.as<float>(), nsplit, nullptr);
            cudaEventRecord(e1);
            cudaEventSynchronize(e1);
            float x = 0;
            cudaEventElapsedTime(&x, e0, e1);
            if (i >= 3) ms.push_back(x);
        }
        GPU_OK(cudaGetLastError());
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        std::sort(ms.begin(), ms.end());
        const double t = ms[ms.size() / 2];
        const double bytes = 2.0 * (b.pos0 + 1) * b.KV * b.hd * (b.f32_cache ? 4 : 2);
        std::printf("[bench] group decode %-24s splits %3d: %7.1f us, %6.0f GB/s of cache\n", b.name, nsplit, t * 1e3,
                    bytes / t * 1e-6);
    }
}

// Rates, not assertions (run with --gtest_also_run_disabled_tests): one
// prefill chunk's attention at the depths the 4k/16k benchmarks reach, as
// TFLOP/s of causal attention work (4 * head_dim flops per query, key and
// head), tensor-core kernel beside the CUDA-core one. CUDA events, median
// of 20 after 3 warm-up runs.
TEST(PrefillAttentionBench, DISABLED_TensorCoreRate) {
    REQUIRE_GPU();
    const Case shapes[] = {
        {"qwen 4096 in one call", 64, 14, 2, 0, 4096, 0, false, false},
        {"qwen chunk 256 at 3840", 64, 14, 2, 3840, 256, 0, false, false},
        {"qwen chunk 256 at 16128", 64, 14, 2, 16128, 256, 0, false, false},
        {"phi3 chunk 256 at 3840", 96, 32, 32, 3840, 256, 0, false, false},
        {"hd128 chunk 256 at 16128", 128, 32, 8, 16128, 256, 0, false, false},
        {"gpt-oss f32 chunk 512 at 15872", 64, 64, 8, 15872, 512, 0, true, true},
        {"gpt-oss f32 window 128, chunk 512", 64, 64, 8, 15872, 512, 128, true, true},
        {"gpt-oss f16 chunk 512 at 15872", 64, 64, 8, 15872, 512, 0, false, true},
    };
    for (const Case& b : shapes) {
        const Inputs in = make_inputs(b, 5);
        OnDevice d(b, in);
        const ehcuda::AttnArgs& a = d.a;
        const size_t sf = ehcuda::attention_prefill_scratch_floats(b.hd);
        ehcuda::DeviceBuffer scratch(sf * 4);
        const ehcuda::AttnSplitScratch sp{scratch.as<float>(), sf};
        double keys = 0;  // attended (query, key) pairs per head
        for (int t = 0; t < b.ntok; ++t) {
            const int qp = b.pos0 + t;
            keys += b.window > 0 ? std::min(qp + 1, b.window) : qp + 1;
        }
        const double flops = 4.0 * b.hd * b.H * keys;
        auto time_ms = [&](auto&& f) {
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0);
            cudaEventCreate(&e1);
            for (int i = 0; i < 3; ++i) f();
            std::vector<float> ms;
            for (int i = 0; i < 20; ++i) {
                cudaEventRecord(e0);
                f();
                cudaEventRecord(e1);
                cudaEventSynchronize(e1);
                float x = 0;
                cudaEventElapsedTime(&x, e0, e1);
                ms.push_back(x);
            }
            cudaEventDestroy(e0);
            cudaEventDestroy(e1);
            std::sort(ms.begin(), ms.end());
            return double(ms[ms.size() / 2]);
        };
        const double t_mma = time_ms([&] { ehcuda::attention_prefill(a, sp, nullptr); });
        GPU_OK(cudaGetLastError());
        const double t_simt = time_ms([&] { ehcuda::attention_prefill_simt(a, nullptr); });
        GPU_OK(cudaGetLastError());
        std::printf("[bench] %-36s splits %2d  tensor cores %8.3f ms %6.1f TFLOP/s | cuda cores %8.3f ms %6.1f TFLOP/s\n",
                    b.name, ehcuda::attention_prefill_splits(b.ntok, b.H, sf, b.hd), t_mma, flops / t_mma * 1e-9,
                    t_simt, flops / t_simt * 1e-9);
    }
}

}  // namespace
}  // namespace ehtest

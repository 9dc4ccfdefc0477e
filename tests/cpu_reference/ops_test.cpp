// Numeric building blocks against their formulas written out directly.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops.hpp"

using namespace cpuref;

namespace {

std::vector<float> ramp(size_t n, float a, float b) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = a + b * static_cast<float>(i);
    return v;
}

// NeoX RoPE over 64 dimensions with YaRN scaling.
RopeConfig yarn_neox64(float freq_base, float factor, uint32_t orig_ctx, bool truncate) {
    return {.style = RopeStyle::Neox, .n_rot = 64, .freq_base = freq_base, .yarn = true, .yarn_factor = factor,
            .yarn_orig_ctx = orig_ctx, .yarn_truncate = truncate, .freq_factors = {}};
}

}  // namespace

TEST(Rope, NormalRotatesAdjacentPairs) {
    RopeConfig cfg;
    cfg.style = RopeStyle::Normal;
    cfg.n_rot = 8;
    cfg.freq_base = 10000.0f;
    const RopeTables t = make_rope_tables(cfg);
    std::vector<float> x = ramp(10, 0.3f, 0.7f), y = x;  // head_dim 10, last 2 not rotated
    const int pos = 5;
    std::vector<float> c(4), s(4);
    rope_cos_sin(t, pos, c.data(), s.data());
    rope_apply(t, c.data(), s.data(), y.data());
    for (int i = 0; i < 4; ++i) {
        const double th = pos * std::pow(10000.0, -2.0 * i / 8);
        EXPECT_NEAR(y[2 * i], x[2 * i] * std::cos(th) - x[2 * i + 1] * std::sin(th), 1e-5);
        EXPECT_NEAR(y[2 * i + 1], x[2 * i] * std::sin(th) + x[2 * i + 1] * std::cos(th), 1e-5);
    }
    EXPECT_EQ(y[8], x[8]);
    EXPECT_EQ(y[9], x[9]);
}

TEST(Rope, NeoxRotatesHalves) {
    RopeConfig cfg;
    cfg.style = RopeStyle::Neox;
    cfg.n_rot = 8;
    cfg.freq_base = 500.0f;
    const RopeTables t = make_rope_tables(cfg);
    std::vector<float> x = ramp(8, -1.0f, 0.37f), y = x;
    const int pos = 11;
    std::vector<float> c(4), s(4);
    rope_cos_sin(t, pos, c.data(), s.data());
    rope_apply(t, c.data(), s.data(), y.data());
    for (int i = 0; i < 4; ++i) {
        const double th = pos * std::pow(500.0, -2.0 * i / 8);
        EXPECT_NEAR(y[i], x[i] * std::cos(th) - x[i + 4] * std::sin(th), 1e-5);
        EXPECT_NEAR(y[i + 4], x[i + 4] * std::cos(th) + x[i] * std::sin(th), 1e-5);
    }
}

TEST(Rope, GgufPermutationMakesNormalEqualNeox) {
    // The llama GGUF converter reorders each head's rows so that pair
    // (2i, 2i+1) holds HF's (i, i + d/2). Normal rope on the permuted vector
    // equals Neox rope on the original, permuted the same way.
    RopeConfig cfg;
    cfg.n_rot = 8;
    cfg.style = RopeStyle::Normal;
    const RopeTables tn = make_rope_tables(cfg);
    cfg.style = RopeStyle::Neox;
    const RopeTables tx = make_rope_tables(cfg);
    std::vector<float> hf = ramp(8, 0.5f, -0.3f), gguf(8);
    for (int i = 0; i < 4; ++i) {
        gguf[2 * i] = hf[i];
        gguf[2 * i + 1] = hf[i + 4];
    }
    std::vector<float> c(4), s(4);
    rope_cos_sin(tn, 7, c.data(), s.data());
    rope_apply(tn, c.data(), s.data(), gguf.data());
    rope_apply(tx, c.data(), s.data(), hf.data());
    for (int i = 0; i < 4; ++i) {
        EXPECT_NEAR(gguf[2 * i], hf[i], 1e-6);
        EXPECT_NEAR(gguf[2 * i + 1], hf[i + 4], 1e-6);
    }
}

TEST(Rope, YarnBlendsInterpolationAndExtrapolation) {
    const RopeTables t = make_rope_tables(yarn_neox64(150000.0f, 32.0f, 4096, false));
    // correction range from the YaRN definition: dim index whose wavelength
    // turns `r` times over the original context
    auto corr = [](double r) { return 64 * std::log(4096 / (r * 2 * M_PI)) / (2 * std::log(150000.0)); };
    const double low = corr(32.0), high = corr(1.0);
    for (int i = 0; i < 32; ++i) {
        const double f = std::pow(150000.0, -2.0 * i / 64);
        const double ramp_v = std::min(1.0, std::max(0.0, (i - low) / (high - low)));
        const double expect = f / 32.0 * ramp_v + f * (1.0 - ramp_v);
        EXPECT_NEAR(t.inv_freq[static_cast<size_t>(i)], expect, 1e-6 * f + 1e-12) << i;
        if (i < low) {
            EXPECT_NEAR(t.inv_freq[static_cast<size_t>(i)], f, 1e-6 * f);  // high frequency kept
        }
        if (i > high) {
            EXPECT_NEAR(t.inv_freq[static_cast<size_t>(i)], f / 32, 1e-6 * f);  // low frequency interpolated
        }
    }
    EXPECT_NEAR(t.attn_factor, 0.1 * std::log(32.0) + 1.0, 1e-6);
    // cos/sin carry the attention factor
    std::vector<float> c(32), s(32);
    rope_cos_sin(t, 0, c.data(), s.data());
    EXPECT_NEAR(c[0], t.attn_factor, 1e-6);
}

TEST(Rope, YarnTruncateRoundsCorrectionRange) {
    RopeConfig cfg = yarn_neox64(10000.0f, 4.0f, 2048, true);
    const RopeTables a = make_rope_tables(cfg);
    cfg.yarn_truncate = false;
    const RopeTables b = make_rope_tables(cfg);
    bool differs = false;
    for (size_t i = 0; i < 32; ++i) differs |= std::fabs(a.inv_freq[i] - b.inv_freq[i]) > 1e-9f;
    EXPECT_TRUE(differs);
}

TEST(Attention, SinkAddsToDenominator) {
    // two keys, head_dim 2
    const float q[2] = {1.0f, 0.0f};
    const float k[4] = {1.0f, 0.0f, 0.0f, 1.0f};
    const float v[4] = {10.0f, 0.0f, 0.0f, 20.0f};
    float scores[2], out[2];
    const float sink = 0.5f, scale = 1.0f;
    attend_one(q, k, v, 2, 2, 0, 1, scale, &sink, scores, out);
    const double e0 = std::exp(1.0), e1 = std::exp(0.0), es = std::exp(0.5);
    const double den = e0 + e1 + es;
    EXPECT_NEAR(out[0], 10.0 * e0 / den, 1e-5);
    EXPECT_NEAR(out[1], 20.0 * e1 / den, 1e-5);
    // without the sink the weights sum to one
    attend_one(q, k, v, 2, 2, 0, 1, scale, nullptr, scores, out);
    EXPECT_NEAR(out[0], 10.0 * e0 / (e0 + e1), 1e-5);
}

TEST(Attention, SlidingWindowLimitsKeys) {
    EXPECT_EQ(window_start(10, 0), 0);
    EXPECT_EQ(window_start(10, 4), 7);  // keys 7, 8, 9, 10
    EXPECT_EQ(window_start(2, 4), 0);
    EXPECT_EQ(window_start(127, 128), 0);
    EXPECT_EQ(window_start(128, 128), 1);
    // a key outside the window has no effect
    const float q[1] = {1.0f};
    float k[5] = {9.0f, 1.0f, 2.0f, 3.0f, 4.0f}, v[5] = {100.0f, 1.0f, 2.0f, 3.0f, 4.0f};
    float sc[5], a[1], b[1];
    attend_one(q, k, v, 1, 1, window_start(4, 4), 4, 1.0f, nullptr, sc, a);
    k[0] = -5.0f;
    v[0] = -100.0f;
    attend_one(q, k, v, 1, 1, window_start(4, 4), 4, 1.0f, nullptr, sc, b);
    EXPECT_EQ(a[0], b[0]);
}

TEST(Moe, TopKThenSoftmaxOverSelected) {
    const float logits[6] = {0.1f, 2.0f, -1.0f, 1.5f, 2.0f, 0.0f};
    auto r = route_top_k(logits, 6, 3);
    ASSERT_EQ(r.size(), 3u);
    EXPECT_EQ(r[0].first, 1);  // tie with 4: lower index first
    EXPECT_EQ(r[1].first, 4);
    EXPECT_EQ(r[2].first, 3);
    const double den = 2 * std::exp(2.0) + std::exp(1.5);
    EXPECT_NEAR(r[0].second, std::exp(2.0) / den, 1e-6);
    EXPECT_NEAR(r[2].second, std::exp(1.5) / den, 1e-6);
    EXPECT_NEAR(r[0].second + r[1].second + r[2].second, 1.0, 1e-6);
}

TEST(Activations, ClampedSwiGlu) {
    const float alpha = 1.702f, limit = 7.0f;
    auto ref = [&](double g, double u) {
        g = std::min(g, 7.0);
        u = std::max(-7.0, std::min(u, 7.0));
        return (u + 1.0) * g / (1.0 + std::exp(-alpha * g));
    };
    for (float g : {-3.0f, 0.0f, 0.5f, 6.9f, 9.0f})
        for (float u : {-8.0f, -1.0f, 0.0f, 2.0f, 10.0f})
            EXPECT_NEAR(swiglu_oai(g, u, alpha, limit), ref(g, u), 1e-5) << g << " " << u;
    EXPECT_NEAR(silu(1.0f), 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
    EXPECT_NEAR(gelu_tanh(1.0f), 0.8411920f, 1e-6);
}

TEST(Norms, RmsAndLayerNorm) {
    const float x[4] = {1, 2, 3, 4}, w[4] = {1, 1, 2, 0.5f}, b[4] = {0, 1, 0, -1};
    float out[4];
    rms_norm(x, w, 1e-5f, 4, out);
    const double r = std::sqrt((1 + 4 + 9 + 16) / 4.0 + 1e-5);
    EXPECT_NEAR(out[2], 3 / r * 2, 1e-5);
    layer_norm(x, w, b, 1e-5f, 4, out);
    const double sd = std::sqrt(1.25 + 1e-5);
    EXPECT_NEAR(out[1], (2 - 2.5) / sd + 1, 1e-5);
    EXPECT_NEAR(out[3], (4 - 2.5) / sd * 0.5 - 1, 1e-5);
}

// Block layouts checked against blocks built by hand from the format
// definitions, and quantize -> dequantize round trips within each type's bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <engine_host/quant_blocks.hpp>

using namespace ehp::quant;

namespace {

uint16_t h(float f) { return fp32_to_fp16(f); }

std::vector<float> deq(uint32_t type, const void* block, size_t n) {
    std::vector<float> out(n);
    EXPECT_TRUE(dequantize_row(type, block, out.data(), n));
    return out;
}

}  // namespace

TEST(Fp16, ExactValuesAndRounding) {
    EXPECT_EQ(fp32_to_fp16(1.0f), 0x3C00);
    EXPECT_EQ(fp32_to_fp16(-2.0f), 0xC000);
    EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7BFF);
    EXPECT_EQ(fp32_to_fp16(1e6f), 0x7C00);              // overflow -> inf
    EXPECT_EQ(fp32_to_fp16(5.9604645e-8f), 0x0001);      // smallest subnormal
    EXPECT_EQ(fp32_to_fp16(1.0f + 1.0f / 2048), 0x3C00); // tie rounds to even
    EXPECT_EQ(fp32_to_fp16(1.0f + 3.0f / 2048), 0x3C02); // tie rounds to even (up)
    EXPECT_FLOAT_EQ(fp16_to_fp32(0x3555), 0.33325195f);
    EXPECT_FLOAT_EQ(fp16_to_fp32(0x0001), 5.9604645e-8f);
    EXPECT_TRUE(std::isinf(fp16_to_fp32(0x7C00)));
    for (uint32_t v = 0; v < 0x7C00; ++v)  // every finite half survives a round trip
        ASSERT_EQ(fp32_to_fp16(fp16_to_fp32(static_cast<uint16_t>(v))), v);
}

// OCP FP8 E4M3, the KV cache's FP8 (EH_TYPE_FP8_E4M3).
TEST(Fp8E4M3, ExactValuesRoundingAndSaturation) {
    EXPECT_EQ(fp32_to_e4m3(1.0f), 0x38);           // exponent 7 (bias), mantissa 0
    EXPECT_EQ(fp32_to_e4m3(-2.0f), 0xC0);
    EXPECT_EQ(fp32_to_e4m3(448.0f), 0x7E);         // largest finite
    EXPECT_EQ(fp32_to_e4m3(1e6f), 0x7E);           // saturates, never NaN
    EXPECT_EQ(fp32_to_e4m3(-1e6f), 0xFE);
    EXPECT_EQ(fp32_to_e4m3(0.015625f), 0x08);      // smallest normal, 2^-6
    EXPECT_EQ(fp32_to_e4m3(0.001953125f), 0x01);   // smallest subnormal, 2^-9
    EXPECT_EQ(fp32_to_e4m3(0.0009765625f), 0x00);  // half of it: tie to even (0)
    EXPECT_EQ(fp32_to_e4m3(1.0625f), 0x38);        // between 1 and 1.125: tie to even
    EXPECT_EQ(fp32_to_e4m3(1.1875f), 0x3A);        // between 1.125 and 1.25: tie to even (up)
    EXPECT_EQ(fp32_to_e4m3(1.96875f), 0x40);       // mantissa rounds up into the next exponent (2.0)
    EXPECT_EQ(fp32_to_e4m3(NAN), 0x7F);
    EXPECT_TRUE(std::isnan(e4m3_to_fp32(0x7F)));
    EXPECT_TRUE(std::isnan(e4m3_to_fp32(0xFF)));
    EXPECT_FLOAT_EQ(e4m3_to_fp32(0x7E), 448.0f);
    EXPECT_FLOAT_EQ(e4m3_to_fp32(0x01), 0.001953125f);
    EXPECT_FLOAT_EQ(e4m3_to_fp32(0xB9), -1.125f);
    for (uint32_t c = 0; c < 256; ++c) {  // every finite code survives a round trip
        if ((c & 0x7F) == 0x7F) continue;
        ASSERT_EQ(fp32_to_e4m3(e4m3_to_fp32(static_cast<uint8_t>(c))), c) << c;
    }
}

TEST(Fp8E4M3, BlockRoundTripWithinItsBound) {
    std::mt19937 rng(7);
    std::normal_distribution<float> dist(0.0f, 3.0f);
    std::vector<float> x(64);
    for (float& v : x) v = dist(rng);
    x[5] = 40.0f;  // an outlier sets its block's scale
    std::vector<uint8_t> q(row_bytes(EH_TYPE_FP8_E4M3, 64));
    ASSERT_EQ(q.size(), 68u);
    ASSERT_TRUE(quantize_row(EH_TYPE_FP8_E4M3, x.data(), q.data(), 64));
    const std::vector<float> y = deq(EH_TYPE_FP8_E4M3, q.data(), 64);
    EXPECT_NEAR(y[5], 40.0f, 40.0f / 1024);  // the block's largest maps onto 448 (times the f16-rounded scale)
    for (size_t i = 0; i < 64; ++i) {
        // 3 mantissa bits: within 1/16 of the value, or of the subnormal step
        const float amax = i < 32 ? 40.0f : *std::max_element(x.begin() + 32, x.end(), [](float a, float b) {
            return std::fabs(a) < std::fabs(b);
        });
        const float step = std::fabs(amax) / 448.0f * 0.001953125f;
        EXPECT_LE(std::fabs(y[i] - x[i]), std::fabs(x[i]) / 16.0f + step + 1e-6f) << i;
    }
}

TEST(Bf16, Conversions) {
    EXPECT_EQ(fp32_to_bf16(1.0f), 0x3F80);
    EXPECT_FLOAT_EQ(bf16_to_fp32(0x4049), 3.140625f);
    EXPECT_EQ(fp32_to_bf16(bits_to_float(0x3F808000u)), 0x3F80);  // tie to even
    EXPECT_EQ(fp32_to_bf16(bits_to_float(0x3F818000u)), 0x3F82);
}

TEST(Dequant, Q4_0) {
    block_q4_0 b{};
    b.d = h(0.5f);
    for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    auto y = deq(EH_TYPE_Q4_0, &b, 32);
    for (int j = 0; j < 16; ++j) {
        EXPECT_FLOAT_EQ(y[j], (j - 8) * 0.5f);
        EXPECT_FLOAT_EQ(y[j + 16], (15 - j - 8) * 0.5f);
    }
}

TEST(Dequant, Q4_1) {
    block_q4_1 b{};
    b.d = h(0.25f);
    b.m = h(-1.0f);
    for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | (3 << 4));
    auto y = deq(EH_TYPE_Q4_1, &b, 32);
    for (int j = 0; j < 16; ++j) {
        EXPECT_FLOAT_EQ(y[j], j * 0.25f - 1.0f);
        EXPECT_FLOAT_EQ(y[j + 16], 3 * 0.25f - 1.0f);
    }
}

TEST(Dequant, Q5_0HighBitsFromQh) {
    block_q5_0 b{};
    b.d = h(2.0f);
    // value 0: low 0xF, high bit set -> 31 - 16 = 15; value 16: low 0, high bit set -> 0;
    // value 5: low 3, no high bit -> -13; value 21: low 1, high bit set -> 1
    b.qs[0] = 0x0F;
    b.qs[5] = 0x13;
    const uint32_t qh = (1u << 0) | (1u << 16) | (1u << 21);
    std::memcpy(b.qh, &qh, 4);
    auto y = deq(EH_TYPE_Q5_0, &b, 32);
    EXPECT_FLOAT_EQ(y[0], 15 * 2.0f);
    EXPECT_FLOAT_EQ(y[16], 0.0f);
    EXPECT_FLOAT_EQ(y[5], -13 * 2.0f);
    EXPECT_FLOAT_EQ(y[21], 1 * 2.0f);
    EXPECT_FLOAT_EQ(y[1], -16 * 2.0f);  // all zero bits -> -16
}

TEST(Dequant, Q5_1) {
    block_q5_1 b{};
    b.d = h(0.5f);
    b.m = h(3.0f);
    b.qs[2] = 0xA7;  // value 2: 7, value 18: 10
    const uint32_t qh = (1u << 18);  // value 18 gets +16
    std::memcpy(b.qh, &qh, 4);
    auto y = deq(EH_TYPE_Q5_1, &b, 32);
    EXPECT_FLOAT_EQ(y[2], 7 * 0.5f + 3.0f);
    EXPECT_FLOAT_EQ(y[18], 26 * 0.5f + 3.0f);
    EXPECT_FLOAT_EQ(y[0], 3.0f);
}

TEST(Dequant, Q8_0) {
    block_q8_0 b{};
    b.d = h(0.125f);
    for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<int8_t>(j * 8 - 128);
    auto y = deq(EH_TYPE_Q8_0, &b, 32);
    for (int j = 0; j < 32; ++j) EXPECT_FLOAT_EQ(y[j], (j * 8 - 128) * 0.125f);
}

TEST(Dequant, Q4_KScalesMinsAndNibbles) {
    block_q4_K b{};
    b.d = h(0.5f);
    b.dmin = h(0.25f);
    // sub-block s: scale = s + 1 (s < 4) or 40 + s (s >= 4, needs the high
    // bits); min = 2s (s < 4) or 50 + s
    uint8_t sc[8], mn[8];
    for (int s = 0; s < 8; ++s) {
        sc[s] = static_cast<uint8_t>(s < 4 ? s + 1 : 40 + s);
        mn[s] = static_cast<uint8_t>(s < 4 ? 2 * s : 50 + s);
    }
    // packing written out by the definition
    for (int j = 0; j < 4; ++j) {
        b.scales[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
        b.scales[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
        b.scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
    }
    // value i gets q = i % 16; sub-blocks 2c (low nibble) and 2c+1 (high)
    for (int c = 0; c < 4; ++c)
        for (int l = 0; l < 32; ++l) {
            const int lo = (64 * c + l) % 16, hi = (64 * c + 32 + l) % 16;
            b.qs[32 * c + l] = static_cast<uint8_t>(lo | (hi << 4));
        }
    auto y = deq(EH_TYPE_Q4_K, &b, 256);
    for (int i = 0; i < 256; ++i) {
        const int s = i / 32;
        EXPECT_FLOAT_EQ(y[i], 0.5f * sc[s] * (i % 16) - 0.25f * mn[s]) << "i=" << i;
    }
}

TEST(Dequant, Q5_KHighBitPlanes) {
    block_q5_K b{};
    b.d = h(1.0f);
    b.dmin = h(1.0f);
    uint8_t sc[8], mn[8];
    for (int s = 0; s < 8; ++s) { sc[s] = 1; mn[s] = 0; }
    pack_k_scale_min(sc, mn, b.scales);
    // value i gets q = i % 32: low 4 bits in qs, bit 4 in qh[l] bit (sub-block index)
    for (int c = 0; c < 4; ++c)
        for (int l = 0; l < 32; ++l) {
            const int lo = (64 * c + l) % 32, hi = (64 * c + 32 + l) % 32;
            b.qs[32 * c + l] = static_cast<uint8_t>((lo & 15) | ((hi & 15) << 4));
            b.qh[l] = static_cast<uint8_t>(b.qh[l] | ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
        }
    auto y = deq(EH_TYPE_Q5_K, &b, 256);
    for (int i = 0; i < 256; ++i) EXPECT_FLOAT_EQ(y[i], static_cast<float>(i % 32)) << "i=" << i;
}

TEST(Dequant, Q6_KLayout) {
    block_q6_K b{};
    b.d = h(0.5f);
    for (int s = 0; s < 16; ++s) b.scales[s] = static_cast<int8_t>(s - 8);
    // value i gets q = i % 64 (stored), i.e. (i % 64) - 32 after the offset
    for (int hh = 0; hh < 2; ++hh)
        for (int k = 0; k < 4; ++k)
            for (int l = 0; l < 32; ++l) {
                const int i = 128 * hh + 32 * k + l;
                const int q = i % 64;
                uint8_t& lowbyte = b.ql[64 * hh + l + 32 * (k & 1)];
                lowbyte = static_cast<uint8_t>(lowbyte | (k < 2 ? (q & 15) : ((q & 15) << 4)));
                b.qh[32 * hh + l] = static_cast<uint8_t>(b.qh[32 * hh + l] | ((q >> 4) << (2 * k)));
            }
    auto y = deq(EH_TYPE_Q6_K, &b, 256);
    for (int i = 0; i < 256; ++i)
        EXPECT_FLOAT_EQ(y[i], 0.5f * (i / 16 - 8) * ((i % 64) - 32)) << "i=" << i;
}

// Q2_K / Q3_K: value i = 128h + 32k + l takes bits 2k..2k+1 of qs[32h + l]
// and sits in sub-block i / 16. Here every value's 2-bit code is (i / 32 + l) % 4.
namespace {
int code2(int i) { return (i / 32 + i % 32) % 4; }
template <class B>
void pack_2bit_codes(B& b) {
    for (int i = 0; i < 256; ++i) {
        const int hh = i / 128, k = (i % 128) / 32, l = i % 32;
        b.qs[32 * hh + l] = static_cast<uint8_t>(b.qs[32 * hh + l] | (code2(i) << (2 * k)));
    }
}
}  // namespace

TEST(Dequant, Q2_KScaleMinNibblesAndCodes) {
    block_q2_K b{};
    b.d = h(0.5f);
    b.dmin = h(0.25f);
    for (int s = 0; s < 16; ++s) b.scales[s] = static_cast<uint8_t>((s % 16) | ((15 - s) << 4));  // scale s, min 15-s
    pack_2bit_codes(b);
    auto y = deq(EH_TYPE_Q2_K, &b, 256);
    for (int i = 0; i < 256; ++i) {
        const int sub = i / 16;
        EXPECT_FLOAT_EQ(y[i], 0.5f * sub * code2(i) - 0.25f * (15 - sub)) << "i=" << i;
    }
}

TEST(Dequant, Q3_KSixBitScalesAndHighBitMask) {
    block_q3_K b{};
    b.d = h(0.5f);
    // sub-block s has the 6-bit scale 4s + 1 (stored with the +32 offset removed on read)
    auto stored = [](int s) { return 4 * s + 1; };
    for (int s = 0; s < 16; ++s) {
        const int v = stored(s);
        if (s < 8) b.scales[s] = static_cast<uint8_t>(b.scales[s] | (v & 15));
        else b.scales[s - 8] = static_cast<uint8_t>(b.scales[s - 8] | ((v & 15) << 4));
        b.scales[8 + s % 4] = static_cast<uint8_t>(b.scales[8 + s % 4] | (((v >> 4) & 3) << (2 * (s / 4))));
    }
    pack_2bit_codes(b);
    // the high bit is set (no -4) for odd l
    for (int i = 0; i < 256; ++i) {
        const int hh = i / 128, k = (i % 128) / 32, l = i % 32;
        if (l % 2) b.hmask[l] = static_cast<uint8_t>(b.hmask[l] | (1 << (4 * hh + k)));
    }
    auto y = deq(EH_TYPE_Q3_K, &b, 256);
    for (int i = 0; i < 256; ++i) {
        const int q = code2(i) - ((i % 32) % 2 ? 0 : 4);
        EXPECT_FLOAT_EQ(y[i], 0.5f * (stored(i / 16) - 32) * q) << "i=" << i;
    }
}

TEST(Dequant, Iq4NlLevels) {
    const float levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    block_iq4_nl b{};
    b.d = h(0.125f);
    for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    auto y = deq(EH_TYPE_IQ4_NL, &b, 32);
    for (int j = 0; j < 16; ++j) {
        EXPECT_FLOAT_EQ(y[j], 0.125f * levels[j]);
        EXPECT_FLOAT_EQ(y[j + 16], 0.125f * levels[15 - j]);
    }
}

TEST(Dequant, Iq4XsSixBitScalesPerSubBlock) {
    const float levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    block_iq4_xs b{};
    b.d = h(0.25f);
    // sub-block i: 6-bit scale 8i + 3 (low nibble in scales_l, high 2 bits in scales_h)
    for (int i = 0; i < 8; ++i) {
        const int v = 8 * i + 3;
        b.scales_l[i / 2] = static_cast<uint8_t>(b.scales_l[i / 2] | ((v & 15) << (4 * (i % 2))));
        b.scales_h = static_cast<uint16_t>(b.scales_h | (((v >> 4) & 3) << (2 * i)));
        for (int j = 0; j < 16; ++j) b.qs[16 * i + j] = static_cast<uint8_t>(((i + j) % 16) | (((i + 2 * j) % 16) << 4));
    }
    auto y = deq(EH_TYPE_IQ4_XS, &b, 256);
    for (int i = 0; i < 8; ++i)
        for (int j = 0; j < 16; ++j) {
            const float dl = 0.25f * (8 * i + 3 - 32);
            EXPECT_FLOAT_EQ(y[32 * i + j], dl * levels[(i + j) % 16]);
            EXPECT_FLOAT_EQ(y[32 * i + j + 16], dl * levels[(i + 2 * j) % 16]);
        }
}

TEST(Dequant, Mxfp4E2M1AndE8M0) {
    block_mxfp4 b{};
    b.e = 128;  // 2^1
    for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    auto y = deq(EH_TYPE_MXFP4, &b, 32);
    const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int j = 0; j < 16; ++j) {
        EXPECT_FLOAT_EQ(y[j], e2m1[j] * 2.0f);
        EXPECT_FLOAT_EQ(y[j + 16], e2m1[15 - j] * 2.0f);
    }
    b.e = 127 - 3;  // 2^-3
    b.qs[0] = 7;    // 6.0
    EXPECT_FLOAT_EQ(deq(EH_TYPE_MXFP4, &b, 32)[0], 6.0f / 8.0f);
    EXPECT_FLOAT_EQ(e8m0_to_fp32(0), std::ldexp(1.0f, -127));
}

// The E2M1 encoder against a nearest-magnitude search in double precision
// (ties to the smaller magnitude, NaN and infinities to 0; the float search
// it replaced also sent finite values past ~2^26 to 0, where the difference
// from 6 rounds away, which quantize_block never meets): at every midpoint and
// its float neighbours, on a fine sweep over [-8, 8], at zeros, subnormals,
// huge values and non-finite ones; and whole MXFP4 blocks against that
// search over x / scale, for scales from 2^-127 to 2^127.
static uint8_t e2m1_by_search(float v) {
    static const double mag[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
    if (!std::isfinite(v)) return 0;
    const double a = std::fabs(double(v));  // distances below 8 exact in double
    int best = 7;                           // 6 is the nearest from 6 on
    if (a < 6.0)
        for (int i = best = 0; i < 8; ++i)
            if (std::fabs(a - mag[i]) < std::fabs(a - mag[best])) best = i;
    return static_cast<uint8_t>(best | ((v < 0 && best != 0) ? 8 : 0));
}

TEST(Quant, E2m1EncoderIsTheNearestMagnitude) {
    std::vector<float> vs = {0.0f, -0.0f, 1e-45f, -1e-45f, 1e-38f, 5.0f, 6.0f, 7.0f, 1e30f, -1e30f, 3.4e38f,
                             INFINITY, -INFINITY, NAN, -NAN};
    for (float m : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f})
        for (float sgn : {1.0f, -1.0f}) {
            vs.push_back(sgn * m);
            vs.push_back(sgn * std::nextafter(m, 0.0f));
            vs.push_back(sgn * std::nextafter(m, 10.0f));
        }
    for (int i = -8192; i <= 8192; ++i) vs.push_back(float(i) / 1024.0f);
    for (float v : vs) EXPECT_EQ(fp32_to_e2m1(v), e2m1_by_search(v)) << v;
}

TEST(Quant, Mxfp4BlocksMatchTheSearchOverEveryScale) {
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    int blocks = 0;
    for (int e2 = -140; e2 <= 130; e2 += 3)
        for (int rep = 0; rep < 4; ++rep, ++blocks) {
            float x[32];
            for (float& v : x) v = std::ldexp(nd(rng), e2);
            if (rep == 3) x[7] = x[19] = 0.0f;
            block_mxfp4 b{};
            quantize_block(x, b);
            float amax = 0.0f;
            for (float v : x) amax = std::max(amax, std::fabs(v));
            int e = 0;
            if (amax > 0.0f) e = std::clamp(int(std::ceil(std::log2(amax / 6.0f))) + 127, 0, 254);
            ASSERT_EQ(b.e, e) << "2^" << e2;
            const float scale = e8m0_to_fp32(uint8_t(e));
            for (int j = 0; j < 16; ++j) {
                const uint8_t want = uint8_t(e2m1_by_search(x[j] / scale) | (e2m1_by_search(x[j + 16] / scale) << 4));
                ASSERT_EQ(b.qs[j], want) << "2^" << e2 << " j " << j;
            }
        }
    EXPECT_GT(blocks, 300);
}

TEST(Dequant, FloatTypes) {
    const uint16_t f16[2] = {0x3C00, 0xC200};
    auto y = deq(EH_TYPE_F16, f16, 2);
    EXPECT_FLOAT_EQ(y[0], 1.0f);
    EXPECT_FLOAT_EQ(y[1], -3.0f);
    const uint16_t bf[2] = {0x3F80, 0x4049};
    y = deq(EH_TYPE_BF16, bf, 2);
    EXPECT_FLOAT_EQ(y[1], 3.140625f);
    EXPECT_FALSE(dequantize_row(EH_TYPE_IQ2_XXS, bf, y.data(), 256));  // not supported here
    EXPECT_FALSE(dequantize_row(EH_TYPE_Q4_0, bf, y.data(), 31));   // not whole blocks
}

// Round trips: bound is a fraction of the block's value range, from the
// format's step size (with slack for f16 scales and 6-bit sub-block scales).
struct RoundTrip {
    uint32_t type;
    size_t n;
    double bound;  // max |error| / (max - min) of the block
};

class QuantRoundTrip : public ::testing::TestWithParam<RoundTrip> {};

TEST_P(QuantRoundTrip, WithinBound) {
    const RoundTrip rt = GetParam();
    std::mt19937 rng(1234);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int trial = 0; trial < 20; ++trial) {
        std::vector<float> x(rt.n);
        for (auto& v : x) v = nd(rng) * (trial + 1) * 0.1f + (trial % 3 == 0 ? 0.5f : 0.0f);
        std::vector<uint8_t> q(row_bytes(rt.type, rt.n));
        ASSERT_TRUE(quantize_row(rt.type, x.data(), q.data(), rt.n));
        std::vector<float> y(rt.n);
        ASSERT_TRUE(dequantize_row(rt.type, q.data(), y.data(), rt.n));
        // symmetric formats scale with the largest magnitude, affine ones
        // with the range: measure against the larger of the two
        const double lo = *std::min_element(x.begin(), x.end()), hi = *std::max_element(x.begin(), x.end());
        const double scale = std::max(hi - lo, std::max(std::fabs(lo), std::fabs(hi)));
        for (size_t i = 0; i < rt.n; ++i)
            ASSERT_LE(std::fabs(x[i] - y[i]), rt.bound * scale) << "type " << rt.type << " i=" << i;
    }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, QuantRoundTrip,
                         ::testing::Values(RoundTrip{EH_TYPE_F16, 256, 1e-3}, RoundTrip{EH_TYPE_BF16, 256, 4.5e-3},
                                           RoundTrip{EH_TYPE_Q8_0, 256, 1.0 / 200},   // d/2 = amax/254
                                           RoundTrip{EH_TYPE_Q4_0, 256, 0.13},        // d = amax/8 at the clamp
                                           RoundTrip{EH_TYPE_Q4_1, 256, 1.0 / 25},    // range/30
                                           RoundTrip{EH_TYPE_Q5_0, 256, 0.065},       // amax/16
                                           RoundTrip{EH_TYPE_Q5_1, 256, 1.0 / 50},    // range/62
                                           RoundTrip{EH_TYPE_Q4_K, 512, 1.0 / 14},
                                           RoundTrip{EH_TYPE_Q5_K, 512, 1.0 / 28},
                                           RoundTrip{EH_TYPE_Q6_K, 512, 1.0 / 45},    // amax/64 + scale rounding
                                           RoundTrip{EH_TYPE_MXFP4, 256, 0.34}));     // step 2S, S < amax/3

TEST(QuantRoundTripExact, RepresentableValuesSurvive) {
    // values already on a Q8_0 grid come back exactly
    std::vector<float> x(32);
    for (int i = 0; i < 32; ++i) x[i] = (i - 16) * 0.25f;
    x[0] = -127 * 0.25f;
    std::vector<uint8_t> q(row_bytes(EH_TYPE_Q8_0, 32));
    quantize_row(EH_TYPE_Q8_0, x.data(), q.data(), 32);
    std::vector<float> y(32);
    dequantize_row(EH_TYPE_Q8_0, q.data(), y.data(), 32);
    for (int i = 0; i < 32; ++i) EXPECT_FLOAT_EQ(x[i], y[i]);
    // and E2M1 values on an MXFP4 grid
    const float grid[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    for (int i = 0; i < 32; ++i) x[i] = grid[i % 8] * (i % 2 ? -0.25f : 0.25f);
    std::vector<uint8_t> m(row_bytes(EH_TYPE_MXFP4, 32));
    quantize_row(EH_TYPE_MXFP4, x.data(), m.data(), 32);
    dequantize_row(EH_TYPE_MXFP4, m.data(), y.data(), 32);
    for (int i = 0; i < 32; ++i) EXPECT_FLOAT_EQ(std::fabs(x[i]), std::fabs(y[i]));
}

// ggml block layouts, written out plainly: the structs, a dequantizer per
// block, and a simple reference quantizer per block. Header-only C++17.
//
// This is the readable definition plugins and the host's quantizer share.
// Dequantization is bit-exact with the format; the quantizers are plain
// round-to-nearest reference versions (they produce valid blocks of the
// format, not ggml's error-minimising choice of scales).
//
// Conventions of every format here: a block covers `block_elems` consecutive
// values of one row; scales are IEEE half (f16) unless said otherwise; all
// multi-byte fields are little-endian (we only target little-endian hosts).
#ifndef ENGINE_HOST_QUANT_BLOCKS_HPP
#define ENGINE_HOST_QUANT_BLOCKS_HPP

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <engine_host/tensor_types.h>

namespace ehp {
namespace quant {

// ---------------------------------------------------------------------------
// Scalar conversions

inline float bits_to_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t float_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

// IEEE binary16 -> binary32, exact for every input (subnormals, inf, NaN).
inline float fp16_to_fp32(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1Fu;
    const uint32_t man = h & 0x3FFu;
    if (exp == 0) {
        // zero or subnormal: man * 2^-24, exact in float
        float v = std::ldexp(static_cast<float>(man), -24);
        return (h & 0x8000u) ? -v : v;
    }
    if (exp == 31) return bits_to_float(sign | 0x7F800000u | (man << 13));
    return bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
}

// binary32 -> binary16 with round-to-nearest-even; overflow gives inf.
inline uint16_t fp32_to_fp16(float f) {
    const uint32_t u = float_to_bits(f);
    const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
    const uint32_t abs = u & 0x7FFFFFFFu;
    if (abs >= 0x7F800000u)  // inf or NaN
        return static_cast<uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0u));
    if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds past 65504
    if (abs < 0x38800000u) {
        // result is subnormal (or zero): value / 2^-24, rounded to even
        const float a = bits_to_float(abs);
        const float scaled = a * 16777216.0f;  // exact: power of two
        const float r = std::nearbyint(scaled); // default rounding mode is to-nearest-even
        return static_cast<uint16_t>(sign | static_cast<uint16_t>(r));
    }
    // normal: drop 13 mantissa bits with round-to-nearest-even
    uint32_t h = ((abs >> 13) - (112u << 10));
    const uint32_t rest = abs & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // carry may bump exponent: still right
    return static_cast<uint16_t>(sign | h);
}

inline float bf16_to_fp32(uint16_t b) { return bits_to_float(static_cast<uint32_t>(b) << 16); }

// All 65536 halves as floats (256 KiB, built on first use): a row of F16
// values converts by lookup instead of bit manipulation per value.
inline const float* fp16_table() {
    static const float* table = [] {
        static float t[65536];
        for (uint32_t i = 0; i < 65536; ++i) t[i] = fp16_to_fp32(static_cast<uint16_t>(i));
        return t;
    }();
    return table;
}

inline uint16_t fp32_to_bf16(float f) {
    const uint32_t u = float_to_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
    return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// E8M0 (MXFP4 shared scale): 2^(e - 127). e = 255 is NaN in the OCP spec;
// ggml decodes it as 2^128 like any other exponent, and so do we.
inline float e8m0_to_fp32(uint8_t e) { return std::ldexp(1.0f, static_cast<int>(e) - 127); }

// E2M1 (FP4) magnitudes for codes 0..7; bit 3 is the sign.
inline float e2m1_to_fp32(uint8_t code) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const float m = mag[code & 7u];
    return (code & 8u) ? -m : m;
}

// ---------------------------------------------------------------------------
// Block structs. Field order is the byte order in the file.

constexpr int QK4_0 = 32, QK4_1 = 32, QK5_0 = 32, QK5_1 = 32, QK8_0 = 32, QK_MXFP4 = 32;
constexpr int QK_K = 256;          // super-block size of the K-quants
constexpr int K_SCALE_SIZE = 12;   // 8 six-bit scales + 8 six-bit mins

struct block_q4_0 { uint16_t d; uint8_t qs[QK4_0 / 2]; };
struct block_q4_1 { uint16_t d; uint16_t m; uint8_t qs[QK4_1 / 2]; };
struct block_q5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; };
struct block_q5_1 { uint16_t d; uint16_t m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; };
struct block_q8_0 { uint16_t d; int8_t qs[QK8_0]; };
// Not ggml's: the KV cache's FP8 block (EH_TYPE_FP8_E4M3), value = d * e4m3(q).
constexpr int QK_FP8 = 32;
struct block_fp8_e4m3 { uint16_t d; uint8_t qs[QK_FP8]; };
struct block_q4_K { uint16_t d; uint16_t dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; };
struct block_q5_K { uint16_t d; uint16_t dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; };
struct block_q6_K { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; };
struct block_mxfp4 { uint8_t e; uint8_t qs[QK_MXFP4 / 2]; };
// Dequantize-only types (no quantizer here; llama-quantize writes them).
constexpr int QK4_NL = 32;
struct block_q2_K { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; uint16_t d; uint16_t dmin; };
struct block_q3_K { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; uint16_t d; };
struct block_iq4_nl { uint16_t d; uint8_t qs[QK4_NL / 2]; };
struct block_iq4_xs { uint16_t d; uint16_t scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; };

static_assert(sizeof(block_q4_0) == 18, "block_q4_0 layout");
static_assert(sizeof(block_q4_1) == 20, "block_q4_1 layout");
static_assert(sizeof(block_q5_0) == 22, "block_q5_0 layout");
static_assert(sizeof(block_q5_1) == 24, "block_q5_1 layout");
static_assert(sizeof(block_q8_0) == 34, "block_q8_0 layout");
static_assert(sizeof(block_fp8_e4m3) == 34, "block_fp8_e4m3 layout");
static_assert(sizeof(block_q4_K) == 144, "block_q4_K layout");
static_assert(sizeof(block_q5_K) == 176, "block_q5_K layout");
static_assert(sizeof(block_q6_K) == 210, "block_q6_K layout");
static_assert(sizeof(block_mxfp4) == 17, "block_mxfp4 layout");
static_assert(sizeof(block_q2_K) == 84, "block_q2_K layout");
static_assert(sizeof(block_q3_K) == 110, "block_q3_K layout");
static_assert(sizeof(block_iq4_nl) == 18, "block_iq4_nl layout");
static_assert(sizeof(block_iq4_xs) == 136, "block_iq4_xs layout");

// ---------------------------------------------------------------------------
// Dequantize one block into `out` (block_elems floats).
//
// The 32-wide formats store value j in the low nibble of qs[j] and value
// j+16 in the high nibble. Q5_x keep the fifth bit of value i in bit i of the
// 32-bit qh. The K-quants split 256 values into sub-blocks with their own
// 6-bit (Q4_K, Q5_K) or 8-bit (Q6_K) scales.

inline void dequantize_block(const block_q4_0& b, float* out) {
    const float d = fp16_to_fp32(b.d);
    for (int j = 0; j < 16; ++j) {
        out[j] = static_cast<float>((b.qs[j] & 0x0F) - 8) * d;
        out[j + 16] = static_cast<float>((b.qs[j] >> 4) - 8) * d;
    }
}

inline void dequantize_block(const block_q4_1& b, float* out) {
    const float d = fp16_to_fp32(b.d), m = fp16_to_fp32(b.m);
    for (int j = 0; j < 16; ++j) {
        out[j] = static_cast<float>(b.qs[j] & 0x0F) * d + m;
        out[j + 16] = static_cast<float>(b.qs[j] >> 4) * d + m;
    }
}

inline uint32_t load_u32_le(const uint8_t* p) {
    return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
           (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

// Bit i of qh as 0 or 16, for i in 0..31 (spelled out so that the loops
// using it have no variable shifts and vectorize).
inline void expand_high_bits(uint32_t qh, uint8_t hb[32]) {
    // byte value -> its 8 bits as 0/16 bytes, by table (little-endian order)
    struct Table {
        uint64_t v[256];
        constexpr Table() : v() {
            for (int b = 0; b < 256; ++b)
                for (int i = 0; i < 8; ++i)
                    if ((b >> i) & 1) v[b] |= uint64_t{16} << (8 * i);
        }
    };
    static constexpr Table table{};
    for (int k = 0; k < 4; ++k) std::memcpy(hb + 8 * k, &table.v[(qh >> (8 * k)) & 0xFF], 8);
}

inline void dequantize_block(const block_q5_0& b, float* out) {
    const float d = fp16_to_fp32(b.d);
    uint8_t hb[32];
    expand_high_bits(load_u32_le(b.qh), hb);
    for (int j = 0; j < 16; ++j) {
        const int lo = (b.qs[j] & 0x0F) | hb[j];
        const int hi = (b.qs[j] >> 4) | hb[j + 16];
        out[j] = static_cast<float>(lo - 16) * d;
        out[j + 16] = static_cast<float>(hi - 16) * d;
    }
}

inline void dequantize_block(const block_q5_1& b, float* out) {
    const float d = fp16_to_fp32(b.d), m = fp16_to_fp32(b.m);
    uint8_t hb[32];
    expand_high_bits(load_u32_le(b.qh), hb);
    for (int j = 0; j < 16; ++j) {
        const int lo = (b.qs[j] & 0x0F) | hb[j];
        const int hi = (b.qs[j] >> 4) | hb[j + 16];
        out[j] = static_cast<float>(lo) * d + m;
        out[j + 16] = static_cast<float>(hi) * d + m;
    }
}

inline void dequantize_block(const block_q8_0& b, float* out) {
    const float d = fp16_to_fp32(b.d);
    for (int j = 0; j < 32; ++j) out[j] = static_cast<float>(b.qs[j]) * d;
}

// OCP FP8 E4M3: sign, 4 exponent bits (bias 7), 3 mantissa bits; no
// infinities; S.1111.111 is NaN; the largest finite value is 448.
inline float e4m3_to_fp32(uint8_t q) {
    const int e = (q >> 3) & 0xF, m = q & 7;
    if ((q & 0x7F) == 0x7F) return NAN;
    const float mag = e ? std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7) : std::ldexp(static_cast<float>(m), -9);
    return (q & 0x80) ? -mag : mag;
}

// Round to nearest, ties to even; saturates at +-448 (never NaN for a
// finite input); NaN in gives NaN out.
inline uint8_t fp32_to_e4m3(float x) {
    if (std::isnan(x)) return 0x7F;
    const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
    const float a = std::fabs(x);
    if (a >= 448.0f) return sign | 0x7E;
    int code;
    if (a < 0.015625f) {  // below the smallest normal, 2^-6: steps of 2^-9
        code = static_cast<int>(std::nearbyint(std::ldexp(a, 9)));
    } else {
        int k;
        const float f = std::frexp(a, &k);  // a = f * 2^k, f in [0.5, 1)
        const int e = k - 1;                // a = (2f) * 2^e
        // codes are monotonic in the value, so a mantissa that rounds up to
        // 8 carries into the next exponent by itself
        code = ((e + 7) << 3) + static_cast<int>(std::nearbyint((2.0f * f - 1.0f) * 8.0f));
    }
    return static_cast<uint8_t>(sign | std::min(code, 0x7E));
}

// All 256 E4M3 codes as floats (built on first use): a KV row reads by lookup.
inline const float* e4m3_table() {
    static const float* table = [] {
        static float t[256];
        for (uint32_t i = 0; i < 256; ++i) t[i] = e4m3_to_fp32(static_cast<uint8_t>(i));
        return t;
    }();
    return table;
}

inline void dequantize_block(const block_fp8_e4m3& b, float* out) {
    const float d = fp16_to_fp32(b.d);
    const float* t = e4m3_table();
    for (int j = 0; j < QK_FP8; ++j) out[j] = t[b.qs[j]] * d;
}

// Q4_K / Q5_K scale packing (12 bytes for 8 scales and 8 mins, 6 bits each):
//   bytes 0..3 : scale[0..3] in bits 0-5, bits 4-5 of scale[4..7] in bits 6-7
//   bytes 4..7 : min[0..3]   in bits 0-5, bits 4-5 of min[4..7]   in bits 6-7
//   bytes 8..11: low 4 bits of scale[4..7] | low 4 bits of min[4..7] << 4
inline void unpack_k_scale_min(int j, const uint8_t* q, uint8_t& scale, uint8_t& min) {
    if (j < 4) {
        scale = q[j] & 63;
        min = q[j + 4] & 63;
    } else {
        scale = static_cast<uint8_t>((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4));
        min = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

inline void pack_k_scale_min(const uint8_t scale[8], const uint8_t min[8], uint8_t* q) {
    for (int j = 0; j < 4; ++j) {
        q[j] = static_cast<uint8_t>((scale[j] & 63) | ((scale[j + 4] >> 4) << 6));
        q[j + 4] = static_cast<uint8_t>((min[j] & 63) | ((min[j + 4] >> 4) << 6));
        q[j + 8] = static_cast<uint8_t>((scale[j + 4] & 0x0F) | ((min[j + 4] & 0x0F) << 4));
    }
}

// Q4_K: value = d*scale[s]*q - dmin*min[s], q in 0..15, eight sub-blocks of
// 32. Bytes qs[32c .. 32c+31] hold sub-block 2c in their low nibbles and
// sub-block 2c+1 in their high nibbles.
inline void dequantize_block(const block_q4_K& b, float* out) {
    const float d = fp16_to_fp32(b.d), dmin = fp16_to_fp32(b.dmin);
    for (int c = 0; c < 4; ++c) {
        uint8_t s0, m0, s1, m1;
        unpack_k_scale_min(2 * c, b.scales, s0, m0);
        unpack_k_scale_min(2 * c + 1, b.scales, s1, m1);
        const float d0 = d * s0, mm0 = dmin * m0, d1 = d * s1, mm1 = dmin * m1;
        const uint8_t* q = b.qs + 32 * c;
        for (int l = 0; l < 32; ++l) {
            out[64 * c + l] = d0 * static_cast<float>(q[l] & 0x0F) - mm0;
            out[64 * c + 32 + l] = d1 * static_cast<float>(q[l] >> 4) - mm1;
        }
    }
}

// Q5_K: as Q4_K with a fifth bit: qh[l] bit 2c is the high bit of value
// 64c + l, bit 2c+1 that of value 64c + 32 + l. q in 0..31.
inline void dequantize_block(const block_q5_K& b, float* out) {
    const float d = fp16_to_fp32(b.d), dmin = fp16_to_fp32(b.dmin);
    for (int c = 0; c < 4; ++c) {
        uint8_t s0, m0, s1, m1;
        unpack_k_scale_min(2 * c, b.scales, s0, m0);
        unpack_k_scale_min(2 * c + 1, b.scales, s1, m1);
        const float d0 = d * s0, mm0 = dmin * m0, d1 = d * s1, mm1 = dmin * m1;
        const uint8_t* q = b.qs + 32 * c;
        for (int l = 0; l < 32; ++l) {
            const int lo = (q[l] & 0x0F) | (((b.qh[l] >> (2 * c)) & 1) << 4);
            const int hi = (q[l] >> 4) | (((b.qh[l] >> (2 * c + 1)) & 1) << 4);
            out[64 * c + l] = d0 * static_cast<float>(lo) - mm0;
            out[64 * c + 32 + l] = d1 * static_cast<float>(hi) - mm1;
        }
    }
}

// Q6_K: value = d * scales[s] * (q - 32), q in 0..63, sixteen sub-blocks of
// 16. Each half h (128 values) uses ql[64h..], qh[32h..], scales[8h..]:
// for l in 0..31, value 128h + 32k + l takes its low 4 bits from
// ql[64h + l + 32*(k&1)] (low nibble for k<2, high nibble for k>=2) and its
// high 2 bits from bits 2k..2k+1 of qh[32h + l].
inline void dequantize_block(const block_q6_K& b, float* out) {
    const float d = fp16_to_fp32(b.d);
    for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = b.ql + 64 * h;
        const uint8_t* qh = b.qh + 32 * h;
        const int8_t* sc = b.scales + 8 * h;
        float* y = out + 128 * h;
        float ds[8];
        for (int i = 0; i < 8; ++i) ds[i] = d * static_cast<float>(sc[i]);
        // the four k = 0..3 cases written out: value 32k + l, scale (32k + l) / 16
        for (int half = 0; half < 2; ++half) {
            const float s0 = ds[half], s1 = ds[half + 2], s2 = ds[half + 4], s3 = ds[half + 6];
            for (int l = 16 * half; l < 16 * half + 16; ++l) {
                const int q0 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) - 32;
                const int q1 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = s0 * static_cast<float>(q0);
                y[l + 32] = s1 * static_cast<float>(q1);
                y[l + 64] = s2 * static_cast<float>(q2);
                y[l + 96] = s3 * static_cast<float>(q3);
            }
        }
    }
}

// MXFP4 (OCP microscaling): one E8M0 exponent, then 32 E2M1 codes, value j in
// the low nibble of qs[j] and value j+16 in the high nibble.
inline void dequantize_block(const block_mxfp4& b, float* out) {
    const float scale = e8m0_to_fp32(b.e);
    for (int j = 0; j < 16; ++j) {
        out[j] = e2m1_to_fp32(b.qs[j] & 0x0F) * scale;
        out[j + 16] = e2m1_to_fp32(b.qs[j] >> 4) * scale;
    }
}

// Q2_K: sixteen sub-blocks of 16, value = d * (sc & 15) * q - dmin * (sc >> 4)
// with sc = scales[sub-block] and q in 0..3. Each half h (128 values) reads
// qs[32h..32h+31]: value 128h + 32k + l (l < 32) is bits 2k..2k+1 of
// qs[32h + l], in sub-block 8h + 2k + l/16.
inline void dequantize_block(const block_q2_K& b, float* out) {
    const float d = fp16_to_fp32(b.d), dmin = fp16_to_fp32(b.dmin);
    for (int h = 0; h < 2; ++h) {
        const uint8_t* q = b.qs + 32 * h;
        for (int k = 0; k < 4; ++k) {
            for (int part = 0; part < 2; ++part) {
                const uint8_t sc = b.scales[8 * h + 2 * k + part];
                const float dl = d * static_cast<float>(sc & 0x0F), ml = dmin * static_cast<float>(sc >> 4);
                for (int l = 16 * part; l < 16 * part + 16; ++l)
                    out[128 * h + 32 * k + l] = dl * static_cast<float>((q[l] >> (2 * k)) & 3) - ml;
            }
        }
    }
}

// Q3_K: sixteen sub-blocks of 16, value = d * (s - 32) * (q - 4 * !high),
// q = 2 low bits as in Q2_K (qs), high bit from hmask: value 128h + 32k + l
// takes bit 4h + k of hmask[l]. The sixteen 6-bit s: low 4 bits are nibbles
// of scales[0..7] (s_i, i < 8: low nibble of scales[i]; i >= 8: high nibble
// of scales[i - 8]), high 2 bits are bits 2(i/4)..+1 of scales[8 + i % 4].
inline void dequantize_block(const block_q3_K& b, float* out) {
    const float d = fp16_to_fp32(b.d);
    int sc[16];
    for (int i = 0; i < 16; ++i) {
        const int low = i < 8 ? (b.scales[i] & 0x0F) : (b.scales[i - 8] >> 4);
        const int high = (b.scales[8 + i % 4] >> (2 * (i / 4))) & 3;
        sc[i] = (low | (high << 4)) - 32;
    }
    for (int h = 0; h < 2; ++h) {
        const uint8_t* q = b.qs + 32 * h;
        for (int k = 0; k < 4; ++k) {
            const uint8_t m = static_cast<uint8_t>(1u << (4 * h + k));
            for (int part = 0; part < 2; ++part) {
                const float dl = d * static_cast<float>(sc[8 * h + 2 * k + part]);
                for (int l = 16 * part; l < 16 * part + 16; ++l) {
                    const int v = ((q[l] >> (2 * k)) & 3) - ((b.hmask[l] & m) ? 0 : 4);
                    out[128 * h + 32 * k + l] = dl * static_cast<float>(v);
                }
            }
        }
    }
}

// The 16 non-uniform levels of IQ4_NL / IQ4_XS (ggml's kvalues_iq4nl).
inline const int8_t* iq4nl_levels() {
    static const int8_t k[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    return k;
}

// IQ4_NL: 32 values, value j = d * level[low nibble of qs[j]], value j+16 =
// d * level[high nibble].
inline void dequantize_block(const block_iq4_nl& b, float* out) {
    const float d = fp16_to_fp32(b.d);
    const int8_t* k = iq4nl_levels();
    for (int j = 0; j < 16; ++j) {
        out[j] = d * static_cast<float>(k[b.qs[j] & 0x0F]);
        out[j + 16] = d * static_cast<float>(k[b.qs[j] >> 4]);
    }
}

// IQ4_XS: eight IQ4_NL-style sub-blocks of 32 with 6-bit scales: sub-block
// i has s = (nibble i%2 of scales_l[i/2]) | (bits 2i..2i+1 of scales_h) << 4,
// value = d * (s - 32) * level[code], codes packed as in IQ4_NL in
// qs[16i..16i+15].
inline void dequantize_block(const block_iq4_xs& b, float* out) {
    const float d = fp16_to_fp32(b.d);
    const int8_t* k = iq4nl_levels();
    for (int i = 0; i < 8; ++i) {
        const int s = ((b.scales_l[i / 2] >> (4 * (i % 2))) & 0x0F) | (((b.scales_h >> (2 * i)) & 3) << 4);
        const float dl = d * static_cast<float>(s - 32);
        const uint8_t* q = b.qs + 16 * i;
        for (int j = 0; j < 16; ++j) {
            out[32 * i + j] = dl * static_cast<float>(k[q[j] & 0x0F]);
            out[32 * i + j + 16] = dl * static_cast<float>(k[q[j] >> 4]);
        }
    }
}

// ---------------------------------------------------------------------------
// Reference quantizers (one block of block_elems floats in, one block out).

namespace detail {
inline int clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }
inline int round_to_int(float v) { return static_cast<int>(std::lround(v)); }
// value with the largest magnitude, keeping its sign
inline float signed_absmax(const float* x, int n) {
    float best = 0.0f;
    for (int i = 0; i < n; ++i)
        if (std::fabs(x[i]) > std::fabs(best)) best = x[i];
    return best;
}
inline void min_max(const float* x, int n, float& mn, float& mx) {
    mn = x[0]; mx = x[0];
    for (int i = 1; i < n; ++i) { mn = std::min(mn, x[i]); mx = std::max(mx, x[i]); }
}
}  // namespace detail

// Symmetric formats put the largest-magnitude value on the most negative
// code (-8 / -16), which is exactly representable.
inline void quantize_block(const float* x, block_q4_0& b) {
    const float amax = detail::signed_absmax(x, 32);
    b.d = fp32_to_fp16(amax / -8.0f);
    const float d = fp16_to_fp32(b.d);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 16; ++j) {
        const int lo = detail::clampi(detail::round_to_int(x[j] * id) + 8, 0, 15);
        const int hi = detail::clampi(detail::round_to_int(x[j + 16] * id) + 8, 0, 15);
        b.qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
}

inline void quantize_block(const float* x, block_q4_1& b) {
    float mn, mx;
    detail::min_max(x, 32, mn, mx);
    b.d = fp32_to_fp16((mx - mn) / 15.0f);
    b.m = fp32_to_fp16(mn);
    const float d = fp16_to_fp32(b.d), m = fp16_to_fp32(b.m);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 16; ++j) {
        const int lo = detail::clampi(detail::round_to_int((x[j] - m) * id), 0, 15);
        const int hi = detail::clampi(detail::round_to_int((x[j + 16] - m) * id), 0, 15);
        b.qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
}

inline void store_u32_le(uint8_t* p, uint32_t v) {
    p[0] = static_cast<uint8_t>(v); p[1] = static_cast<uint8_t>(v >> 8);
    p[2] = static_cast<uint8_t>(v >> 16); p[3] = static_cast<uint8_t>(v >> 24);
}

inline void quantize_block(const float* x, block_q5_0& b) {
    const float amax = detail::signed_absmax(x, 32);
    b.d = fp32_to_fp16(amax / -16.0f);
    const float d = fp16_to_fp32(b.d);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
        const int lo = detail::clampi(detail::round_to_int(x[j] * id) + 16, 0, 31);
        const int hi = detail::clampi(detail::round_to_int(x[j + 16] * id) + 16, 0, 31);
        b.qs[j] = static_cast<uint8_t>((lo & 0x0F) | ((hi & 0x0F) << 4));
        qh |= static_cast<uint32_t>(lo >> 4) << j;
        qh |= static_cast<uint32_t>(hi >> 4) << (j + 16);
    }
    store_u32_le(b.qh, qh);
}

inline void quantize_block(const float* x, block_q5_1& b) {
    float mn, mx;
    detail::min_max(x, 32, mn, mx);
    b.d = fp32_to_fp16((mx - mn) / 31.0f);
    b.m = fp32_to_fp16(mn);
    const float d = fp16_to_fp32(b.d), m = fp16_to_fp32(b.m);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
        const int lo = detail::clampi(detail::round_to_int((x[j] - m) * id), 0, 31);
        const int hi = detail::clampi(detail::round_to_int((x[j + 16] - m) * id), 0, 31);
        b.qs[j] = static_cast<uint8_t>((lo & 0x0F) | ((hi & 0x0F) << 4));
        qh |= static_cast<uint32_t>(lo >> 4) << j;
        qh |= static_cast<uint32_t>(hi >> 4) << (j + 16);
    }
    store_u32_le(b.qh, qh);
}

inline void quantize_block(const float* x, block_q8_0& b) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    b.d = fp32_to_fp16(amax / 127.0f);
    const float d = fp16_to_fp32(b.d);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; ++j)
        b.qs[j] = static_cast<int8_t>(detail::clampi(detail::round_to_int(x[j] * id), -127, 127));
}

// The scale maps the block's largest magnitude onto E4M3's largest, 448.
inline void quantize_block(const float* x, block_fp8_e4m3& b) {
    float amax = 0.0f;
    for (int j = 0; j < QK_FP8; ++j) amax = std::max(amax, std::fabs(x[j]));
    b.d = fp32_to_fp16(amax / 448.0f);
    const float d = fp16_to_fp32(b.d);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < QK_FP8; ++j) b.qs[j] = fp32_to_e4m3(x[j] * id);
}

namespace detail {
// Per sub-block affine parameters for Q4_K / Q5_K: value = s*q - m with
// m >= 0, then the scales and mins quantized to 6 bits against d and dmin.
template <int QMAX>
inline void k_affine(const float* x, uint16_t& d_out, uint16_t& dmin_out,
                     uint8_t sc[8], uint8_t mn[8], float eff_d[8], float eff_m[8]) {
    float s[8], m[8], smax = 0.0f, mmax = 0.0f;
    for (int j = 0; j < 8; ++j) {
        float lo, hi;
        min_max(x + 32 * j, 32, lo, hi);
        lo = std::min(lo, 0.0f);
        hi = std::max(hi, 0.0f);
        m[j] = -lo;
        s[j] = (hi - lo) / static_cast<float>(QMAX);
        smax = std::max(smax, s[j]);
        mmax = std::max(mmax, m[j]);
    }
    d_out = fp32_to_fp16(smax / 63.0f);
    dmin_out = fp32_to_fp16(mmax / 63.0f);
    const float d = fp16_to_fp32(d_out), dmin = fp16_to_fp32(dmin_out);
    for (int j = 0; j < 8; ++j) {
        // round the scale up so the sub-block's range stays covered
        sc[j] = static_cast<uint8_t>(clampi(d > 0 ? static_cast<int>(std::ceil(s[j] / d)) : 0, 0, 63));
        mn[j] = static_cast<uint8_t>(clampi(dmin > 0 ? round_to_int(m[j] / dmin) : 0, 0, 63));
        eff_d[j] = d * sc[j];
        eff_m[j] = dmin * mn[j];
    }
}
}  // namespace detail

inline void quantize_block(const float* x, block_q4_K& b) {
    uint8_t sc[8], mn[8];
    float ed[8], em[8];
    detail::k_affine<15>(x, b.d, b.dmin, sc, mn, ed, em);
    pack_k_scale_min(sc, mn, b.scales);
    for (int c = 0; c < 4; ++c) {
        for (int l = 0; l < 32; ++l) {
            int q[2];
            for (int h = 0; h < 2; ++h) {
                const int s = 2 * c + h;
                const float v = x[64 * c + 32 * h + l];
                q[h] = ed[s] > 0 ? detail::clampi(detail::round_to_int((v + em[s]) / ed[s]), 0, 15) : 0;
            }
            b.qs[32 * c + l] = static_cast<uint8_t>(q[0] | (q[1] << 4));
        }
    }
}

inline void quantize_block(const float* x, block_q5_K& b) {
    uint8_t sc[8], mn[8];
    float ed[8], em[8];
    detail::k_affine<31>(x, b.d, b.dmin, sc, mn, ed, em);
    pack_k_scale_min(sc, mn, b.scales);
    std::memset(b.qh, 0, sizeof(b.qh));
    for (int c = 0; c < 4; ++c) {
        for (int l = 0; l < 32; ++l) {
            int q[2];
            for (int h = 0; h < 2; ++h) {
                const int s = 2 * c + h;
                const float v = x[64 * c + 32 * h + l];
                q[h] = ed[s] > 0 ? detail::clampi(detail::round_to_int((v + em[s]) / ed[s]), 0, 31) : 0;
                b.qh[l] = static_cast<uint8_t>(b.qh[l] | ((q[h] >> 4) << (2 * c + h)));
            }
            b.qs[32 * c + l] = static_cast<uint8_t>((q[0] & 0x0F) | ((q[1] & 0x0F) << 4));
        }
    }
}

inline void quantize_block(const float* x, block_q6_K& b) {
    // sub-block scale puts its largest-magnitude value on code -32
    float s[16], smax = 0.0f;
    for (int j = 0; j < 16; ++j) {
        s[j] = detail::signed_absmax(x + 16 * j, 16) / -32.0f;
        if (std::fabs(s[j]) > std::fabs(smax)) smax = s[j];
    }
    b.d = fp32_to_fp16(std::fabs(smax) / 127.0f);
    const float d = fp16_to_fp32(b.d);
    float eff[16];
    for (int j = 0; j < 16; ++j) {
        b.scales[j] = static_cast<int8_t>(d > 0 ? detail::clampi(detail::round_to_int(s[j] / d), -127, 127) : 0);
        eff[j] = d * b.scales[j];
    }
    std::memset(b.ql, 0, sizeof(b.ql));
    std::memset(b.qh, 0, sizeof(b.qh));
    for (int h = 0; h < 2; ++h) {
        for (int k = 0; k < 4; ++k) {
            for (int l = 0; l < 32; ++l) {
                const int v = 128 * h + 32 * k + l;
                const float e = eff[v / 16];
                const int q = e != 0.0f ? detail::clampi(detail::round_to_int(x[v] / e), -32, 31) + 32 : 32;
                uint8_t& lowbyte = b.ql[64 * h + l + 32 * (k & 1)];
                lowbyte = static_cast<uint8_t>(lowbyte | ((k < 2) ? (q & 0x0F) : ((q & 0x0F) << 4)));
                b.qh[32 * h + l] = static_cast<uint8_t>(b.qh[32 * h + l] | ((q >> 4) << (2 * k)));
            }
        }
    }
}

// Nearest E2M1 code for v (already divided by the block scale): magnitudes
// 0, 0.5, 1, 1.5, 2, 3, 4, 6, a tie to the smaller (a midpoint counts as
// below); |v| past 5 is 6; NaN and infinities are 0. Counting the midpoints
// below |v| is the nearest-magnitude search without its seven distance
// comparisons a value (the MXFP4 quantizer's cost in `forge` and `quantize`).
inline uint8_t fp32_to_e2m1(float v) {
    const float a = std::fabs(v);
    if (!(a < INFINITY)) return 0;
    const int c = (a > 0.25f) + (a > 0.75f) + (a > 1.25f) + (a > 1.75f) + (a > 2.5f) + (a > 3.5f) + (a > 5.0f);
    return static_cast<uint8_t>(c | ((v < 0 && c != 0) ? 8 : 0));
}

inline void quantize_block(const float* x, block_mxfp4& b) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    // smallest power of two that maps the largest value into [-6, 6]
    int e = 0;
    if (amax > 0.0f) e = detail::clampi(static_cast<int>(std::ceil(std::log2(amax / 6.0f))) + 127, 0, 254);
    b.e = static_cast<uint8_t>(e);
    // scale is a power of two (2^-127 .. 2^127), so 1 / scale is exact and
    // x * (1 / scale) rounds exactly as x / scale does
    const float inv = 1.0f / e8m0_to_fp32(b.e);
    for (int j = 0; j < 16; ++j) {
        const uint8_t lo = fp32_to_e2m1(x[j] * inv);
        const uint8_t hi = fp32_to_e2m1(x[j + 16] * inv);
        b.qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
}

// ---------------------------------------------------------------------------
// Rows. A row of n values (n a multiple of the block size) is n/block_elems
// consecutive blocks.

// True for the types these helpers can dequantize.
inline bool can_dequantize(uint32_t type) {
    switch (type) {
    case EH_TYPE_F32: case EH_TYPE_F16: case EH_TYPE_BF16:
    case EH_TYPE_Q4_0: case EH_TYPE_Q4_1: case EH_TYPE_Q5_0: case EH_TYPE_Q5_1: case EH_TYPE_Q8_0:
    case EH_TYPE_Q4_K: case EH_TYPE_Q5_K: case EH_TYPE_Q6_K: case EH_TYPE_MXFP4:
    case EH_TYPE_Q2_K: case EH_TYPE_Q3_K: case EH_TYPE_IQ4_NL: case EH_TYPE_IQ4_XS:
        return true;
    default:
        return false;
    }
}

// Bytes of a row of n values; 0 when n is not a multiple of the block size
// or the type is unknown.
inline uint64_t row_bytes(uint32_t type, uint64_t n) {
    const eh_type_traits t = eh_tensor_type_traits(type);
    if (t.block_bytes == 0 || n % t.block_elems != 0) return 0;
    return n / t.block_elems * t.block_bytes;
}

namespace detail {
template <class Block>
inline void dequantize_blocks(const void* src, float* dst, uint64_t n, int qk) {
    const uint8_t* p = static_cast<const uint8_t*>(src);
    for (uint64_t i = 0; i < n / static_cast<uint64_t>(qk); ++i) {
        Block b;  // copy: source blocks may be unaligned (17-byte MXFP4 etc.)
        std::memcpy(&b, p + i * sizeof(Block), sizeof(Block));
        dequantize_block(b, dst + i * static_cast<uint64_t>(qk));
    }
}
template <class Block>
inline void quantize_blocks(const float* src, void* dst, uint64_t n, int qk) {
    uint8_t* p = static_cast<uint8_t*>(dst);
    for (uint64_t i = 0; i < n / static_cast<uint64_t>(qk); ++i) {
        Block b;
        quantize_block(src + i * static_cast<uint64_t>(qk), b);
        std::memcpy(p + i * sizeof(Block), &b, sizeof(Block));
    }
}
}  // namespace detail

// Dequantizes n values of `type` from src into dst. Returns false for an
// unsupported type or an n that is not a whole number of blocks.
inline bool dequantize_row(uint32_t type, const void* src, float* dst, uint64_t n) {
    if (row_bytes(type, n) == 0 && n != 0) return false;
    const uint8_t* p = static_cast<const uint8_t*>(src);
    switch (type) {
    case EH_TYPE_F32: std::memcpy(dst, src, n * 4); return true;
    case EH_TYPE_F16: {
        const float* table = fp16_table();
        for (uint64_t i = 0; i < n; ++i) { uint16_t h; std::memcpy(&h, p + 2 * i, 2); dst[i] = table[h]; }
        return true;
    }
    case EH_TYPE_BF16:
        for (uint64_t i = 0; i < n; ++i) { uint16_t h; std::memcpy(&h, p + 2 * i, 2); dst[i] = bf16_to_fp32(h); }
        return true;
    case EH_TYPE_Q4_0: detail::dequantize_blocks<block_q4_0>(src, dst, n, QK4_0); return true;
    case EH_TYPE_Q4_1: detail::dequantize_blocks<block_q4_1>(src, dst, n, QK4_1); return true;
    case EH_TYPE_Q5_0: detail::dequantize_blocks<block_q5_0>(src, dst, n, QK5_0); return true;
    case EH_TYPE_Q5_1: detail::dequantize_blocks<block_q5_1>(src, dst, n, QK5_1); return true;
    case EH_TYPE_Q8_0: detail::dequantize_blocks<block_q8_0>(src, dst, n, QK8_0); return true;
    case EH_TYPE_Q4_K: detail::dequantize_blocks<block_q4_K>(src, dst, n, QK_K); return true;
    case EH_TYPE_Q5_K: detail::dequantize_blocks<block_q5_K>(src, dst, n, QK_K); return true;
    case EH_TYPE_Q6_K: detail::dequantize_blocks<block_q6_K>(src, dst, n, QK_K); return true;
    case EH_TYPE_MXFP4: detail::dequantize_blocks<block_mxfp4>(src, dst, n, QK_MXFP4); return true;
    case EH_TYPE_FP8_E4M3: detail::dequantize_blocks<block_fp8_e4m3>(src, dst, n, QK_FP8); return true;
    case EH_TYPE_Q2_K: detail::dequantize_blocks<block_q2_K>(src, dst, n, QK_K); return true;
    case EH_TYPE_Q3_K: detail::dequantize_blocks<block_q3_K>(src, dst, n, QK_K); return true;
    case EH_TYPE_IQ4_NL: detail::dequantize_blocks<block_iq4_nl>(src, dst, n, QK4_NL); return true;
    case EH_TYPE_IQ4_XS: detail::dequantize_blocks<block_iq4_xs>(src, dst, n, QK_K); return true;
    default: return false;
    }
}

// Quantizes n floats into `type` (dst must hold row_bytes(type, n) bytes).
inline bool quantize_row(uint32_t type, const float* src, void* dst, uint64_t n) {
    if (row_bytes(type, n) == 0 && n != 0) return false;
    uint8_t* p = static_cast<uint8_t*>(dst);
    switch (type) {
    case EH_TYPE_F32: std::memcpy(dst, src, n * 4); return true;
    case EH_TYPE_F16:
        for (uint64_t i = 0; i < n; ++i) { uint16_t h = fp32_to_fp16(src[i]); std::memcpy(p + 2 * i, &h, 2); }
        return true;
    case EH_TYPE_BF16:
        for (uint64_t i = 0; i < n; ++i) { uint16_t h = fp32_to_bf16(src[i]); std::memcpy(p + 2 * i, &h, 2); }
        return true;
    case EH_TYPE_Q4_0: detail::quantize_blocks<block_q4_0>(src, dst, n, QK4_0); return true;
    case EH_TYPE_Q4_1: detail::quantize_blocks<block_q4_1>(src, dst, n, QK4_1); return true;
    case EH_TYPE_Q5_0: detail::quantize_blocks<block_q5_0>(src, dst, n, QK5_0); return true;
    case EH_TYPE_Q5_1: detail::quantize_blocks<block_q5_1>(src, dst, n, QK5_1); return true;
    case EH_TYPE_Q8_0: detail::quantize_blocks<block_q8_0>(src, dst, n, QK8_0); return true;
    case EH_TYPE_Q4_K: detail::quantize_blocks<block_q4_K>(src, dst, n, QK_K); return true;
    case EH_TYPE_Q5_K: detail::quantize_blocks<block_q5_K>(src, dst, n, QK_K); return true;
    case EH_TYPE_Q6_K: detail::quantize_blocks<block_q6_K>(src, dst, n, QK_K); return true;
    case EH_TYPE_MXFP4: detail::quantize_blocks<block_mxfp4>(src, dst, n, QK_MXFP4); return true;
    case EH_TYPE_FP8_E4M3: detail::quantize_blocks<block_fp8_e4m3>(src, dst, n, QK_FP8); return true;
    default: return false;
    }
}

}  // namespace quant
}  // namespace ehp

#endif  // ENGINE_HOST_QUANT_BLOCKS_HPP

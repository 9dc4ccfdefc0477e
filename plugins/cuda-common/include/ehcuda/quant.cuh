// Device-side decoding of the stored weight formats, 32 elements at a time.
//
// Every supported type is decoded through one primitive: load_chunk<T>(row,
// c, v) writes elements [32c, 32c+32) of a weight row into v. The legacy
// types (Q4_0..Q8_0, IQ4_NL) have exactly one 32-element block per chunk; the
// K-quants and IQ4_XS have 8 chunks per 256-element super-block (chunk = one
// sub-block with its own scale (and min), or for Q2_K, Q3_K and Q6_K two
// 16-element scale groups); the float types are plain. GEMV and GEMM kernels build on this, so no kernel ever
// holds a dequantized copy of a whole tensor.
//
// Byte layouts (little-endian, fp16 = IEEE half):
//   Q4_0 (18 B / 32):  d:f16, qs[16]: x[j] = ((qs[j]&15)-8)*d, x[j+16] = ((qs[j]>>4)-8)*d
//   Q4_1 (20 B / 32):  d:f16, m:f16, qs[16]: x = q*d + m (same nibble order)
//   Q5_0 (22 B / 32):  d:f16, qh:u32, qs[16]: 5th bit of x[j] is qh bit j; x = (q-16)*d
//   Q5_1 (24 B / 32):  d:f16, m:f16, qh:u32, qs[16]: x = q*d + m
//   Q8_0 (34 B / 32):  d:f16, qs:i8[32]: x = q*d
//   Q4_K (144 B / 256): d, dmin:f16, scales[12] (8 x 6-bit scale + 6-bit min),
//                       qs[128]: 64-element group g uses qs[32g..32g+32), low
//                       nibbles for sub-block 2g, high for 2g+1; x = d*sc*q - dmin*m
//   Q5_K (176 B / 256): as Q4_K plus qh[32] before qs: bit s of qh[l] is the 5th
//                       bit of element l of sub-block s
//   Q6_K (210 B / 256): ql[128], qh[64], scales:i8[16], d:f16; two 128-element
//                       halves, each four 32-element quarters (see load_chunk)
//   Q2_K (84 B / 256):  scales[16] (4-bit scale | 4-bit min << 4 per 16 values),
//                       qs[64], d, dmin:f16; chunk 4h+k (half h, quarter k)
//                       is bits 2k..2k+1 of qs[32h..32h+32); x = d*sc*q - dmin*m
//   Q3_K (110 B / 256): hmask[32], qs[64], scales[12] (16 x 6-bit, biased by
//                       32), d:f16; q as Q2_K's, and bit 4h+k of hmask[l]:
//                       x = d*(s-32)*q where it is set, d*(s-32)*(q-4) where not
//   IQ4_NL (18 B / 32): d:f16, qs[16] in Q4_0's nibble order; x = d*level[q]
//                       with the 16 non-uniform levels below
//   IQ4_XS (136 B / 256): d:f16, scales_h:u16, scales_l[4], qs[128]: eight
//                       IQ4_NL-like 32-value sub-blocks (qs[16s..16s+16)), a
//                       6-bit scale each (low nibble from scales_l, high 2
//                       bits from scales_h); x = d*(ls-32)*level[q]
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <engine_host/plugin_abi.h>

namespace ehcuda {

__device__ __forceinline__ float f16_at(const uint8_t* p) {
    uint16_t bits = uint16_t(p[0]) | (uint16_t(p[1]) << 8);
    return __half2float(__ushort_as_half(bits));
}

__device__ __forceinline__ uint32_t u32_at(const uint8_t* p) {
    return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

// 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K super-block.
__device__ __forceinline__ void k4_scale_min(const uint8_t* s, int j, float& sc, float& mn) {
    if (j < 4) {
        sc = float(s[j] & 63);
        mn = float(s[j + 4] & 63);
    } else {
        sc = float((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
        mn = float((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

// A Q4_K/Q5_K super-block's d, dmin and sub-block j's scale and min (as
// f16_at and k4_scale_min give them, bit for bit) from one 16-byte load of
// its first 16 bytes: no byte loads, and no branch on j, which differs
// between the lanes of a warp (lane = chunk) so that k4_scale_min ran both
// of its sides. b must be 16-byte aligned: every super-block of a row that
// starts so (144 and 176 bytes), as the 16-byte code loads beside it assume.
struct K4Head {
    float d, dmin, sc, mn;
};
__device__ __forceinline__ K4Head k4_head(const uint8_t* b, int j) {
    const uint4 h = *reinterpret_cast<const uint4*>(b);
    const uint32_t sh = uint32_t(j & 3) * 8;
    // bytes j & 3 of s[0..3], s[4..7] and s[8..11] (s = b + 4)
    const uint32_t a = (h.y >> sh) & 0xFFu, m = (h.z >> sh) & 0xFFu, c = (h.w >> sh) & 0xFFu;
    const bool low = j < 4;
    const uint32_t sc = low ? (a & 63u) : ((c & 0xFu) | ((a >> 6) << 4));
    const uint32_t mn = low ? (m & 63u) : ((c >> 4) | ((m >> 6) << 4));
    return K4Head{__half2float(__ushort_as_half(uint16_t(h.x & 0xFFFFu))),
                  __half2float(__ushort_as_half(uint16_t(h.x >> 16))), float(sc), float(mn)};
}

// The IQ4 levels (ggml's kvalues_iq4nl: -127 -104 -83 -65 -49 -35 -22 -10
// 1 13 25 38 53 69 89 113) as int8 bytes, four to a word, so a lookup is a
// byte permute rather than a load from a divergent table.
constexpr uint32_t kIq4Levels[4] = {0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u};

// The int8 levels of the four 4-bit codes in the low 16 bits of s (one
// per nibble), four to a word: each code's low 3 bits pick one of 8 bytes of
// the lower or upper half of the table, its bit 3 picks the half.
__device__ __forceinline__ uint32_t iq4_levels4(uint32_t s) {
    const uint32_t lo = __byte_perm(kIq4Levels[0], kIq4Levels[1], s & 0x7777u);
    const uint32_t hi = __byte_perm(kIq4Levels[2], kIq4Levels[3], s & 0x7777u);
    return __byte_perm(lo, hi, 0x3210u | ((s & 0x8888u) >> 1));
}

// The levels of the eight codes in one word u of IQ4 code bytes (Q4_0's
// order: byte j holds element j's code low, element j+16's high): lo gets
// those of the low nibbles, hi of the high nibbles, each in element order.
// The word's halves are already four selectors each (low, high, low, high
// nibble), so no code is moved before the lookup, only the levels after.
__device__ __forceinline__ void iq4_levels8(uint32_t u, uint32_t& lo, uint32_t& hi) {
    const uint32_t a = iq4_levels4(u), b = iq4_levels4(u >> 16);
    lo = __byte_perm(a, b, 0x6420u);
    hi = __byte_perm(a, b, 0x7531u);
}

// 6-bit scale (biased by 32) of Q3_K sub-blocks 8h+2k and 8h+2k+1: the
// pair chunk 4h+k uses.
__device__ __forceinline__ void k3_scales(const uint8_t* s, int h, int k, int& s0, int& s1) {
    const int hs = 4 * h + 2 * (k >> 1);
    const int hb = 8 + 2 * (k & 1);
    s0 = (((s[2 * k] >> (4 * h)) & 15) | (((s[hb] >> hs) & 3) << 4)) - 32;
    s1 = (((s[2 * k + 1] >> (4 * h)) & 15) | (((s[hb + 1] >> hs) & 3) << 4)) - 32;
}

// 6-bit scale (biased by 32) of IQ4_XS sub-block s.
__device__ __forceinline__ int iq4xs_scale(const uint8_t* b, int s) {
    const int sh = int(b[2]) | (int(b[3]) << 8);
    return (((b[4 + (s >> 1)] >> (4 * (s & 1))) & 15) | (((sh >> (2 * s)) & 3) << 4)) - 32;
}

// N 32-bit words from a 2-byte-aligned address (blocks of 18, 22, 34 and
// 210 bytes leave their fields there): N aligned word loads, one more when
// the address is not 4-byte aligned, and funnel shifts; half the load
// instructions of 16-bit loads. Reads nothing past the N words'
// last byte's aligned word. Shared: p points into shared memory (a weight
// tile the bulk GEMV copied there), read with ordinary loads.
template <int N, bool Shared = false>
__device__ __forceinline__ void load_words2(const uint8_t* p, uint32_t (&out)[N]) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    const uint32_t* w = reinterpret_cast<const uint32_t*>(a & ~uintptr_t(3));
    const uint32_t sh = uint32_t(a & 2) * 8;
    uint32_t x[N + 1];
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = Shared ? w[i] : __ldg(w + i);
    x[N] = sh ? (Shared ? w[N] : __ldg(w + N)) : 0u;
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = __funnelshift_r(x[i], x[i + 1], sh);
}

// The 2-byte word at a 2-byte-aligned address (f16_at's value as bits).
template <bool Shared = false>
__device__ __forceinline__ uint32_t load_u16(const uint8_t* p) {
    const uint16_t* w = reinterpret_cast<const uint16_t*>(p);
    return Shared ? *w : __ldg(w);
}

// N 32-bit words from a 4-byte-aligned address (Q2_K's 84-byte blocks).
template <int N, bool Shared = false>
__device__ __forceinline__ void load_words4(const uint8_t* p, uint32_t (&out)[N]) {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(p);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = Shared ? w[i] : __ldg(w + i);
}

// N (even) 32-bit words from an 8-byte-aligned address (IQ4_XS's
// 136-byte blocks), two per load.
template <int N, bool Shared = false>
__device__ __forceinline__ void load_words8(const uint8_t* p, uint32_t (&out)[N]) {
    const uint2* w = reinterpret_cast<const uint2*>(p);
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
        const uint2 v = Shared ? w[i] : __ldg(w + i);
        out[2 * i] = v.x;
        out[2 * i + 1] = v.y;
    }
}

// Q2_K chunk 4h+k of the block at b: its 32 two-bit codes as bytes, four
// to a word in element order (bits 2k..2k+1 of qs[32h..32h+32)).
template <bool Shared = false>
__device__ __forceinline__ void q2k_codes(const uint8_t* b, int h, int k, uint32_t (&v)[8]) {
    load_words4<8, Shared>(b + 16 + 32 * h, v);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = (v[i] >> (2 * k)) & 0x03030303u;
}

// Q3_K chunk 4h+k of the block at b: codes 0..7 as bytes, four to a word
// (Q2_K's two low bits from qs plus bit 4h+k of hmask[l] as bit 2; the
// value is d * scale * (code - 4)). hmask and qs are equally (2-byte)
// aligned, so the codes are merged byte-wise in aligned words and moved
// into place once (load_words2's funnel shift, by 0 or 2 whole bytes).
template <bool Shared = false>
__device__ __forceinline__ void q3k_codes(const uint8_t* b, int h, int k, uint32_t (&v)[8]) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(b);
    const uint32_t* wh = reinterpret_cast<const uint32_t*>(a & ~uintptr_t(3));
    const uint32_t* wq = reinterpret_cast<const uint32_t*>((a & ~uintptr_t(3)) + 32 + 32 * h);
    const uint32_t sh = uint32_t(a & 2) * 8;
    const int hs = 4 * h + k;
    uint32_t m[9];
#pragma unroll
    for (int i = 0; i < 9; ++i) {
        if (i == 8 && !sh) {
            m[i] = 0;
            break;
        }
        const uint32_t qw = Shared ? wq[i] : __ldg(wq + i), hw = Shared ? wh[i] : __ldg(wh + i);
        m[i] = ((qw >> (2 * k)) & 0x03030303u) | (((hw >> hs) & 0x01010101u) << 2);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __funnelshift_r(m[i], m[i + 1], sh);
}

template <int T>
__device__ __forceinline__ void load_chunk(const uint8_t* row, int c, float (&v)[32]);

template <>
__device__ __forceinline__ void load_chunk<EH_TYPE_F32>(const uint8_t* row, int c, float (&v)[32]) {
    const float4* p = reinterpret_cast<const float4*>(row) + c * 8;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        float4 f = p[i];
        v[4 * i] = f.x; v[4 * i + 1] = f.y; v[4 * i + 2] = f.z; v[4 * i + 3] = f.w;
    }
}

template <>
__device__ __forceinline__ void load_chunk<EH_TYPE_F16>(const uint8_t* row, int c, float (&v)[32]) {
    const uint4* p = reinterpret_cast<const uint4*>(row + size_t(c) * 64);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        uint4 q = p[i];
        const __half2* h = reinterpret_cast<const __half2*>(&q);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            float2 f = __half22float2(h[k]);
            v[8 * i + 2 * k] = f.x;
            v[8 * i + 2 * k + 1] = f.y;
        }
    }
}

template <>
__device__ __forceinline__ void load_chunk<EH_TYPE_BF16>(const uint8_t* row, int c, float (&v)[32]) {
    const uint4* p = reinterpret_cast<const uint4*>(row + size_t(c) * 64);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        uint4 q = p[i];
        const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            v[8 * i + 2 * k] = __uint_as_float(w[k] << 16);
            v[8 * i + 2 * k + 1] = __uint_as_float(w[k] & 0xFFFF0000u);
        }
    }
}

template <>
__device__ __forceinline__ void load_chunk<EH_TYPE_Q4_0>(const uint8_t* row, int c, float (&v)[32]) {
    const uint8_t* b = row + size_t(c) * 18;
    float d = f16_at(b);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        uint8_t q = b[2 + j];
        v[j] = float(int(q & 15) - 8) * d;
        v[j + 16] = float(int(q >> 4) - 8) * d;
    }
}

template <>
__device__ __forceinline__ void load_chunk<EH_TYPE_Q4_1>(const uint8_t* row, int c, float (&v)[32]) {
    const uint8_t* b = row + size_t(c) * 20;
    float d = f16_at(b), m = f16_at(b + 2);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        uint8_t q = b[4 + j];
        v[j] = float(q & 15) * d + m;
        v[j + 16] = float(q >> 4) * d + m;
    }
}

template <>
__device__ __forceinline__ void load_chunk<EH_TYPE_Q5_0>(const uint8_t* row, int c, float (&v)[32]) {
    const uint8_t* b = row + size_t(c) * 22;
    float d = f16_at(b);
    uint32_t qh = u32_at(b + 2);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        uint8_t q = b[6 + j];
        int lo = (q & 15) | (((qh >> j) & 1) << 4);
        int hi = (q >> 4) | (((qh >> (j + 16)) & 1) << 4);
        v[j] = float(lo - 16) * d;
        v[j + 16] = float(hi - 16) * d;
    }
}

template <>
__device__ __forceinline__ void load_chunk<EH_TYPE_Q5_1>(const uint8_t* row, int c, float (&v)[32]) {
    const uint8_t* b = row + size_t(c) * 24;
    float d = f16_at(b), m = f16_at(b + 2);
    uint32_t qh = u32_at(b + 4);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        uint8_t q = b[8 + j];
        int lo = (q & 15) | (((qh >> j) & 1) << 4);
        int hi = (q >> 4) | (((qh >> (j + 16)) & 1) << 4);
        v[j] = float(lo) * d + m;
        v[j + 16] = float(hi) * d + m;
    }
}

template <>
__device__ __forceinline__ void load_chunk<EH_TYPE_Q8_0>(const uint8_t* row, int c, float (&v)[32]) {
    const uint8_t* b = row + size_t(c) * 34;
    float d = f16_at(b);
    const int8_t* q = reinterpret_cast<const int8_t*>(b + 2);
#pragma unroll
    for (int j = 0; j < 32; ++j) v[j] = float(q[j]) * d;
}

template <>
__device__ __forceinline__ void load_chunk<EH_TYPE_Q4_K>(const uint8_t* row, int c, float (&v)[32]) {
    const uint8_t* b = row + size_t(c >> 3) * 144;
    int s = c & 7;
    float d = f16_at(b), dmin = f16_at(b + 2);
    float sc, mn;
    k4_scale_min(b + 4, s, sc, mn);
    float d1 = d * sc, m1 = dmin * mn;
    const uint4* q4 = reinterpret_cast<const uint4*>(b + 16 + 32 * (s >> 1));
    int shift = (s & 1) * 4;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        uint4 q = q4[i];
        const uint8_t* qb = reinterpret_cast<const uint8_t*>(&q);
#pragma unroll
        for (int j = 0; j < 16; ++j) v[16 * i + j] = d1 * float((qb[j] >> shift) & 15) - m1;
    }
}

template <>
__device__ __forceinline__ void load_chunk<EH_TYPE_Q5_K>(const uint8_t* row, int c, float (&v)[32]) {
    const uint8_t* b = row + size_t(c >> 3) * 176;
    int s = c & 7;
    float d = f16_at(b), dmin = f16_at(b + 2);
    float sc, mn;
    k4_scale_min(b + 4, s, sc, mn);
    float d1 = d * sc, m1 = dmin * mn;
    const uint8_t* qh = b + 16;
    const uint8_t* ql = b + 48 + 32 * (s >> 1);
    int shift = (s & 1) * 4;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
        int q = ((ql[j] >> shift) & 15) | (((qh[j] >> s) & 1) << 4);
        v[j] = d1 * float(q) - m1;
    }
}

template <>
__device__ __forceinline__ void load_chunk<EH_TYPE_Q6_K>(const uint8_t* row, int c, float (&v)[32]) {
    const uint8_t* b = row + size_t(c >> 3) * 210;
    int s = c & 7;
    int half = s >> 2, quarter = s & 3;
    const uint8_t* ql = b + 64 * half + ((quarter & 1) ? 32 : 0);
    const uint8_t* qh = b + 128 + 32 * half;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * half + 2 * quarter;
    float d = f16_at(b + 208);
    int lshift = (quarter >> 1) * 4;
    int hshift = quarter * 2;
    float d0 = d * float(sc[0]), d1 = d * float(sc[1]);
#pragma unroll
    for (int j = 0; j < 32; ++j) {
        int q = ((ql[j] >> lshift) & 15) | (((qh[j] >> hshift) & 3) << 4);
        v[j] = (j < 16 ? d0 : d1) * float(q - 32);
    }
}

template <>
__device__ __forceinline__ void load_chunk<EH_TYPE_Q2_K>(const uint8_t* row, int c, float (&v)[32]) {
    const uint8_t* b = row + size_t(c >> 3) * 84;
    const int s = c & 7, h = s >> 2, k = s & 3;
    const float d = f16_at(b + 80), dmin = f16_at(b + 82);
    const int sc0 = b[8 * h + 2 * k], sc1 = b[8 * h + 2 * k + 1];
    const float d0 = d * float(sc0 & 15), m0 = dmin * float(sc0 >> 4);
    const float d1 = d * float(sc1 & 15), m1 = dmin * float(sc1 >> 4);
    uint32_t q[8];
    q2k_codes(b, h, k, q);
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float qv = float((q[i] >> (8 * j)) & 0xFF);
            v[4 * i + j] = i < 4 ? d0 * qv - m0 : d1 * qv - m1;
        }
}

template <>
__device__ __forceinline__ void load_chunk<EH_TYPE_Q3_K>(const uint8_t* row, int c, float (&v)[32]) {
    const uint8_t* b = row + size_t(c >> 3) * 110;
    const int s = c & 7, h = s >> 2, k = s & 3;
    int s0, s1;
    k3_scales(b + 96, h, k, s0, s1);
    const float d = f16_at(b + 108);
    const float d0 = d * float(s0), d1 = d * float(s1);
    uint32_t q[8];
    q3k_codes(b, h, k, q);
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) v[4 * i + j] = (i < 4 ? d0 : d1) * float(int((q[i] >> (8 * j)) & 0xFF) - 4);
}

// Four words of IQ4 code bytes (16 bytes, Q4_0's nibble order) times d
// into v.
__device__ __forceinline__ void iq4_decode16(const uint32_t (&q)[4], float d, float (&v)[32]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        uint32_t lo, hi;
        iq4_levels8(q[i], lo, hi);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            v[4 * i + j] = d * float(int8_t(lo >> (8 * j)));
            v[16 + 4 * i + j] = d * float(int8_t(hi >> (8 * j)));
        }
    }
}

template <>
__device__ __forceinline__ void load_chunk<EH_TYPE_IQ4_NL>(const uint8_t* row, int c, float (&v)[32]) {
    const uint8_t* b = row + size_t(c) * 18;
    uint32_t q[4];
    load_words2<4>(b + 2, q);
    iq4_decode16(q, f16_at(b), v);
}

template <>
__device__ __forceinline__ void load_chunk<EH_TYPE_IQ4_XS>(const uint8_t* row, int c, float (&v)[32]) {
    const uint8_t* b = row + size_t(c >> 3) * 136;
    const int s = c & 7;
    uint32_t q[4];
    load_words8<4>(b + 8 + 16 * s, q);
    iq4_decode16(q, f16_at(b) * float(iq4xs_scale(b, s)), v);
}

// Address of the bulk of chunk c's bytes (for prefetching); the type at
// run time (a mixed-type launch) or as a template argument.
__device__ __forceinline__ const uint8_t* chunk_ptr(int type, const uint8_t* row, int c) {
    switch (type) {
    case EH_TYPE_F32: return row + size_t(c) * 128;
    case EH_TYPE_F16: case EH_TYPE_BF16: return row + size_t(c) * 64;
    case EH_TYPE_Q4_0: return row + size_t(c) * 18;
    case EH_TYPE_Q4_1: return row + size_t(c) * 20;
    case EH_TYPE_Q5_0: return row + size_t(c) * 22;
    case EH_TYPE_Q5_1: return row + size_t(c) * 24;
    case EH_TYPE_Q8_0: return row + size_t(c) * 34;
    case EH_TYPE_Q4_K: return row + size_t(c >> 3) * 144 + 16 + 32 * ((c & 7) >> 1);
    case EH_TYPE_Q5_K: return row + size_t(c >> 3) * 176 + 48 + 32 * ((c & 7) >> 1);
    case EH_TYPE_Q6_K: return row + size_t(c >> 3) * 210 + 64 * ((c & 7) >> 2);
    case EH_TYPE_Q2_K: return row + size_t(c >> 3) * 84 + 16 + 32 * ((c & 7) >> 2);
    case EH_TYPE_Q3_K: return row + size_t(c >> 3) * 110 + 32 + 32 * ((c & 7) >> 2);
    case EH_TYPE_IQ4_NL: return row + size_t(c) * 18;
    case EH_TYPE_IQ4_XS: return row + size_t(c >> 3) * 136 + 8 + 16 * (c & 7);
    default: return row;
    }
}
template <int T>
__device__ __forceinline__ const uint8_t* chunk_ptr(const uint8_t* row, int c) {
    return chunk_ptr(T, row, c);
}

__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// Calls f.template operator()<T>() for the runtime type id; false if unknown.
template <class F>
__device__ __forceinline__ bool dispatch_type(int type, F&& f) {
    switch (type) {
    case EH_TYPE_F32: f.template operator()<EH_TYPE_F32>(); return true;
    case EH_TYPE_F16: f.template operator()<EH_TYPE_F16>(); return true;
    case EH_TYPE_BF16: f.template operator()<EH_TYPE_BF16>(); return true;
    case EH_TYPE_Q4_0: f.template operator()<EH_TYPE_Q4_0>(); return true;
    case EH_TYPE_Q4_1: f.template operator()<EH_TYPE_Q4_1>(); return true;
    case EH_TYPE_Q5_0: f.template operator()<EH_TYPE_Q5_0>(); return true;
    case EH_TYPE_Q5_1: f.template operator()<EH_TYPE_Q5_1>(); return true;
    case EH_TYPE_Q8_0: f.template operator()<EH_TYPE_Q8_0>(); return true;
    case EH_TYPE_Q4_K: f.template operator()<EH_TYPE_Q4_K>(); return true;
    case EH_TYPE_Q5_K: f.template operator()<EH_TYPE_Q5_K>(); return true;
    case EH_TYPE_Q6_K: f.template operator()<EH_TYPE_Q6_K>(); return true;
    case EH_TYPE_Q2_K: f.template operator()<EH_TYPE_Q2_K>(); return true;
    case EH_TYPE_Q3_K: f.template operator()<EH_TYPE_Q3_K>(); return true;
    case EH_TYPE_IQ4_NL: f.template operator()<EH_TYPE_IQ4_NL>(); return true;
    case EH_TYPE_IQ4_XS: f.template operator()<EH_TYPE_IQ4_XS>(); return true;
    default: return false;
    }
}

}  // namespace ehcuda

// Integer dot products of one 32-element weight chunk with a 32-element
// input chunk quantized to integers with one float scale: the decode GEMV's
// path for quantized weights. Weight codes are unpacked four to a 32-bit
// word and multiplied with __dp2a (int16 input: ~1.5e-5 rounding of the
// chunk's largest |x|, below FP32 accumulation noise for these tests),
// __dp4a (int8 input: faster, ~0.4 % rounding), or __dp2a plus __dp4a
// (int16x2: the input as int16 codes plus int8 codes of their rounding
// residue in 1/256 of a code, ~2^-24 of the chunk's largest |x|, as fine
// as FP32 rounding of it, for models whose routing must not move); block
// scales and offsets are
// applied once per chunk, with the input code sums precomputed at staging:
//   sum_j w_j * x_j  ~=  xd * (scale * sum_j q_j * qx_j  - offset * sum_j qx_j).
// The float path (load_chunk) stays the reference.
#pragma once

#include <type_traits>

#include "quant.cuh"
#include "mxfp4.cuh"

namespace ehcuda {

// Spreads 4 bits (b0..b3) to bit 4 of each byte.
__device__ __forceinline__ uint32_t spread4(uint32_t b) {
    return ((b & 1u) << 4) | ((b & 2u) << 11) | ((b & 4u) << 18) | ((b & 8u) << 25);
}

// Integer sums of the int16x2 form: the codes' part and the residue
// codes' part (in units of 1/kResidueUnits of a code).
constexpr int kResidueUnits = 256;
struct I2 {
    int hi, lo;
};
__device__ __forceinline__ I2 operator+(I2 a, I2 b) { return I2{a.hi + b.hi, a.lo + b.lo}; }
__device__ __forceinline__ I2 operator-(I2 a, I2 b) { return I2{a.hi - b.hi, a.lo - b.lo}; }
__device__ __forceinline__ I2 operator*(int m, I2 a) { return I2{m * a.hi, m * a.lo}; }
__device__ __forceinline__ float to_f(int v) { return float(v); }
__device__ __forceinline__ float to_f(I2 v) { return fmaf(float(v.lo), 1.0f / float(kResidueUnits), float(v.hi)); }

// One input chunk: codes of elements 4k..4k+3 are word k (int8) or words
// 2k, 2k+1 (int16 pairs; Bits 32: also their int8 residue codes, word k of
// r); sum_lo and sum_hi are the code sums of elements 0..15 and 16..31; d
// the scale.
template <int Bits>
struct XChunk {
    static constexpr int kWords = Bits == 8 ? 8 : 16;
    using Sum = std::conditional_t<Bits == 32, I2, int>;
    int w[kWords];
    int r[Bits == 32 ? 8 : 1];
    Sum sum_lo, sum_hi;
    float d;
};
using XInt8 = XChunk<8>;
using XInt16 = XChunk<16>;
using XInt16x2 = XChunk<32>;

// acc + sum over the 4 bytes b of v: b * x[4k + b].
__device__ __forceinline__ int dot4(const XInt8& x, int k, uint32_t v, int acc) {
    return __dp4a(int(v), x.w[k], acc);
}
__device__ __forceinline__ int dot4(const XInt16& x, int k, uint32_t v, int acc) {
    return __dp2a_hi(x.w[2 * k + 1], int(v), __dp2a_lo(x.w[2 * k], int(v), acc));
}
__device__ __forceinline__ I2 dot4(const XInt16x2& x, int k, uint32_t v, I2 acc) {
    return I2{__dp2a_hi(x.w[2 * k + 1], int(v), __dp2a_lo(x.w[2 * k], int(v), acc.hi)), __dp4a(int(v), x.r[k], acc.lo)};
}

// dot4 with the weight bytes of v read as unsigned (0..255): for codes kept
// in place in a byte's high nibble (16 q), which a signed byte would read
// negative (int8 and int16 inputs; int16x2 keeps the shifted codes). PTX's dp2a / dp4a take each operand's signedness apart; the
// CUDA intrinsics have only the all-signed and all-unsigned forms.
__device__ __forceinline__ int dp2a_lo_su(int a, uint32_t b, int c) {
    int d;
    asm("dp2a.lo.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ int dp2a_hi_su(int a, uint32_t b, int c) {
    int d;
    asm("dp2a.hi.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ int dot4u(const XInt8& x, int k, uint32_t v, int acc) { return dp4a_us(v, x.w[k], acc); }
__device__ __forceinline__ int dot4u(const XInt16& x, int k, uint32_t v, int acc) {
    return dp2a_hi_su(x.w[2 * k + 1], v, dp2a_lo_su(x.w[2 * k], v, acc));
}

// The integer dot of 8 words of 4-bit codes with x, the codes taken in
// place from the low (hi16 false) or high (hi16 true) nibble of each byte:
// one mask a word instead of a shift and a mask. High nibbles are read as
// 16 q, so the sum is 16 times the codes' (exactly: |16 q x| sums stay far
// inside int32 for int16 codes, and a power-of-two factor is exact through
// the float conversion and the scale's product, see dot_chunk_int).
template <class X>
__device__ __forceinline__ typename X::Sum nibble_dot(const uint32_t (&q)[8], bool hi16, const X& x) {
    const uint32_t m = hi16 ? 0xF0F0F0F0u : 0x0F0F0F0Fu;
    typename X::Sum si{};
#pragma unroll
    for (int k = 0; k < 8; ++k) si = dot4u(x, k, q[k] & m, si);
    return si;
}

// Integer dot of 16 IQ4 code bytes (Q4_0's nibble order) with x: the
// codes' levels (iq4_levels8), without the block's scale.
template <class X>
__device__ __forceinline__ typename X::Sum iq4_dot(const uint32_t (&q)[4], const X& x) {
    typename X::Sum si{};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        uint32_t lo, hi;
        iq4_levels8(q[i], lo, hi);
        si = dot4(x, i, lo, si);
        si = dot4(x, 4 + i, hi, si);
    }
    return si;
}

// Integer dots of 8 words of byte codes with x, the halves apart
// (elements 0..15 and 16..31: the K-quants' 16-value sub-blocks).
template <class X>
__device__ __forceinline__ void dot_halves(const uint32_t (&q)[8], const X& x, typename X::Sum& lo,
                                           typename X::Sum& hi) {
    lo = {};
    hi = {};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        lo = dot4(x, i, q[i], lo);
        hi = dot4(x, 4 + i, q[4 + i], hi);
    }
}

// Weight chunk c of a row dotted with x (both scales applied). Shared: the
// row lies in shared memory.
template <int T, bool Shared = false, class X>
__device__ __forceinline__ float dot_chunk_int(const uint8_t* row, int c, const X& x) {
    using S = typename X::Sum;
    const S sx = x.sum_lo + x.sum_hi;
    if constexpr (T == EH_TYPE_Q4_0) {
        const uint8_t* b = row + size_t(c) * 18;
        uint32_t q[4];
        load_words2<4, Shared>(b + 2, q);
        S si{};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const uint32_t u = q[k];
            si = dot4(x, k, u & 0x0F0F0F0Fu, si);
            si = dot4(x, 4 + k, (u >> 4) & 0x0F0F0F0Fu, si);
        }
        return f16_at(b) * x.d * to_f(si - 8 * sx);
    } else if constexpr (T == EH_TYPE_Q4_1) {
        const uint8_t* b = row + size_t(c) * 20;
        const uint32_t* q = reinterpret_cast<const uint32_t*>(b + 4);
        S si{};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const uint32_t u = q[k];
            si = dot4(x, k, u & 0x0F0F0F0Fu, si);
            si = dot4(x, 4 + k, (u >> 4) & 0x0F0F0F0Fu, si);
        }
        return x.d * (f16_at(b) * to_f(si) + f16_at(b + 2) * to_f(sx));
    } else if constexpr (T == EH_TYPE_Q5_0) {
        const uint8_t* b = row + size_t(c) * 22;
        uint32_t q[5];
        load_words2<5, Shared>(b + 2, q);
        const uint32_t qh = q[0];
        S si{};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const uint32_t u = q[1 + k];
            si = dot4(x, k, (u & 0x0F0F0F0Fu) | spread4(qh >> (4 * k)), si);
            si = dot4(x, 4 + k, ((u >> 4) & 0x0F0F0F0Fu) | spread4(qh >> (16 + 4 * k)), si);
        }
        return f16_at(b) * x.d * to_f(si - 16 * sx);
    } else if constexpr (T == EH_TYPE_Q5_1) {
        const uint8_t* b = row + size_t(c) * 24;
        const uint32_t qh = *reinterpret_cast<const uint32_t*>(b + 4);
        const uint32_t* q = reinterpret_cast<const uint32_t*>(b + 8);
        S si{};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const uint32_t u = q[k];
            si = dot4(x, k, (u & 0x0F0F0F0Fu) | spread4(qh >> (4 * k)), si);
            si = dot4(x, 4 + k, ((u >> 4) & 0x0F0F0F0Fu) | spread4(qh >> (16 + 4 * k)), si);
        }
        return x.d * (f16_at(b) * to_f(si) + f16_at(b + 2) * to_f(sx));
    } else if constexpr (T == EH_TYPE_Q8_0) {
        const uint8_t* b = row + size_t(c) * 34;
        uint32_t q[8];
        load_words2<8, Shared>(b + 2, q);
        S si{};
#pragma unroll
        for (int k = 0; k < 8; ++k) si = dot4(x, k, q[k], si);
        return f16_at(b) * x.d * to_f(si);
    } else if constexpr (T == EH_TYPE_Q4_K || T == EH_TYPE_Q5_K) {
        constexpr bool k5 = T == EH_TYPE_Q5_K;
        const uint8_t* b = row + size_t(c >> 3) * (k5 ? 176 : 144);
        const int s = c & 7;
        const K4Head hd = k4_head(b, s);
        const uint4* q4 = reinterpret_cast<const uint4*>(b + (k5 ? 48 : 16) + 32 * (s >> 1));
        const uint4 qa = q4[0], qb = q4[1];
        const uint32_t q[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
        uint32_t h[8] = {};
        if constexpr (k5) {
            const uint4* h4 = reinterpret_cast<const uint4*>(b + 16);
            const uint4 ha = h4[0], hb = h4[1];
            const uint32_t hh[8] = {ha.x, ha.y, ha.z, ha.w, hb.x, hb.y, hb.z, hb.w};
#pragma unroll
            for (int k = 0; k < 8; ++k) h[k] = ((hh[k] >> s) & 0x01010101u) << 4;
        }
        if constexpr (!k5 && !std::is_same_v<S, I2>) {
            // odd sub-blocks' codes are the high nibbles, read in place as
            // 16 q (nibble_dot); their scale takes the 1/16: d sc / 16 is
            // d sc rounded, over 16 (d >= 2^-24, far from FP32's
            // subnormals), so the product is the one of the shifted form.
            // (int16x2 inputs keep the shifted form: in the MoE decode
            // kernels, at their 128-register bound, this one measured 0.85 %
            // slower, Qwen3-30B-A3B on an H200.)
            const S si = nibble_dot(q, s & 1, x);
            const float sc = (s & 1) ? hd.sc * 0.0625f : hd.sc;
            return x.d * (hd.d * sc * to_f(si) - hd.dmin * hd.mn * to_f(sx));
        }
        const int shift = (s & 1) * 4;
        S si{};
#pragma unroll
        for (int k = 0; k < 8; ++k) si = dot4(x, k, ((q[k] >> shift) & 0x0F0F0F0Fu) | h[k], si);
        return x.d * (hd.d * hd.sc * to_f(si) - hd.dmin * hd.mn * to_f(sx));
    } else if constexpr (T == EH_TYPE_Q6_K) {
        const uint8_t* b = row + size_t(c >> 3) * 210;
        const int s = c & 7;
        const int half = s >> 2, quarter = s & 3;
        const uint8_t* ql = b + 64 * half + ((quarter & 1) ? 32 : 0);
        const uint8_t* qh = b + 128 + 32 * half;
        // the chunk's two int8 scales and the block's FP16 d, one 2-byte load
        // each (Q6_K blocks of 210 bytes are 2-byte aligned)
        const uint32_t sc2 = load_u16<Shared>(b + 192 + 8 * half + 2 * quarter);
        const int sc[2] = {int(int8_t(sc2 & 0xFFu)), int(int8_t(sc2 >> 8))};
        const float d6 = __half2float(__ushort_as_half(uint16_t(load_u16<Shared>(b + 208))));
        // a code's two high bits sit at bits 2 quarter of its qh byte: one
        // rotate by 4 - 2 quarter (mod 32) puts them at bits 4..5 of the
        // same byte (what crosses a byte boundary is masked off); int16x2
        // inputs keep the shift form (see Q4_K above)
        constexpr bool kRotate = !std::is_same_v<S, I2>;
        const int lshift = (quarter >> 1) * 4, hshift = quarter * 2, hrot = (4 - 2 * quarter) & 31;
        uint32_t lw[8], hw[8];
        load_words2<8, Shared>(ql, lw);
        load_words2<8, Shared>(qh, hw);
        S si0{}, si1{};
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const uint32_t l = lw[k], hb = hw[k];
            const uint32_t hv = kRotate ? __funnelshift_l(hb, hb, hrot) & 0x30303030u : ((hb >> hshift) & 0x03030303u) << 4;
            const uint32_t v = ((l >> lshift) & 0x0F0F0F0Fu) | hv;
            if (k < 4)
                si0 = dot4(x, k, v, si0);
            else
                si1 = dot4(x, k, v, si1);
        }
        return d6 * x.d *
               (float(sc[0]) * to_f(si0 - 32 * x.sum_lo) + float(sc[1]) * to_f(si1 - 32 * x.sum_hi));
    } else if constexpr (T == EH_TYPE_Q2_K) {
        // chunk 4h+k: bits 2k..2k+1 of qs[32h..32h+32); elements 0..15 and
        // 16..31 have their own 4-bit scale and min, applied to the half sums
        const uint8_t* b = row + size_t(c >> 3) * 84;
        const int s = c & 7, h = s >> 2, k = s & 3;
        uint32_t q[8];
        q2k_codes<Shared>(b, h, k, q);
        S si0, si1;
        dot_halves(q, x, si0, si1);
        const int sc0 = b[8 * h + 2 * k], sc1 = b[8 * h + 2 * k + 1];
        return x.d * (f16_at(b + 80) * to_f((sc0 & 15) * si0 + (sc1 & 15) * si1) -
                      f16_at(b + 82) * to_f((sc0 >> 4) * x.sum_lo + (sc1 >> 4) * x.sum_hi));
    } else if constexpr (T == EH_TYPE_Q3_K) {
        // codes 0..7 (q3k_codes), less 4 through the input code sums
        const uint8_t* b = row + size_t(c >> 3) * 110;
        const int s = c & 7, h = s >> 2, k = s & 3;
        uint32_t q[8];
        q3k_codes<Shared>(b, h, k, q);
        S si0, si1;
        dot_halves(q, x, si0, si1);
        int s0, s1;
        k3_scales(b + 96, h, k, s0, s1);
        return f16_at(b + 108) * x.d * to_f(s0 * (si0 - 4 * x.sum_lo) + s1 * (si1 - 4 * x.sum_hi));
    } else if constexpr (T == EH_TYPE_IQ4_NL) {
        // codes through the level table (iq4_levels8) to signed bytes
        const uint8_t* b = row + size_t(c) * 18;
        uint32_t q[4];
        load_words2<4, Shared>(b + 2, q);
        const S si = iq4_dot(q, x);
        return f16_at(b) * x.d * to_f(si);
    } else if constexpr (T == EH_TYPE_IQ4_XS) {
        const uint8_t* b = row + size_t(c >> 3) * 136;
        const int s = c & 7;
        uint32_t q[4];
        load_words8<4, Shared>(b + 8 + 16 * s, q);
        const S si = iq4_dot(q, x);
        return f16_at(b) * float(iq4xs_scale(b, s)) * x.d * to_f(si);
    } else if constexpr (T == EH_TYPE_MXFP4) {
        // device layout (mxfp4.cuh): aligned 16-byte loads of the codes
        // and of the group's exponents; word k expands to input words k
        // and 4 + k
        uint32_t e;
        uint4 q;
        static_assert(!Shared, "MXFP4 rows are read from global memory only");
        mxfp4_block(row, c, e, q);
        const uint32_t w[4] = {q.x, q.y, q.z, q.w};
        S si{};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            uint32_t lo, hi;
            mxfp4_x2_bytes(w[k], lo, hi);
            si = dot4(x, k, lo, si);
            si = dot4(x, 4 + k, hi, si);
        }
        return 0.5f * e8m0_value(e) * x.d * to_f(si);
    } else {
        static_assert(T == EH_TYPE_Q4_0, "no integer-input path for this type");
        return 0.0f;
    }
}

// dot_chunk_int with the type known at run time (mixed-type launches: one
// warp-uniform switch per chunk).
template <bool Shared = false, class X>
__device__ __forceinline__ float dot_chunk_int_any(int type, const uint8_t* row, int c, const X& x) {
    switch (type) {
    case EH_TYPE_Q4_0: return dot_chunk_int<EH_TYPE_Q4_0, Shared>(row, c, x);
    case EH_TYPE_Q4_1: return dot_chunk_int<EH_TYPE_Q4_1, Shared>(row, c, x);
    case EH_TYPE_Q5_0: return dot_chunk_int<EH_TYPE_Q5_0, Shared>(row, c, x);
    case EH_TYPE_Q5_1: return dot_chunk_int<EH_TYPE_Q5_1, Shared>(row, c, x);
    case EH_TYPE_Q8_0: return dot_chunk_int<EH_TYPE_Q8_0, Shared>(row, c, x);
    case EH_TYPE_Q4_K: return dot_chunk_int<EH_TYPE_Q4_K, Shared>(row, c, x);
    case EH_TYPE_Q5_K: return dot_chunk_int<EH_TYPE_Q5_K, Shared>(row, c, x);
    case EH_TYPE_Q6_K: return dot_chunk_int<EH_TYPE_Q6_K, Shared>(row, c, x);
    default: return 0.0f;  // the host launches only these (mixed_launch_type)
    }
}

template <int T>
constexpr bool has_int_input_path() {
    return T == EH_TYPE_MXFP4 || T == EH_TYPE_Q4_0 || T == EH_TYPE_Q4_1 || T == EH_TYPE_Q5_0 || T == EH_TYPE_Q5_1 || T == EH_TYPE_Q8_0 ||
           T == EH_TYPE_Q4_K || T == EH_TYPE_Q5_K || T == EH_TYPE_Q6_K || T == EH_TYPE_Q2_K || T == EH_TYPE_Q3_K ||
           T == EH_TYPE_IQ4_NL || T == EH_TYPE_IQ4_XS;
}

// Bytes from a row's start to chunk c's block, for c a multiple of 16
// (whole blocks of every integer-path type: 32 values, 256 for the
// K-quants, groups of 16 blocks in MXFP4's device layout): where a slice
// of a row that starts at chunk c begins.
template <int T>
__host__ __device__ constexpr size_t chunk_run_offset(int c) {
    static_assert(has_int_input_path<T>(), "integer-path types only");
    switch (T) {
    case EH_TYPE_Q4_0: return size_t(c) * 18;
    case EH_TYPE_Q4_1: return size_t(c) * 20;
    case EH_TYPE_Q5_0: return size_t(c) * 22;
    case EH_TYPE_Q5_1: return size_t(c) * 24;
    case EH_TYPE_Q8_0: return size_t(c) * 34;
    case EH_TYPE_Q4_K: return size_t(c >> 3) * 144;
    case EH_TYPE_Q5_K: return size_t(c >> 3) * 176;
    case EH_TYPE_Q6_K: return size_t(c >> 3) * 210;
    case EH_TYPE_Q2_K: return size_t(c >> 3) * 84;
    case EH_TYPE_Q3_K: return size_t(c >> 3) * 110;
    case EH_TYPE_IQ4_NL: return size_t(c) * 18;
    case EH_TYPE_IQ4_XS: return size_t(c >> 3) * 136;
    default: return mxfp4_group_offset(c);
    }
}

}  // namespace ehcuda

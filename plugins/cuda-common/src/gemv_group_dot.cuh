// A weight chunk decoded once and dotted with several tokens' integer
// input chunks (the bulk GEMV's token groups, gemv_bulk.cu, under
// KernelPlan::bulk_group_once). Every integer-path type but MXFP4 is, per
// 32-element chunk, byte codes q_j and per half chunk h (elements 0..15,
// 16..31) a scale a_h, an integer offset o and a float offset m_h:
//   w_j = a_h * (q_j + o) + m_h
// so with an input chunk of codes x_j and scale d,
//   sum_j w_j x_j = d * sum_h (a_h * (sum q x + o * sum x) + m_h * sum x)
// over the half's codes: the codes and scales are decoded once per chunk
// (WChunk), each token then costs its integer dots (dot4) and a few
// multiplies. The same algebra as dot_chunk_int (quant_dp4a.cuh), whose
// sums it equals up to float rounding of the scale products.
#pragma once

#include "ehcuda/quant_dp4a.cuh"

namespace ehcuda::detail {

// Halves with their own scale (1: one scale for the chunk).
template <int T>
constexpr int kWHalves = T == EH_TYPE_Q6_K || T == EH_TYPE_Q2_K || T == EH_TYPE_Q3_K ? 2 : 1;
// The integer offset o of the codes.
template <int T>
constexpr int kWOffset = T == EH_TYPE_Q4_0 ? -8 : T == EH_TYPE_Q5_0 ? -16 : T == EH_TYPE_Q6_K ? -32 : T == EH_TYPE_Q3_K ? -4 : 0;
// Whether the type has the float offset m (a block minimum).
template <int T>
constexpr bool kWMin = T == EH_TYPE_Q4_1 || T == EH_TYPE_Q5_1 || T == EH_TYPE_Q4_K || T == EH_TYPE_Q5_K || T == EH_TYPE_Q2_K;

// Chunk c of a row: byte codes four to a word in element order (word k:
// elements 4k..4k+3, as dot4 pairs them with the input), the halves'
// scales and minimums.
template <int T>
struct WChunk {
    uint32_t q[8];
    float a[kWHalves<T>];
    float m[kWMin<T> ? kWHalves<T> : 1];
};

// Decodes chunk c of `row` (in shared memory: the bulk GEMV's tile).
template <int T>
__device__ __forceinline__ void decode_wchunk(const uint8_t* row, int c, WChunk<T>& w) {
    constexpr bool Sh = true;
    if constexpr (T == EH_TYPE_Q4_0 || T == EH_TYPE_IQ4_NL) {
        const uint8_t* b = row + size_t(c) * 18;
        uint32_t u[4];
        load_words2<4, Sh>(b + 2, u);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            if constexpr (T == EH_TYPE_Q4_0) {
                w.q[k] = u[k] & 0x0F0F0F0Fu;
                w.q[4 + k] = (u[k] >> 4) & 0x0F0F0F0Fu;
            } else {
                iq4_levels8(u[k], w.q[k], w.q[4 + k]);
            }
        }
        w.a[0] = f16_at(b);
    } else if constexpr (T == EH_TYPE_Q4_1) {
        const uint8_t* b = row + size_t(c) * 20;
        const uint32_t* u = reinterpret_cast<const uint32_t*>(b + 4);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const uint32_t v = u[k];
            w.q[k] = v & 0x0F0F0F0Fu;
            w.q[4 + k] = (v >> 4) & 0x0F0F0F0Fu;
        }
        w.a[0] = f16_at(b);
        w.m[0] = f16_at(b + 2);
    } else if constexpr (T == EH_TYPE_Q5_0 || T == EH_TYPE_Q5_1) {
        constexpr bool one = T == EH_TYPE_Q5_1;
        const uint8_t* b = row + size_t(c) * (one ? 24 : 22);
        uint32_t qh, u[4];
        if constexpr (one) {
            qh = *reinterpret_cast<const uint32_t*>(b + 4);
#pragma unroll
            for (int k = 0; k < 4; ++k) u[k] = reinterpret_cast<const uint32_t*>(b + 8)[k];
        } else {
            uint32_t v[5];
            load_words2<5, Sh>(b + 2, v);
            qh = v[0];
#pragma unroll
            for (int k = 0; k < 4; ++k) u[k] = v[1 + k];
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            w.q[k] = (u[k] & 0x0F0F0F0Fu) | spread4(qh >> (4 * k));
            w.q[4 + k] = ((u[k] >> 4) & 0x0F0F0F0Fu) | spread4(qh >> (16 + 4 * k));
        }
        w.a[0] = f16_at(b);
        if constexpr (one) w.m[0] = f16_at(b + 2);
    } else if constexpr (T == EH_TYPE_Q8_0) {
        const uint8_t* b = row + size_t(c) * 34;
        load_words2<8, Sh>(b + 2, w.q);
        w.a[0] = f16_at(b);
    } else if constexpr (T == EH_TYPE_Q4_K || T == EH_TYPE_Q5_K) {
        constexpr bool k5 = T == EH_TYPE_Q5_K;
        const uint8_t* b = row + size_t(c >> 3) * (k5 ? 176 : 144);
        const int s = c & 7;
        const K4Head hd = k4_head(b, s);
        const uint4* q4 = reinterpret_cast<const uint4*>(b + (k5 ? 48 : 16) + 32 * (s >> 1));
        const uint4 qa = q4[0], qb = q4[1];
        const uint32_t q[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
        const int shift = (s & 1) * 4;
#pragma unroll
        for (int k = 0; k < 8; ++k) w.q[k] = (q[k] >> shift) & 0x0F0F0F0Fu;
        if constexpr (k5) {
            const uint4* h4 = reinterpret_cast<const uint4*>(b + 16);
            const uint4 ha = h4[0], hb = h4[1];
            const uint32_t hh[8] = {ha.x, ha.y, ha.z, ha.w, hb.x, hb.y, hb.z, hb.w};
#pragma unroll
            for (int k = 0; k < 8; ++k) w.q[k] |= ((hh[k] >> s) & 0x01010101u) << 4;
        }
        w.a[0] = hd.d * hd.sc;
        w.m[0] = -(hd.dmin * hd.mn);
    } else if constexpr (T == EH_TYPE_Q6_K) {
        const uint8_t* b = row + size_t(c >> 3) * 210;
        const int s = c & 7;
        const int half = s >> 2, quarter = s & 3;
        const uint8_t* ql = b + 64 * half + ((quarter & 1) ? 32 : 0);
        const uint8_t* qh = b + 128 + 32 * half;
        const uint32_t sc2 = load_u16<Sh>(b + 192 + 8 * half + 2 * quarter);
        const float d6 = __half2float(__ushort_as_half(uint16_t(load_u16<Sh>(b + 208))));
        const int lshift = (quarter >> 1) * 4, hrot = (4 - 2 * quarter) & 31;
        uint32_t lw[8], hw[8];
        load_words2<8, Sh>(ql, lw);
        load_words2<8, Sh>(qh, hw);
#pragma unroll
        for (int k = 0; k < 8; ++k)
            w.q[k] = ((lw[k] >> lshift) & 0x0F0F0F0Fu) | (__funnelshift_l(hw[k], hw[k], hrot) & 0x30303030u);
        w.a[0] = d6 * float(int(int8_t(sc2 & 0xFFu)));
        w.a[1] = d6 * float(int(int8_t(sc2 >> 8)));
    } else if constexpr (T == EH_TYPE_Q2_K) {
        const uint8_t* b = row + size_t(c >> 3) * 84;
        const int s = c & 7, h = s >> 2, k = s & 3;
        q2k_codes<Sh>(b, h, k, w.q);
        const int sc0 = b[8 * h + 2 * k], sc1 = b[8 * h + 2 * k + 1];
        const float d = f16_at(b + 80), dmin = f16_at(b + 82);
        w.a[0] = d * float(sc0 & 15);
        w.a[1] = d * float(sc1 & 15);
        w.m[0] = -(dmin * float(sc0 >> 4));
        w.m[1] = -(dmin * float(sc1 >> 4));
    } else if constexpr (T == EH_TYPE_Q3_K) {
        const uint8_t* b = row + size_t(c >> 3) * 110;
        const int s = c & 7, h = s >> 2, k = s & 3;
        q3k_codes<Sh>(b, h, k, w.q);
        int s0, s1;
        k3_scales(b + 96, h, k, s0, s1);
        const float d = f16_at(b + 108);
        w.a[0] = d * float(s0);
        w.a[1] = d * float(s1);
    } else if constexpr (T == EH_TYPE_IQ4_XS) {
        const uint8_t* b = row + size_t(c >> 3) * 136;
        const int s = c & 7;
        uint32_t u[4];
        load_words8<4, Sh>(b + 8 + 16 * s, u);
#pragma unroll
        for (int k = 0; k < 4; ++k) iq4_levels8(u[k], w.q[k], w.q[4 + k]);
        w.a[0] = f16_at(b) * float(iq4xs_scale(b, s));
    } else {
        static_assert(T == EH_TYPE_Q4_0, "no decoded-once form for this type");
    }
}

// The decoded chunk dotted with one token's input chunk (both scales
// applied).
template <int T, class X>
__device__ __forceinline__ float wchunk_dot(const WChunk<T>& w, const X& x) {
    using S = typename X::Sum;
    constexpr int o = kWOffset<T>;
    if constexpr (kWHalves<T> == 1) {
        S si{};
#pragma unroll
        for (int k = 0; k < 8; ++k) si = dot4(x, k, w.q[k], si);
        const S sx = x.sum_lo + x.sum_hi;
        if constexpr (o != 0) si = si + o * sx;
        float v = w.a[0] * to_f(si);
        if constexpr (kWMin<T>) v = fmaf(w.m[0], to_f(sx), v);
        return x.d * v;
    } else {
        S s0{}, s1{};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            s0 = dot4(x, k, w.q[k], s0);
            s1 = dot4(x, 4 + k, w.q[4 + k], s1);
        }
        if constexpr (o != 0) {
            s0 = s0 + o * x.sum_lo;
            s1 = s1 + o * x.sum_hi;
        }
        float v = fmaf(w.a[1], to_f(s1), w.a[0] * to_f(s0));
        if constexpr (kWMin<T>) v = fmaf(w.m[1], to_f(x.sum_hi), fmaf(w.m[0], to_f(x.sum_lo), v));
        return x.d * v;
    }
}

// The rows x tokens sums of a warp (V per lane, a power of two <= 32)
// added over its 32 lanes, transposed on the way: each xor step sends
// half of a lane's remaining sums to its partner and adds the other
// half's, so V = 32 takes 31 shuffles instead of 160. Afterwards value
// `held` of the V is complete on the lanes whose lowest log2(32 / V) bits
// are zero (every lane of a group of 32 / V holds it). A fixed tree per
// value: deterministic.
template <int V, int O = 16>
__device__ __forceinline__ void transpose_sum(float (&acc)[V], int lane, int& held) {
    constexpr int kLog = V == 1 ? 0 : V == 2 ? 1 : V == 4 ? 2 : V == 8 ? 3 : V == 16 ? 4 : 5;
    static_assert((1 << kLog) == V, "V: a power of two up to 32");
    // step s = 4 - log2(O); values left before it: V >> s (at least 1)
    constexpr int s = O == 16 ? 0 : O == 8 ? 1 : O == 4 ? 2 : O == 2 ? 3 : 4;
    constexpr int left = (V >> s) > 0 ? (V >> s) : 1;
    if constexpr (left > 1) {
        constexpr int half = left / 2;
        const bool upper = (lane & O) != 0;
#pragma unroll
        for (int i = 0; i < half; ++i) {
            const float send = upper ? acc[i] : acc[i + half];
            const float keep = upper ? acc[i + half] : acc[i];
            acc[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
        }
        if (upper) held += half;
    } else {
        acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], O);
    }
    if constexpr (O > 1) transpose_sum<V, O / 2>(acc, lane, held);
}

}  // namespace ehcuda::detail

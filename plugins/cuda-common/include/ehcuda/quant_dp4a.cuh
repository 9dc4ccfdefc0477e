// Integer dot products of one 32-element weight chunk with a 32-element
// input chunk quantized to int8 (scale xd): the decode GEMV's fast path.
// Weight codes are unpacked four to a 32-bit word and multiplied with
// __dp4a, then the block scales/offsets are applied once per chunk:
//   sum_j w_j * x_j  ~=  xd * (scale * sum_j q_j * qx_j  - offset terms).
// The float path (load_chunk) stays the reference.
#pragma once

#include "quant.cuh"

namespace ehcuda {

__device__ __forceinline__ uint32_t u32_from_u16(const uint8_t* p) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
    return uint32_t(h[0]) | (uint32_t(h[1]) << 16);
}

// Sum of the four int8 lanes of v.
__device__ __forceinline__ int sum4(int v) { return __dp4a(v, 0x01010101, 0); }

// Spreads 4 bits (b0..b3) to bit 4 of each byte.
__device__ __forceinline__ uint32_t spread4(uint32_t b) {
    return ((b & 1u) << 4) | ((b & 2u) << 11) | ((b & 4u) << 18) | ((b & 8u) << 25);
}

// x: 8 words of packed int8 (elements 4k..4k+3 in word k).
template <int T>
__device__ __forceinline__ float dot_chunk_q8x(const uint8_t* row, int c, const int (&x)[8], float xd);

template <>
__device__ __forceinline__ float dot_chunk_q8x<EH_TYPE_Q4_0>(const uint8_t* row, int c, const int (&x)[8], float xd) {
    const uint8_t* b = row + size_t(c) * 18;
    int si = 0, sx = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const uint32_t u = u32_from_u16(b + 2 + 4 * k);
        si = __dp4a(int(u & 0x0F0F0F0Fu), x[k], si);
        si = __dp4a(int((u >> 4) & 0x0F0F0F0Fu), x[4 + k], si);
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) sx += sum4(x[k]);
    return f16_at(b) * xd * float(si - 8 * sx);
}

template <>
__device__ __forceinline__ float dot_chunk_q8x<EH_TYPE_Q4_1>(const uint8_t* row, int c, const int (&x)[8], float xd) {
    const uint8_t* b = row + size_t(c) * 20;
    const uint32_t* q = reinterpret_cast<const uint32_t*>(b + 4);
    int si = 0, sx = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const uint32_t u = q[k];
        si = __dp4a(int(u & 0x0F0F0F0Fu), x[k], si);
        si = __dp4a(int((u >> 4) & 0x0F0F0F0Fu), x[4 + k], si);
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) sx += sum4(x[k]);
    return xd * (f16_at(b) * float(si) + f16_at(b + 2) * float(sx));
}

template <>
__device__ __forceinline__ float dot_chunk_q8x<EH_TYPE_Q5_0>(const uint8_t* row, int c, const int (&x)[8], float xd) {
    const uint8_t* b = row + size_t(c) * 22;
    const uint32_t qh = u32_from_u16(b + 2);
    int si = 0, sx = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const uint32_t u = u32_from_u16(b + 6 + 4 * k);
        si = __dp4a(int((u & 0x0F0F0F0Fu) | spread4(qh >> (4 * k))), x[k], si);
        si = __dp4a(int(((u >> 4) & 0x0F0F0F0Fu) | spread4(qh >> (16 + 4 * k))), x[4 + k], si);
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) sx += sum4(x[k]);
    return f16_at(b) * xd * float(si - 16 * sx);
}

template <>
__device__ __forceinline__ float dot_chunk_q8x<EH_TYPE_Q5_1>(const uint8_t* row, int c, const int (&x)[8], float xd) {
    const uint8_t* b = row + size_t(c) * 24;
    const uint32_t qh = *reinterpret_cast<const uint32_t*>(b + 4);
    const uint32_t* q = reinterpret_cast<const uint32_t*>(b + 8);
    int si = 0, sx = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const uint32_t u = q[k];
        si = __dp4a(int((u & 0x0F0F0F0Fu) | spread4(qh >> (4 * k))), x[k], si);
        si = __dp4a(int(((u >> 4) & 0x0F0F0F0Fu) | spread4(qh >> (16 + 4 * k))), x[4 + k], si);
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) sx += sum4(x[k]);
    return xd * (f16_at(b) * float(si) + f16_at(b + 2) * float(sx));
}

template <>
__device__ __forceinline__ float dot_chunk_q8x<EH_TYPE_Q8_0>(const uint8_t* row, int c, const int (&x)[8], float xd) {
    const uint8_t* b = row + size_t(c) * 34;
    int si = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) si = __dp4a(int(u32_from_u16(b + 2 + 4 * k)), x[k], si);
    return f16_at(b) * xd * float(si);
}

template <>
__device__ __forceinline__ float dot_chunk_q8x<EH_TYPE_Q4_K>(const uint8_t* row, int c, const int (&x)[8], float xd) {
    const uint8_t* b = row + size_t(c >> 3) * 144;
    const int s = c & 7;
    float sc, mn;
    k4_scale_min(b + 4, s, sc, mn);
    const uint4* q4 = reinterpret_cast<const uint4*>(b + 16 + 32 * (s >> 1));
    const uint4 qa = q4[0], qb = q4[1];
    const uint32_t q[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
    const int shift = (s & 1) * 4;
    int si = 0, sx = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        si = __dp4a(int((q[k] >> shift) & 0x0F0F0F0Fu), x[k], si);
        sx += sum4(x[k]);
    }
    return xd * (f16_at(b) * sc * float(si) - f16_at(b + 2) * mn * float(sx));
}

template <>
__device__ __forceinline__ float dot_chunk_q8x<EH_TYPE_Q5_K>(const uint8_t* row, int c, const int (&x)[8], float xd) {
    const uint8_t* b = row + size_t(c >> 3) * 176;
    const int s = c & 7;
    float sc, mn;
    k4_scale_min(b + 4, s, sc, mn);
    const uint4* h4 = reinterpret_cast<const uint4*>(b + 16);
    const uint4* q4 = reinterpret_cast<const uint4*>(b + 48 + 32 * (s >> 1));
    const uint4 ha = h4[0], hb = h4[1], qa = q4[0], qb = q4[1];
    const uint32_t h[8] = {ha.x, ha.y, ha.z, ha.w, hb.x, hb.y, hb.z, hb.w};
    const uint32_t q[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
    const int shift = (s & 1) * 4;
    int si = 0, sx = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const uint32_t v = ((q[k] >> shift) & 0x0F0F0F0Fu) | (((h[k] >> s) & 0x01010101u) << 4);
        si = __dp4a(int(v), x[k], si);
        sx += sum4(x[k]);
    }
    return xd * (f16_at(b) * sc * float(si) - f16_at(b + 2) * mn * float(sx));
}

template <>
__device__ __forceinline__ float dot_chunk_q8x<EH_TYPE_Q6_K>(const uint8_t* row, int c, const int (&x)[8], float xd) {
    const uint8_t* b = row + size_t(c >> 3) * 210;
    const int s = c & 7;
    const int half = s >> 2, quarter = s & 3;
    const uint8_t* ql = b + 64 * half + ((quarter & 1) ? 32 : 0);
    const uint8_t* qh = b + 128 + 32 * half;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * half + 2 * quarter;
    const int lshift = (quarter >> 1) * 4, hshift = quarter * 2;
    int si0 = 0, si1 = 0, sx0 = 0, sx1 = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const uint32_t l = u32_from_u16(ql + 4 * k), h = u32_from_u16(qh + 4 * k);
        const uint32_t v = ((l >> lshift) & 0x0F0F0F0Fu) | (((h >> hshift) & 0x03030303u) << 4);
        if (k < 4) {
            si0 = __dp4a(int(v), x[k], si0);
            sx0 += sum4(x[k]);
        } else {
            si1 = __dp4a(int(v), x[k], si1);
            sx1 += sum4(x[k]);
        }
    }
    return f16_at(b + 208) * xd * (float(sc[0]) * float(si0 - 32 * sx0) + float(sc[1]) * float(si1 - 32 * sx1));
}

template <int T>
constexpr bool has_q8x_path() {
    return T == EH_TYPE_Q4_0 || T == EH_TYPE_Q4_1 || T == EH_TYPE_Q5_0 || T == EH_TYPE_Q5_1 || T == EH_TYPE_Q8_0 ||
           T == EH_TYPE_Q4_K || T == EH_TYPE_Q5_K || T == EH_TYPE_Q6_K;
}

}  // namespace ehcuda

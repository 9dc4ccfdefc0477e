// Device-side decoding of the stored weight formats, 32 elements at a time.
//
// Every supported type is decoded through one primitive: load_chunk<T>(row,
// c, v) writes elements [32c, 32c+32) of a weight row into v. The legacy
// types (Q4_0..Q8_0) have exactly one 32-element block per chunk; the K-quants
// have 8 chunks per 256-element super-block (chunk = one sub-block with its
// own 6-bit scale/min, or for Q6_K two 16-element scale groups); the float
// types are plain. GEMV and GEMM kernels build on this, so no kernel ever
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
    default: return false;
    }
}

}  // namespace ehcuda

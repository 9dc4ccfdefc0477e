// Device decoding of MXFP4 blocks (OCP microscaling, ggml layout), 17 bytes
// per 32 values: e (E8M0 shared exponent, value 2^(e-127)), then qs[16]
// with value j in the low nibble of qs[j] and value j+16 in the high nibble.
// Each nibble is an E2M1 code: bit 3 sign, magnitudes {0, .5, 1, 1.5, 2, 3,
// 4, 6}.
#pragma once

#include <stdint.h>

#include "quant.cuh"

namespace ehcuda {

__device__ __forceinline__ float e2m1_value(uint32_t code) {
    // m = 0, 1: subnormal 0 and 0.5; m >= 2: 2^((m>>1)-1) * (1 + (m&1)/2)
    const uint32_t m = code & 7u;
    const float mag = m < 2 ? 0.5f * float(m) : float(1u << (m >> 1)) * (m & 1u ? 0.75f : 0.5f);
    return code & 8u ? -mag : mag;
}

// 2^(e-127) as float bits; e = 0 is the subnormal 2^-127, e = 255 is +inf
// (as the host's ldexp gives).
__device__ __forceinline__ float e8m0_value(uint32_t e) {
    return e == 0 ? __int_as_float(0x00400000) : __int_as_float(int(e << 23));
}

// Block c of a row as five words: byte 0 of y[0] the exponent, then qs[j]
// at byte j + 1. Blocks sit at a 17-byte stride, so the 17 bytes are
// fetched as five aligned 32-bit words (up to 3 bytes past the block) and
// realigned with funnel shifts.
__device__ __forceinline__ void load_mxfp4_words(const uint8_t* row, int c, uint32_t (&y)[5]) {
    const uint8_t* b = row + size_t(c) * 17;
    const uintptr_t addr = reinterpret_cast<uintptr_t>(b);
    const uint32_t* w = reinterpret_cast<const uint32_t*>(addr & ~uintptr_t(3));
    const uint32_t sh = uint32_t(addr & 3) * 8;
    uint32_t x[5];
#pragma unroll
    for (int i = 0; i < 5; ++i) x[i] = __ldg(w + i);
#pragma unroll
    for (int i = 0; i < 4; ++i) y[i] = __funnelshift_r(x[i], x[i + 1], sh);
    y[4] = x[4] >> sh;
}

__device__ __forceinline__ void load_mxfp4_chunk(const uint8_t* row, int c, float (&v)[32]) {
    uint32_t y[5];
    load_mxfp4_words(row, c, y);
    const float scale = e8m0_value(y[0] & 0xFFu);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const int k = j + 1;  // byte index of qs[j] within the block
        const uint32_t q = (y[k >> 2] >> ((k & 3) * 8)) & 0xFFu;
        v[j] = e2m1_value(q & 15u) * scale;
        v[j + 16] = e2m1_value(q >> 4) * scale;
    }
}

// load_chunk<T> for the matmul types plus MXFP4.
template <int T>
__device__ __forceinline__ void load_any_chunk(const uint8_t* row, int c, float (&v)[32]) {
    if constexpr (T == EH_TYPE_MXFP4) load_mxfp4_chunk(row, c, v);
    else load_chunk<T>(row, c, v);
}

}  // namespace ehcuda

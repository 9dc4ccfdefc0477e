// Device side of the quantized KV pool (ehcuda/kv_quant.hpp has the row
// layout): the cache element tags the attention kernels template on, a
// quantized pool's rows, the codes' values, and the warp quantizer the KV
// stores use. The quantizer is quant_blocks.hpp's quantize_block for
// block_q8_0 / block_fp8_e4m3 step for step (the scale rounded to FP16 from
// amax / 127 or amax / 448, codes from x / scale rounded half away from zero
// or to E4M3 nearest-even, saturating), so a row holds the bits the CPU
// reference would store for the same floats.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "ehcuda/attention_paged.hpp"
#include "ehcuda/kv_quant.hpp"

namespace ehcuda::detail {

// Cache element tags: a kernel templated on C takes __half (F16 pool), float
// (gpt-cuda's contiguous FP32 cache) or one of these.
struct KvQ8 {
    static constexpr uint32_t kType = EH_TYPE_Q8_0;
    static constexpr float kMaxCode = 127.0f;
};
struct KvF8 {
    static constexpr uint32_t kType = EH_TYPE_FP8_E4M3;
    static constexpr float kMaxCode = 448.0f;
};
template <class C>
inline constexpr bool kQuantKv = std::is_same_v<C, KvQ8> || std::is_same_v<C, KvF8>;

// Calls f.template operator()<C>() with the tag of a quantized type.
template <class F>
void by_kv_quant(uint32_t type, F&& f) {
    if (type == EH_TYPE_Q8_0) f.template operator()<KvQ8>();
    else f.template operator()<KvF8>();
}

// A code's value before scaling (exact in float and in half).
__device__ __forceinline__ float kv_code(KvQ8, uint8_t c) { return float(int8_t(c)); }
__device__ __forceinline__ float kv_code(KvF8, uint8_t c) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(c), __NV_E4M3)));
}

// One layer's quantized K or V pool, read by position (through a block
// table when `table` is set, as KvRows) and KV head.
template <class C>
struct KvQuantRows {
    const uint8_t* base;
    int kv_dim;  // values per row (n_kv * head_dim)
    int hd;
    const int32_t* table;  // block ids of a paged pool, or null
    __device__ __forceinline__ size_t row_of(int pos) const {
        return table ? size_t(table[pos / kPagedBlockTokens]) * kPagedBlockTokens + pos % kPagedBlockTokens
                     : size_t(pos);
    }
    __device__ __forceinline__ const uint8_t* row_at(size_t r) const {
        return base + r * kv_row_bytes(C::kType, kv_dim);
    }
    // Head kvh's hd codes, and (hd a multiple of 32) its hd / 32 scales.
    __device__ __forceinline__ const uint8_t* codes(size_t r, int kvh) const { return row_at(r) + size_t(kvh) * hd; }
    // The row's kv_dim / 32 scales: row element e's is [e / 32].
    __device__ __forceinline__ const __half* row_scales(size_t r) const {
        return reinterpret_cast<const __half*>(row_at(r) + kv_scale_offset(kv_dim));
    }
    __device__ __forceinline__ const __half* scales(size_t r, int kvh) const {
        return reinterpret_cast<const __half*>(row_at(r) + kv_scale_offset(kv_dim)) + kvh * (hd / kKvQuantBlock);
    }
};

// Eight codes (one 8-byte piece) times their scale d, as eight halves.
template <class C>
__device__ __forceinline__ uint4 kv_dequant8(uint2 codes, __half d) {
    const float df = __half2float(d);
    const uint32_t w[2] = {codes.x, codes.y};
    uint32_t h[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint32_t c = w[i / 2] >> (16 * (i % 2));
        const __half2 p = __floats2half2_rn(kv_code(C{}, uint8_t(c)) * df, kv_code(C{}, uint8_t(c >> 8)) * df);
        h[i] = *reinterpret_cast<const uint32_t*>(&p);
    }
    return make_uint4(h[0], h[1], h[2], h[3]);
}

// The warp's 32 lanes quantize one 32-value block, x from each lane: code
// `lane` goes to codes[lane], the scale (lane 0) to *scale. Returns the
// lane's value as stored (scale * code).
template <class C>
__device__ __forceinline__ float kv_quantize_warp(float x, uint8_t* codes, __half* scale, int lane) {
    float amax = fabsf(x);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const __half d = __float2half_rn(amax / C::kMaxCode);
    const float df = __half2float(d);
    const float id = df != 0.0f ? 1.0f / df : 0.0f;
    uint8_t c;
    if constexpr (std::is_same_v<C, KvQ8>) {
        const int q = max(-127, min(127, int(roundf(x * id))));
        c = uint8_t(int8_t(q));
    } else {
        c = uint8_t(__nv_cvt_float_to_fp8(x * id, __NV_SATFINITE, __NV_E4M3));
    }
    codes[lane] = c;
    if (lane == 0) *scale = d;
    return kv_code(C{}, c) * df;
}

}  // namespace ehcuda::detail

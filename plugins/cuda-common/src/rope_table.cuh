// Pieces the table RoPE kernel (gpt_ops.cu) and the fused sink attention
// (attention_decode_sinks.cu) share, so both leave the same bits in the
// cache: the cache element stores and the table rotation.
#pragma once

#include <cuda_fp16.h>

#include "ehcuda/gpt_ops.hpp"

namespace ehcuda::detail {

__device__ __forceinline__ void store_kv(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store_kv(float* p, float v) { *p = v; }
__device__ __forceinline__ float load_kv(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float load_kv(const float* p) { return *p; }

// Pair i of a head at position pos, rotated by the table frequency with
// the attention factor (YaRN): the one formula of the RoPE kernel and the
// fused decode attention, so both leave the same bits in the cache.
__device__ __forceinline__ void rope_table_angle(const RopeTableArgs& a, int pos, int i, float& sn, float& cs) {
    sincosf(float(pos) * a.inv_freq[i], &sn, &cs);
    cs *= a.attn_factor;
    sn *= a.attn_factor;
}
// Explicit roundings: the compiler may contract a * b - c * d either way at
// each inlined site, and the RoPE kernel and the fused attention must agree.
__device__ __forceinline__ void rope_apply(float sn, float cs, float& x0, float& x1) {
    const float y0 = fmaf(x0, cs, -__fmul_rn(x1, sn)), y1 = fmaf(x1, cs, __fmul_rn(x0, sn));
    x0 = y0;
    x1 = y1;
}
__device__ __forceinline__ void rope_table_pair(const RopeTableArgs& a, int pos, int i, float& x0, float& x1) {
    float sn, cs;
    rope_table_angle(a, pos, i, sn, cs);
    rope_apply(sn, cs, x0, x1);
}

}  // namespace ehcuda::detail

// The pieces of the kernels that give one block to each (query row, head)
// and walk a paged pool in tiles of 32 keys, each warp its own tiles
// (attention_paged.cu, attention_span.cu): a lane scores one key, the warp
// folds the tile into its running softmax, each lane adds the tile's
// weighted V values for its own output dims, and the warps' partials are
// merged in warp order. Fixed shuffle trees and orders: the same inputs give
// the same bits.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "block_reduce.cuh"
#include "ehcuda/attention_paged.hpp"

namespace ehcuda::detail {

// The pool row of position pos of a sequence with block table `table`.
__device__ __forceinline__ size_t pool_row(const int32_t* table, int pos) {
    return size_t(table[pos / kPagedBlockTokens]) * kPagedBlockTokens + size_t(pos % kPagedBlockTokens);
}

// q . k over hd dims (hd <= 32 * DPL) of an F16 key. A lane scores a whole
// key: with hd % 8 == 0 (every real model) its row is fetched as 16-byte
// pieces all issued before the first is used, so the lane waits for memory
// once per key rather than once per element.
template <int DPL>
__device__ __forceinline__ float key_dot(const __half* k, const float* qs, int hd) {
    float dot = 0.0f;
    if (hd % 8 == 0) {
        constexpr int kPieces = DPL * 4;  // 8 halves each
        uint4 piece[kPieces];
#pragma unroll
        for (int c = 0; c < kPieces; ++c)
            if (c < hd / 8) piece[c] = reinterpret_cast<const uint4*>(k)[c];
#pragma unroll
        for (int c = 0; c < kPieces; ++c) {
            if (c >= hd / 8) break;
            const __half2* h2 = reinterpret_cast<const __half2*>(&piece[c]);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float2 kf = __half22float2(h2[j]);
                dot = fmaf(qs[8 * c + 2 * j], kf.x, dot);
                dot = fmaf(qs[8 * c + 2 * j + 1], kf.y, dot);
            }
        }
        return dot;
    }
    const __half2* k2 = reinterpret_cast<const __half2*>(k);
    for (int d = 0; d < hd / 2; ++d) {
        const float2 kf = __half22float2(k2[d]);
        dot = fmaf(qs[2 * d], kf.x, dot);
        dot = fmaf(qs[2 * d + 1], kf.y, dot);
    }
    return dot;
}

// One tile folded into the warp's running softmax and output sums: s is
// the lane's score, -inf where !valid (lane 0's key must be valid, so the
// tile's maximum is finite); l and acc are rescaled from the running
// maximum m to mnew, the new one, and l gains the tile's weights. Returns
// the lane's weight (the caller sets m = mnew once it has added the values).
template <int DPL>
__device__ __forceinline__ float fold_tile(float s, bool valid, float m, float& mnew, float& l, float (&acc)[DPL]) {
    mnew = fmaxf(m, warp_max(s));
    const float alpha = m == -INFINITY ? 0.0f : expf(m - mnew);
    const float p = valid ? expf(s - mnew) : 0.0f;
    l = l * alpha + warp_sum(p);
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[i] *= alpha;
    return p;
}

// acc[i] += p * v[lane + 32 i] over one F16 value row's head dims.
template <int DPL>
__device__ __forceinline__ void add_value_row(float (&acc)[DPL], float p, const __half* v, int hd, int lane) {
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
        const int d = lane + 32 * i;
        if (d < hd) acc[i] = fmaf(p, __half2float(v[d]), acc[i]);
    }
}

// Each warp's (m, l, acc) to shared memory for merge_warps, then a block
// barrier.
template <int kWarps, int DPL>
__device__ __forceinline__ void stash_warp(float m, float l, const float (&acc)[DPL], float (&part_m)[kWarps],
                                           float (&part_l)[kWarps], float (&part_acc)[kWarps][DPL * 32], int warp,
                                           int lane) {
    if (lane == 0) {
        part_m[warp] = m;
        part_l[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < DPL; ++i) part_acc[warp][lane + 32 * i] = acc[i];
    __syncthreads();
}

// Warp 0: the warps' partials merged in warp order into o[0 .. hd). A sink
// logit (has_sink; sink is -inf otherwise) takes part in the maximum and the
// denominator only, after the warps.
template <int kWarps, int DPL>
__device__ __forceinline__ void merge_warps(const float (&part_m)[kWarps], const float (&part_l)[kWarps],
                                            const float (&part_acc)[kWarps][DPL * 32], float sink, bool has_sink,
                                            float* o, int hd, int lane) {
    float M = sink;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, part_m[w]);
    float L = 0.0f, f[kWarps];
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
        f[w] = part_m[w] == -INFINITY ? 0.0f : expf(part_m[w] - M);
        L += part_l[w] * f[w];
    }
    if (has_sink) L += expf(sink - M);
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
        const int d = lane + 32 * i;
        if (d >= hd) continue;
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) v = fmaf(part_acc[w][d], f[w], v);
        o[d] = v * inv;
    }
}

// Host side: f.template operator()<DPL>() with DPL = ceil(head_dim / 32),
// the output dims per lane (8 for anything above 224).
template <class F>
void with_dims_per_lane(int head_dim, F&& f) {
    switch ((head_dim + 31) / 32) {
    case 1: f.template operator()<1>(); break;
    case 2: f.template operator()<2>(); break;
    case 3: f.template operator()<3>(); break;
    case 4: f.template operator()<4>(); break;
    case 5: f.template operator()<5>(); break;
    case 6: f.template operator()<6>(); break;
    case 7: f.template operator()<7>(); break;
    default: f.template operator()<8>(); break;
    }
}

}  // namespace ehcuda::detail

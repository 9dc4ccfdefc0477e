// The per-key-group steps of the decode attention kernels (attention.cu,
// gpt_ops.cu): a warp scores a group of G keys (score_keys) and folds them
// into its running max m, sum l and unnormalised output acc (softmax_fold);
// lane i holds dims i, i+32, ...
#pragma once

#include <math.h>

namespace ehcuda::detail {

// Scores of G keys: q . k_j over the lane's dims, then summed over the
// warp (every lane gets them); the G reductions interleaved.
template <int G, int DPL>
__device__ __forceinline__ void score_keys(const float (&q)[DPL], const float (&kf)[G][DPL], float (&s)[G]) {
#pragma unroll
    for (int j = 0; j < G; ++j) {
        float d = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) d = fmaf(q[i], kf[j][i], d);
        s[j] = d;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
#pragma unroll
        for (int j = 0; j < G; ++j) s[j] += __shfl_xor_sync(0xffffffffu, s[j], off);
}

// s[j]: the warp-reduced score of key j, vf[j]: its value dims; keys
// j >= nvalid are masked (their p is 0; their values must be finite).
template <int G, int DPL>
__device__ __forceinline__ void softmax_fold(const float (&s)[G], const float (&vf)[G][DPL], int nvalid, float& m,
                                             float& l, float (&acc)[DPL]) {
    float mt = m;
#pragma unroll
    for (int j = 0; j < G; ++j)
        if (j < nvalid) mt = fmaxf(mt, s[j]);
    const float alpha = m == -INFINITY ? 0.0f : __expf(m - mt);
    l *= alpha;
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[i] *= alpha;
#pragma unroll
    for (int j = 0; j < G; ++j) {
        const float p = j < nvalid ? __expf(s[j] - mt) : 0.0f;
        l += p;
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[i] = fmaf(p, vf[j][i], acc[i]);
    }
    m = mt;
}

}  // namespace ehcuda::detail

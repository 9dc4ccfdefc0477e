// The running-softmax step of the decode attention kernels (attention.cu,
// gpt_ops.cu): a warp folds a group of G scored keys into its running max
// m, sum l and unnormalised output acc (lane i holds dims i, i+32, ...).
#pragma once

#include <math.h>

namespace ehcuda::detail {

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

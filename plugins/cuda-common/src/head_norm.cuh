// QK-norm (Qwen3): the RMS scale of one attention head's hd values, summed
// by one warp. head_rmsnorm_kernel and the fused decode attention both use
// it, so a head normalised in its own kernel or inside the attention has
// the same bits (a sequence's tokens do not depend on which path its step took).
#pragma once

namespace ehcuda::detail {

// x: the head's hd floats; every lane of the warp gets the scale
// rsqrt(mean(x^2) + eps). Lane-strided sums, then a butterfly in a fixed order.
__device__ __forceinline__ float head_rms_scale(const float* x, int hd, float eps, int lane) {
    float ss = 0.0f;
    for (int i = lane; i < hd; i += 32) ss = fmaf(x[i], x[i], ss);
#pragma unroll
    for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
    return rsqrtf(ss / float(hd) + eps);
}

}  // namespace ehcuda::detail

// The RoPE rotation, shared by rope_kernel (elementwise.cu) and the fused
// decode attention (attention.cu), so both give the same bits.
#pragma once

namespace ehcuda::detail {

// Angle of rotary pair i at position pos: theta_i = pos * base^(-2i / n_rot)
// (divided by factors[i] when there are per-pair factors: Llama 3).
// powf and sincosf (full range reduction) without fast-math: positions in
// the thousands keep their accuracy.
__device__ __forceinline__ void rope_sincos(int pos, int i, int n_rot, float base, const float* factors, float* sn,
                                            float* cs) {
    float inv = powf(base, -2.0f * float(i) / float(n_rot));
    if (factors) inv /= factors[i];
    sincosf(float(pos) * inv, sn, cs);
}

// Dims of pair i: NEOX rotates the two halves of the rotary part against
// each other, the original layout adjacent pairs.
__device__ __forceinline__ int rope_i0(int i, int half_rot, bool neox) { return neox ? i : 2 * i; }
__device__ __forceinline__ int rope_i1(int i, int half_rot, bool neox) { return neox ? i + half_rot : 2 * i + 1; }

// Explicit roundings: the compiler may contract a * b - c * d either way at
// each inlined site, and the RoPE kernel and the fused attention must agree.
__device__ __forceinline__ void rope_rotate(float x0, float x1, float sn, float cs, float* y0, float* y1) {
    *y0 = fmaf(x0, cs, -__fmul_rn(x1, sn));
    *y1 = fmaf(x1, cs, __fmul_rn(x0, sn));
}

}  // namespace ehcuda::detail

// Device pieces shared by the per-pair MoE kernels (moe.cu) and the grouped
// prefill path (moe_prefill.cu), so both apply the same activation.
#pragma once

namespace ehcuda {

// gpt-oss's clamped SwiGLU: gate = min(gate, limit), up = clamp(up, -limit,
// limit), out = (up + 1) * gate * sigmoid(alpha * gate).
__device__ __forceinline__ float swiglu_oai(float g, float u, float alpha, float limit) {
    g = fminf(g, limit);
    u = fminf(fmaxf(u, -limit), limit);
    return (u + 1.0f) * (g / (1.0f + __expf(-alpha * g)));
}

}  // namespace ehcuda

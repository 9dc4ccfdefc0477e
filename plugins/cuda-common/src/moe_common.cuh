// Pieces shared by the MoE kernels: the per-pair kernels (moe.cu), the
// single-token decode kernels (moe_decode.cu) and the grouped prefill path
// (moe_prefill.cu), so all apply the same activation and read expert rows
// the same way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <engine_host/plugin_abi.hpp>

#include "ehcuda/moe.hpp"

namespace ehcuda {

// gpt-oss's clamped SwiGLU: gate = min(gate, limit), up = clamp(up, -limit,
// limit), out = (up + 1) * gate * sigmoid(alpha * gate).
__device__ __forceinline__ float swiglu_oai(float g, float u, float alpha, float limit) {
    g = fminf(g, limit);
    u = fminf(fmaxf(u, -limit), limit);
    return (u + 1.0f) * (g / (1.0f + __expf(-alpha * g)));
}

namespace moe_detail {

// Kernel-side copy of an ExpertMat.
struct DevMat {
    const uint8_t* data;
    size_t row_bytes;
    size_t expert_stride;
    const float* bias;
    int bias_stride;
    int rows, cols, row0;
};

inline DevMat to_dev(const ExpertMat& m, const char* what) {
    if (!moe_type_supported(m.type))
        throw ehp::Error(EH_UNSUPPORTED, std::string(what) + ": unsupported weight type " + ehp::type_name(m.type));
    if (m.cols <= 0 || m.cols % 32 || m.rows <= 0 || m.row_bytes != moe_row_bytes(m.type, m.cols) || !m.data)
        throw ehp::Error(EH_INTERNAL, std::string(what) + ": bad shape");
    if (m.type == EH_TYPE_MXFP4 && reinterpret_cast<uintptr_t>(m.data) % 16)
        throw ehp::Error(EH_INTERNAL, std::string(what) + ": MXFP4 data is not 16-byte aligned");
    return DevMat{static_cast<const uint8_t*>(m.data), m.row_bytes, m.expert_stride, m.bias, m.bias_stride,
                  m.rows, m.cols, m.row0};
}

__device__ __forceinline__ const uint8_t* row_ptr(const DevMat& m, int e, int r) {
    return m.data + size_t(e) * m.expert_stride + size_t(m.row0 + r) * m.row_bytes;
}

__device__ __forceinline__ float bias_of(const DevMat& m, int e, int r) {
    return m.bias ? m.bias[size_t(e) * m.bias_stride + r] : 0.0f;
}

}  // namespace moe_detail
}  // namespace ehcuda

// Gemma 3's extra per-step kernels (gemma_ops.hpp). The arithmetic follows
// the CPU reference's (tanhf, not a fast approximation; the norm's sum of
// squares in FP32) so the two plugins agree to rounding.
#include <cmath>
#include <cstdint>

#include "block_reduce.cuh"
#include "ehcuda/check.hpp"
#include "ehcuda/gemma_ops.hpp"
#include "ehcuda/launch.cuh"

namespace ehcuda {
namespace {

constexpr int kThreads = 256;

// Grid-stride over n floats; few blocks (a step's rows are small).
int blocks_for(size_t n) {
    const size_t b = (n + kThreads - 1) / kThreads;
    return int(b < 1024 ? (b ? b : 1) : 1024);
}

__global__ void scale_kernel(float* x, size_t n, float s) {
    pdl_entry();
    pdl_release();
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        x[i] *= s;
}

__global__ void softcap_kernel(float* x, size_t n, float cap) {
    pdl_entry();
    pdl_release();
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        x[i] = cap * tanhf(x[i] / cap);
}

// One block row per token (blockIdx.y), blocks across the features.
__global__ void geglu_kernel(float* x, int ld, int n_ff) {
    pdl_entry();
    pdl_release();
    float* row = x + size_t(blockIdx.y) * ld;
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < n_ff; k += gridDim.x * blockDim.x) {
        const float g = row[k];
        const float c = 0.7978845608028654f;  // sqrt(2/pi)
        row[k] = 0.5f * g * (1.0f + tanhf(c * (g + 0.044715f * g * g * g))) * row[k + n_ff];
    }
}

// One block per token. Rows of a multiple of 4 features go as float4s, a
// thread's few kept in registers between the sum and the add: one read of
// d, h and w each, since at one token this launch is all latency (two a
// layer in Gemma's decode step).
constexpr int kMaxQuadsPerThread = 2;

__global__ void rmsnorm_add_kernel(float* h, const float* d, const float* w, int n, float eps) {
    pdl_entry();
    pdl_release();
    __shared__ float shm[32];
    const float* dr = d + size_t(blockIdx.x) * n;
    float* hr = h + size_t(blockIdx.x) * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss = fmaf(dr[i], dr[i], ss);
    ss = detail::block_sum(ss, shm);
    const float scale = rsqrtf(ss / float(n) + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) hr[i] += dr[i] * scale * w[i];
}

__global__ void rmsnorm_add_quads_kernel(float4* h, const float4* d, const float4* w, int quads, float eps) {
    pdl_entry();
    pdl_release();
    __shared__ float shm[32];
    const float4* dr = d + size_t(blockIdx.x) * quads;
    float4* hr = h + size_t(blockIdx.x) * quads;
    float4 v[kMaxQuadsPerThread];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < kMaxQuadsPerThread; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        v[k] = i < quads ? dr[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        ss = fmaf(v[k].x, v[k].x, ss);
        ss = fmaf(v[k].y, v[k].y, ss);
        ss = fmaf(v[k].z, v[k].z, ss);
        ss = fmaf(v[k].w, v[k].w, ss);
    }
    ss = detail::block_sum(ss, shm);
    const float scale = rsqrtf(ss / float(quads * 4) + eps);
#pragma unroll
    for (int k = 0; k < kMaxQuadsPerThread; ++k) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i >= quads) break;
        const float4 wk = w[i];
        float4 hk = hr[i];
        hk.x += v[k].x * scale * wk.x;
        hk.y += v[k].y * scale * wk.y;
        hk.z += v[k].z * scale * wk.z;
        hk.w += v[k].w * scale * wk.w;
        hr[i] = hk;
    }
}

}  // namespace

void scale_floats(float* x, size_t n, float s, cudaStream_t stream) {
    if (n == 0) return;
    launch("scale_kernel", scale_kernel, blocks_for(n), kThreads, 0, stream, x, n, s);
    EHC_LAUNCHED("scale_kernel");
}

void softcap_floats(float* x, size_t n, float cap, cudaStream_t stream) {
    if (n == 0) return;
    launch("softcap_kernel", softcap_kernel, blocks_for(n), kThreads, 0, stream, x, n, cap);
    EHC_LAUNCHED("softcap_kernel");
}

void geglu_tanh(float* x, int ld, int n_ff, int ntok, cudaStream_t stream) {
    if (ntok <= 0 || n_ff <= 0) return;
    const int bx = (n_ff + kThreads - 1) / kThreads;
    launch("geglu_kernel", geglu_kernel, dim3(bx < 64 ? bx : 64, ntok), kThreads, 0, stream, x, ld, n_ff);
    EHC_LAUNCHED("geglu_kernel");
}

void rmsnorm_add(float* h, const float* d, const float* w, int n, int ntok, float eps, cudaStream_t stream) {
    if (ntok <= 0) return;
    const int quads = n / 4;
    const bool aligned = ((reinterpret_cast<uintptr_t>(h) | reinterpret_cast<uintptr_t>(d) |
                           reinterpret_cast<uintptr_t>(w)) & 15) == 0;
    if (n % 4 == 0 && aligned && quads <= kMaxQuadsPerThread * 1024) {
        const int threads = quads >= 1024 ? 1024 : (quads + 31) / 32 * 32;  // (a quad a thread up to 1,024)
        launch("rmsnorm_add_quads_kernel", rmsnorm_add_quads_kernel, ntok, threads, 0, stream,
               reinterpret_cast<float4*>(h), reinterpret_cast<const float4*>(d), reinterpret_cast<const float4*>(w),
               quads, eps);
        EHC_LAUNCHED("rmsnorm_add_quads_kernel");
        return;
    }
    launch("rmsnorm_add_kernel", rmsnorm_add_kernel, ntok, kThreads, 0, stream, h, d, w, n, eps);
    EHC_LAUNCHED("rmsnorm_add_kernel");
}

}  // namespace ehcuda

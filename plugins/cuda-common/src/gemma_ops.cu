// Gemma 3's extra per-step kernels (gemma_ops.hpp). The arithmetic follows
// the CPU reference's (tanhf, not a fast approximation; the norm's sum of
// squares in FP32) so the two plugins agree to rounding.
#include <cmath>

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

// One block per token.
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
    launch("rmsnorm_add_kernel", rmsnorm_add_kernel, ntok, kThreads, 0, stream, h, d, w, n, eps);
    EHC_LAUNCHED("rmsnorm_add_kernel");
}

}  // namespace ehcuda

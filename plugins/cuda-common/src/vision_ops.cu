#include "vision_ops.hpp"

#include <cmath>

#include "ehcuda/check.hpp"

namespace ehcuda::vision {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(size_t n) { return unsigned((n + kThreads - 1) / kThreads); }

// Sum of v over the block (kThreads threads); every thread gets it.
__device__ float block_sum(float v, float* red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // red may still be read from a previous call
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = 0.0f;
    for (int w = 0; w < kThreads / 32; ++w) t += red[w];
    return t;
}
__device__ float block_max(float v, float* red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = -INFINITY;
    for (int w = 0; w < kThreads / 32; ++w) t = fmaxf(t, red[w]);
    return t;
}

__global__ void im2col_kernel(const float* px, int size, int patch, int grid, float* out) {
    const size_t P = size_t(3) * patch * patch;
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= size_t(grid) * grid * P) return;
    const size_t t = i / P, r = i % P;
    const int py = int(t / grid), pxi = int(t % grid);
    const int c = int(r / (size_t(patch) * patch)), ky = int(r / patch % patch), kx = int(r % patch);
    out[i] = px[(size_t(c) * size + size_t(py) * patch + ky) * size + size_t(pxi) * patch + kx];
}

__global__ void add_bias_pos_kernel(const float* y, const float* b, const float* pos, int rows, int n, float* x) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= size_t(rows) * n) return;
    x[i] = y[i] + b[i % n] + pos[i];
}

__global__ void add_bias_kernel(float* y, const float* b, int rows, int n, __half* outh) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= size_t(rows) * n) return;
    const float v = y[i] + b[i % n];
    if (outh) outh[i] = __float2half_rn(v);
    else y[i] = v;
}

__global__ void add_residual_kernel(float* x, const float* y, const float* b, int rows, int n) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= size_t(rows) * n) return;
    x[i] += y[i] + b[i % n];
}

__global__ void bias_gelu_kernel(float* u, const float* b, int rows, int n, __half* outh) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= size_t(rows) * n) return;
    const float x = u[i] + b[i % n];
    const float c = 0.7978845608028654f;  // sqrt(2/pi)
    const float v = 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
    if (outh) outh[i] = __float2half_rn(v);
    else u[i] = v;
}

__global__ void layer_norm_kernel(const float* x, const float* w, const float* b, float eps, int n, float* out,
                                  __half* outh) {
    __shared__ float red[kThreads / 32];
    const float* r = x + size_t(blockIdx.x) * n;
    float s = 0.0f;
    for (int e = threadIdx.x; e < n; e += kThreads) s += r[e];
    const float mean = block_sum(s, red) / float(n);
    float v = 0.0f;
    for (int e = threadIdx.x; e < n; e += kThreads) v += (r[e] - mean) * (r[e] - mean);
    const float inv = rsqrtf(block_sum(v, red) / float(n) + eps);
    if (outh) {
        __half* o = outh + size_t(blockIdx.x) * n;
        for (int e = threadIdx.x; e < n; e += kThreads) o[e] = __float2half_rn((r[e] - mean) * inv * w[e] + b[e]);
        return;
    }
    float* o = out + size_t(blockIdx.x) * n;
    for (int e = threadIdx.x; e < n; e += kThreads) o[e] = (r[e] - mean) * inv * w[e] + b[e];
}

__global__ void to_half_kernel(const float* x, size_t n, __half* out) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2half_rn(x[i]);
}

__global__ void softmax_kernel(const float* sc, int n, float* outf, __half* outh) {
    __shared__ float red[kThreads / 32];
    const size_t row = blockIdx.x;
    const float* r = sc + row * n;
    float m = -INFINITY;
    for (int e = threadIdx.x; e < n; e += kThreads) m = fmaxf(m, r[e]);
    m = block_max(m, red);
    float s = 0.0f;
    for (int e = threadIdx.x; e < n; e += kThreads) s += expf(r[e] - m);
    const float inv = 1.0f / block_sum(s, red);
    for (int e = threadIdx.x; e < n; e += kThreads) {
        const float p = expf(r[e] - m) * inv;
        if (outf) outf[row * n + e] = p;
        else outh[row * n + e] = __float2half_rn(p);
    }
}

__global__ void pool_rms_kernel(const float* x, int grid, int merge, int n, const float* w, float eps, float* out) {
    __shared__ float red[kThreads / 32];
    const int g = grid / merge;
    const int oy = blockIdx.x / g, ox = blockIdx.x % g;
    float* o = out + size_t(blockIdx.x) * n;
    const float inv = 1.0f / float(merge * merge);
    float ss = 0.0f;
    for (int e = threadIdx.x; e < n; e += kThreads) {
        float a = 0.0f;
        for (int ky = 0; ky < merge; ++ky)
            for (int kx = 0; kx < merge; ++kx)
                a += x[(size_t(oy * merge + ky) * grid + size_t(ox * merge + kx)) * n + e];
        a *= inv;
        o[e] = a;
        ss += a * a;
    }
    const float r = rsqrtf(block_sum(ss, red) / float(n) + eps);
    for (int e = threadIdx.x; e < n; e += kThreads) o[e] = o[e] * r * w[e];
}

}  // namespace

void im2col(const float* pixels, int size, int patch, float* out, cudaStream_t s) {
    const int grid = size / patch;
    const size_t n = size_t(grid) * grid * 3 * patch * patch;
    im2col_kernel<<<blocks_for(n), kThreads, 0, s>>>(pixels, size, patch, grid, out);
    EHC_LAUNCHED("vision_im2col");
}
void add_bias_pos(const float* y, const float* bias, const float* pos, int rows, int n, float* x, cudaStream_t s) {
    add_bias_pos_kernel<<<blocks_for(size_t(rows) * n), kThreads, 0, s>>>(y, bias, pos, rows, n, x);
    EHC_LAUNCHED("vision_add_bias_pos");
}
void add_bias(float* y, const float* bias, int rows, int n, cudaStream_t s, __half* outh) {
    add_bias_kernel<<<blocks_for(size_t(rows) * n), kThreads, 0, s>>>(y, bias, rows, n, outh);
    EHC_LAUNCHED("vision_add_bias");
}
void add_residual(float* x, const float* y, const float* bias, int rows, int n, cudaStream_t s) {
    add_residual_kernel<<<blocks_for(size_t(rows) * n), kThreads, 0, s>>>(x, y, bias, rows, n);
    EHC_LAUNCHED("vision_add_residual");
}
void bias_gelu(float* u, const float* bias, int rows, int n, cudaStream_t s, __half* outh) {
    bias_gelu_kernel<<<blocks_for(size_t(rows) * n), kThreads, 0, s>>>(u, bias, rows, n, outh);
    EHC_LAUNCHED("vision_bias_gelu");
}
void layer_norm(const float* x, const float* w, const float* b, float eps, int rows, int n, float* out, cudaStream_t s,
                __half* outh) {
    layer_norm_kernel<<<unsigned(rows), kThreads, 0, s>>>(x, w, b, eps, n, out, outh);
    EHC_LAUNCHED("vision_layer_norm");
}
void to_half(const float* x, size_t n, __half* out, cudaStream_t s) {
    to_half_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, n, out);
    EHC_LAUNCHED("vision_to_half");
}
void softmax_rows(const float* scores, int rows, int n, float* outf, __half* outh, cudaStream_t s) {
    softmax_kernel<<<unsigned(rows), kThreads, 0, s>>>(scores, n, outf, outh);
    EHC_LAUNCHED("vision_softmax");
}
void pool_rms(const float* x, int grid, int merge, int n, const float* w, float eps, float* out, cudaStream_t s) {
    const int g = grid / merge;
    pool_rms_kernel<<<unsigned(g * g), kThreads, 0, s>>>(x, grid, merge, n, w, eps, out);
    EHC_LAUNCHED("vision_pool_rms");
}

}  // namespace ehcuda::vision

#include "vision_qwen_ops.hpp"

#include <cmath>

#include "ehcuda/check.hpp"

namespace ehcuda::vision::qwen {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(size_t n) { return unsigned((n + kThreads - 1) / kThreads); }

template <class T>
__device__ T block_reduce(T v, T* red, bool max) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const T w = __shfl_xor_sync(0xffffffffu, v, o);
        v = max ? (w > v ? w : v) : v + w;
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // red may still be read from a previous call
    if (lane == 0) red[warp] = v;
    __syncthreads();
    T t = red[0];
    for (int w = 1; w < kThreads / 32; ++w) t = max ? (red[w] > t ? red[w] : t) : t + red[w];
    return t;
}

__global__ void gather_kernel(const float* px, int width, int height, int patch, const int32_t* rc, int n, float* out) {
    const size_t P = size_t(3) * patch * patch;
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= size_t(n) * P) return;
    const size_t t = i / P, r = i % P;
    const int c = int(r / (size_t(patch) * patch)), ky = int(r / patch % patch), kx = int(r % patch);
    const int row = rc[2 * t], col = rc[2 * t + 1];
    out[i] = px[(size_t(c) * height + size_t(row) * patch + ky) * width + size_t(col) * patch + kx];
}

__global__ void rms_kernel(const float* x, const float* w, float eps, int n, float* out, __half* outh) {
    __shared__ double red[kThreads / 32];
    const float* row = x + size_t(blockIdx.x) * n;
    double ss = 0.0;
    for (int e = threadIdx.x; e < n; e += kThreads) ss += double(row[e]) * row[e];
    ss = block_reduce(ss, red, false);
    const float inv = float(1.0 / sqrt(ss / double(n) + double(eps)));
    for (int e = threadIdx.x; e < n; e += kThreads) {
        const float v = row[e] * inv * w[e];
        if (outh) outh[size_t(blockIdx.x) * n + e] = __float2half_rn(v);
        else out[size_t(blockIdx.x) * n + e] = v;
    }
}

// Block per patch: every pair of its Q and K heads, then (qkvh) the row as halves.
__global__ void rope2d_kernel(float* qkv, int width, int n_head, const float* cs, const float* sn, __half* qkvh) {
    const int t = blockIdx.x, hd = width / n_head, half = hd / 2;
    float* row = qkv + size_t(t) * 3 * width;
    const float* c = cs + size_t(t) * half;
    const float* s = sn + size_t(t) * half;
    for (int p = threadIdx.x; p < 2 * n_head * half; p += blockDim.x) {
        const int head = p / half, i = p % half;  // heads 0..n_head-1 Q, then K
        float* x = row + size_t(head) * hd;
        const float x0 = x[i], x1 = x[i + half];
        x[i] = x0 * c[i] - x1 * s[i];
        x[i + half] = x1 * c[i] + x0 * s[i];
    }
    if (!qkvh) return;
    __syncthreads();
    for (int e = threadIdx.x; e < 3 * width; e += blockDim.x) qkvh[size_t(t) * 3 * width + e] = __float2half_rn(row[e]);
}

__global__ void window_softmax_kernel(const float* sc, int n, const int32_t* win, float* outf, __half* outh) {
    __shared__ float red[kThreads / 32];
    const size_t r = blockIdx.x;
    const int q = int(r % size_t(n));
    const int wq = win ? win[q] : 0;
    const float* row = sc + r * n;
    float m = -INFINITY;
    for (int k = threadIdx.x; k < n; k += kThreads)
        if (!win || win[k] == wq) m = fmaxf(m, row[k]);
    m = block_reduce(m, red, true);
    float sum = 0.0f;
    for (int k = threadIdx.x; k < n; k += kThreads)
        if (!win || win[k] == wq) sum += expf(row[k] - m);
    sum = block_reduce(sum, red, false);
    const float inv = 1.0f / sum;
    for (int k = threadIdx.x; k < n; k += kThreads) {
        const float p = !win || win[k] == wq ? expf(row[k] - m) * inv : 0.0f;
        if (outh) outh[r * n + k] = __float2half_rn(p);
        else outf[r * n + k] = p;
    }
}

__global__ void swiglu_kernel(const float* gu, const float* b, int rows, int ff, float* out, __half* outh) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= size_t(rows) * ff) return;
    const size_t t = i / ff;
    const int e = int(i % ff);
    const float g = gu[t * 2 * ff + e] + b[e], u = gu[t * 2 * ff + ff + e] + b[ff + e];
    const float v = g / (1.0f + expf(-g)) * u;
    if (outh) outh[i] = __float2half_rn(v);
    else out[i] = v;
}

__global__ void gelu_kernel(float* y, const float* b, int rows, int n, __half* outh) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= size_t(rows) * n) return;
    const float a = y[i] + b[i % n];
    const float v = 0.5f * a * (1.0f + erff(a * 0.70710678118654752f));
    if (outh) outh[i] = __float2half_rn(v);
    else y[i] = v;
}

}  // namespace

void gather_patches(const float* pixels, int width, int height, int patch, const int32_t* d_rc, int n, float* out,
                    cudaStream_t s) {
    const size_t total = size_t(n) * 3 * patch * patch;
    gather_kernel<<<blocks_for(total), kThreads, 0, s>>>(pixels, width, height, patch, d_rc, n, out);
    EHC_LAUNCHED("qwen_vision_gather");
}

void rms_rows(const float* x, const float* w, float eps, int rows, int n, float* out, __half* outh, cudaStream_t s) {
    rms_kernel<<<unsigned(rows), kThreads, 0, s>>>(x, w, eps, n, out, outh);
    EHC_LAUNCHED("qwen_vision_rms");
}

void rope2d(float* qkv, int n, int width, int n_head, const float* cs, const float* sn, __half* qkvh, cudaStream_t s) {
    rope2d_kernel<<<unsigned(n), 128, 0, s>>>(qkv, width, n_head, cs, sn, qkvh);
    EHC_LAUNCHED("qwen_vision_rope2d");
}

void window_softmax(const float* scores, int heads, int n, const int32_t* d_win, float* outf, __half* outh,
                    cudaStream_t s) {
    window_softmax_kernel<<<unsigned(size_t(heads) * n), kThreads, 0, s>>>(scores, n, d_win, outf, outh);
    EHC_LAUNCHED("qwen_vision_window_softmax");
}

void swiglu_bias(const float* gu, const float* bias, int rows, int ff, float* out, __half* outh, cudaStream_t s) {
    swiglu_kernel<<<blocks_for(size_t(rows) * ff), kThreads, 0, s>>>(gu, bias, rows, ff, out, outh);
    EHC_LAUNCHED("qwen_vision_swiglu");
}

void bias_gelu_erf(float* y, const float* bias, int rows, int n, __half* outh, cudaStream_t s) {
    gelu_kernel<<<blocks_for(size_t(rows) * n), kThreads, 0, s>>>(y, bias, rows, n, outh);
    EHC_LAUNCHED("qwen_vision_gelu");
}

}  // namespace ehcuda::vision::qwen

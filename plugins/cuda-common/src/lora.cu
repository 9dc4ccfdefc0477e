// The LoRA update's kernels (lora.hpp): a shrink (u = A x) and an expand
// (y += s * B u, a thread per output), one row of the step per block row,
// each row reading its own adapter's descriptors. Up to kLoraMaxParts sites
// that read the same input (q, k, v; gate, up) go in one launch pair.
//
// The shrink splits the input into slices of kSliceCols (a block each: a
// thread per column pair, kRankTile rank rows at a time, reduced over the
// block), so a row's dot products run on many threads at once: a warp per
// rank row walking the whole input kept too few loads in flight (Llama-3.1-8B,
// 64 rows over 8 adapters: 0.51x the base model's decode throughput). Each
// slice writes its partial sums; the expand adds them in slice order, so a
// row's u does not depend on the other rows.
#include <cublas_v2.h>

#include <string>

#include "ehcuda/check.hpp"
#include "ehcuda/launch.cuh"
#include "ehcuda/lora.hpp"

namespace ehcuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRankTile = 16;

// The row's token's adapter slot, or -1.
__device__ __forceinline__ int row_slot(const LoraApplyArgs& a, int r) {
    return a.token_slot[a.row_token ? a.row_token[r] : r];
}

// Part p's descriptor for this slot, or NULL when the adapter has no pair
// at that site.
__device__ __forceinline__ const LoraDesc* part_desc(const LoraApplyArgs& a, int slot, int p) {
    const LoraDesc* d = a.table + size_t(slot) * a.n_sites + a.part[p].site;
    return d->rank > 0 ? d : nullptr;
}

// Slice `slice` of part p's partial sums of row r.
__device__ __forceinline__ float* partial(const LoraApplyArgs& a, int p, int slice, int r) {
    return a.u + ((size_t(p) * a.slices + slice) * a.u_rows + r) * kLoraMaxRank;
}

// Block (row, part, slice).
__global__ void lora_shrink_kernel(LoraApplyArgs a) {
    pdl_entry();  // (every block, before any early exit: the next kernel's start depends on it)
    pdl_release();
    const int r = blockIdx.x, p = blockIdx.y, slice = blockIdx.z;
    const int slot = row_slot(a, r);
    if (slot < 0) return;
    const LoraDesc* d = part_desc(a, slot, p);
    if (!d) return;
    __shared__ float red[kWarps][kRankTile];
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    const int i0 = slice * kSliceCols, i1 = min(a.n_in, i0 + kSliceCols);
    const float* x = a.x + size_t(r) * a.ldx;
    float* out = partial(a, p, slice, r);
    for (int k0 = 0; k0 < d->rank; k0 += kRankTile) {
        const int nk = min(kRankTile, d->rank - k0);
        const __half* w = d->a + size_t(k0) * a.n_in;
        float acc[kRankTile];
#pragma unroll
        for (int j = 0; j < kRankTile; ++j) acc[j] = 0.0f;
        if (a.vec) {  // (n_in and ldx even: column pairs)
            for (int i = i0 + 2 * int(threadIdx.x); i < i1; i += 2 * kThreads) {
                const float2 xv = *reinterpret_cast<const float2*>(x + i);
#pragma unroll
                for (int j = 0; j < kRankTile; ++j)
                    if (j < nk) {
                        const float2 wv = __half22float2(*reinterpret_cast<const __half2*>(w + size_t(j) * a.n_in + i));
                        acc[j] = fmaf(wv.y, xv.y, fmaf(wv.x, xv.x, acc[j]));
                    }
            }
        } else {
            for (int i = i0 + int(threadIdx.x); i < i1; i += kThreads) {
                const float xv = x[i];
#pragma unroll
                for (int j = 0; j < kRankTile; ++j)
                    if (j < nk) acc[j] = fmaf(__half2float(w[size_t(j) * a.n_in + i]), xv, acc[j]);
            }
        }
#pragma unroll
        for (int j = 0; j < kRankTile; ++j) {
            float v = acc[j];
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0) red[warp][j] = v;
        }
        __syncthreads();
        if (int(threadIdx.x) < nk) {
            float v = 0.0f;
            for (int q = 0; q < kWarps; ++q) v += red[q][threadIdx.x];
            out[k0 + int(threadIdx.x)] = v;
        }
        __syncthreads();
    }
}

// Outputs of all parts side by side: thread j of the row is part p's
// output j - start(p). u: the slices' partial sums added in slice order.
__global__ void lora_expand_kernel(LoraApplyArgs a) {
    pdl_entry();
    pdl_release();
    __shared__ float u[kLoraMaxParts][kLoraMaxRank];
    const int r = blockIdx.x;
    const int slot = row_slot(a, r);
    if (slot < 0) return;  // (uniform over the block, as below)
    const LoraDesc* d[kLoraMaxParts] = {};
    bool any = false;
    for (int p = 0; p < a.nparts; ++p) {
        d[p] = part_desc(a, slot, p);
        any = any || d[p];
    }
    if (!any) return;
    for (int p = 0; p < a.nparts; ++p)
        if (d[p])
            for (int k = threadIdx.x; k < d[p]->rank; k += blockDim.x) {
                float v = 0.0f;
                for (int slice = 0; slice < a.slices; ++slice) v += partial(a, p, slice, r)[k];
                u[p][k] = v;
            }
    __syncthreads();
    int j = blockIdx.y * blockDim.x + threadIdx.x, p = 0;
    while (p < a.nparts && j >= a.part[p].n_out) j -= a.part[p++].n_out;
    if (p >= a.nparts || !d[p]) return;
    const LoraDesc& dp = *d[p];
    const int n_out = a.part[p].n_out;
    float acc = 0.0f;
#pragma unroll 8
    for (int k = 0; k < dp.rank; ++k) acc = fmaf(__half2float(dp.bt[size_t(k) * n_out + j]), u[p][k], acc);
    a.y[size_t(r) * a.ldy + a.part[p].col0 + j] += dp.scale * acc;
}

__global__ void swiglu_kernel(float* x, int ld, int n_ff) {
    pdl_entry();
    pdl_release();
    float* row = x + size_t(blockIdx.y) * ld;
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < n_ff; k += gridDim.x * blockDim.x) {
        const float g = row[k];
        row[k] = g / (1.0f + __expf(-g)) * row[k + n_ff];  // (the SwiGLU input staging's silu)
    }
}

__global__ void to_half_kernel(const float* x, int ldx, int cols, __half* out) {
    pdl_entry();
    pdl_release();
    const float* row = x + size_t(blockIdx.y) * ldx;
    __half* o = out + size_t(blockIdx.y) * cols;
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < cols; k += gridDim.x * blockDim.x) o[k] = __float2half(row[k]);
}

void check_blas(cublasStatus_t st, const char* what) {
    if (st != CUBLAS_STATUS_SUCCESS)
        throw ehp::Error(EH_CUDA_ERROR, std::string("LoRA ") + what + " failed: " + cublasGetStatusName(st));
}

}  // namespace

void lora_apply_gemm(const LoraGemmArgs& a, cudaStream_t stream) {
    if (a.rows <= 0 || a.n_in <= 0) return;
    bool any = false;
    for (int p = 0; p < a.nparts; ++p) any = any || a.desc[p].rank > 0;
    if (!any) return;
    const int bx = (a.n_in + kThreads - 1) / kThreads;
    launch("lora_to_half_kernel", to_half_kernel, dim3(bx < 64 ? bx : 64, a.rows), kThreads, 0, stream, a.x, a.ldx, a.n_in,
           a.xh);
    EHC_LAUNCHED("lora_to_half_kernel");
    cublasHandle_t h = a.blas;
    check_blas(cublasSetStream(h, stream), "cublasSetStream");
    for (int p = 0; p < a.nparts; ++p) {
        const LoraDesc& d = a.desc[p];
        if (d.rank <= 0) continue;
        // u (rows x rank, row-major) = x A^T: column-major u^T = A . x^T.
        const float one = 1.0f, zero = 0.0f;
        check_blas(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, d.rank, a.rows, a.n_in, &one, d.a, CUDA_R_16F, a.n_in, a.xh,
                                CUDA_R_16F, a.n_in, &zero, a.uh, CUDA_R_16F, d.rank, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx (A x)");
        // y (rows x n_out, row-major, ldy) += s u B^T: column-major y^T += s Bt^T... = B^T(col) . u^T.
        const float s = d.scale;
        check_blas(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, a.part[p].n_out, a.rows, d.rank, &s, d.bt, CUDA_R_16F,
                                a.part[p].n_out, a.uh, CUDA_R_16F, d.rank, &one, a.y + a.part[p].col0, CUDA_R_32F, a.ldy,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx (B u)");
    }
}

void lora_apply(const LoraApplyArgs& a, cudaStream_t stream) {
    if (a.nrows <= 0 || a.n_in <= 0 || a.nparts <= 0 || a.nparts > kLoraMaxParts) return;
    if (a.nrows > a.u_rows || a.slices != lora_slices(a.n_in))
        throw ehp::Error(EH_INTERNAL, "lora_apply: more rows or slices than the scratch holds");
    int n_out = 0;
    for (int p = 0; p < a.nparts; ++p) n_out += a.part[p].n_out;
    if (n_out <= 0) return;
    launch("lora_shrink_kernel", lora_shrink_kernel, dim3(a.nrows, a.nparts, a.slices), kThreads, 0, stream, a);
    EHC_LAUNCHED("lora_shrink_kernel");
    launch("lora_expand_kernel", lora_expand_kernel, dim3(a.nrows, (n_out + kThreads - 1) / kThreads), kThreads, 0,
           stream, a);
    EHC_LAUNCHED("lora_expand_kernel");
}

void swiglu_inplace(float* x, int ld, int n_ff, int ntok, cudaStream_t stream) {
    if (ntok <= 0 || n_ff <= 0) return;
    const int bx = (n_ff + kThreads - 1) / kThreads;
    launch("swiglu_kernel", swiglu_kernel, dim3(bx < 64 ? bx : 64, ntok), kThreads, 0, stream, x, ld, n_ff);
    EHC_LAUNCHED("swiglu_kernel");
}

}  // namespace ehcuda

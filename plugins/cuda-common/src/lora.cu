// The LoRA update's kernels (lora.hpp): a shrink (u = A x, a warp per rank
// row) and an expand (y += s * B u, a thread per output), one row of the
// step per block row, each row reading its own adapter's descriptors. Up to
// kLoraMaxParts sites that read the same input (q, k, v; gate, up) go in one
// launch pair.
#include <cublas_v2.h>

#include <string>

#include "ehcuda/check.hpp"
#include "ehcuda/launch.cuh"
#include "ehcuda/lora.hpp"

namespace ehcuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Blocks per row and part of the shrink: rank rows are spread over
// kShrinkBlocks * kWarps warps (a rank-16 pair keeps 16 busy per row).
constexpr int kShrinkBlocks = 4;

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

__global__ void lora_shrink_kernel(LoraApplyArgs a) {
    pdl_entry();  // (every block, before any early exit: the next kernel's start depends on it)
    pdl_release();
    const int r = blockIdx.x;
    const int p = blockIdx.y / kShrinkBlocks, sub = blockIdx.y % kShrinkBlocks;
    const int slot = row_slot(a, r);
    if (slot < 0) return;
    const LoraDesc* d = part_desc(a, slot, p);
    if (!d) return;
    const int lane = threadIdx.x & 31;
    const float* x = a.x + size_t(r) * a.ldx;
    float* u = a.u + (size_t(p) * a.u_rows + r) * kLoraMaxRank;
    const int rank = d->rank;
    for (int k = sub * kWarps + threadIdx.x / 32; k < rank; k += kShrinkBlocks * kWarps) {
        const __half* row = d->a + size_t(k) * a.n_in;
        float acc = 0.0f;
        if ((a.n_in & 1) == 0) {
            const __half2* row2 = reinterpret_cast<const __half2*>(row);
            for (int i = lane; i < a.n_in / 2; i += 32) {
                const float2 w = __half22float2(row2[i]);
                acc = fmaf(w.x, x[2 * i], acc);
                acc = fmaf(w.y, x[2 * i + 1], acc);
            }
        } else {
            for (int i = lane; i < a.n_in; i += 32) acc = fmaf(__half2float(row[i]), x[i], acc);
        }
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) u[k] = acc;
    }
}

// Outputs of all parts side by side: thread j of the row is part p's
// output j - start(p).
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
            for (int k = threadIdx.x; k < d[p]->rank; k += blockDim.x)
                u[p][k] = a.u[(size_t(p) * a.u_rows + r) * kLoraMaxRank + k];
    __syncthreads();
    int j = blockIdx.y * blockDim.x + threadIdx.x, p = 0;
    while (p < a.nparts && j >= a.part[p].n_out) j -= a.part[p++].n_out;
    if (p >= a.nparts || !d[p]) return;
    const LoraDesc& dp = *d[p];
    const int n_out = a.part[p].n_out;
    float acc = 0.0f;
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
    if (a.nrows > a.u_rows) throw ehp::Error(EH_INTERNAL, "lora_apply: more rows than the scratch holds");
    int n_out = 0;
    for (int p = 0; p < a.nparts; ++p) n_out += a.part[p].n_out;
    if (n_out <= 0) return;
    launch("lora_shrink_kernel", lora_shrink_kernel, dim3(a.nrows, kShrinkBlocks * a.nparts), kThreads, 0, stream, a);
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

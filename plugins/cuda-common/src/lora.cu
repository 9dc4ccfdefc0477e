// The LoRA update's kernels (lora.hpp): a shrink (u = A x) and an expand
// (y += s * B u, a thread per output column). A block takes one adapter's
// rows of the step (LoraApplyArgs::slots: the adapters with a pair at its
// sites; each block finds its adapter's rows among the step's): it reads
// that adapter's A slice or B^T columns once for all of them, where a block
// per row read them once per row (Llama-3.1-8B, 64 rows over 8 rank-16
// adapters: the gate|up expand alone read 58 MB a layer). Up to
// kLoraMaxParts sites that read the same input (q, k, v; gate, up) go in
// one launch pair.
//
// The shrink splits the input into slices (lora_slice_cols; a block each:
// a thread per column pair, kRankTile rank rows and kShrinkRows rows at a
// time, reduced over the block); each slice writes its partial sums, which
// the expand adds in slice order. A row's sums run in the same order
// whichever rows share its block, so its result depends on its own entry
// alone.
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
constexpr int kShrinkRows = 4;   // rows a shrink thread accumulates at once
constexpr int kExpandRows = 16;  // rows an expand thread accumulates at once

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

// The rows (ascending) whose adapter is `slot`, into rows[]; their count,
// the same for every thread of the block. The first warp scans.
__device__ int slot_rows(const LoraApplyArgs& a, int slot, int* rows) {
    __shared__ int count;
    if (threadIdx.x < 32) {
        const unsigned lane = threadIdx.x;
        int n = 0;
        for (int r0 = 0; r0 < a.nrows; r0 += 32) {
            const int r = r0 + int(lane);
            const bool mine = r < a.nrows && row_slot(a, r) == slot;
            const unsigned m = __ballot_sync(0xffffffffu, mine);
            if (mine) rows[n + __popc(m & ((1u << lane) - 1u))] = r;
            n += __popc(m);
        }
        if (lane == 0) count = n;
    }
    __syncthreads();
    return count;
}

// Input column i of row r: x itself, or silu(gate) * up from the FFN's
// gate|up halves (as the down projection's input staging computes it).
__device__ __forceinline__ float x_at(const LoraApplyArgs& a, const float* row, int i) {
    if (!a.swiglu) return row[i];
    const float g = row[i];
    return g / (1.0f + __expf(-g)) * row[i + a.n_in];
}
__device__ __forceinline__ float2 x_pair(const LoraApplyArgs& a, const float* row, int i) {
    const float2 v = *reinterpret_cast<const float2*>(row + i);
    if (!a.swiglu) return v;
    const float2 u = *reinterpret_cast<const float2*>(row + i + a.n_in);
    return make_float2(v.x / (1.0f + __expf(-v.x)) * u.x, v.y / (1.0f + __expf(-v.y)) * u.y);
}

// Block (adapter, part, slice): every row of that adapter, kShrinkRows at
// a time, over the slice's columns.
__global__ void lora_shrink_kernel(LoraApplyArgs a) {
    pdl_entry();  // (every block, before any early exit: the next kernel's start depends on it)
    pdl_release();
    const int slot = a.slots[blockIdx.x], p = blockIdx.y, slice = blockIdx.z;
    const LoraDesc* d = part_desc(a, slot, p);
    if (!d) return;  // (uniform over the block)
    __shared__ int rows[LoraStep::kRows];
    const int n = slot_rows(a, slot, rows);
    __shared__ float red[kWarps][kShrinkRows][kRankTile];
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    const int i0 = slice * a.slice_cols, i1 = min(a.n_in, i0 + a.slice_cols);
    for (int k0 = 0; k0 < d->rank; k0 += kRankTile) {
        const int nk = min(kRankTile, d->rank - k0);
        const __half* w = d->a + size_t(k0) * a.n_in;
        for (int c0 = 0; c0 < n; c0 += kShrinkRows) {
            const int nr = min(kShrinkRows, n - c0);
            const float* x[kShrinkRows];
#pragma unroll
            for (int q = 0; q < kShrinkRows; ++q) x[q] = a.x + size_t(rows[c0 + min(q, nr - 1)]) * a.ldx;
            float acc[kShrinkRows][kRankTile];
#pragma unroll
            for (int q = 0; q < kShrinkRows; ++q)
#pragma unroll
                for (int j = 0; j < kRankTile; ++j) acc[q][j] = 0.0f;
            if (a.vec) {  // (n_in and ldx even: column pairs)
                for (int i = i0 + 2 * int(threadIdx.x); i < i1; i += 2 * kThreads) {
                    float2 wv[kRankTile];
#pragma unroll
                    for (int j = 0; j < kRankTile; ++j)
                        wv[j] = j < nk ? __half22float2(*reinterpret_cast<const __half2*>(w + size_t(j) * a.n_in + i))
                                       : make_float2(0.0f, 0.0f);
#pragma unroll
                    for (int q = 0; q < kShrinkRows; ++q) {
                        if (q >= nr) break;
                        const float2 xv = x_pair(a, x[q], i);
#pragma unroll
                        for (int j = 0; j < kRankTile; ++j) acc[q][j] = fmaf(wv[j].y, xv.y, fmaf(wv[j].x, xv.x, acc[q][j]));
                    }
                }
            } else {
                for (int i = i0 + int(threadIdx.x); i < i1; i += kThreads) {
                    float wv[kRankTile];
#pragma unroll
                    for (int j = 0; j < kRankTile; ++j) wv[j] = j < nk ? __half2float(w[size_t(j) * a.n_in + i]) : 0.0f;
#pragma unroll
                    for (int q = 0; q < kShrinkRows; ++q) {
                        if (q >= nr) break;
                        const float xv = x_at(a, x[q], i);
#pragma unroll
                        for (int j = 0; j < kRankTile; ++j) acc[q][j] = fmaf(wv[j], xv, acc[q][j]);
                    }
                }
            }
#pragma unroll
            for (int q = 0; q < kShrinkRows; ++q)
#pragma unroll
                for (int j = 0; j < kRankTile; ++j) {
                    float v = acc[q][j];
                    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
                    if (lane == 0) red[warp][q][j] = v;
                }
            __syncthreads();
            if (int(threadIdx.x) < kShrinkRows * kRankTile) {
                const int q = threadIdx.x / kRankTile, j = threadIdx.x % kRankTile;
                if (q < nr && j < nk) {
                    float v = 0.0f;
                    for (int wq = 0; wq < kWarps; ++wq) v += red[wq][q][j];
                    partial(a, p, slice, rows[c0 + q])[k0 + j] = v;
                }
            }
            __syncthreads();
        }
    }
}

// Block (adapter, column tile): outputs of all parts side by side, thread
// j of the tile part p's output j - start(p), for every row of that adapter,
// kExpandRows at a time; u: the slices' partial sums added in slice order.
__global__ void lora_expand_kernel(LoraApplyArgs a) {
    pdl_entry();
    pdl_release();
    const int slot = a.slots[blockIdx.x];
    const LoraDesc* d[kLoraMaxParts] = {};
    int max_rank = 0;
    for (int p = 0; p < a.nparts; ++p) {
        d[p] = part_desc(a, slot, p);
        if (d[p]) max_rank = max(max_rank, d[p]->rank);
    }
    if (max_rank == 0) return;  // (uniform over the block, as below)
    __shared__ int rows[LoraStep::kRows];
    const int n = slot_rows(a, slot, rows);
    __shared__ float us[kLoraMaxParts][kExpandRows][kRankTile];
    int j = blockIdx.y * blockDim.x + threadIdx.x, p = 0;
    while (p < a.nparts && j >= a.part[p].n_out) j -= a.part[p++].n_out;
    const LoraDesc* dp = p < a.nparts ? d[p] : nullptr;
    const int n_out = dp ? a.part[p].n_out : 0;
    for (int c0 = 0; c0 < n; c0 += kExpandRows) {
        const int nr = min(kExpandRows, n - c0);
        float acc[kExpandRows];
#pragma unroll
        for (int q = 0; q < kExpandRows; ++q) acc[q] = 0.0f;
        for (int k0 = 0; k0 < max_rank; k0 += kRankTile) {
            for (int e = threadIdx.x; e < a.nparts * kExpandRows * kRankTile; e += blockDim.x) {
                const int pp = e / (kExpandRows * kRankTile), q = e / kRankTile % kExpandRows, k = e % kRankTile;
                float v = 0.0f;
                if (d[pp] && q < nr && k0 + k < d[pp]->rank)
                    for (int slice = 0; slice < a.slices; ++slice) v += partial(a, pp, slice, rows[c0 + q])[k0 + k];
                us[pp][q][k] = v;
            }
            __syncthreads();
            if (dp) {
                const int nk = min(kRankTile, dp->rank - k0);
                for (int k = 0; k < nk; ++k) {
                    const float b = __half2float(dp->bt[size_t(k0 + k) * n_out + j]);
#pragma unroll
                    for (int q = 0; q < kExpandRows; ++q) acc[q] = fmaf(b, us[p][q][k], acc[q]);
                }
            }
            __syncthreads();
        }
        if (dp)
#pragma unroll
            for (int q = 0; q < kExpandRows; ++q)
                if (q < nr) a.y[size_t(rows[c0 + q]) * a.ldy + a.part[p].col0 + j] += dp->scale * acc[q];
    }
}

// x's rows in FP16 (swiglu: silu(gate) * up of gate|up rows, as x_at).
__global__ void to_half_kernel(const float* x, int ldx, int cols, bool swiglu, __half* out) {
    pdl_entry();
    pdl_release();
    const float* row = x + size_t(blockIdx.y) * ldx;
    __half* o = out + size_t(blockIdx.y) * cols;
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < cols; k += gridDim.x * blockDim.x) {
        float v = row[k];
        if (swiglu) v = v / (1.0f + __expf(-v)) * row[k + cols];
        o[k] = __float2half(v);
    }
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
           a.swiglu, a.xh);
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

namespace {

// The launch's output columns (every part's), or 0 where it has nothing to
// do; throws where the scratch does not hold its rows or slices.
int lora_outputs(const LoraApplyArgs& a) {
    if (a.nrows <= 0 || a.n_in <= 0 || a.nparts <= 0 || a.nparts > kLoraMaxParts || a.nslots <= 0) return 0;
    if (a.nrows > a.u_rows || a.nrows > LoraStep::kRows || a.nparts * a.slices > a.u_slices || a.slice_cols % 2 ||
        a.slices != (a.n_in + a.slice_cols - 1) / a.slice_cols || a.nslots > kLoraMaxAdapters)
        throw ehp::Error(EH_INTERNAL, "lora_apply: more rows, slices or adapters than the scratch holds");
    int n_out = 0;
    for (int p = 0; p < a.nparts; ++p) n_out += a.part[p].n_out;
    return n_out;
}

}  // namespace

void lora_shrink(const LoraApplyArgs& a, cudaStream_t stream) {
    if (lora_outputs(a) <= 0) return;
    launch("lora_shrink_kernel", lora_shrink_kernel, dim3(a.nslots, a.nparts, a.slices), kThreads, 0, stream, a);
    EHC_LAUNCHED("lora_shrink_kernel");
}

void lora_expand(const LoraApplyArgs& a, cudaStream_t stream) {
    const int n_out = lora_outputs(a);
    if (n_out <= 0) return;
    launch("lora_expand_kernel", lora_expand_kernel, dim3(a.nslots, (n_out + kThreads - 1) / kThreads), kThreads, 0,
           stream, a);
    EHC_LAUNCHED("lora_expand_kernel");
}

void lora_apply(const LoraApplyArgs& a, cudaStream_t stream) {
    lora_shrink(a, stream);
    lora_expand(a, stream);
}

}  // namespace ehcuda

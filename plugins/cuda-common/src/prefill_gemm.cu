// cuBLAS prefill GEMM: quantized weights are dequantized a bounded slab of
// rows at a time into FP16 scratch, the activations are converted to FP16
// once per call, and cublasGemmEx runs FP16 x FP16 with FP32 accumulation
// and FP32 output (beta = 1 for the fused residual add).
//
// FP16 activations: the same operand precision as the WMMA kernel this path
// replaces (it staged activations as FP16 too). Matmul inputs here are
// normalised hidden states, attention outputs and SwiGLU products, far below
// FP16's 65504 in the models served; BF16 would avoid that ceiling at 8x the
// rounding error, TF32 at twice the bytes. An input beyond the FP16 range
// becomes inf, which is why both paths are documented as FP16-operand.
#include <cublas_v2.h>

#include <algorithm>
#include <string>

#include <engine_host/plugin_abi.hpp>

#include "ehcuda/check.hpp"
#include "ehcuda/launch.cuh"
#include "ehcuda/moe.hpp"
#include "ehcuda/mxfp4.cuh"
#include "ehcuda/weight_mirror.hpp"
#include "matmul_common.cuh"
#include "mma.cuh"
#include "prefill_gemm.hpp"

namespace ehcuda::prefill {
namespace {

// One thread per 32-element chunk, consecutive threads taking consecutive
// chunks (of a row, then of the next row: the output is the dense
// [rows][nch * 32] FP16 matrix, so a block's chunks are one contiguous
// range of it). Each thread's 64 output bytes go through shared memory so
// that the stores to memory are whole 16-byte words of consecutive lanes:
// storing them straight from the thread that decoded them put every store
// instruction's 32 lanes 64 bytes apart, and the MXFP4 experts' dequant ran
// at ~1.3 TB/s (33 us for a gpt-oss-20b gate|up expert, ncu on an H100).
constexpr int kDequantThreads = 256;
constexpr int kDequantLd = 20;  // words per staged chunk: 16 + 4 of padding, 16-byte stores conflict-free

template <int T>
__global__ void __launch_bounds__(kDequantThreads) dequant_kernel(const uint8_t* base, size_t row_bytes, int rows,
                                                                  int nch, __half* out) {
    __shared__ __align__(16) uint32_t stage[kDequantThreads * kDequantLd];
    const size_t first = size_t(blockIdx.x) * kDequantThreads;
    const size_t total = size_t(rows) * nch;
    const size_t idx = first + threadIdx.x;
    if (idx < total) {
        const size_t r = idx / nch;
        const int c = int(idx % nch);
        float v[32];
        load_any_chunk<T>(base + r * row_bytes, c, v);
        uint4* dst = reinterpret_cast<uint4*>(stage + threadIdx.x * kDequantLd);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            __align__(16) __half2 h[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) h[k] = __floats2half2_rn(v[8 * i + 2 * k], v[8 * i + 2 * k + 1]);
            dst[i] = *reinterpret_cast<const uint4*>(h);
        }
    }
    __syncthreads();
    // The block's chunks as 16-byte words: word f is part f % 4 of chunk f / 4.
    const int nwords = int(min(total - first, size_t(kDequantThreads))) * 4;
    uint4* o = reinterpret_cast<uint4*>(out + first * 32);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int f = j * kDequantThreads + threadIdx.x;
        if (f < nwords) o[f] = *reinterpret_cast<const uint4*>(stage + (f >> 2) * kDequantLd + (f & 3) * 4);
    }
}

__device__ __forceinline__ float silu(float v) { return v / (1.0f + __expf(-v)); }

// x16[t][k] = x[t][k] (or silu(x[t][k]) * x[t][k + cols] for SwiGLU), eight
// elements per thread.
__global__ void __launch_bounds__(256) convert_x_kernel(const float* x, int ldx, int cols, int ntok, int swiglu,
                                                        __half* out) {
    const int per_row = cols / 8;
    const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= size_t(ntok) * per_row) return;
    const size_t t = idx / per_row;
    const int k = int(idx % per_row) * 8;
    const float4* p = reinterpret_cast<const float4*>(x + t * ldx + k);
    float v[8];
    float4 a = p[0], b = p[1];
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    if (swiglu) {
        const float4* u = reinterpret_cast<const float4*>(x + t * ldx + cols + k);
        float4 c = u[0], d = u[1];
        const float w[8] = {c.x, c.y, c.z, c.w, d.x, d.y, d.z, d.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = silu(v[i]) * w[i];
    }
    detail::store_half8(out + t * cols + k, v);
}

// y[t][off + r] = (accumulate ? y : 0) + bias[r]: the bias goes in first and
// the GEMM then accumulates onto it (beta = 1).
__global__ void bias_fill_kernel(float* y, int ldy, int off, int rows, int ntok, const float* bias, int accumulate) {
    const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= size_t(ntok) * rows) return;
    const size_t t = idx / rows;
    const int r = int(idx % rows);
    float* dst = y + t * ldy + off + r;
    *dst = (accumulate ? *dst : 0.0f) + bias[r];
}

template <class F>
void type_dispatch(uint32_t type, F&& f) {
    detail::host_dispatch_mxfp4(type, "prefill dequant", f);
}

unsigned blocks_for(size_t n, unsigned per) { return unsigned((n + per - 1) / per); }

}  // namespace

void dequant_rows(uint32_t type, const void* base, size_t row_bytes, int rows, int cols, __half* out,
                  cudaStream_t stream) {
    if (rows <= 0) return;
    const int nch = cols / 32;
    const size_t n = size_t(rows) * nch;
    type_dispatch(type, [&]<int T>() {
        dequant_kernel<T><<<blocks_for(n, kDequantThreads), kDequantThreads, 0, stream>>>(
            static_cast<const uint8_t*>(base), row_bytes, rows, nch, out);
    });
    EHC_LAUNCHED("dequant_kernel");
}

void gemm_f16(const PrefillWorkspace& ws, int m, int n, int k, const __half* w, int ldw, const __half* x, int ldx,
              float* c, int ldc, float beta, cudaStream_t stream) {
    if (m <= 0 || n <= 0) return;
    cublasHandle_t h = ws.cublas();
    cublasStatus_t st = cublasSetStream(h, stream);
    const float alpha = 1.0f;
    // Column-major view: W^T (k x m, ld ldw) transposed is W; X^T (k x n)
    // as is; C^T (m x n, ld ldc) is the row-major [token][row] output.
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, w, CUDA_R_16F, ldw, x, CUDA_R_16F, ldx, &beta,
                          c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS)
        throw ehp::Error(EH_CUDA_ERROR, std::string("cublasGemmEx failed: ") + cublasGetStatusName(st) + " (m=" +
                                            std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) + ")");
}

bool gemm_cublas(const MatmulArgs& a, cudaStream_t stream) {
    PrefillWorkspace* ws = a.prefill;
    if (!ws || !ws->enabled_for(a.ntok) || a.xmode == XMode::RmsNorm) return false;
    if (a.nseg < 1 || a.nseg > 3 || a.cols <= 0 || a.cols % 32) return false;
    if (size_t(a.ntok) * size_t(a.cols) > ws->act_halves()) return false;
    const size_t slab_rows = ws->dense_slab_halves() / size_t(a.cols);
    if (slab_rows == 0) return false;
    for (int s = 0; s < a.nseg; ++s)
        if (!matmul_type_supported(a.seg[s].w.type) || a.seg[s].w.rows <= 0 ||
            a.seg[s].w.row_bytes != row_bytes(a.seg[s].w.type, a.cols) || a.seg[s].w.cols != a.cols)
            return false;

    ws->note_use();
    detail::note_launch("cublas", dim3(0), dim3(0), 0);  // (its kernels are cuBLAS's and the slab's)
    const int K = a.cols, N = a.ntok;
    __half* x16 = ws->act();
    const size_t nx = size_t(N) * (K / 8);
    convert_x_kernel<<<blocks_for(nx, 256), 256, 0, stream>>>(a.x, a.ldx, K, N, a.xmode == XMode::SwiGLU ? 1 : 0, x16);
    EHC_LAUNCHED("convert_x_kernel");

    float beta[3];
    for (int s = 0; s < a.nseg; ++s) {
        const MatSeg& g = a.seg[s];
        beta[s] = a.accumulate ? 1.0f : 0.0f;
        if (g.bias) {
            const size_t n = size_t(N) * g.w.rows;
            bias_fill_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(a.y, a.ldy, g.out_offset, g.w.rows, N, g.bias,
                                                                     a.accumulate ? 1 : 0);
            EHC_LAUNCHED("bias_fill_kernel");
            beta[s] = 1.0f;
        }
    }

    // FP16 weights, and matrices the model mirrors in FP16, need no slab: the
    // GEMM reads them where they are.
    const __half* f16[3] = {};
    for (int s = 0; s < a.nseg; ++s) {
        const MatSeg& g = a.seg[s];
        const bool stored = g.w.type == EH_TYPE_F16;
        f16[s] = stored ? static_cast<const __half*>(g.w.data) : ws->mirror() ? ws->mirror()->find(g.w) : nullptr;
        if (f16[s])
            gemm_f16(*ws, g.w.rows, N, K, f16[s], stored ? int(g.w.row_bytes / 2) : K, x16, K, a.y + g.out_offset,
                     a.ldy, beta[s], stream);
    }

    // The other segments' rows, concatenated, in slabs of slab_rows. Pieces
    // of a slab whose outputs are adjacent (Q|K|V) share one GEMM.
    struct Piece {
        int seg, r0, r1;
    };
    int total = 0;
    for (int s = 0; s < a.nseg; ++s)
        if (!f16[s]) total += a.seg[s].w.rows;
    __half* slab = ws->slab();
    for (int R0 = 0; R0 < total; R0 += int(slab_rows)) {
        const int R1 = int(std::min<size_t>(size_t(total), size_t(R0) + slab_rows));
        Piece pieces[3];
        int np = 0, base = 0;
        for (int s = 0; s < a.nseg; ++s) {
            const MatSeg& g = a.seg[s];
            if (f16[s]) continue;
            const int lo = std::max(R0, base), hi = std::min(R1, base + g.w.rows);
            if (lo < hi) {
                pieces[np++] = {s, lo - base, hi - base};
                dequant_rows(g.w.type, static_cast<const uint8_t*>(g.w.data) + size_t(lo - base) * g.w.row_bytes,
                             g.w.row_bytes, hi - lo, K, slab + size_t(lo - R0) * K, stream);
            }
            base += g.w.rows;
        }
        int srow = 0;  // slab row of pieces[i]
        for (int i = 0; i < np;) {
            int j = i + 1, m = pieces[i].r1 - pieces[i].r0;
            const MatSeg& gi = a.seg[pieces[i].seg];
            while (j < np && beta[pieces[j].seg] == beta[pieces[i].seg] &&
                   a.seg[pieces[j - 1].seg].out_offset + pieces[j - 1].r1 == a.seg[pieces[j].seg].out_offset + pieces[j].r0) {
                m += pieces[j].r1 - pieces[j].r0;
                ++j;
            }
            gemm_f16(*ws, m, N, K, slab + size_t(srow) * K, K, x16, K, a.y + gi.out_offset + pieces[i].r0, a.ldy,
                     beta[pieces[i].seg], stream);
            srow += m;
            i = j;
        }
    }
    return true;
}

}  // namespace ehcuda::prefill

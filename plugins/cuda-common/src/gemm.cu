// Prefill GEMM: Y[tok][row] = sum_k X[tok][k] * W[row][k] on tensor cores.
// Each 128-thread block owns a 64-token x 64-row output tile. Per 32-wide K
// step, half the threads decode one 32-element chunk of a weight row each
// into shared memory as FP16 (the in-kernel dequantization), the other half
// convert the matching activations; four warps then run 16x16x16 WMMA with
// FP32 accumulators. No global scratch: the only copy of a dequantized
// weight is the 4 KiB shared-memory tile.
#include <mma.h>

#include "ehcuda/check.hpp"
#include "matmul_common.cuh"

namespace ehcuda {
namespace {

using namespace nvcuda;
using detail::DevArgs;

constexpr int BM = 64;   // tokens per tile
constexpr int BN = 64;   // output rows per tile
constexpr int BK = 32;   // one chunk
constexpr int LDS = BK + 8;  // padded shared row (halves)
constexpr int LDC = BN + 4;

__device__ __forceinline__ void store_half32(__half* dst, const float (&v)[32]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        __align__(16) __half2 h[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) h[k] = __floats2half2_rn(v[8 * i + 2 * k], v[8 * i + 2 * k + 1]);
        *reinterpret_cast<uint4*>(dst + 8 * i) = *reinterpret_cast<const uint4*>(h);
    }
}

__global__ void __launch_bounds__(128) gemm_kernel(DevArgs a) {
    __shared__ __align__(32) __half As[BM * LDS];
    __shared__ __align__(32) __half Bs[BN * LDS];
    __shared__ __align__(32) float Cs[BM * LDC];

    const detail::DevSeg& g = a.seg[0];
    const int tid = threadIdx.x;
    const int warp = tid >> 5;
    const int m0 = blockIdx.y * BM;
    const int n0 = blockIdx.x * BN;
    const int nch = a.cols / BK;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    const int wm = (warp >> 1) * 32;
    const int wn = (warp & 1) * 32;

    for (int c = 0; c < nch; ++c) {
        float v[32];
        if (tid < BN) {
            int row = n0 + tid;
            bool ok = false;
            if (row < g.rows) {
                const uint8_t* w = g.w + size_t(row) * g.row_bytes;
                ok = dispatch_type(g.type, [&]<int T>() { load_chunk<T>(w, c, v); });
            }
            if (!ok)
#pragma unroll
                for (int j = 0; j < 32; ++j) v[j] = 0.0f;
            store_half32(Bs + tid * LDS, v);
        } else {
            int m = tid - BN;
            if (m0 + m < a.ntok)
                detail::load_x32(a, m0 + m, c, v);
            else
#pragma unroll
                for (int j = 0; j < 32; ++j) v[j] = 0.0f;
            store_half32(As + m * LDS, v);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], As + (wm + 16 * i) * LDS + kk, LDS);
#pragma unroll
            for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], Bs + (wn + 16 * j) * LDS + kk, LDS);
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
            wmma::store_matrix_sync(Cs + (wm + 16 * i) * LDC + wn + 16 * j, acc[i][j], LDC,
                                    wmma::mem_row_major);
    __syncthreads();

    for (int e = tid; e < BM * BN; e += 128) {
        int m = e / BN, n = e % BN;
        int tok = m0 + m, row = n0 + n;
        if (tok >= a.ntok || row >= g.rows) continue;
        float val = Cs[m * LDC + n] + (g.bias ? g.bias[row] : 0.0f);
        float* dst = a.y + size_t(tok) * a.ldy + g.out_offset + row;
        *dst = a.accumulate ? *dst + val : val;
    }
}

}  // namespace

void gemm(const MatmulArgs& a, cudaStream_t stream) {
    for (int s = 0; s < a.nseg; ++s) {
        MatmulArgs one = a;
        one.nseg = 1;
        one.seg[0] = a.seg[s];
        DevArgs d = detail::to_dev(one);
        dim3 grid((d.seg[0].rows + BN - 1) / BN, (a.ntok + BM - 1) / BM);
        gemm_kernel<<<grid, 128, 0, stream>>>(d);
        EHC_LAUNCHED("gemm_kernel");
    }
}

}  // namespace ehcuda

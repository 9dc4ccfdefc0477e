// Prefill GEMM: Y[tok][row] = sum_k X[tok][k] * W[row][k] on tensor cores.
// With a PrefillWorkspace, gemm() hands large batches to the cuBLAS path in
// prefill_gemm.cu first; this kernel is the fallback.
// Each 128-thread block owns a 64-token x 64-row output tile. Per 32-wide K
// step, half the threads decode one 32-element chunk of a weight row each
// into shared memory as FP16 (the in-kernel dequantization), the other half
// convert the matching activations; four warps then run 16x16x16 WMMA with
// FP32 accumulators. No global scratch: the only copy of a dequantized
// weight is the 4 KiB shared-memory tile.
#include <mma.h>

#include "ehcuda/check.hpp"
#include "ehcuda/launch.cuh"
#include "matmul_common.cuh"
#include "prefill_gemm.hpp"

namespace ehcuda {
namespace {

using namespace nvcuda;
using detail::DevArgs;

constexpr int BM = 64;       // tokens per tile
constexpr int BK = 32;       // one chunk
constexpr int LDS = BK + 8;  // padded shared row (halves)

__device__ __forceinline__ void store_half32(__half* dst, const float (&v)[32]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        __align__(16) __half2 h[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) h[k] = __floats2half2_rn(v[8 * i + 2 * k], v[8 * i + 2 * k + 1]);
        *reinterpret_cast<uint4*>(dst + 8 * i) = *reinterpret_cast<const uint4*>(h);
    }
}

// Threads [0, BN) decode one weight row's chunk each; threads [64, 128)
// convert one token's input chunk each.
template <int T, int BN>
__device__ __forceinline__ void fetch(const DevArgs& a, const detail::DevSeg& g, int m0, int n0, int c, float (&v)[32]) {
    const int tid = threadIdx.x;
    bool ok = false;
    if (tid < BN) {
        const int row = n0 + tid;
        if (row < g.rows) {
            const uint8_t* w = g.w + size_t(row) * g.row_bytes;
            load_chunk<T>(w, c, v);
            ok = true;
        }
    } else if (tid >= 64 && m0 + tid - 64 < a.ntok) {
        detail::load_x32(a, m0 + tid - 64, c, v);
        ok = true;
    }
    if (!ok)
#pragma unroll
        for (int j = 0; j < 32; ++j) v[j] = 0.0f;
}

// BN = 64: each warp computes 32x32 (2x2 fragments); BN = 32: 32x16 (2x1),
// for short matrices so that enough blocks exist to fill the GPU. The next
// chunk is fetched into registers while the tensor cores work on the
// current one (two shared-memory stages, one barrier per step).
template <int T, int BN>
__global__ void __launch_bounds__(128) gemm_kernel(DevArgs a) {
    constexpr int FN = BN / 32;  // fragments per warp along n
    constexpr int LDC = BN + 4;
    __shared__ __align__(32) __half As[2][BM * LDS];
    __shared__ __align__(32) __half Bs[2][BN * LDS];
    __shared__ __align__(32) float Cs[BM * LDC];

    // Segments (Q|K|V or gate|up) share the launch when each holds whole
    // BN-row tiles; a tile never straddles two.
    int sg = 0, base = 0;
    while (sg + 1 < a.nseg && int(blockIdx.x) * BN >= base + a.seg[sg].rows) base += a.seg[sg++].rows;
    const detail::DevSeg& g = a.seg[sg];
    const int tid = threadIdx.x;
    const int warp = tid >> 5;
    const int m0 = blockIdx.y * BM;
    const int n0 = blockIdx.x * BN - base;
    const int nch = a.cols / BK;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][FN];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    const int wm = (warp >> 1) * 32;
    const int wn = (warp & 1) * (BN / 2);

    auto stage = [&](int buf, const float (&v)[32]) {
        if (tid < BN) store_half32(Bs[buf] + tid * LDS, v);
        else if (tid >= 64) store_half32(As[buf] + (tid - 64) * LDS, v);
    };

    float v[32];
    fetch<T, BN>(a, g, m0, n0, 0, v);
    stage(0, v);
    __syncthreads();
    for (int c = 0; c < nch; ++c) {
        const int buf = c & 1;
        if (c + 1 < nch) fetch<T, BN>(a, g, m0, n0, c + 1, v);
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb[FN];
#pragma unroll
            for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], As[buf] + (wm + 16 * i) * LDS + kk, LDS);
#pragma unroll
            for (int j = 0; j < FN; ++j) wmma::load_matrix_sync(fb[j], Bs[buf] + (wn + 16 * j) * LDS + kk, LDS);
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < FN; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        // The other buffer was last read before the previous barrier.
        if (c + 1 < nch) stage(buf ^ 1, v);
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j)
            wmma::store_matrix_sync(Cs + (wm + 16 * i) * LDC + wn + 16 * j, acc[i][j], LDC, wmma::mem_row_major);
    __syncthreads();

    for (int e = tid; e < BM * BN; e += 128) {
        const int m = e / BN, n = e % BN;
        const int tok = m0 + m, row = n0 + n;
        if (tok >= a.ntok || row >= g.rows) continue;
        detail::store_out(a, g, tok, row, Cs[m * LDC + n]);
    }
}

}  // namespace

void gemm(const MatmulArgs& a, cudaStream_t stream) {
    if (a.xmode == XMode::RmsNorm) throw ehp::Error(EH_INTERNAL, "gemm: fused RMSNorm is single-token only");
    if (prefill::gemm_cublas(a, stream)) return;
    DevArgs all = detail::to_dev(a);
    const int mt = (a.ntok + BM - 1) / BM;
    auto run = [&](const DevArgs& d) {
        const int blocks64 = (d.total_rows + 63) / 64 * mt;
        const bool wide = blocks64 >= 2 * detail::sm_count();
        detail::host_dispatch(d.seg[0].type, [&]<int T>() {
            if (wide)
                gemm_kernel<T, 64><<<dim3((d.total_rows + 63) / 64, mt), 128, 0, stream>>>(d);
            else
                gemm_kernel<T, 32><<<dim3((d.total_rows + 31) / 32, mt), 128, 0, stream>>>(d);
        });
        EHC_LAUNCHED("gemm_kernel");
        detail::note_launch("gemm_kernel", dim3((d.total_rows + (wide ? 63 : 31)) / (wide ? 64 : 32), mt), dim3(128), 0);
    };
    bool fuse = true;
    for (int s = 0; s < all.nseg; ++s) fuse &= all.seg[s].type == all.seg[0].type && all.seg[s].rows % 64 == 0;
    if (fuse) {
        run(all);
        return;
    }
    for (int s = 0; s < all.nseg; ++s) {
        DevArgs one = all;
        one.nseg = 1;
        one.seg[0] = all.seg[s];
        one.total_rows = all.seg[s].rows;
        run(one);
    }
}

}  // namespace ehcuda

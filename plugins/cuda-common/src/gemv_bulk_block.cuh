// What the bulk-copy GEMV's kernels share (gemv_bulk.cu, gemv_slice_ring.cu):
// a warp's rows of one segment (a tile), and a block's staging of one
// token's input, so both forms dot the same codes with the same factor.
#pragma once

#include "ehcuda/quant_dp4a.cuh"
#include "gemv_stage.cuh"
#include "matmul_common.cuh"

namespace ehcuda::detail {

// Copies a producer's integer chunks (global, L2-resident) to shared memory:
// a few 16-byte loads per thread, all issued before any store.
__device__ __forceinline__ void copy_chunks(const int4* src, int4* dst, int n16) {
    constexpr int kBatch = 8;
    for (int base = 0; base < n16; base += kBatch * int(blockDim.x)) {
        int4 v[kBatch];
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
            const int i = base + k * int(blockDim.x) + int(threadIdx.x);
            if (i < n16) v[k] = src[i];
        }
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
            const int i = base + k * int(blockDim.x) + int(threadIdx.x);
            if (i < n16) dst[i] = v[k];
        }
    }
    __syncthreads();
}

// Tile `t` of the launch: its segment, first row and row count. A
// segment's tiles are its own (the last may be short), in segment order.
struct TileRef {
    const DevSeg* g;
    int lr0, nr;
};
__device__ __forceinline__ TileRef tile_ref(const DevArgs& a, int tr, int t) {
    int s = 0;
    for (; s + 1 < a.nseg; ++s) {
        const int n = (a.seg[s].rows + tr - 1) / tr;
        if (t < n) break;
        t -= n;
    }
    const DevSeg& g = a.seg[s];
    return TileRef{&g, t * tr, min(tr, g.rows - t * tr)};
}

// Stages the block's input (or copies a producer's chunks); returns the
// factor the dot products take (1 / rms for the RMSNorm fold, else 1).
// Every thread of the block calls it (it ends in a block barrier).
template <int XB>
__device__ __forceinline__ float stage_input(const DevArgs& a, int4* smem) {
    if (a.xmode != int(XMode::Chunks)) return stage_x_int<XB>(a, reinterpret_cast<uint8_t*>(smem));
    copy_chunks(reinterpret_cast<const int4*>(a.x), smem, int(size_t(a.cols / 32) * kIntStride<XB> / 16));
    return 1.0f;
}

// One-token GEMV as a ring of K slices per warp (BulkLaunch::slots > 0,
// gemv_slice_ring.cu); gemv_bulk() hands such launches to it.
void gemv_slice_ring(const DevArgs& d, const KernelLaunch& k, cudaStream_t stream);

}  // namespace ehcuda::detail

// One-token GEMV as a ring of K slices per warp (the plan's bulk_slices;
// plan_bulk chooses it, gemv_bulk() hands it here). Each warp owns R (1 or
// 2) rows of one segment for the whole kernel and walks K in slices of 32
// chunks: its lanes r < R issue row r's slices through the bulk copy engine
// (bulk_copy.cuh), `slots` slices in flight, each slot with its own
// mbarrier, and a slot is refilled as soon as the warp has dotted it, with
// no block barrier in the loop. So a warp's dot products overlap its later
// copies, where the one-shot kernel (gemv_bulk_kernel) copies a whole tile
// and only then dots it, and the resident ring (gemv_bulk_ring_kernel)
// needs two whole tiles per warp in shared memory, which long rows do not
// fit for enough warps (a Q6_K row of 15,360 inputs is 12.6 KB). The FFN
// pair kernel's bulk form (gate_up_pair.cuh) streams its rows the same way.
//
// The input is staged once per block (gemv_bulk_block.cuh, as the other
// bulk forms stage it). Lane l dots chunk l of each slice, so over the row
// it takes chunks l, l + 32, ... in order, then the warp's sums are added
// widest first and lane 0 stores: gemv_kernel's order, so the result is
// bitwise gemv_kernel's and gemv_bulk_kernel's (but for the last bits of
// the RMSNorm fold's 1 / rms, whose partial sums follow the block size).
#include <cstdint>

#include "bulk_copy.cuh"
#include "ehcuda/check.hpp"
#include "ehcuda/kernel_route.hpp"
#include "ehcuda/launch.cuh"
#include "ehcuda/quant_dp4a.cuh"
#include "gemv_bulk_block.cuh"
#include "gemv_stage.cuh"
#include "matmul_common.cuh"

namespace ehcuda::detail {

namespace {

constexpr int kSliceChunks = 32;  // a slice: one chunk per lane
constexpr int kMixed = -1;        // segments of different types, looked up per warp

struct SliceArgs {
    DevArgs d;
    int rows;     // a warp's rows (<= R of the kernel)
    int groups;   // warps with rows: the row groups of all segments together
    int stride;   // shared bytes of one row's slice buffer, a multiple of 16
    int x_bytes;  // shared bytes of the staged input, a multiple of 16
    int slots;    // slices in flight per warp (at most the row's slices)
};

// Bytes of a slice of a row of segment g: 1024 inputs, whole blocks of
// every type this form takes (32 or 256 inputs a block).
__device__ __forceinline__ int slice_bytes(const DevSeg& g, int cols) {
    return int(g.row_bytes * size_t(kSliceChunks * 32) / size_t(cols));
}

// A warp's rows tf (of type T) dotted slice by slice as the slots land;
// `issue(s, k)` puts slice s of the rows into slot k. acc[r] takes chunk
// c = 32 s + lane of row r at slice s, so each lane's chunks come in
// gemv_kernel's order. (Offsets in 32-bit ints and each row's lead kept
// as it moves: the kernel runs at 64 registers.)
template <int T, int R, int XB, class Issue>
__device__ __forceinline__ void slice_loop(const DevArgs& a, const TileRef& tf, const uint8_t* mine, int stride,
                                           int ns, uint64_t* bars, const uint8_t* xs, float xscale, int lane,
                                           const Issue& issue) {
    const DevSeg& g = *tf.g;
    const int nr = tf.nr, nch = a.cols / 32, nsl = (nch + kSliceChunks - 1) / kSliceChunks;
    const int sb16 = slice_bytes(g, a.cols) & 15;
    // the slice keeps its global address's alignment modulo 16
    // (bulk_range_issue), which the chunk's word loads assume: row r's
    // slice s starts `lead[r]` bytes into its buffer
    int lead[R];
#pragma unroll
    for (int r = 0; r < R; ++r) lead[r] = int(reinterpret_cast<uintptr_t>(g.w + size_t(tf.lr0 + r) * g.row_bytes) & 15);
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    int k = 0;           // s % ns
    uint32_t phase = 0;  // (s / ns) & 1
    for (int s = 0; s < nsl; ++s) {
        const int c = s * kSliceChunks + lane;
        mbar_wait(&bars[k], phase);
        __syncwarp();
        if (c < nch) {
            XChunk<XB> x;
            load_staged_int<XB>(xs, c, x);
            const uint8_t* base = mine + k * R * stride;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                if (r >= nr) continue;
                acc[r] += dot_chunk_int<T, true>(base + r * stride + lead[r], lane, x);
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) lead[r] = (lead[r] + sb16) & 15;
        if (s + ns < nsl) {
            fence_async_shared();  // this warp's reads of the slot before the copy engine's refill
            __syncwarp();
            issue(s + ns, k);
        }
        if (++k == ns) {
            k = 0;
            phase ^= 1u;
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
    if (lane != 0) return;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if (r >= nr) break;
        store_out(a, g, 0, tf.lr0 + r, __fmul_rn(acc[r], xscale));  // as gemv_kernel rounds
    }
}

// Warp w of the grid takes row group w (tile_ref's order: a segment's
// groups are its own). The first `slots` slices are issued before
// pdl_entry() (weights are never written), the block's input staged after
// it. At most 64 registers a thread (two 16-warp blocks a multiprocessor),
// the occupancy plan_bulk_slice_ring counts on.
template <int T, int R, int XB>
__global__ void __launch_bounds__(kBulkMaxWarps * 32, 2) gemv_slice_ring_kernel(SliceArgs b) {
    static_assert(XB == 16 || XB == 32, "int16 / int16x2 inputs");
    const DevArgs& a = b.d;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __shared__ uint64_t bars[kBulkMaxWarps][kBulkSliceMaxSlots];
    extern __shared__ int4 smem_raw[];
    const uint8_t* xs = reinterpret_cast<const uint8_t*>(smem_raw);
    uint8_t* mine = reinterpret_cast<uint8_t*>(smem_raw) + b.x_bytes + size_t(warp) * b.slots * R * b.stride;
    const int t = int(blockIdx.x) * int(blockDim.x >> 5) + warp;
    const TileRef tf = tile_ref(a, b.rows, t < b.groups ? t : 0);
    const int nr = t < b.groups ? tf.nr : 0;
    const DevSeg& g = *tf.g;
    const int sb = slice_bytes(g, a.cols), rb = int(g.row_bytes);
    const uint8_t* row = g.w + size_t(tf.lr0 + (lane < nr ? lane : 0)) * g.row_bytes;
    const uint8_t* limit = g.w + size_t(g.rows) * g.row_bytes;
    const int nsl = (a.cols / 32 + kSliceChunks - 1) / kSliceChunks;
    const int ns = min(b.slots, nsl);
    auto issue = [&](int s, int k) {  // lane r < nr: row r's slice s into slot k
        if (lane >= nr) return;
        const int o0 = s * sb, n = o0 + sb <= rb ? sb : rb - o0;
        bulk_range_issue(&bars[warp][k], mine + (k * R + lane) * b.stride, row + o0, size_t(n), limit);
    };
    if (nr > 0) {
        if (lane == 0)
            for (int k = 0; k < ns; ++k) mbar_init(&bars[warp][k], uint32_t(nr));
        __syncwarp();
        for (int s = 0; s < ns; ++s) issue(s, s);
    }
    pdl_entry();
    pdl_release();
    const float xscale = stage_input<XB>(a, smem_raw);
    if (nr == 0) return;
    uint64_t* wb = bars[warp];
    if constexpr (T != kMixed) {
        slice_loop<T, R, XB>(a, tf, mine, b.stride, ns, wb, xs, xscale, lane, issue);
    } else {
        // one switch per warp: its rows lie in one segment
#define EHCUDA_SLICE_TYPE(TY) \
    case TY: return slice_loop<TY, R, XB>(a, tf, mine, b.stride, ns, wb, xs, xscale, lane, issue);
        switch (g.type) {  // mixed_launch_type's types (the launcher checks)
        EHCUDA_SLICE_TYPE(EH_TYPE_Q4_0)
        EHCUDA_SLICE_TYPE(EH_TYPE_Q4_1)
        EHCUDA_SLICE_TYPE(EH_TYPE_Q5_0)
        EHCUDA_SLICE_TYPE(EH_TYPE_Q5_1)
        EHCUDA_SLICE_TYPE(EH_TYPE_Q8_0)
        EHCUDA_SLICE_TYPE(EH_TYPE_Q4_K)
        EHCUDA_SLICE_TYPE(EH_TYPE_Q5_K)
        EHCUDA_SLICE_TYPE(EH_TYPE_Q6_K)
        default: return;
        }
#undef EHCUDA_SLICE_TYPE
    }
}

}  // namespace

void gemv_slice_ring(const DevArgs& d, const KernelLaunch& k, cudaStream_t stream) {
    const BulkLaunch& p = k.bulk;
    const size_t xb = size_t(d.cols / 32) * int_chunk_bytes(k.input);
    bool ok = d.ntok == 1 && p.ntok == 1 && p.slots >= 1 && p.slots <= kBulkSliceMaxSlots && p.warps >= 1 &&
              p.warps <= kBulkMaxWarps && (p.tr == 1 || p.tr == 2) && p.tile_stride > 0 && p.tile_stride % 16 == 0 &&
              p.x_bytes % 16 == 0 && size_t(p.x_bytes) >= xb && p.blocks >= 1 &&
              p.smem >= size_t(p.x_bytes) + size_t(p.warps) * p.slots * p.tr * p.tile_stride &&
              (k.input == GemvInput::Int16 || k.input == GemvInput::Int16x2) && d.cols > 0 && d.cols % 32 == 0;
    for (int s = 0; s < d.nseg; ++s) {
        const uint32_t type = uint32_t(d.seg[s].type);
        ok &= int_input_type(type) && type != EH_TYPE_MXFP4 && (p.same || mixed_launch_type(type));
        // a slice's bytes fit its buffer with the lead of up to 15 bytes
        ok &= d.seg[s].row_bytes * 1024 / size_t(d.cols) + 15 <= size_t(p.tile_stride);
        ok &= d.seg[s].row_bytes < (size_t(1) << 30);  // (the kernel's offsets in a row are ints)
    }
    if (!ok) throw ehp::Error(EH_INTERNAL, "gemv_bulk: a slice ring launch its kernel does not take");
    SliceArgs b{d, p.tr, p.tiles, p.tile_stride, p.x_bytes, p.slots};
    const bool int16 = k.input == GemvInput::Int16;
    auto go = [&](auto kernel) {
        allow_dynamic_smem(kernel, p.smem);
        launch("gemv_bulk_kernel", kernel, dim3(unsigned(p.blocks)), p.warps * 32, p.smem, stream, b);
    };
    auto by_form = [&]<int T>() {
        if (p.tr == 1) {
            if (int16) go(gemv_slice_ring_kernel<T, 1, 16>);
            else go(gemv_slice_ring_kernel<T, 1, 32>);
        } else {
            if (int16) go(gemv_slice_ring_kernel<T, 2, 16>);
            else go(gemv_slice_ring_kernel<T, 2, 32>);
        }
    };
    if (p.same) {
        int_type_dispatch(uint32_t(d.seg[0].type), [&]<int T>() {
            if constexpr (T == EH_TYPE_MXFP4) throw ehp::Error(EH_INTERNAL, "gemv_bulk: MXFP4");  // refused above
            else by_form.template operator()<T>();
        });
    } else {
        by_form.template operator()<kMixed>();
    }
    EHC_LAUNCHED("gemv_bulk_kernel");
}

}  // namespace ehcuda::detail

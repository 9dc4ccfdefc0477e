// Single-token GEMV on quantized weights through the bulk copy engine
// (bulk_copy.cuh): each warp owns a tile of up to R consecutive rows, which
// are contiguous bytes; its lane 0 issues one copy of the whole tile into
// shared memory before the kernel waits for its predecessor, so a warp's
// entire share of the matrix is in flight at once instead of one 32-element
// chunk per lane per round trip (the latency bound of gemv_kernel). The dot
// products then read the tile from shared memory in exactly gemv_kernel's
// order (lane = chunk, same integer dot, same warp reduction), so the
// result is bitwise that of gemv_kernel without split-K (but for the last
// bits of the RMSNorm fold's 1/rms, whose partial sums follow the block size).
// Matrices of several waves take a resident grid instead
// (gemv_bulk_ring_kernel), whose warps stream tile after tile.
//
// Token groups (NT > 1): a launch of 2 .. kBulkMaxTokens tokens stages
// every token's input once per block (or copies it, quantized once by
// quantize_tokens_kernel) and dots each tile with all of them, so the
// weights are read once for the group; each token's codes are the
// single-token launch's, its sums taken in another (fixed) order.
#include <algorithm>

#include "bulk_copy.cuh"
#include "ehcuda/check.hpp"
#include "ehcuda/kernel_route.hpp"
#include "ehcuda/launch.cuh"
#include "ehcuda/quant_dp4a.cuh"
#include "gate_up_pair.cuh"
#include "gemv_stage.cuh"
#include "matmul_common.cuh"

namespace ehcuda::detail {

namespace {

constexpr int kMaxWarps = kBulkMaxWarps;
constexpr int kMixed = -1;  // segments of different types, looked up per warp

struct BulkArgs {
    DevArgs d;
    int rows_per_tile;  // <= R of the kernel
    int tiles;          // tiles of all segments together, one per warp
    int tile_stride;    // shared bytes per tile buffer, a multiple of 16
    int x_bytes;        // shared bytes of the staged input, a multiple of 16
    int x_stride;       // token groups: shared bytes of one token's staged input
    const uint8_t* xq;  // token groups: the inputs quantized once (token t at xq + t * x_stride), or null
};

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

// Tile `t` of the launch: its segment, first row and row count.
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

// A warp's tile of nr rows, in shared memory at w (row r at w + r *
// row_bytes), dotted with the staged inputs of a.ntok (<= NT) tokens
// (token t's at xs + t * x_stride). Lane l takes token l % NT and the chunks
// c = l / NT, l / NT + 32 / NT, ... of every row, its token's chunk loaded
// once for all the rows; the 32 / NT lanes of a token add their sums (xor
// shuffles, widest first) and the first stores them. One token (NT 1) is
// gemv_kernel's order exactly (lane = chunk, same integer dot, same warp
// reduction; lane 0 stores). A token group's inputs are read once per
// chunk and tile, not once per row: read once per row, they cost more
// shared-memory bandwidth than the weights cost memory bandwidth. (Its
// tokens' sums are in another order than one-token launches': equal within
// float reassociation, deterministic.)
template <int T, int R, int XB, int NT>
__device__ __forceinline__ void tile_dot_typed(const DevArgs& a, const TileRef& tf, const uint8_t* w,
                                               const uint8_t* xs, int x_stride, float xscale, int lane) {
    constexpr int kSlots = 32 / NT;
    const DevSeg& g = *tf.g;
    const int nch = a.cols / 32, nr = tf.nr;
    const int t = lane % NT;
    const bool on = t < a.ntok;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    if (on) {
        const uint8_t* xt = xs + size_t(t) * x_stride;
        for (int c = lane / NT; c < nch; c += kSlots) {
            XChunk<XB> x;
            load_staged_int<XB>(xt, c, x);
#pragma unroll
            for (int r = 0; r < R; ++r) {
                if (r >= nr) continue;
                acc[r] += dot_chunk_int<T, true>(w + size_t(r) * g.row_bytes, c, x);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int o = 16; o >= NT; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
    if (!on || lane >= NT) return;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if (r >= nr) break;
        store_out(a, g, t, tf.lr0 + r, __fmul_rn(acc[r], xscale));  // as gemv_kernel rounds
    }
}

// tile_dot_typed for the launch's type, or in a mixed-type launch for the
// tile's (a tile lies in one segment): one switch per tile, so each type's
// chunk loop is the single-type kernel's. (A switch per chunk,
// dot_chunk_int_any, ran Llama-3.1-8B's Q4_K + Q6_K QKV at 16.1 us a call
// against 10.4 for its all-Q4_K layers, ncu on an H200; this form took its
// decode 369.9 -> 378.2 tok/s and Qwen3-8B's 359.1 -> 370.1, same H200.)
template <int T, int R, int XB, int NT>
__device__ __forceinline__ void tile_dot(const DevArgs& a, const TileRef& tf, const uint8_t* w, const uint8_t* xs,
                                         int x_stride, float xscale, int lane) {
    if constexpr (T != kMixed) {
        tile_dot_typed<T, R, XB, NT>(a, tf, w, xs, x_stride, xscale, lane);
    } else {
        switch (tf.g->type) {  // mixed_launch_type's types, as dot_chunk_int_any
        case EH_TYPE_Q4_0: return tile_dot_typed<EH_TYPE_Q4_0, R, XB, NT>(a, tf, w, xs, x_stride, xscale, lane);
        case EH_TYPE_Q4_1: return tile_dot_typed<EH_TYPE_Q4_1, R, XB, NT>(a, tf, w, xs, x_stride, xscale, lane);
        case EH_TYPE_Q5_0: return tile_dot_typed<EH_TYPE_Q5_0, R, XB, NT>(a, tf, w, xs, x_stride, xscale, lane);
        case EH_TYPE_Q5_1: return tile_dot_typed<EH_TYPE_Q5_1, R, XB, NT>(a, tf, w, xs, x_stride, xscale, lane);
        case EH_TYPE_Q8_0: return tile_dot_typed<EH_TYPE_Q8_0, R, XB, NT>(a, tf, w, xs, x_stride, xscale, lane);
        case EH_TYPE_Q4_K: return tile_dot_typed<EH_TYPE_Q4_K, R, XB, NT>(a, tf, w, xs, x_stride, xscale, lane);
        case EH_TYPE_Q5_K: return tile_dot_typed<EH_TYPE_Q5_K, R, XB, NT>(a, tf, w, xs, x_stride, xscale, lane);
        case EH_TYPE_Q6_K: return tile_dot_typed<EH_TYPE_Q6_K, R, XB, NT>(a, tf, w, xs, x_stride, xscale, lane);
        default: return;  // the host launches only these
        }
    }
}

// Stages the block's input (or copies a producer's chunks); returns the
// factor tile_dot applies (1 / rms for the RMSNorm fold, else 1).
template <int XB>
__device__ __forceinline__ float stage_input(const DevArgs& a, int4* smem) {
    if (a.xmode != int(XMode::Chunks)) return stage_x_int<XB>(a, reinterpret_cast<uint8_t*>(smem));
    copy_chunks(reinterpret_cast<const int4*>(a.x), smem, int(size_t(a.cols / 32) * kIntStride<XB> / 16));
    return 1.0f;
}

// The block's staging: one token's (NT 1: the input staged or a producer's
// chunks copied; returns the RMSNorm fold's factor), or a token group's
// (plain or SwiGLU inputs, no fold: the chunks quantized once copied, else
// each token staged).
template <int XB, int NT>
__device__ __forceinline__ float stage_block(const BulkArgs& b, int4* smem) {
    if constexpr (NT == 1) {
        return stage_input<XB>(b.d, smem);
    } else {
        if (b.xq) copy_chunks(reinterpret_cast<const int4*>(b.xq), smem, b.d.ntok * b.x_stride / 16);
        else stage_x_int_tokens<XB>(b.d, reinterpret_cast<uint8_t*>(smem), b.d.ntok, b.x_stride);
        return 1.0f;
    }
}

// Issues tile tf's copy into `dst` (16-byte aligned), completing on `bar`;
// its first byte lands at dst + tile_lead(tf) (bulk_range_issue).
__device__ __forceinline__ void issue_tile(const TileRef& tf, uint8_t* dst, uint64_t* bar) {
    const DevSeg& g = *tf.g;
    bulk_range_issue(bar, dst, g.w + size_t(tf.lr0) * g.row_bytes, size_t(tf.nr) * g.row_bytes,
                     g.w + size_t(g.rows) * g.row_bytes);
}
__device__ __forceinline__ int tile_lead(const TileRef& tf) {
    return int(reinterpret_cast<uintptr_t>(tf.g->w + size_t(tf.lr0) * tf.g->row_bytes) & 15);
}

// Warp w of the launch takes tile w; its lane 0 issues the tile's copy
// before pdl_entry(), then the block stages the input once for all its
// warps (up to 8 by default: the staging is a per-block cost) while the
// tiles are in flight.
template <int T, int R, int XB, int NT>
__global__ void __launch_bounds__(kMaxWarps * 32) gemv_bulk_kernel(BulkArgs b) {
    static_assert(XB != 0, "the bulk GEMV takes integer inputs only");
    const DevArgs& a = b.d;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __shared__ uint64_t bars[kMaxWarps];
    extern __shared__ int4 smem_raw[];
    uint8_t* xs = reinterpret_cast<uint8_t*>(smem_raw);
    uint8_t* tile = xs + b.x_bytes + size_t(warp) * b.tile_stride;
    const int t = blockIdx.x * (blockDim.x >> 5) + warp;
    const bool active = t < b.tiles;
    const TileRef tf = tile_ref(a, b.rows_per_tile, active ? t : 0);
    if (active && lane == 0) {
        mbar_init(&bars[warp]);
        issue_tile(tf, tile, &bars[warp]);
    }
    pdl_entry();
    pdl_release();
    const float xscale = stage_block<XB, NT>(b, smem_raw);
    if (!active) return;
    mbar_wait(&bars[warp], 0);
    __syncwarp();
    tile_dot<T, R, XB, NT>(a, tf, tile + tile_lead(tf), xs, b.x_stride, xscale, lane);
}

// For matrices of several waves of gemv_bulk_kernel's blocks: a grid that
// stays resident, each warp taking tiles w, w + W, w + 2W, ... (W warps in
// the grid) through two tile buffers, the next copy in flight while it dots
// the current one, and issuing the one after as soon as a buffer is free;
// the input is staged once per block. One-shot blocks start, land and dot
// their tiles in step (the copy engine serves a multiprocessor's copies
// together: splitting a tile into 2-4 copies each waited for on its own
// bought nothing on an H100), so their dot products and block turnover
// leave the memory idle; here a warp's copies are issued one tile apart.
// (As the only form, for every matrix, this was slower in models: one-wave
// matrices need every tile in flight at once. Phi-3 decode 486 -> 446.)
template <int T, int R, int XB, int NT>
__global__ void __launch_bounds__(kMaxWarps * 32) gemv_bulk_ring_kernel(BulkArgs b) {
    static_assert(XB != 0, "the bulk GEMV takes integer inputs only");
    const DevArgs& a = b.d;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __shared__ uint64_t bars[kMaxWarps][2];
    extern __shared__ int4 smem_raw[];
    uint8_t* xs = reinterpret_cast<uint8_t*>(smem_raw);
    uint8_t* buf = xs + b.x_bytes + size_t(warp) * 2 * b.tile_stride;
    const int nw = int(gridDim.x) * int(blockDim.x >> 5);
    const int t0 = blockIdx.x * (blockDim.x >> 5) + warp;
    if (lane == 0) {
        mbar_init(&bars[warp][0]);
        mbar_init(&bars[warp][1]);
        for (int k = 0; k < 2; ++k)
            if (t0 + k * nw < b.tiles)
                issue_tile(tile_ref(a, b.rows_per_tile, t0 + k * nw), buf + k * b.tile_stride, &bars[warp][k]);
    }
    pdl_entry();
    pdl_release();
    const float xscale = stage_block<XB, NT>(b, smem_raw);
    int i = 0;
    for (int t = t0; t < b.tiles; t += nw, ++i) {
        const int k = i & 1;
        uint8_t* tile = buf + k * b.tile_stride;
        const TileRef tf = tile_ref(a, b.rows_per_tile, t);
        mbar_wait(&bars[warp][k], uint32_t(i >> 1) & 1u);
        __syncwarp();
        tile_dot<T, R, XB, NT>(a, tf, tile + tile_lead(tf), xs, b.x_stride, xscale, lane);
        if (t + 2 * nw < b.tiles) {
            fence_async_shared();  // this warp's reads of the buffer before the refill
            __syncwarp();
            if (lane == 0) issue_tile(tile_ref(a, b.rows_per_tile, t + 2 * nw), tile, &bars[warp][k]);
        }
    }
}

// A token group's inputs quantized once, for every block of the group's
// launch to copy (BulkLaunch::prequant): one warp per token and 32-element
// chunk, rounded as stage_x_int rounds (store_chunk_warp), so the codes are
// those each block would have staged. Token t's chunks at out + t * stride.
template <int Bits>
__global__ void __launch_bounds__(256) quantize_tokens_kernel(DevArgs a, uint8_t* out, int stride) {
    pdl_entry();
    pdl_release();
    const int nch = a.cols / 32;
    const int w = int(blockIdx.x) * 8 + int(threadIdx.x >> 5);
    if (w >= a.ntok * nch) return;
    const int t = w / nch, c = w - t * nch, lane = threadIdx.x & 31;
    const float* x = a.x + size_t(t) * a.ldx + 32 * c + lane;
    float v = *x;
    if (a.xmode == int(XMode::SwiGLU)) v = silu(v) * x[a.cols];
    store_chunk_warp<Bits>(v, out + size_t(t) * stride + size_t(c) * kIntStride<Bits>);
}

}  // namespace

void gemv_bulk(const DevArgs& d, const KernelLaunch& k, cudaStream_t stream) {
    // Tile rows, warps per block, one-shot or resident grid: the route's
    // (kernel_route.cpp, plan_bulk).
    const BulkLaunch& p = k.bulk;
    const bool group = d.ntok > 1;
    if (d.ntok < 1 || d.ntok > kBulkMaxTokens || d.ntok != p.ntok || p.warps == 0 ||
        (group && (d.xmode != int(XMode::Plain) && d.xmode != int(XMode::SwiGLU))) ||
        (k.input != GemvInput::Int16 && k.input != GemvInput::Int16x2))
        throw ehp::Error(EH_INTERNAL, "gemv_bulk: a launch the bulk kernels do not take");
    const int R = p.tr <= 1 ? 1 : p.tr <= 2 ? 2 : p.tr <= 4 ? 4 : 8;
    const int bits = k.input == GemvInput::Int16 ? 16 : 32;
    BulkArgs b{};
    b.d = d;
    b.rows_per_tile = p.tr;
    b.tiles = p.tiles;
    b.tile_stride = p.tile_stride;
    b.x_bytes = p.x_bytes;
    b.x_stride = p.x_stride;
    if (group && p.prequant) {
        if (!d.xq) throw ehp::Error(EH_INTERNAL, "gemv_bulk: a token group quantized once needs the call's scratch");
        const int warps = d.ntok * (d.cols / 32);
        const unsigned blocks = unsigned((warps + 7) / 8);
        if (bits == 16) launch("quantize_tokens_kernel", quantize_tokens_kernel<16>, dim3(blocks), 256, 0, stream, d, d.xq, p.x_stride);
        else launch("quantize_tokens_kernel", quantize_tokens_kernel<32>, dim3(blocks), 256, 0, stream, d, d.xq, p.x_stride);
        b.xq = d.xq;
    }
    auto go = [&](auto kernel) {
        allow_dynamic_smem(kernel, p.smem);
        int blocks = p.blocks;
        if (p.ring) {
            int per_sm = 0;
            EHC_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, p.warps * 32, p.smem));
            blocks = std::min(blocks, std::max(1, per_sm) * sm_count());
        }
        launch(p.ring ? "gemv_bulk_ring_kernel" : "gemv_bulk_kernel", kernel, dim3(unsigned(blocks)), p.warps * 32,
               p.smem, stream, b);
    };
    auto by_group = [&]<int T, int R_, int XB>() {
        if (group) {
            if constexpr (R_ <= kBulkGroupMaxRows) {
                // the lane layout of the group's size: NT token slots, the
                // rest of the warp's lanes chunk slots (none left idle for
                // 2 or 4 tokens)
                auto by_nt = [&]<int NT>() {
                    if (p.ring) go(gemv_bulk_ring_kernel<T, R_, XB, NT>);
                    else go(gemv_bulk_kernel<T, R_, XB, NT>);
                };
                static_assert(kBulkMaxTokens == 8, "the token slots below");
                if (d.ntok <= 2) by_nt.template operator()<2>();
                else if (d.ntok <= 4) by_nt.template operator()<4>();
                else by_nt.template operator()<8>();
            } else {
                throw ehp::Error(EH_INTERNAL, "gemv_bulk: a token group's tile of more than kBulkGroupMaxRows rows");
            }
        } else if (p.ring) {
            go(gemv_bulk_ring_kernel<T, R_, XB, 1>);
        } else {
            go(gemv_bulk_kernel<T, R_, XB, 1>);
        }
    };
    auto by_bits = [&]<int T, int R_>() {
        if (bits == 16) by_group.template operator()<T, R_, 16>();
        else by_group.template operator()<T, R_, 32>();
    };
    auto by_rows = [&]<int T>() {
        if constexpr (T == EH_TYPE_MXFP4) throw ehp::Error(EH_INTERNAL, "gemv_bulk: MXFP4");  // can_implement_bulk refuses it
        else if (R == 1) by_bits.template operator()<T, 1>();
        else if (R == 2) by_bits.template operator()<T, 2>();
        else if (R == 4) by_bits.template operator()<T, 4>();
        else by_bits.template operator()<T, 8>();
    };
    if (p.same) int_type_dispatch(uint32_t(d.seg[0].type), by_rows);
    else by_rows.template operator()<kMixed>();
    EHC_LAUNCHED("gemv_bulk_kernel");
}

}  // namespace ehcuda::detail

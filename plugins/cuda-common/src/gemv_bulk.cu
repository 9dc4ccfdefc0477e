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
// (gemv_bulk_ring_kernel), whose warps stream tile after tile; under the
// plan's bulk_slices, a ring of K slices per warp (gemv_slice_ring.cu).
//
// Token groups (NT > 1): a launch of 2 .. kBulkMaxTokens tokens stages
// every token's input once per block (or copies it, quantized once by
// quantize_tokens_kernel) and dots each tile with all of them, so the
// weights are read once for the group; each token's codes are the
// single-token launch's, its sums taken in another (fixed) order. Under
// bulk_group_once (BulkLaunch::once) a group's lanes take chunks as one
// token's do and each decodes its weight chunk once for all the tokens
// (gemv_group_dot.cuh). A group's RMSNorm (bulk_group_norm) is taken where
// its inputs are quantized once: codes of x * norm_w as the one-token fold
// stages them, each token's 1 / rms applied to its sums.
#include <algorithm>

#include "bulk_copy.cuh"
#include "ehcuda/check.hpp"
#include "ehcuda/kernel_route.hpp"
#include "ehcuda/launch.cuh"
#include "ehcuda/quant_dp4a.cuh"
#include "gate_up_pair.cuh"
#include "gemv_bulk_block.cuh"
#include "gemv_group_dot.cuh"
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
    const float* tscale;  // token groups with an RMSNorm: token t's 1 / rms (after the tokens' chunks in xq), or null
    int kslice;           // a sliced group's chunks of K a step (gemv_bulk_slice_kernel), else 0
};

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
                                               const uint8_t* xs, int x_stride, float xscale, const float* tscale,
                                               int lane) {
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
    if (NT > 1 && tscale) xscale = tscale[t];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if (r >= nr) break;
        store_out(a, g, t, tf.lr0 + r, __fmul_rn(acc[r], xscale));  // as gemv_kernel rounds
    }
}

// A token group's tile as tile_dot_typed's, lanes taking chunks as one
// token's do (lane l: chunks l, l + 32, ...): each lane decodes its chunk
// of the tile's rows once (decode_wchunk) and dots it with every token's
// staged chunk, so a group costs one decode and a token's integer dots per
// weight chunk instead of a decode per token. The R x NT sums (r * NT + t)
// are added over the warp by transpose_sum; each is stored by the first
// lane that holds it.
template <int T, int R, int XB, int NT>
__device__ __forceinline__ void tile_dot_once(const DevArgs& a, const TileRef& tf, const uint8_t* w,
                                              const uint8_t* xs, int x_stride, const float* tscale, int lane) {
    constexpr int V = R * NT;
    static_assert(V <= 32, "rows x tokens of a tile: at most a warp's lanes");
    const DevSeg& g = *tf.g;
    const int nch = a.cols / 32, nr = tf.nr, ntok = a.ntok;
    float acc[V];
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] = 0.0f;
    for (int c = lane; c < nch; c += 32) {
        WChunk<T> wc[R];
#pragma unroll
        for (int r = 0; r < R; ++r)
            if (r < nr) decode_wchunk<T>(w + size_t(r) * g.row_bytes, c, wc[r]);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            if (t >= ntok) break;  // uniform across the warp
            XChunk<XB> x;
            load_staged_int<XB>(xs + size_t(t) * x_stride, c, x);
#pragma unroll
            for (int r = 0; r < R; ++r)
                if (r < nr) acc[r * NT + t] += wchunk_dot<T>(wc[r], x);
        }
    }
    int held = 0;
    transpose_sum<V>(acc, lane, held);
    if (lane % (32 / V) != 0) return;
    const int r = held / NT, t = held % NT;
    if (r >= nr || t >= ntok) return;
    const float xscale = tscale ? tscale[t] : 1.0f;
    store_out(a, g, t, tf.lr0 + r, __fmul_rn(acc[0], xscale));
}

// tile_dot_typed for the launch's type, or in a mixed-type launch for the
// tile's (a tile lies in one segment): one switch per tile, so each type's
// chunk loop is the single-type kernel's. (A switch per chunk,
// dot_chunk_int_any, ran Llama-3.1-8B's Q4_K + Q6_K QKV at 16.1 us a call
// against 10.4 for its all-Q4_K layers, ncu on an H200; this form took its
// decode 369.9 -> 378.2 tok/s and Qwen3-8B's 359.1 -> 370.1, same H200.)
// A mixed launch's decoded-once tile, one function per type: inlined, the
// eight types' bodies in one tile loop took the resident kernel to 64
// registers and kilobytes of spills (ptxas, sm_90).
template <int T, int R, int XB, int NT>
__device__ __noinline__ void tile_dot_once_call(const DevArgs& a, const TileRef& tf, const uint8_t* w,
                                                const uint8_t* xs, int x_stride, const float* tscale, int lane) {
    tile_dot_once<T, R, XB, NT>(a, tf, w, xs, x_stride, tscale, lane);
}
template <int T, int R, int XB, int NT, bool Once, bool Mixed = false>
__device__ __forceinline__ void tile_dot_one(const DevArgs& a, const TileRef& tf, const uint8_t* w, const uint8_t* xs,
                                             int x_stride, float xscale, const float* tscale, int lane) {
    if constexpr (Once && Mixed) tile_dot_once_call<T, R, XB, NT>(a, tf, w, xs, x_stride, tscale, lane);
    else if constexpr (Once) tile_dot_once<T, R, XB, NT>(a, tf, w, xs, x_stride, tscale, lane);
    else tile_dot_typed<T, R, XB, NT>(a, tf, w, xs, x_stride, xscale, tscale, lane);
}
template <int T, int R, int XB, int NT, bool Once>
__device__ __forceinline__ void tile_dot(const DevArgs& a, const TileRef& tf, const uint8_t* w, const uint8_t* xs,
                                         int x_stride, float xscale, const float* tscale, int lane) {
    if constexpr (T != kMixed) {
        tile_dot_one<T, R, XB, NT, Once>(a, tf, w, xs, x_stride, xscale, tscale, lane);
    } else {
#define EHCUDA_TILE_TYPE(TY) \
    case TY: return tile_dot_one<TY, R, XB, NT, Once, true>(a, tf, w, xs, x_stride, xscale, tscale, lane);
        switch (tf.g->type) {  // mixed_launch_type's types, as dot_chunk_int_any
        EHCUDA_TILE_TYPE(EH_TYPE_Q4_0)
        EHCUDA_TILE_TYPE(EH_TYPE_Q4_1)
        EHCUDA_TILE_TYPE(EH_TYPE_Q5_0)
        EHCUDA_TILE_TYPE(EH_TYPE_Q5_1)
        EHCUDA_TILE_TYPE(EH_TYPE_Q8_0)
        EHCUDA_TILE_TYPE(EH_TYPE_Q4_K)
        EHCUDA_TILE_TYPE(EH_TYPE_Q5_K)
        EHCUDA_TILE_TYPE(EH_TYPE_Q6_K)
        default: return;  // the host launches only these
        }
#undef EHCUDA_TILE_TYPE
    }
}

// stage_x_int_tokens with an RMSNorm: each token's codes those of x *
// norm_w (as stage_x_int stages the one-token fold) and its 1 / rms at
// tsc[t] (shared). A thread's sums of squares are kept per token (its
// float4 indices may span two tokens), added over the warp, then over the
// warps in order: a fixed tree.
template <int Bits>
__device__ __forceinline__ void stage_tokens_norm(const DevArgs& a, uint8_t* smem, int stride, float* tsc) {
    constexpr int kT = kBulkMaxTokens;
    __shared__ float red[kMaxWarps][kT];
    const int ntok = a.ntok, n4 = a.cols / 4, total = ntok * n4;
    float ss[kT];
#pragma unroll
    for (int u = 0; u < kT; ++u) ss[u] = 0.0f;
    constexpr int kBatch = 4;
    for (int base = 0; base < total; base += kBatch * blockDim.x) {
        float4 vb[kBatch], wb[kBatch];
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
            const int f = base + k * blockDim.x + threadIdx.x;
            const int t = f / n4, i = f - t * n4;
            vb[k] = f < total ? reinterpret_cast<const float4*>(a.x + size_t(t) * a.ldx)[i] : make_float4(0.f, 0.f, 0.f, 0.f);
            wb[k] = f < total ? reinterpret_cast<const float4*>(a.norm_w)[i] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
            const int f = base + k * blockDim.x + threadIdx.x;
            if (base + k * blockDim.x >= total) break;  // uniform across the block
            const bool ok = f < total;
            const int t = ok ? f / n4 : 0, i = f - t * n4;
            float4 v = vb[k];
            const float4 w = wb[k];
            float q = 0.0f;
            q = fmaf(v.x, v.x, q);
            q = fmaf(v.y, v.y, q);
            q = fmaf(v.z, v.z, q);
            q = fmaf(v.w, v.w, q);
#pragma unroll
            for (int u = 0; u < kT; ++u)
                if (u == t) ss[u] += q;
            v.x *= w.x;
            v.y *= w.y;
            v.z *= w.z;
            v.w *= w.w;
            quantize_quad<Bits>(v, ok, i, smem + size_t(t) * stride);
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int u = 0; u < kT; ++u) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss[u] += __shfl_xor_sync(0xffffffffu, ss[u], o);
        if (lane == 0) red[warp][u] = ss[u];
    }
    __syncthreads();
    if (int(threadIdx.x) < ntok) {
        float tot = 0.0f;
        for (int w = 0; w < int(blockDim.x >> 5); ++w) tot += red[w][threadIdx.x];
        tsc[threadIdx.x] = rsqrtf(tot / float(a.cols) + a.norm_eps);
    }
    __syncthreads();
}

// The block's staging: one token's (NT 1: the input staged or a producer's
// chunks copied; returns the RMSNorm fold's factor), or a token group's
// (the chunks quantized once copied, else each token staged; with an
// RMSNorm, `tscale` set to the tokens' 1 / rms, in the scratch after their
// chunks or in tsc).
template <int XB, int NT>
__device__ __forceinline__ float stage_block(const BulkArgs& b, int4* smem, const float*& tscale, float* tsc) {
    tscale = nullptr;
    if constexpr (NT == 1) {
        return stage_input<XB>(b.d, smem);
    } else {
        if (b.xq) {
            copy_chunks(reinterpret_cast<const int4*>(b.xq), smem, b.d.ntok * b.x_stride / 16);
            tscale = b.tscale;
        } else if (b.d.xmode == int(XMode::RmsNorm)) {
            stage_tokens_norm<XB>(b.d, reinterpret_cast<uint8_t*>(smem), b.x_stride, tsc);
            tscale = tsc;
        } else {
            stage_x_int_tokens<XB>(b.d, reinterpret_cast<uint8_t*>(smem), b.d.ntok, b.x_stride);
        }
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
template <int T, int R, int XB, int NT, bool Once>
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
    __shared__ float tsc[kBulkMaxTokens];
    const float* tscale;
    const float xscale = stage_block<XB, NT>(b, smem_raw, tscale, tsc);
    if (!active) return;
    mbar_wait(&bars[warp], 0);
    __syncwarp();
    tile_dot<T, R, XB, NT, Once>(a, tf, tile + tile_lead(tf), xs, b.x_stride, xscale, tscale, lane);
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
template <int T, int R, int XB, int NT, bool Once>
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
    __shared__ float tsc[kBulkMaxTokens];
    const float* tscale;
    const float xscale = stage_block<XB, NT>(b, smem_raw, tscale, tsc);
    int i = 0;
    for (int t = t0; t < b.tiles; t += nw, ++i) {
        const int k = i & 1;
        uint8_t* tile = buf + k * b.tile_stride;
        const TileRef tf = tile_ref(a, b.rows_per_tile, t);
        mbar_wait(&bars[warp][k], uint32_t(i >> 1) & 1u);
        __syncwarp();
        tile_dot<T, R, XB, NT, Once>(a, tf, tile + tile_lead(tf), xs, b.x_stride, xscale, tscale, lane);
        if (t + 2 * nw < b.tiles) {
            fence_async_shared();  // this warp's reads of the buffer before the refill
            __syncwarp();
            if (lane == 0) issue_tile(tile_ref(a, b.rows_per_tile, t + 2 * nw), tile, &bars[warp][k]);
        }
    }
}

// A token group over rows too long for whole-row tiles (BulkLaunch::kslice,
// plan_bulk_slices): a block's kBulkSliceWarps warps take kBulkOnceMaxRows
// rows each and walk K in slices of S chunks together, each slice's inputs
// (the tokens' chunks quantized once, b.xq) copied once for the block and
// each warp's rows' slices by its lane 0, two slices in flight. A lane
// takes chunks c, c + 32 of each slice, so the same chunks in the same
// order as tile_dot_once's lane over whole rows; the sums are added over
// the warp and stored once, after the last slice.
template <int T, int NT>
__global__ void __launch_bounds__(kBulkSliceWarps * 32) gemv_bulk_slice_kernel(BulkArgs b) {
    constexpr int R = kBulkOnceMaxRows, W = kBulkSliceWarps, V = R * NT;
    constexpr int kXc = kIntStride<16>;
    const DevArgs& a = b.d;
    const DevSeg& g = a.seg[0];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int S = b.kslice, parts = a.cols / 32 / S, ntok = a.ntok;
    const int sb = b.tile_stride;  // one row's slice, a multiple of 16 bytes
    __shared__ uint64_t xbar[2], wbar[W][2];
    extern __shared__ int4 smem_raw[];
    uint8_t* xbuf = reinterpret_cast<uint8_t*>(smem_raw);
    uint8_t* wbuf = xbuf + 2 * size_t(b.x_bytes) + size_t(warp) * 2 * R * sb;
    const int row0 = (int(blockIdx.x) * W + warp) * R;
    const int nr = max(0, min(R, g.rows - row0));
    auto issue_w = [&](int part, int k) {  // lane 0 of a warp with rows
        mbar_expect(&wbar[warp][k], uint32_t(nr * sb));
        for (int r = 0; r < nr; ++r)
            bulk_copy(wbuf + size_t(k) * R * sb + size_t(r) * sb,
                      g.w + size_t(row0 + r) * g.row_bytes + size_t(part) * sb, uint32_t(sb), &wbar[warp][k]);
    };
    auto issue_x = [&](int part, int k) {  // thread 0
        const int cb = S * kXc;
        mbar_expect(&xbar[k], uint32_t(ntok * cb));
        for (int t = 0; t < ntok; ++t)
            bulk_copy(xbuf + size_t(k) * b.x_bytes + size_t(t) * cb, b.xq + size_t(t) * b.x_stride + size_t(part) * cb,
                      uint32_t(cb), &xbar[k]);
    };
    if (threadIdx.x == 0) {
        mbar_init(&xbar[0]);
        mbar_init(&xbar[1]);
    }
    if (lane == 0) {
        mbar_init(&wbar[warp][0]);
        mbar_init(&wbar[warp][1]);
    }
    __syncthreads();
    // the weights before the wait for the kernel before (they are never
    // written), the inputs (its output) after it
    if (lane == 0 && nr > 0)
        for (int k = 0; k < 2 && k < parts; ++k) issue_w(k, k);
    pdl_entry();
    pdl_release();
    if (threadIdx.x == 0)
        for (int k = 0; k < 2 && k < parts; ++k) issue_x(k, k);
    float acc[V];
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] = 0.0f;
    for (int part = 0; part < parts; ++part) {
        const int k = part & 1;
        const uint32_t parity = uint32_t(part >> 1) & 1u;
        mbar_wait(&xbar[k], parity);
        if (nr > 0) {
            mbar_wait(&wbar[warp][k], parity);
            __syncwarp();
            const uint8_t* w = wbuf + size_t(k) * R * sb;
            const uint8_t* xs = xbuf + size_t(k) * b.x_bytes;
            for (int c = lane; c < S; c += 32) {
                WChunk<T> wc[R];
#pragma unroll
                for (int r = 0; r < R; ++r)
                    if (r < nr) decode_wchunk<T>(w + size_t(r) * sb, c, wc[r]);
#pragma unroll
                for (int t = 0; t < NT; ++t) {
                    if (t >= ntok) break;  // uniform across the block
                    XChunk<16> x;
                    load_staged_int<16>(xs + size_t(t) * S * kXc, c, x);
#pragma unroll
                    for (int r = 0; r < R; ++r)
                        if (r < nr) acc[r * NT + t] += wchunk_dot<T>(wc[r], x);
                }
            }
        }
        if (part + 2 < parts) {  // (uniform) every warp done with buffer k: refill it
            fence_async_shared();
            __syncthreads();
            if (threadIdx.x == 0) issue_x(part + 2, k);
            if (lane == 0 && nr > 0) issue_w(part + 2, k);
        }
    }
    if (nr == 0) return;
    int held = 0;
    transpose_sum<V>(acc, lane, held);
    if (lane % (32 / V) != 0) return;
    const int r = held / NT, t = held % NT;
    if (r >= nr || t >= ntok) return;
    store_out(a, g, t, row0 + r, __fmul_rn(acc[0], b.tscale ? b.tscale[t] : 1.0f));
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

// quantize_tokens_kernel for a group with an RMSNorm: one block a token
// (kNormWarps warps), the codes those of x * norm_w (as stage_x_int stages
// the one-token fold), and the token's 1 / rms, from its sum of squares
// added lane by lane then warp by warp in a fixed order, at scale[t]. All
// of a lane's loads are issued before the first chunk's shuffles.
constexpr int kNormWarps = 32;
template <int Bits>
__global__ void __launch_bounds__(kNormWarps * 32) quantize_tokens_norm_kernel(DevArgs a, uint8_t* out, int stride,
                                                                              float* scale) {
    pdl_entry();
    pdl_release();
    __shared__ float red[kNormWarps];
    const int nch = a.cols / 32, t = int(blockIdx.x), lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float* x = a.x + size_t(t) * a.ldx;
    constexpr int kBatch = 4;
    float ss = 0.0f;
    for (int base = warp; base < nch; base += kBatch * kNormWarps) {
        float v[kBatch], wv[kBatch];
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
            const int c = base + k * kNormWarps;
            v[k] = c < nch ? x[32 * c + lane] : 0.0f;
            wv[k] = c < nch ? a.norm_w[32 * c + lane] : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
            const int c = base + k * kNormWarps;
            if (c >= nch) break;  // uniform across the warp
            ss = fmaf(v[k], v[k], ss);
            store_chunk_warp<Bits>(v[k] * wv[k], out + size_t(t) * stride + size_t(c) * kIntStride<Bits>);
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        float tot = 0.0f;
        for (int w = 0; w < kNormWarps; ++w) tot += red[w];
        scale[t] = rsqrtf(tot / float(a.cols) + a.norm_eps);
    }
}

}  // namespace

void gemv_bulk(const DevArgs& d, const KernelLaunch& k, cudaStream_t stream) {
    // Tile rows, warps per block, one-shot or resident grid: the route's
    // (kernel_route.cpp, plan_bulk).
    const BulkLaunch& p = k.bulk;
    if (p.slots) return gemv_slice_ring(d, k, stream);  // (plan_bulk under bulk_slices)
    const bool group = d.ntok > 1;
    const bool norm = group && d.xmode == int(XMode::RmsNorm);
    if (d.ntok < 1 || d.ntok > kBulkMaxTokens || d.ntok != p.ntok || p.warps == 0 ||
        (group && !norm && d.xmode != int(XMode::Plain) && d.xmode != int(XMode::SwiGLU)) ||
        (p.once && (!group || p.tr > kBulkOnceMaxRows || k.input != GemvInput::Int16)) ||
        (k.input != GemvInput::Int16 && k.input != GemvInput::Int16x2))
        throw ehp::Error(EH_INTERNAL, "gemv_bulk: a launch the bulk kernels do not take");
    if (p.kslice && (!group || !p.once || !p.prequant || d.nseg != 1 || k.input != GemvInput::Int16 ||
                     p.tile_stride % 16 || d.seg[0].row_bytes % 16 || reinterpret_cast<uintptr_t>(d.seg[0].w) % 16))
        throw ehp::Error(EH_INTERNAL, "gemv_bulk: a sliced token group needs one 16-byte aligned segment and its inputs quantized once");
    const int R = p.tr <= 1 ? 1 : p.tr <= 2 ? 2 : p.tr <= 4 ? 4 : 8;
    const int bits = k.input == GemvInput::Int16 ? 16 : 32;
    BulkArgs b{};
    b.d = d;
    b.rows_per_tile = p.tr;
    b.tiles = p.tiles;
    b.tile_stride = p.tile_stride;
    b.x_bytes = p.x_bytes;
    b.x_stride = p.x_stride;
    b.kslice = p.kslice;
    if (group && p.prequant) {
        if (!d.xq) throw ehp::Error(EH_INTERNAL, "gemv_bulk: a token group quantized once needs the call's scratch");
        if (norm) {
            // (the tokens' 1 / rms after their chunks: bulk_group_scratch)
            float* scale = reinterpret_cast<float*>(d.xq + size_t(d.ntok) * p.x_stride);
            const unsigned blocks = unsigned(d.ntok), threads = unsigned(kNormWarps * 32);
            if (bits == 16) launch("quantize_tokens_kernel", quantize_tokens_norm_kernel<16>, dim3(blocks), threads, 0, stream, d, d.xq, p.x_stride, scale);
            else launch("quantize_tokens_kernel", quantize_tokens_norm_kernel<32>, dim3(blocks), threads, 0, stream, d, d.xq, p.x_stride, scale);
            b.tscale = scale;
        } else {
            const int warps = d.ntok * (d.cols / 32);
            const unsigned blocks = unsigned((warps + 7) / 8);
            if (bits == 16) launch("quantize_tokens_kernel", quantize_tokens_kernel<16>, dim3(blocks), 256, 0, stream, d, d.xq, p.x_stride);
            else launch("quantize_tokens_kernel", quantize_tokens_kernel<32>, dim3(blocks), 256, 0, stream, d, d.xq, p.x_stride);
        }
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
    if (p.kslice) {  // (after the quantize launch above)
        int_type_dispatch(uint32_t(d.seg[0].type), [&]<int T>() {
            if constexpr (T == EH_TYPE_MXFP4) {
                throw ehp::Error(EH_INTERNAL, "gemv_bulk: MXFP4");  // plan_bulk_slices refuses it
            } else {
                auto one = [&](auto kernel) {
                    allow_dynamic_smem(kernel, p.smem);
                    launch("gemv_bulk_kernel", kernel, dim3(unsigned(p.blocks)), p.warps * 32, p.smem, stream, b);
                };
                if (d.ntok <= 2) one(gemv_bulk_slice_kernel<T, 2>);
                else if (d.ntok <= 4) one(gemv_bulk_slice_kernel<T, 4>);
                else one(gemv_bulk_slice_kernel<T, 8>);
            }
        });
        EHC_LAUNCHED("gemv_bulk_kernel");
        return;
    }
    auto by_group = [&]<int T, int R_, int XB>() {
        if (group) {
            if constexpr (R_ <= kBulkGroupMaxRows) {
                // the lane layout of the group's size: NT token slots, the
                // rest of the warp's lanes chunk slots (none left idle for
                // 2 or 4 tokens)
                auto by_nt = [&]<int NT>() {
                    if (p.once) {
                        if constexpr (R_ <= kBulkOnceMaxRows && XB == 16) {
                            if (p.ring) go(gemv_bulk_ring_kernel<T, R_, XB, NT, true>);
                            else go(gemv_bulk_kernel<T, R_, XB, NT, true>);
                        }
                    } else if (p.ring) {
                        go(gemv_bulk_ring_kernel<T, R_, XB, NT, false>);
                    } else {
                        go(gemv_bulk_kernel<T, R_, XB, NT, false>);
                    }
                };
                static_assert(kBulkMaxTokens == 8, "the token slots below");
                if (d.ntok <= 2) by_nt.template operator()<2>();
                else if (d.ntok <= 4) by_nt.template operator()<4>();
                else by_nt.template operator()<8>();
            } else {
                throw ehp::Error(EH_INTERNAL, "gemv_bulk: a token group's tile of more than kBulkGroupMaxRows rows");
            }
        } else if (p.ring) {
            go(gemv_bulk_ring_kernel<T, R_, XB, 1, false>);
        } else {
            go(gemv_bulk_kernel<T, R_, XB, 1, false>);
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

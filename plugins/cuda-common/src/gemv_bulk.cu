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
#include <algorithm>
#include <cstdlib>

#include "bulk_copy.cuh"
#include "ehcuda/check.hpp"
#include "ehcuda/launch.cuh"
#include "ehcuda/quant_dp4a.cuh"
#include "gate_up_pair.cuh"
#include "gemv_stage.cuh"
#include "matmul_common.cuh"

namespace ehcuda::detail {

namespace {

constexpr int kMaxWarps = 16;
constexpr int kMixed = -1;  // segments of different types, looked up per warp

struct BulkArgs {
    DevArgs d;
    int rows_per_tile;  // <= R of the kernel
    int tiles;          // tiles of all segments together, one per warp
    int tile_stride;    // shared bytes per tile buffer, a multiple of 16
    int x_bytes;        // shared bytes of the staged input, a multiple of 16
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

// Warp w of the launch takes tile w; its lane 0 issues the tile's copy
// before pdl_entry(), then the block stages the input once for all its
// warps (up to 8 by default: the staging is a per-block cost) while the
// tiles are in flight. (A persistent grid with a ring of tile buffers per
// warp was measured on an H100: fewer warps per multiprocessor left the dot
// products latency-bound, Phi-3 decode 486 -> 446 tok/s.)
template <int T, int R, int XB>
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
    const DevSeg& g = *tf.g;
    const int nr = active ? tf.nr : 0;
    const uint8_t* src = g.w + size_t(tf.lr0) * g.row_bytes;
    if (active && lane == 0) {
        mbar_init(&bars[warp]);
        bulk_range_issue(&bars[warp], tile, src, size_t(nr) * g.row_bytes, g.w + size_t(g.rows) * g.row_bytes);
    }
    pdl_entry();
    pdl_release();

    float xscale = 1.0f;
    if (a.xmode == int(XMode::Chunks))
        copy_chunks(reinterpret_cast<const int4*>(a.x), smem_raw, int(size_t(a.cols / 32) * kIntStride<XB> / 16));
    else
        xscale = stage_x_int<XB>(a, xs);
    if (!active) return;
    mbar_wait(&bars[warp], 0);
    __syncwarp();

    const uint8_t* w = tile + (reinterpret_cast<uintptr_t>(src) & 15);
    const int nch = a.cols / 32;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    for (int c = lane; c < nch; c += 32) {
        XChunk<XB> x;
        load_staged_int<XB>(xs, c, x);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            if (r >= nr) continue;
            if constexpr (T == kMixed) acc[r] += dot_chunk_int_any<true>(g.type, w + size_t(r) * g.row_bytes, c, x);
            else acc[r] += dot_chunk_int<T, true>(w + size_t(r) * g.row_bytes, c, x);
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

// Tile cap in bytes (EHCUDA_GEMV_BULK_KB, for measurements).
int env_int(const char* name, int dflt, int lo, int hi) {
    const char* e = std::getenv(name);
    return std::clamp(e && *e ? std::atoi(e) : dflt, lo, hi);
}
const size_t kTileCap = size_t(env_int("EHCUDA_GEMV_BULK_KB", 8, 1, 48)) << 10;
// Warps per block (EHCUDA_GEMV_BULK_WARPS = 4 / 8 / 16 fixes the most; 0,
// the default: 16 for matrices of 4 or more waves of such blocks, else 8).
// 8 rather than 16 on an H100 (tok/s): Phi-3 494 -> 534, gpt-oss 453 -> 475,
// Qwen2.5-0.5B 1,287 -> 1,290 (4: 485, 437, 1,283): 16-warp blocks left
// Phi-3's 3,072-row matrices at 1.5 blocks per multiprocessor. 16 for the
// tall ones: their per-block input staging halves (16384 x 8192 Q4_K with
// float input: 68 % of copy bandwidth at 16, 51 % at 8).
const int kWarpsCap = env_int("EHCUDA_GEMV_BULK_WARPS", 0, 0, kMaxWarps);
// With the default, 8 rather than 16 where a 16-warp block would sit alone
// on its multiprocessor (one block loading, none computing) and the staged
// input is at most two warps' tiles, so staging it twice as often costs
// little (EHCUDA_GEMV_BULK_FIT2=0: 16 regardless). H100, 16 -> 8: Qwen2.5's
// tied Q8_0 head (151936 x 896) 84 -> 91 % of copy bandwidth, decode
// 1,542-1,544 -> 1,553-1,556 tok/s, Phi-3 (its Q6_K head) 594-595 ->
// 597-598; where the input is the larger (Q6_K 16384 x 8192, int16 input
// 20 KB against 6.7 KB tiles) 65 -> 58 %.
const bool kFit2 = env_int("EHCUDA_GEMV_BULK_FIT2", 1, 0, 1) != 0;
constexpr size_t kSmemPerSm = 228 * 1024;  // sm_90; each block also holds 1 KB of the system's

// Rows per tile, tiles, warps per block and shared bytes of one launch.
struct Plan {
    int tr = 0, tiles = 0, warps = 0, x_bytes = 0, tile_stride = 0;
    size_t smem = 0;
    bool same = true;
};

Plan plan_for(const DevArgs& d) {
    Plan p;
    size_t max_rb = 0;
    for (int s = 0; s < d.nseg; ++s) {
        max_rb = std::max(max_rb, d.seg[s].row_bytes);
        p.same &= d.seg[s].type == d.seg[0].type;
    }
    // Tiles for ~32 warps on every multiprocessor, each at most kTileCap
    // bytes (at least one row) and 8 rows.
    const int nsm = sm_count();
    const int want = std::max(1, (d.total_rows + 32 * nsm - 1) / (32 * nsm));
    const int cap = int(std::max<size_t>(1, kTileCap / max_rb));
    p.tr = std::min({want, cap, 8});
    for (int s = 0; s < d.nseg; ++s) p.tiles += (d.seg[s].rows + p.tr - 1) / p.tr;
    p.tile_stride = int((size_t(p.tr) * max_rb + 15 + 15) / 16 * 16);
    const size_t xb = gemv_input() == GemvInput::Int16 ? staged_int_bytes<16>(d.cols) : staged_int_bytes<32>(d.cols);
    p.x_bytes = int((xb + 15) / 16 * 16);
    // Warps per block: as many as keep every multiprocessor busy (4..16),
    // within the shared memory a block may have.
    if (kWarpsCap == 0) {
        p.warps = (p.tiles + 15) / 16 >= 4 * nsm ? 16 : 8;
        if (p.warps == 16 && kFit2 && p.x_bytes <= 2 * p.tile_stride &&
            2 * (size_t(p.x_bytes) + 16 * size_t(p.tile_stride) + 2048) > kSmemPerSm)
            p.warps = 8;
    }
    else p.warps = kWarpsCap >= 16 ? 16 : kWarpsCap >= 8 ? 8 : 4;
    while (p.warps > 4 && ((p.tiles + p.warps - 1) / p.warps < nsm ||
                           size_t(p.x_bytes) + size_t(p.warps) * p.tile_stride > kBulkMaxSmem))
        p.warps /= 2;
    p.smem = size_t(p.x_bytes) + size_t(p.warps) * p.tile_stride;
    if (p.smem > kBulkMaxSmem) p.warps = 0;  // too wide: the register kernel serves it
    return p;
}

}  // namespace

int pair_slots() {
    static const int n = env_int("EHCUDA_PAIR_SLOTS", 2, 0, kPairMaxSlots);
    return n;
}

bool gemv_bulk_enabled = [] {
    const char* e = std::getenv("EHCUDA_GEMV_BULK");
    return !(e && *e == '0');
}();

bool gemv_bulk(const DevArgs& d, cudaStream_t stream) {
    const GemvInput in = gemv_input();
    if (!gemv_bulk_enabled || d.ntok != 1 || (in != GemvInput::Int16 && in != GemvInput::Int16x2) || cc_major() < 9)
        return false;
    for (int s = 0; s < d.nseg; ++s)
        if (!int_type(uint32_t(d.seg[s].type)) || d.seg[s].type == EH_TYPE_MXFP4) return false;
    const Plan p = plan_for(d);
    if (p.warps == 0) return false;
    const int R = p.tr <= 1 ? 1 : p.tr <= 2 ? 2 : p.tr <= 4 ? 4 : 8;
    const int bits = gemv_input() == GemvInput::Int16 ? 16 : 32;
    BulkArgs b{};
    b.d = d;
    b.rows_per_tile = p.tr;
    b.tiles = p.tiles;
    b.tile_stride = p.tile_stride;
    b.x_bytes = p.x_bytes;
    const dim3 grid(unsigned((p.tiles + p.warps - 1) / p.warps));
    auto go = [&](auto kernel) {
        allow_dynamic_smem(kernel, p.smem);
        launch("gemv_bulk_kernel", kernel, grid, p.warps * 32, p.smem, stream, b);
    };
    auto by_bits = [&]<int T, int R_>() {
        if (bits == 16) go(gemv_bulk_kernel<T, R_, 16>);
        else go(gemv_bulk_kernel<T, R_, 32>);
    };
    auto by_rows = [&]<int T>() {
        if constexpr (T == EH_TYPE_MXFP4) throw ehp::Error(EH_INTERNAL, "gemv_bulk: MXFP4");  // refused above
        else if (R == 1) by_bits.template operator()<T, 1>();
        else if (R == 2) by_bits.template operator()<T, 2>();
        else if (R == 4) by_bits.template operator()<T, 4>();
        else by_bits.template operator()<T, 8>();
    };
    if (p.same) int_type_dispatch(uint32_t(d.seg[0].type), by_rows);
    else by_rows.template operator()<kMixed>();
    EHC_LAUNCHED("gemv_bulk_kernel");
    return true;
}

}  // namespace ehcuda::detail

// The tile form of the grouped MoE products (moe_grouped in moe.hpp picks
// it when the experts average many tokens: prefill chunks, large batches;
// moe_common.cuh declares the calls): a block multiplies 128 weight rows of
// one expert by 128 of the pairs routed to it, for any stored type.
//
// Why beside moe_grouped_mma.cu: that kernel turns every weight code into a
// tensor-core fragment once per pass of 8 to 64 tokens, so its arithmetic
// is bound by that conversion when an expert gets hundreds of tokens. Here
// the codes of a tile are decoded once into shared memory as FP16 and each
// decoded value feeds 128 pairs.
//
// Block: 16 warps, 128 KB of shared memory, one block per multiprocessor.
//   - Warps 0-7 multiply (consumers): 2 x 4 warps of 64 rows x 32 pairs,
//     ldmatrix + mma.sync m16n8k16 (FP16 operands, FP32 accumulators).
//   - Warps 8-15 fill (producers), in two groups of four taking alternate
//     k-tiles of 64 values: a group copies the tile's 128 pair rows of FP16
//     inputs with cp.async and decodes the 128 weight rows' two 32-value
//     chunks (load_any_chunk, whatever the type) into FP16, into stage
//     kt % kStages, then arrives on that stage's FULL barrier.
//   Consumers wait on FULL, multiply, and arrive on EMPTY, which a group
//   waits on before refilling the stage. The barriers are named ones
//   (bar.sync / bar.arrive) so the producers' memory latency overlaps the
//   consumers' math; two groups, because one group's decode of a tile (a
//   dependent global load and its arithmetic) takes longer than the
//   consumers' multiply of one.
// Shared tiles are [128][64] FP16 with their 16-byte chunks XOR-swizzled by
// row (chunk ^ (row & 7)): the cp.async stores, the decoded stores and the
// ldmatrix reads of eight rows each touch eight distinct bank groups.
//
// gate|up (Pair): a block takes 64 rows of the expert's hidden width, f0 ..
// f0 + 64, and its tile rows interleave gate and up by eights (tile rows
// 16q .. 16q+7 are gate rows f0+8q .. f0+8q+7, tile rows 16q+8 .. 16q+15
// the same rows of up), so every accumulator thread holds gate and up of
// one row for its pairs and applies the SwiGLU in registers: act16[pair][f]
// as FP16, as mma_gate_up writes it. down: 128 rows of the expert's output
// width, out[pair][r] in FP32 without the bias (combine_sorted adds it).
//
// Work: the units kernel lists (expert, first pair) for every 128 pairs of
// every expert; block b takes unit b / row_tiles and row tile b % row_tiles
// (the blocks of one unit run together and share its inputs through L2).
// Each (row, pair) sum runs over k in one order whatever the step's other
// pairs (no split-K, no atomics), so a pair's result does not depend on
// which others share its call.
#include <cuda_fp16.h>

#include <algorithm>

#include "ehcuda/check.hpp"
#include "ehcuda/launch.cuh"
#include "ehcuda/mxfp4.cuh"
#include "ehcuda/quant.cuh"
#include "mma.cuh"
#include "moe_common.cuh"

namespace ehcuda {
namespace {

using moe_detail::bias_of;
using moe_detail::DevMat;
using moe_detail::row_ptr;
using moe_detail::TileUnit;

constexpr int kBM = 128;  // weight rows per block (gate|up: 64 of each)
constexpr int kBN = moe_detail::kTilePairs;  // pairs per block
constexpr int kBK = 64;   // values per k-tile: two 32-value chunks a row
constexpr int kStages = 4;
constexpr int kGroups = 2;  // producer groups (alternate k-tiles)
constexpr int kConsumerThreads = 8 * 32;
constexpr int kGroupThreads = 4 * 32;
constexpr int kThreads = kConsumerThreads + kGroups * kGroupThreads;  // 512
constexpr int kTileHalves = kBM * kBK;  // one operand's tile (kBN == kBM)
static_assert(kBN == kBM, "the pair tile and the weight tile share one shape and swizzle");
static_assert(kStages % kGroups == 0, "a group always fills the same stages");
constexpr size_t kSmemBytes = size_t(kStages) * 2 * kTileHalves * sizeof(__half);
// The barrier a stage's FULL and EMPTY use (0 is __syncthreads').
constexpr int full_barrier(int s) { return 1 + s; }
constexpr int empty_barrier(int s) { return 1 + kStages + s; }
// Threads taking part in each: one producer group and the consumers.
constexpr int kBarrierThreads = kConsumerThreads + kGroupThreads;

__device__ __forceinline__ void bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Half offset of (row, 16-byte chunk) in a swizzled [128][64] tile.
__device__ __forceinline__ int swz(int row, int chunk) { return row * kBK + ((chunk ^ (row & 7)) << 3); }

// f.template operator()<T>() for the stored type (every moe type): the
// producers' loop is instantiated per type, so within it both chunks'
// loads are straight-line code the compiler issues before either decode.
template <class F>
__device__ __forceinline__ void type_switch(uint32_t type, F&& f) {
    switch (type) {
#define EHC_TILE_TYPE(T) \
    case T: f.template operator()<T>(); return;
        EHC_TILE_TYPE(EH_TYPE_MXFP4)
        EHC_TILE_TYPE(EH_TYPE_F32)
        EHC_TILE_TYPE(EH_TYPE_F16)
        EHC_TILE_TYPE(EH_TYPE_BF16)
        EHC_TILE_TYPE(EH_TYPE_Q4_0)
        EHC_TILE_TYPE(EH_TYPE_Q4_1)
        EHC_TILE_TYPE(EH_TYPE_Q5_0)
        EHC_TILE_TYPE(EH_TYPE_Q5_1)
        EHC_TILE_TYPE(EH_TYPE_Q8_0)
        EHC_TILE_TYPE(EH_TYPE_Q2_K)
        EHC_TILE_TYPE(EH_TYPE_Q3_K)
        EHC_TILE_TYPE(EH_TYPE_Q4_K)
        EHC_TILE_TYPE(EH_TYPE_Q5_K)
        EHC_TILE_TYPE(EH_TYPE_Q6_K)
        EHC_TILE_TYPE(EH_TYPE_IQ4_NL)
        EHC_TILE_TYPE(EH_TYPE_IQ4_XS)
#undef EHC_TILE_TYPE
        default: f.template operator()<0>();  // (tile_matrix refuses the others: zeros)
    }
}

// The producer loop of one group for a weight row of type T (row: the
// row, or null past the matrix's rows; `safe` any readable row of the same
// type, read instead so that the loads need no branch): for each of the
// group's k-tiles, the 128 pair rows' inputs by cp.async (8 of the 1024
// 16-byte chunks a thread; zeros past the expert's pairs and past K) and
// this thread's weight row's two chunks, decoded, into the stage.
template <int T>
__device__ __forceinline__ void produce_loop(int pt, int group, int n0, int cnt, int off, int K, const __half* x,
                                             const uint8_t* row, const uint8_t* safe, __half* smem) {
    const int nch = K / 32, kt_count = (K + kBK - 1) / kBK;
    for (int kt = group; kt < kt_count; kt += kGroups) {
        const int s = kt % kStages;
        if (kt >= kStages) bar_sync(empty_barrier(s), kBarrierThreads);
        __half* As = smem + size_t(s) * 2 * kTileHalves;
        __half* Bs = As + kTileHalves;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int idx = pt + i * kGroupThreads, r = idx >> 3, ch = idx & 7;
            const int col = kt * kBK + ch * 8;
            const bool ok = n0 + r < cnt && col < K;
            const __half* src = ok ? x + size_t(off + n0 + r) * size_t(K) + col : x;
            detail::cp_async16(Bs + swz(r, ch), src, ok ? 16 : 0);
        }
        detail::cp_async_commit();
        float v[2][32];
        bool ok[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int c = kt * 2 + h;
            ok[h] = row && c < nch;
            if constexpr (T != 0) load_any_chunk<T>(ok[h] ? row : safe, ok[h] ? c : 0, v[h]);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            if (T == 0 || !ok[h]) {
#pragma unroll
                for (int i = 0; i < 32; ++i) v[h][i] = 0.0f;
            }
#pragma unroll
            for (int q = 0; q < 4; ++q) detail::store_half8(As + swz(pt, h * 4 + q), v[h] + 8 * q);
        }
        detail::cp_async_wait<0>();
        bar_arrive(full_barrier(s), kBarrierThreads);
    }
}

// A producer thread: weight row pt of the tile (gate|up: interleaved by
// eights, see the top), its type's loop.
template <bool Pair>
__device__ void produce(int pt, int group, int e, int n0, int cnt, int off, int m_tile, const __half* x,
                        const DevMat& a, uint32_t type_a, const DevMat& b, uint32_t type_b, __half* smem) {
    const uint8_t* row = nullptr;
    const uint8_t* safe = row_ptr(a, e, 0);
    uint32_t type = type_a;
    if constexpr (Pair) {
        const int q = pt >> 4, w = pt & 15, f = m_tile * (kBM / 2) + q * 8 + (w & 7);
        if (w >= 8) safe = row_ptr(b, e, 0), type = type_b;
        if (f < a.rows) row = w < 8 ? row_ptr(a, e, f) : row_ptr(b, e, f);
    } else {
        const int r = m_tile * kBM + pt;
        if (r < a.rows) row = row_ptr(a, e, r);
    }
    type_switch(type, [&]<int T>() { produce_loop<T>(pt, group, n0, cnt, off, a.cols, x, row, safe, smem); });
}

template <bool Pair>
__global__ void __launch_bounds__(kThreads, 1)
    tile_kernel(const __half* x, const int32_t* offsets, const TileUnit* units, const int* unit_count, int row_tiles,
                DevMat a, uint32_t type_a, DevMat b, uint32_t type_b, float alpha, float limit, __half* out16,
                float* out32, int ldo) {
    pdl_entry();
    const int u = int(blockIdx.x) / row_tiles, m_tile = int(blockIdx.x) % row_tiles;
    if (u >= *unit_count) return;
    const TileUnit unit = units[u];
    const int e = unit.expert, n0 = unit.first;
    const int off = offsets[e], cnt = offsets[e + 1] - off;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __half* smem = reinterpret_cast<__half*>(smem_raw);
    const int tid = threadIdx.x;
    if (tid >= kConsumerThreads) {
        const int p = tid - kConsumerThreads;
        produce<Pair>(p % kGroupThreads, p / kGroupThreads, e, n0, cnt, off, m_tile, x, a, type_a, b, type_b, smem);
        return;
    }
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int wm = warp & 1, wn = warp >> 1;  // 64-row half, 32-pair quarter
    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;
    const int kt_count = (a.cols + kBK - 1) / kBK;
    // ldmatrix rows and chunk offsets of this lane (mma.cuh's fragment order)
    const int a_row = wm * 64 + (lane & 7) + 8 * ((lane >> 3) & 1), a_ch = lane >> 4;
    const int b_row = wn * 32 + (lane & 7) + 8 * (lane >> 4), b_ch = (lane >> 3) & 1;
    for (int kt = 0; kt < kt_count; ++kt) {
        const int s = kt % kStages;
        bar_sync(full_barrier(s), kBarrierThreads);
        const __half* As = smem + size_t(s) * 2 * kTileHalves;
        const __half* Bs = As + kTileHalves;
#pragma unroll
        for (int ks = 0; ks < kBK / 16; ++ks) {
            uint32_t af[4][4], bf[4][2];
#pragma unroll
            for (int mt = 0; mt < 4; ++mt) detail::ldsm_x4(af[mt], As + swz(a_row + mt * 16, ks * 2 + a_ch));
#pragma unroll
            for (int np = 0; np < 2; ++np) {
                uint32_t r[4];
                detail::ldsm_x4(r, Bs + swz(b_row + np * 16, ks * 2 + b_ch));
                bf[2 * np][0] = r[0];
                bf[2 * np][1] = r[1];
                bf[2 * np + 1][0] = r[2];
                bf[2 * np + 1][1] = r[3];
            }
#pragma unroll
            for (int mt = 0; mt < 4; ++mt)
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) detail::mma16816(acc[mt][nt], af[mt], bf[nt][0], bf[nt][1]);
        }
        // (only where a producer will wait: no arrival is left pending at exit)
        if (kt + kStages < kt_count) bar_arrive(empty_barrier(s), kBarrierThreads);
    }
    // Epilogue: accumulator q of (mt, nt) is tile row wm*64 + mt*16 + g (+8
    // for q >= 2) and pair n0 + wn*32 + nt*8 + 2t (+1 for odd q).
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
            for (int odd = 0; odd < 2; ++odd) {
                const int j = n0 + wn * 32 + nt * 8 + 2 * t + odd;
                if (j >= cnt) continue;
                const size_t i = size_t(off + j);
                if constexpr (Pair) {
                    const int f = m_tile * (kBM / 2) + (wm * 4 + mt) * 8 + g;
                    if (f >= a.rows) continue;
                    const float gv = acc[mt][nt][odd] + bias_of(a, e, f), uv = acc[mt][nt][2 + odd] + bias_of(b, e, f);
                    out16[i * ldo + f] = __float2half_rn(expert_swiglu(gv, uv, alpha, limit));
                } else {
#pragma unroll
                    for (int hi = 0; hi < 2; ++hi) {
                        const int r = m_tile * kBM + wm * 64 + mt * 16 + g + 8 * hi;
                        if (r < a.rows) out32[i * ldo + r] = acc[mt][nt][2 * hi + odd];
                    }
                }
            }
        }
    }
}

// units[0 .. *count) = (e, n0) for n0 = 0, 128, .. below expert e's pair
// count, experts in order. One block of up to 1024 threads, n_expert of them
// busy.
__global__ void __launch_bounds__(1024) units_kernel(const int32_t* offsets, int n_expert, TileUnit* units, int* count) {
    pdl_entry();
    __shared__ int warp_sum[32];
    const int e = threadIdx.x, lane = e & 31, warp = e >> 5;
    const int cnt = e < n_expert ? offsets[e + 1] - offsets[e] : 0;
    const int n = (cnt + kBN - 1) / kBN;
    int incl = n;  // inclusive scan within the warp, then over the warps
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    if (lane == 31) warp_sum[warp] = incl;
    __syncthreads();
    int before = 0;
    for (int w = 0; w < warp; ++w) before += warp_sum[w];
    const int first = before + incl - n;
    for (int i = 0; i < n; ++i) units[first + i] = TileUnit{e, i * kBN};
    if (e == int(blockDim.x) - 1) *count = before + incl;
}

template <bool Pair>
void launch_tiles(const __half* x, int pairs, const int32_t* offsets, int n_expert, const moe_detail::TileWork& w,
                  const DevMat& a, uint32_t type_a, const DevMat& b, uint32_t type_b, float alpha, float limit,
                  __half* out16, float* out32, int ldo, cudaStream_t stream) {
    auto kernel = tile_kernel<Pair>;
    allow_dynamic_smem(kernel, kSmemBytes);
    const int row_tiles = Pair ? (a.rows + kBM / 2 - 1) / (kBM / 2) : (a.rows + kBM - 1) / kBM;
    const long blocks = long(moe_detail::tile_units_max(pairs, n_expert)) * row_tiles;
    if (blocks > 0x7fffffffL) throw ehp::Error(EH_INTERNAL, "moe tiles: too many blocks");
    launch(Pair ? "moe tiles gate_up" : "moe tiles down", kernel, dim3(unsigned(blocks)), kThreads, kSmemBytes, stream,
           x, offsets, static_cast<const TileUnit*>(w.units), static_cast<const int*>(w.count), row_tiles, a, type_a, b,
           type_b, alpha, limit, out16, out32, ldo);
    EHC_LAUNCHED("tile_kernel");
}

bool tile_matrix(const ExpertMat& m) { return moe_type_supported(m.type) && m.cols % 32 == 0; }

}  // namespace

namespace moe_detail {

int tile_units_max(int pairs, int n_expert) { return (pairs + kBN - 1) / kBN + std::min(n_expert, pairs); }

bool tile_experts(const ExpertMat& gate, const ExpertMat& up, const ExpertMat& down, int n_expert) {
    return n_expert <= 1024 && tile_matrix(gate) && tile_matrix(up) && tile_matrix(down);
}

void tile_units(const int32_t* offsets, int n_expert, const TileWork& w, cudaStream_t stream) {
    launch("moe tiles units", units_kernel, dim3(1), dim3(1024), 0, stream, offsets, n_expert, w.units, w.count);
    EHC_LAUNCHED("units_kernel");
}

void tile_gate_up(const __half* x16, int pairs, const int32_t* offsets, int n_expert, const TileWork& w,
                  const DevMat& g, uint32_t type_g, const DevMat& u, uint32_t type_u, float alpha, float limit,
                  __half* act16, cudaStream_t stream) {
    launch_tiles<true>(x16, pairs, offsets, n_expert, w, g, type_g, u, type_u, alpha, limit, act16, nullptr, g.rows,
                       stream);
}

void tile_down(const __half* act16, int pairs, const int32_t* offsets, int n_expert, const TileWork& w, const DevMat& d,
               uint32_t type_d, float* out, cudaStream_t stream) {
    launch_tiles<false>(act16, pairs, offsets, n_expert, w, d, type_d, d, type_d, 0.0f, 0.0f, nullptr, out, d.rows,
                        stream);
}

}  // namespace moe_detail
}  // namespace ehcuda

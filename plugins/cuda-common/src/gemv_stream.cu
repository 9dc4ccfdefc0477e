// Single-token GEMV streamed through shared memory, for matrices of a few MB
// and more. The register-fed kernel (gemv.cu) keeps one chunk per row in
// flight per lane and walks a row in dependent rounds: ncu had Phi-3's
// GEMVs at 15-38 % of DRAM bandwidth, latency-bound. Here each block copies
// tiles of whole rows (contiguous bytes) into a ring of shared-memory stages
// with cp.async, kStages - 1 tiles ahead of the one its warps compute on,
// so the bytes in flight no longer depend on registers, and the input is
// staged once per block for all of its tiles. The arithmetic is the
// register kernel's: the same lane -> chunk order and warp reduction, so
// results are bitwise those of gemv.cu's kernel without split-K.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>

#include "ehcuda/check.hpp"
#include "ehcuda/launch.cuh"
#include "ehcuda/quant_dp4a.cuh"
#include "gemv_stage.cuh"
#include "matmul_common.cuh"

namespace ehcuda {
namespace detail {

// Weights below this many bytes keep the register kernel (cold start of a
// small grid). EHCUDA_GEMV_STREAM_MIN_BYTES overrides; set_gemv_stream()
// for tests.
size_t gemv_stream_min_bytes = [] {
    const char* e = std::getenv("EHCUDA_GEMV_STREAM_MIN_BYTES");
    return e && *e ? size_t(std::strtoull(e, nullptr, 10)) : size_t(2) << 20;
}();
// Weight types streamed (bit t for type t). Measured on an H100
// (Bench.DISABLED_GemvBandwidth, int16 input, 16384 x 8192): Q6_K 46 -> 66 %
// and Q8_0 66 -> 75 % of copy bandwidth, but Q4_K 61 -> 34 % and Q4_0
// 46 % (more instructions per weight byte, and the input chunk re-read per
// row): only the types that gained. EHCUDA_GEMV_STREAM_TYPES overrides.
uint64_t gemv_stream_types = [] {
    const char* e = std::getenv("EHCUDA_GEMV_STREAM_TYPES");
    return e && *e ? uint64_t(std::strtoull(e, nullptr, 0)) : (uint64_t(1) << EH_TYPE_Q6_K) | (uint64_t(1) << EH_TYPE_Q8_0);
}();

}  // namespace detail

namespace {

using detail::DevArgs;
using detail::kMixedTypes;

constexpr int kWarps = 4;
constexpr int kStages = 3;
// A tile is 4 * RW rows (RW per warp); RW is the largest of 4, 2, 1 whose
// tile fits this many bytes.
constexpr size_t kTileBudget = 36 * 1024;

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int bytes) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    // bytes < 16: the rest of the 16 is zero-filled and never read from
    // global memory (the last piece of a tensor).
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

struct Tile {
    int seg, row0, rows;  // rows row0 .. row0 + rows - 1 of segment seg
};

// Tiles are numbered through the segments in order, each segment's rows cut
// into tiles of `rt` rows (the last one shorter).
__device__ __forceinline__ Tile tile_at(const DevArgs& a, int rt, int t) {
    int s = 0;
    for (; s + 1 < a.nseg; ++s) {
        const int n = (a.seg[s].rows + rt - 1) / rt;
        if (t < n) break;
        t -= n;
    }
    const int row0 = t * rt;
    return Tile{s, row0, min(rt, a.seg[s].rows - row0)};
}

// A tile's first byte in global memory, and its offset in its stage: the
// copy starts at the 16-byte boundary below it (the stage keeps the bytes'
// alignment mod 16, which the chunk readers' vector loads rely on).
__device__ __forceinline__ const uint8_t* tile_src(const DevArgs& a, const Tile& tl) {
    return a.seg[tl.seg].w + size_t(tl.row0) * a.seg[tl.seg].row_bytes;
}
__device__ __forceinline__ int tile_head(const uint8_t* src) { return int(reinterpret_cast<uintptr_t>(src) & 15); }

// Copies a tile into `dst` (the back cut exactly: nothing past the tensor is
// read).
__device__ __forceinline__ void issue_tile(const DevArgs& a, const Tile& tl, uint8_t* dst) {
    const uint8_t* src = tile_src(a, tl);
    const int head = tile_head(src);
    const uint8_t* lo = src - head;
    const int total = head + tl.rows * int(a.seg[tl.seg].row_bytes);
    for (int o = threadIdx.x * 16; o < total; o += kWarps * 32 * 16) cp_async16(dst + o, lo + o, min(16, total - o));
}

// Grid: min(tiles, resident blocks); block b takes tiles b, b + grid, ...
// T: the weight type, or kMixedTypes (each tile's segment type at run time).
template <int T, int XB, int RW>
__global__ void __launch_bounds__(kWarps * 32) gemv_stream_kernel(DevArgs a, int ntiles, int stage_bytes, int x_bytes) {
    constexpr int kRows = kWarps * RW;
    extern __shared__ float4 smem_raw[];
    uint8_t* smem = reinterpret_cast<uint8_t*>(smem_raw);
    uint8_t* stages = smem + x_bytes;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nch = a.cols / 32;

    // The first tiles' copies go out before the wait for the previous
    // kernel: weights are never written after load.
#pragma unroll
    for (int i = 0; i < kStages - 1; ++i) {
        const int t = blockIdx.x + i * gridDim.x;
        if (t < ntiles) issue_tile(a, tile_at(a, kRows, t), stages + i * stage_bytes);
        cp_async_commit();
    }
    pdl_entry();
    const uint8_t* xq = smem;
    if (a.xmode == int(XMode::Chunks)) xq = reinterpret_cast<const uint8_t*>(a.x);  // a producer's, L2-resident
    else detail::stage_x_int<XB>(a, smem);

    for (int i = 0;; ++i) {
        const int t = blockIdx.x + i * gridDim.x;
        if (t >= ntiles) break;
        {
            const int tn = t + (kStages - 1) * gridDim.x;
            const int bn = (i + kStages - 1) % kStages;
            if (tn < ntiles) issue_tile(a, tile_at(a, kRows, tn), stages + bn * stage_bytes);
            cp_async_commit();
        }
        cp_async_wait<kStages - 1>();
        __syncthreads();

        const Tile tl = tile_at(a, kRows, t);
        const detail::DevSeg& g = a.seg[tl.seg];
        const int b = i % kStages;
        // Warp w: rows w*RW .. w*RW + RW - 1 of the tile.
        const int r0 = warp * RW;
        const int nr = max(0, min(RW, tl.rows - r0));
        const uint8_t* w = stages + b * stage_bytes + tile_head(tile_src(a, tl)) + size_t(r0) * g.row_bytes;
        float acc[RW];
#pragma unroll
        for (int r = 0; r < RW; ++r) acc[r] = 0.0f;
        if (nr > 0)
            for (int c = lane; c < nch; c += 32) {
                XChunk<XB> x;
                detail::load_staged_int<XB>(xq, c, x);
#pragma unroll
                for (int r = 0; r < RW; ++r) {
                    if (r >= nr) continue;
                    const uint8_t* row = w + size_t(r) * g.row_bytes;
                    if constexpr (T == kMixedTypes) acc[r] += dot_chunk_int_any<true>(g.type, row, c, x);
                    else acc[r] += dot_chunk_int<T, true>(row, c, x);
                }
            }
#pragma unroll
        for (int r = 0; r < RW; ++r)
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < RW; ++r) {
                if (r >= nr) break;
                const int row = tl.row0 + r0 + r;
                const float val = acc[r] + (g.bias ? g.bias[row] : 0.0f);
                float* dst = a.y + g.out_offset + row;
                *dst = a.accumulate ? *dst + val : val;
            }
        __syncthreads();  // stage b is refilled next round
    }
}

// Resident blocks per multiprocessor for a kernel and its shared memory
// (cached: a decode step launches the same few shapes over and over).
template <class K>
int blocks_per_sm(K kernel, size_t smem) {
    static std::mutex mu;
    static std::map<std::pair<const void*, size_t>, int> cache;
    std::lock_guard<std::mutex> lock(mu);
    const auto key = std::make_pair(reinterpret_cast<const void*>(kernel), smem);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    int n = 0;
    EHC_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kWarps * 32, smem));
    return cache[key] = std::max(n, 1);
}

}  // namespace

GemvStream set_gemv_stream(GemvStream s) {
    const GemvStream was{detail::gemv_stream_min_bytes, detail::gemv_stream_types};
    detail::gemv_stream_min_bytes = s.min_bytes;
    detail::gemv_stream_types = s.types;
    return was;
}

bool detail::gemv_stream_applies(const DevArgs& d) {
    if (d.ntok != 1 || gemv_input() == GemvInput::Float) return false;
    size_t bytes = 0;
    for (int s = 0; s < d.nseg; ++s) {
        const uint32_t type = uint32_t(d.seg[s].type);
        if (!int_type(type) || type == EH_TYPE_MXFP4 || type >= 64 || !((gemv_stream_types >> type) & 1)) return false;
        bytes += d.seg[s].row_bytes * size_t(d.seg[s].rows);
    }
    return bytes >= gemv_stream_min_bytes;
}

void detail::launch_gemv_stream(const DevArgs& d, bool mixed, cudaStream_t stream) {
    size_t rb = 0;
    for (int s = 0; s < d.nseg; ++s) rb = std::max(rb, d.seg[s].row_bytes);
    // Rows per warp: the tile within budget, and no fewer tiles than two per
    // multiprocessor where the matrix allows.
    int rw = 4 * kWarps * rb <= kTileBudget ? 4 : 2 * kWarps * rb <= kTileBudget ? 2 : 1;
    while (rw > 1 && (d.total_rows + kWarps * rw - 1) / (kWarps * rw) < 2 * sm_count()) rw /= 2;
    const int rows = kWarps * rw;
    int ntiles = 0;
    for (int s = 0; s < d.nseg; ++s) ntiles += (d.seg[s].rows + rows - 1) / rows;
    const int stage_bytes = int((size_t(rows) * rb + 16 + 15) / 16 * 16);
    const bool chunks = d.xmode == int(XMode::Chunks);
    const GemvInput in = gemv_input();
    const int xb = in == GemvInput::Int8 ? 8 : in == GemvInput::Int16 ? 16 : 32;
    const size_t x_bytes = chunks ? 0
                           : xb == 8 ? staged_int_bytes<8>(d.cols)
                           : xb == 16 ? staged_int_bytes<16>(d.cols)
                                      : staged_int_bytes<32>(d.cols);
    const size_t smem = x_bytes + size_t(kStages) * stage_bytes;
    auto go = [&](auto kernel) {
        if (smem > 48 * 1024) EHC_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        const int grid = std::min(ntiles, sm_count() * blocks_per_sm(kernel, smem));
        launch("gemv_stream_kernel", kernel, dim3(grid), kWarps * 32, smem, stream, d, ntiles, stage_bytes, int(x_bytes));
    };
    auto by_rw = [&]<int T, int XB>() {
        if (rw == 4) go(gemv_stream_kernel<T, XB, 4>);
        else if (rw == 2) go(gemv_stream_kernel<T, XB, 2>);
        else go(gemv_stream_kernel<T, XB, 1>);
    };
    auto by_input = [&]<int T>() {
        if (xb == 8) by_rw.template operator()<T, 8>();
        else if (xb == 16) by_rw.template operator()<T, 16>();
        else by_rw.template operator()<T, 32>();
    };
    if (mixed) {
        by_input.template operator()<kMixedTypes>();
    } else {
        const bool ok = int_type_dispatch(uint32_t(d.seg[0].type), [&]<int T>() {
            if constexpr (T != EH_TYPE_MXFP4) by_input.template operator()<T>();
        });
        if (!ok) throw ehp::Error(EH_INTERNAL, "gemv_stream: not an integer-path type");
    }
    EHC_LAUNCHED("gemv_stream_kernel");
}

}  // namespace ehcuda

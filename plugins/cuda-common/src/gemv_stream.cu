// Single-token GEMV streamed through shared memory, for matrices of a few MB
// and more. The register-fed kernel (gemv.cu) keeps one chunk per row in
// flight per lane and walks a row in dependent rounds: ncu had Phi-3's
// GEMVs at 15-38 % of DRAM bandwidth, latency-bound. Here each block copies
// tiles (a group of rows x 32 chunks: one chunk per lane) into a ring of
// shared-memory stages with cp.async, kStages - 1 tiles ahead of the one its
// warps compute on, so the bytes in flight no longer depend on registers,
// and the input is staged once per block for all of its row groups. (Tiles
// of whole rows were tried first: the input chunk then had to be reloaded
// per row, and 4-bit types fell to ~35 % of copy bandwidth.) The arithmetic is the
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

}  // namespace detail

namespace {

using detail::DevArgs;
using detail::kMixedTypes;

constexpr int kWarps = 8;
constexpr int kStages = 4;

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

// A tile: the rows row0 .. row0 + rows - 1 of segment seg (a row group:
// kWarps * RW rows, the segment's last group shorter), chunks c0 .. c1 - 1
// (a slice: one chunk per lane).
struct Tile {
    int seg, row0, rows, c0, c1;
};

// Tile j of a block's sequence: its row groups blockIdx.x, blockIdx.x +
// gridDim.x, ... (numbered through the segments in order), each walked
// slice by slice.
__device__ __forceinline__ Tile tile_at(const DevArgs& a, int rg, int nslices, int j) {
    int grp = blockIdx.x + (j / nslices) * gridDim.x;
    const int k = j % nslices;
    int s = 0;
    for (; s + 1 < a.nseg; ++s) {
        const int n = (a.seg[s].rows + rg - 1) / rg;
        if (grp < n) break;
        grp -= n;
    }
    const int row0 = grp * rg;
    const int nch = a.cols / 32;
    return Tile{s, row0, min(rg, a.seg[s].rows - row0), 32 * k, min(nch, 32 * k + 32)};
}

// Byte offset of chunk c in a row (exact at slice bounds: multiples of 32
// chunks, and K-quant rows hold whole 8-chunk blocks).
__device__ __forceinline__ size_t chunk_offset(const DevArgs& a, const detail::DevSeg& g, int c) {
    return g.row_bytes * size_t(c) / size_t(a.cols / 32);
}

// Row r of a tile in global memory, and its offset in the stage's row slot:
// each row's copy starts at the 16-byte boundary below it, so the stage
// keeps the bytes' alignment mod 16 (the chunk readers' vector loads rely
// on it).
__device__ __forceinline__ const uint8_t* tile_row_src(const DevArgs& a, const Tile& tl, int r) {
    const detail::DevSeg& g = a.seg[tl.seg];
    return g.w + size_t(tl.row0 + r) * g.row_bytes + chunk_offset(a, g, tl.c0);
}
__device__ __forceinline__ int head_of(const uint8_t* src) { return int(reinterpret_cast<uintptr_t>(src) & 15); }

// Copies a tile into `dst` (row r at dst + r * slot); each row's copy ends
// exactly at its slice's last byte, so nothing past a tensor is read.
__device__ __forceinline__ void issue_tile(const DevArgs& a, const Tile& tl, uint8_t* dst, int slot) {
    const detail::DevSeg& g = a.seg[tl.seg];
    const int bytes = int(chunk_offset(a, g, tl.c1) - chunk_offset(a, g, tl.c0));
    const int pieces = (bytes + 15) / 16 + 1;  // with a head of up to 15 bytes
    for (int i = threadIdx.x; i < tl.rows * pieces; i += kWarps * 32) {
        const int r = i / pieces, p = i - r * pieces;
        const uint8_t* src = tile_row_src(a, tl, r);
        const int head = head_of(src);
        const int left = head + bytes - 16 * p;
        if (left > 0) cp_async16(dst + r * slot + 16 * p, src - head + 16 * p, min(16, left));
    }
}

// Grid: min(row groups, resident blocks). T: the weight type, or
// kMixedTypes (each group's segment type at run time).
template <int T, int XB, int RW>
__global__ void __launch_bounds__(kWarps * 32) gemv_stream_kernel(DevArgs a, int ngroups, int slot, int x_bytes) {
    constexpr int kRows = kWarps * RW;
    extern __shared__ float4 smem_raw[];
    uint8_t* smem = reinterpret_cast<uint8_t*>(smem_raw);
    uint8_t* stages = smem + x_bytes;
    const int stage_bytes = kRows * slot;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nslices = (a.cols / 32 + 31) / 32;
    const int mine = ngroups > int(blockIdx.x) ? (ngroups - 1 - int(blockIdx.x)) / int(gridDim.x) + 1 : 0;
    const int ntiles = mine * nslices;

    // The first tiles' copies go out before the wait for the previous
    // kernel: weights are never written after load.
#pragma unroll
    for (int j = 0; j < kStages - 1; ++j) {
        if (j < ntiles) issue_tile(a, tile_at(a, kRows, nslices, j), stages + j * stage_bytes, slot);
        cp_async_commit();
    }
    pdl_entry();
    const uint8_t* xq = smem;
    if (a.xmode == int(XMode::Chunks)) xq = reinterpret_cast<const uint8_t*>(a.x);  // a producer's, L2-resident
    else detail::stage_x_int<XB>(a, smem);

    float acc[RW];
#pragma unroll
    for (int r = 0; r < RW; ++r) acc[r] = 0.0f;
    for (int j = 0; j < ntiles; ++j) {
        {
            const int jn = j + kStages - 1;
            if (jn < ntiles) issue_tile(a, tile_at(a, kRows, nslices, jn), stages + (jn % kStages) * stage_bytes, slot);
            cp_async_commit();
        }
        cp_async_wait<kStages - 1>();
        __syncthreads();

        const Tile tl = tile_at(a, kRows, nslices, j);
        const detail::DevSeg& g = a.seg[tl.seg];
        const uint8_t* stage = stages + (j % kStages) * stage_bytes;
        // Warp w: rows w*RW .. w*RW + RW - 1 of the group; lane: chunk c0 + lane.
        const int r0 = warp * RW;
        const int nr = max(0, min(RW, tl.rows - r0));
        const int c = tl.c0 + lane;
        if (nr > 0 && c < tl.c1) {
            XChunk<XB> x;
            detail::load_staged_int<XB>(xq, c, x);
            const size_t base = chunk_offset(a, g, tl.c0);
#pragma unroll
            for (int r = 0; r < RW; ++r) {
                if (r >= nr) continue;
                // Where the row would start if the whole row sat in the stage.
                const uint8_t* row = stage + (r0 + r) * slot + head_of(tile_row_src(a, tl, r0 + r)) - base;
                if constexpr (T == kMixedTypes) acc[r] += dot_chunk_int_any<true>(g.type, row, c, x);
                else acc[r] += dot_chunk_int<T, true>(row, c, x);
            }
        }
        if (tl.c1 == a.cols / 32) {  // the group's last slice
#pragma unroll
            for (int r = 0; r < RW; ++r) {
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
                if (lane == 0 && r < nr) {
                    const int row = tl.row0 + r0 + r;
                    const float val = acc[r] + (g.bias ? g.bias[row] : 0.0f);
                    float* dst = a.y + g.out_offset + row;
                    *dst = a.accumulate ? *dst + val : val;
                }
                acc[r] = 0.0f;
            }
        }
        __syncthreads();  // this stage is refilled next round
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

size_t set_gemv_stream(size_t min_bytes) {
    const size_t was = detail::gemv_stream_min_bytes;
    detail::gemv_stream_min_bytes = min_bytes;
    return was;
}

bool detail::gemv_stream_applies(const DevArgs& d) {
    if (d.ntok != 1 || gemv_input() == GemvInput::Float) return false;
    size_t bytes = 0;
    for (int s = 0; s < d.nseg; ++s) {
        const uint32_t type = uint32_t(d.seg[s].type);
        if (!int_type(type) || type == EH_TYPE_MXFP4) return false;
        bytes += d.seg[s].row_bytes * size_t(d.seg[s].rows);
    }
    return bytes >= gemv_stream_min_bytes;
}

void detail::launch_gemv_stream(const DevArgs& d, bool mixed, cudaStream_t stream) {
    // A row slot holds one slice (32 chunks) of a row plus its 16-byte head.
    size_t slice = 0;
    const int nch = d.cols / 32;
    for (int s = 0; s < d.nseg; ++s)
        slice = std::max(slice, d.seg[s].row_bytes * size_t(std::min(nch, 32)) / size_t(nch));
    const int slot = int((slice + 15) / 16 * 16 + 16);
    // Rows per warp: 2 (the input chunk serves both rows), 1 where that
    // leaves fewer row groups than multiprocessors.
    int rw = 2;
    if ((d.total_rows + kWarps * rw - 1) / (kWarps * rw) < sm_count()) rw = 1;
    int ngroups = 0;
    for (int s = 0; s < d.nseg; ++s) ngroups += (d.seg[s].rows + kWarps * rw - 1) / (kWarps * rw);
    const bool chunks = d.xmode == int(XMode::Chunks);
    const GemvInput in = gemv_input();
    const int xb = in == GemvInput::Int8 ? 8 : in == GemvInput::Int16 ? 16 : 32;
    const size_t x_bytes = chunks ? 0
                           : xb == 8 ? staged_int_bytes<8>(d.cols)
                           : xb == 16 ? staged_int_bytes<16>(d.cols)
                                      : staged_int_bytes<32>(d.cols);
    const size_t smem = x_bytes + size_t(kStages) * kWarps * rw * slot;
    auto go = [&](auto kernel) {
        if (smem > 48 * 1024) EHC_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        const int grid = std::min(ngroups, sm_count() * blocks_per_sm(kernel, smem));
        launch("gemv_stream_kernel", kernel, dim3(grid), kWarps * 32, smem, stream, d, ngroups, slot, int(x_bytes));
    };
    auto by_rw = [&]<int T, int XB>() {
        if (rw == 2) go(gemv_stream_kernel<T, XB, 2>);
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

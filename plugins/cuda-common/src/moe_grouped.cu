// Grouped MoE for a batch of tokens (see moe_grouped in moe.hpp). Three
// forms, all group, then gate|up, down, combine:
//   - tiles (moe_grouped_tiles.cu), any type, when the experts average at
//     least KernelPlan::moe_tile_pass_tokens tokens (prefill chunks, large
//     batches), unless the call asks for one arithmetic at every size;
//   - else MXFP4, Q4_K and Q6_K experts the tensor-core passes
//     (moe_grouped_mma.cu); both gather the inputs as FP16;
//   - else this file's integer form.
// Per call, all on the stream, no host synchronisation (a captured step
// graph takes it):
//   1. x rows -> integer chunks (store_chunk_warp: the codes the single-token
//      kernels stage for themselves);
//   2. the (token, slot) pairs grouped by expert on the device (moe_prefill's
//      counting sort: offsets[e] .. offsets[e+1) of `sorted`; a pair of
//      negative id, another rank's under expert parallelism, is in no
//      expert's range, so no pass computes it, and the combine skips it);
//   3. gate|up: block (8 rows of gate and the same of up, expert e); each warp
//      reads its rows chunk by chunk once per tile of kTile tokens routed to
//      e and dots every chunk with all the tile's inputs, so a weight comes
//      from memory once per tile instead of once per token (the per-token
//      kernels read every selected expert once per token: 64 tokens x 4 slots
//      read ~8x the expert bytes of one pass) -> clamped SwiGLU -> act[pair];
//   4. act rows -> integer chunks; 5. down the same way -> d[pair] (+ bias);
//   6. h[t] += sum over slots s in rank order of w[t][s] * d[t*k + s].
// Per (row, token) the chunks are summed in the single-token kernels' order
// (lane c takes chunks c, c + 32, ...; then the warp sum) with the same
// integer dot products, so a token's result does not depend on which other
// tokens share its step, and no float is accumulated with atomics.
#include <algorithm>

#include "block_reduce.cuh"
#include "ehcuda/check.hpp"
#include "ehcuda/expert_route.hpp"
#include "ehcuda/kernel_plan.hpp"
#include "ehcuda/launch.cuh"
#include "ehcuda/moe.hpp"
#include "gate_up_pair.cuh"
#include "gemv_stage.cuh"
#include "moe_common.cuh"

namespace ehcuda {
namespace {

using detail::kIntStride;
using moe_detail::bias_of;
using moe_detail::DevMat;
using moe_detail::row_ptr;
using moe_detail::to_dev;

constexpr int kBits = 32;  // int16x2 inputs, as the single-token MoE kernels
constexpr int kChunkBytes = kIntStride<kBits>;
constexpr int kWarps = 4;
constexpr int kTile = 8;  // tokens dotted with each weight chunk load

// One weight chunk held in registers across a tile's tokens. MXFP4 decodes
// its codes once (the product is dot_chunk_int's, term for term); the other
// types re-read the chunk per token, from L1 after the first.
template <int T>
struct WeightChunk {
    const uint8_t* row;
    int c;
    __device__ __forceinline__ void load(const uint8_t* r, int cc) { row = r, c = cc; }
    __device__ __forceinline__ float dot(const XInt16x2& x) const { return dot_chunk_int<T>(row, c, x); }
};

template <>
struct WeightChunk<EH_TYPE_MXFP4> {
    float half_scale;
    uint32_t lo[4], hi[4];
    __device__ __forceinline__ void load(const uint8_t* row, int c) {
        uint32_t e;
        uint4 q;
        mxfp4_block(row, c, e, q);
        half_scale = 0.5f * e8m0_value(e);
        const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) mxfp4_x2_bytes(w[k], lo[k], hi[k]);
    }
    __device__ __forceinline__ float dot(const XInt16x2& x) const {
        I2 si{};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            si = dot4(x, k, lo[k], si);
            si = dot4(x, 4 + k, hi[k], si);
        }
        return half_scale * x.d * to_f(si);
    }
};

// One warp per (row, 32-element chunk): rows of x (row stride ldx floats)
// -> integer chunks, row r's at q + r * (cols / 32) * kChunkBytes.
__global__ void quantize_rows_kernel(const float* x, int ldx, int rows, int cols, uint8_t* q) {
    pdl_entry();
    const int nch = cols / 32;
    const int w = blockIdx.x * kWarps + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (w >= rows * nch) return;
    const int r = w / nch, c = w % nch;
    detail::store_chunk_warp<kBits>(x[size_t(r) * ldx + size_t(c) * 32 + lane],
                                    q + (size_t(r) * nch + c) * kChunkBytes);
}

// The products of one expert's rows with the inputs routed to it. Block
// (row group, expert e); warp w owns rows r0 + w * R .. + R of `a` (and,
// with Pair, the same rows of `b`). Pair i of the expert's group takes its
// input row from xq at (sorted[i] / x_div) and leaves its output at
// out[sorted[i] * ldo + r]: act(a . x + bias_a, b . x + bias_b) with Pair,
// a . x + bias_a without.
template <int T, int R, bool Pair, class Act>
__global__ void __launch_bounds__(kWarps * 32) grouped_rows_kernel(const uint8_t* xq, int x_div, const int32_t* offsets,
                                                                   const int32_t* sorted, DevMat a, DevMat b, Act act,
                                                                   float* out, int ldo) {
    pdl_entry();
    const int e = blockIdx.y;
    const int off = offsets[e], cnt = offsets[e + 1] - off;
    if (cnt <= 0) return;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r0 = (blockIdx.x * kWarps + warp) * R;
    if (r0 >= a.rows) return;
    const int nr = min(R, a.rows - r0);
    const int nch = a.cols / 32;
    const uint8_t* wa = row_ptr(a, e, r0);
    const uint8_t* wb = Pair ? row_ptr(b, e, r0) : nullptr;
    for (int j0 = 0; j0 < cnt; j0 += kTile) {
        const int n = min(kTile, cnt - j0);
        int pair[kTile];
        const uint8_t* xr[kTile];
#pragma unroll
        for (int j = 0; j < kTile; ++j) {
            pair[j] = j < n ? sorted[off + j0 + j] : 0;
            xr[j] = xq + size_t(pair[j] / x_div) * nch * kChunkBytes;
        }
        float acc_a[R][kTile] = {}, acc_b[Pair ? R : 1][kTile] = {};
        for (int c = lane; c < nch; c += 32) {
            WeightChunk<T> wca[R], wcb[Pair ? R : 1];
#pragma unroll
            for (int i = 0; i < R; ++i) {
                if (i < nr) {
                    wca[i].load(wa + size_t(i) * a.row_bytes, c);
                    if constexpr (Pair) wcb[i].load(wb + size_t(i) * b.row_bytes, c);
                }
            }
#pragma unroll
            for (int j = 0; j < kTile; ++j) {
                if (j < n) {
                    XInt16x2 x;
                    detail::load_staged_int<kBits>(xr[j], c, x);
#pragma unroll
                    for (int i = 0; i < R; ++i) {
                        if (i < nr) {
                            acc_a[i][j] += wca[i].dot(x);
                            if constexpr (Pair) acc_b[i][j] += wcb[i].dot(x);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int j = 0; j < kTile; ++j) {
#pragma unroll
            for (int i = 0; i < R; ++i) {
                const float va = detail::warp_sum(acc_a[i][j]);
                const float vb = Pair ? detail::warp_sum(acc_b[i][j]) : 0.0f;
                if (lane == 0 && j < n && i < nr) {
                    const int r = r0 + i;
                    float v;
                    if constexpr (Pair) v = act(va + bias_of(a, e, r), vb + bias_of(b, e, r));
                    else v = va + bias_of(a, e, r);
                    out[size_t(pair[j]) * ldo + r] = v;
                }
            }
        }
    }
}

// h[t][r] += sum over s in rank order of w[t*k+s] * d[t*k+s][r], the
// single-token down kernel's sum; a slot whose id is negative (another
// rank's pair, which no pass computed) adds no term.
__global__ void combine_kernel(const float* d, int embd, int k, const int32_t* ids, const float* wts, float* h,
                               int ldh) {
    pdl_entry();
    const int t = blockIdx.y;
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= embd) return;
    float sum = 0.0f;
    for (int s = 0; s < k; ++s)
        if (ids[t * k + s] >= 0) sum = fmaf(wts[t * k + s], d[size_t(t * k + s) * embd + r], sum);
    h[size_t(t) * ldh + r] += sum;
}

struct NoAct {
    __device__ float operator()(float, float) const { return 0.0f; }
};

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// Scratch layout (each piece 256-byte aligned): offsets [n_expert + 1],
// sorted [P], pos [P] (int32); then the integer form's x chunks [ntok][E/32],
// act [P][F] (float), act chunks [P][F/32], d [P][E] (float), or the FP16
// forms' x16 [P][E], act16 [P][F] (FP16), the tiles' units and their count,
// d [P][E] (float, sorted).
struct Layout {
    size_t offsets, sorted, pos, xq, act, actq, x16, act16, units, unit_count, d, total;
    Layout(int ntok, int k, int n_expert, int E, int F, bool fp16) {
        const size_t P = size_t(ntok) * size_t(k);
        size_t o = 0;
        auto take = [&](size_t n) { const size_t at = o; o += align256(n); return at; };
        offsets = take(size_t(n_expert + 1) * 4);
        sorted = take(P * 4);
        pos = take(P * 4);
        xq = act = actq = x16 = act16 = units = unit_count = 0;
        if (fp16) {
            x16 = take(P * size_t(E) * 2);
            act16 = take(P * size_t(F) * 2);
            units = take(size_t(moe_detail::tile_units_max(int(P), n_expert)) * sizeof(moe_detail::TileUnit));
            unit_count = take(sizeof(int));
        } else {
            xq = take(size_t(ntok) * size_t(E / 32) * kChunkBytes);
            act = take(P * size_t(F) * 4);
            actq = take(P * size_t(F / 32) * kChunkBytes);
        }
        d = take(P * size_t(E) * 4);
        total = o;
    }
};

unsigned blocks_for(size_t n, unsigned per) { return unsigned((n + per - 1) / per); }

void quantize_rows(const float* x, int ldx, int rows, int cols, uint8_t* q, cudaStream_t stream) {
    launch("moe quantize_rows_kernel", quantize_rows_kernel, blocks_for(size_t(rows) * (cols / 32), kWarps),
           kWarps * 32, 0, stream, x, ldx, rows, cols, q);
    EHC_LAUNCHED("quantize_rows_kernel");
}

constexpr int kRowsPair = 2;  // rows of gate (and of up) per warp
constexpr int kRowsDown = 4;

}  // namespace

bool moe_grouped_supported(const ExpertMat& gate, const ExpertMat& up, const ExpertMat& down, int k) {
    return moe_decode_supported(gate, up, down, k) && down.rows == gate.cols;
}

size_t moe_grouped_scratch_bytes(int ntok, int k, int n_expert, int n_embd, int n_ff) {
    if (ntok < 1 || k < 1 || n_expert < 1 || n_embd < 32 || n_ff < 32) return 0;
    return std::max(Layout(ntok, k, n_expert, n_embd, n_ff, false).total, Layout(ntok, k, n_expert, n_embd, n_ff, true).total);
}

void moe_grouped(const MoeGroupedArgs& a, cudaStream_t stream) {
    if (!moe_grouped_supported(a.gate, a.up, a.down, a.k))
        throw ehp::Error(EH_INTERNAL, "moe grouped: expert shapes or types not supported (check moe_grouped_supported)");
    if (a.ntok < 1 || a.n_expert < a.k || !a.x || !a.ids || !a.weights || !a.h || !a.scratch || a.ldx < a.gate.cols ||
        a.ldh < a.down.rows || reinterpret_cast<uintptr_t>(a.scratch) % 256)
        throw ehp::Error(EH_INTERNAL, "moe grouped: missing buffer, bad leading dimension or unaligned scratch");
    const DevMat g = to_dev(a.gate, "moe gate"), u = to_dev(a.up, "moe up"), d = to_dev(a.down, "moe down");
    const int E = g.cols, F = g.rows;
    if (d.cols != F || d.rows != E)
        throw ehp::Error(EH_INTERNAL, "moe grouped: down must map the gate's rows back to its columns");
    const int P = a.ntok * a.k;
    // ntok tokens routed k ways over n_expert experts average P / n_expert each
    const bool tiles = !a.integer_path && !a.one_form && moe_detail::tile_experts(a.gate, a.up, a.down, a.n_expert) &&
                       tile_form_by_average(plan(), P, a.n_expert);
    const bool mma = !a.integer_path && !tiles && moe_detail::mma_experts(a.gate, a.up, a.down);
    const Layout lay(a.ntok, a.k, a.n_expert, E, F, tiles || mma);
    if (a.scratch_bytes < lay.total) throw ehp::Error(EH_INTERNAL, "moe grouped: scratch too small");
    char* s = static_cast<char*>(a.scratch);
    int32_t* offsets = reinterpret_cast<int32_t*>(s + lay.offsets);
    int32_t* sorted = reinterpret_cast<int32_t*>(s + lay.sorted);
    int32_t* pos = reinterpret_cast<int32_t*>(s + lay.pos);
    float* dout = reinterpret_cast<float*>(s + lay.d);
    moe_detail::group_pairs(a.ids, P, a.n_expert, offsets, sorted, pos, stream);
    if (tiles || mma) {
        __half* x16 = reinterpret_cast<__half*>(s + lay.x16);
        __half* act16 = reinterpret_cast<__half*>(s + lay.act16);
        moe_detail::gather_half_rows(a.x, a.ldx, E, a.k, sorted, P, x16, stream);
        if (tiles) {
            const moe_detail::TileWork w{reinterpret_cast<moe_detail::TileUnit*>(s + lay.units),
                                         reinterpret_cast<int*>(s + lay.unit_count)};
            moe_detail::tile_units(offsets, a.n_expert, w, stream);
            moe_detail::tile_gate_up(x16, P, offsets, a.n_expert, w, g, a.gate.type, u, a.up.type, a.alpha, a.limit,
                                     act16, stream);
            moe_detail::tile_down(act16, P, offsets, a.n_expert, w, d, a.down.type, dout, stream);
        } else {
            moe_detail::mma_gate_up(x16, P, offsets, a.n_expert, g, u, a.gate.type, a.alpha, a.limit, act16, stream);
            moe_detail::mma_down(act16, P, offsets, a.n_expert, d, a.down.type, dout, stream);
        }
        moe_detail::combine_sorted(dout, E, a.ntok, a.k, a.ids, a.weights, pos, a.down.bias, a.down.bias_stride, a.h,
                                   a.ldh, stream);
        return;
    }
    uint8_t* xq = reinterpret_cast<uint8_t*>(s + lay.xq);
    float* act = reinterpret_cast<float*>(s + lay.act);
    uint8_t* actq = reinterpret_cast<uint8_t*>(s + lay.actq);

    quantize_rows(a.x, a.ldx, a.ntok, E, xq, stream);
    detail::int_type_dispatch(a.gate.type, [&]<int T>() {
        constexpr int kRows = kWarps * kRowsPair;
        launch("moe grouped gate_up", grouped_rows_kernel<T, kRowsPair, true, detail::ExpertSwiGlu>,
               dim3(blocks_for(size_t(F), kRows), unsigned(a.n_expert)), kWarps * 32, 0, stream,
               static_cast<const uint8_t*>(xq), a.k, static_cast<const int32_t*>(offsets),
               static_cast<const int32_t*>(sorted), g, u, detail::ExpertSwiGlu{a.alpha, a.limit}, act, F);
    });
    EHC_LAUNCHED("grouped_rows_kernel (gate_up)");
    quantize_rows(act, F, P, F, actq, stream);
    detail::int_type_dispatch(a.down.type, [&]<int T>() {
        constexpr int kRows = kWarps * kRowsDown;
        launch("moe grouped down", grouped_rows_kernel<T, kRowsDown, false, NoAct>,
               dim3(blocks_for(size_t(E), kRows), unsigned(a.n_expert)), kWarps * 32, 0, stream,
               static_cast<const uint8_t*>(actq), 1, static_cast<const int32_t*>(offsets),
               static_cast<const int32_t*>(sorted), d, d, NoAct{}, dout, E);
    });
    EHC_LAUNCHED("grouped_rows_kernel (down)");
    launch("moe grouped combine", combine_kernel, dim3(blocks_for(size_t(E), 256), unsigned(a.ntok)), 256, 0, stream,
           static_cast<const float*>(dout), E, a.k, a.ids, a.weights, a.h, a.ldh);
    EHC_LAUNCHED("combine_kernel");
}

}  // namespace ehcuda

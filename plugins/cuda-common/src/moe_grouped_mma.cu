// The tensor-core form of the grouped MoE products for MXFP4 experts
// (moe_grouped in moe.hpp picks it; see moe_common.cuh for the calls).
//
// Block (64 rows, expert e): 4 groups of 16 rows, each group's k range
// split over 4 warps (2 for the 64-token pass; see Geometry), a GEMM of
// those rows by the tiles of 8 of the tokens routed to e that one pass
// takes. The K dimension is walked half an MXFP4 group at a time (8 blocks
// of 32 values; a group is a 16-byte exponent header and 256 code bytes,
// contiguous in the device layout): the block copies that run of each of
// its rows, with the group's header, and the pass's FP16 inputs for those
// 256 columns, into shared memory with cp.async, three or four stages deep,
// so the next segments stream in while one is multiplied (the rows come
// from memory in 128-byte runs, and enough of them are in flight to keep
// HBM busy). Per block of 32 values a warp turns its rows' codes into two
// m16n8k16 A fragments through a 256-entry table (code byte -> two FP16
// values, exact), loads each tile's input fragments with one ldmatrix
// (shared by gate and up), two mma.sync per tile give the 16 rows x 8
// tokens partial sums, and the block scale (a power of two) multiplies them
// into the FP32 accumulators. Each weight byte is read once per pass; the
// inputs are FP16 as in the cuBLAS prefill path (moe_prefill); the order of
// the sums is fixed. gate|up keeps 16 rows of gate and the same 16 of up
// per warp and applies the clamped SwiGLU in registers, writing FP16
// activations in sorted pair order for the down kernel, which writes FP32
// [pair][row].
#include <cuda_fp16.h>

#include <algorithm>

#include "ehcuda/check.hpp"
#include "ehcuda/kernel_plan.hpp"
#include "ehcuda/launch.cuh"
#include "ehcuda/mxfp4.cuh"
#include "mma.cuh"
#include "moe_common.cuh"

namespace ehcuda {
namespace {

using moe_detail::bias_of;
using moe_detail::DevMat;
using moe_detail::row_ptr;

constexpr int kRowWarps = 4;           // warps along the rows, 16 rows each
constexpr int kRows = kRowWarps * 16;  // rows per block
constexpr int kTok = 8;                // tokens per tile (the mma's n)
// A stage holds one segment: half an MXFP4 group (8 blocks, 256 values) of
// every row, with the group's exponent header copied along (16 + 128 bytes
// per row), and the pass's inputs for those 256 columns. A pass takes NT
// tiles of 8 tokens: each A fragment feeds NT mma (NT 1 when experts get
// a few tokens each; 4 past KernelPlan::moe_wide_pass_tokens and 8 past
// moe_long_pass_tokens, so the codes are turned into fragments once per 32
// or 64 tokens: the kernel is bound by that conversion, not by HBM). An
// expert's passes are spread over the grid's z slices.
constexpr int kSegBlocks = kMxfp4GroupBlocks / 2;
constexpr int kSegVals = kSegBlocks * 32;
constexpr int kSegRowBytes = 16 + kSegBlocks * 16;
constexpr int kXLd = kSegVals + 8;  // halves per staged input row (+8: distinct banks)

// A block's warps: kRowWarps groups of 16 rows, each group's k range split
// over KSplit warps (more warps hide the latency of the table lookups and
// mma; their partial sums are added in a fixed order at the end). The
// 64-token pass keeps 64 accumulators a lane, which 16 warps' registers
// cannot hold, so it splits k two ways.
template <int NT>
struct Geometry {
    static constexpr int kKSplit = NT >= 8 ? 2 : 4;
    static constexpr int kWarps = kRowWarps * kKSplit;
    static constexpr int kThreadsPerRow = kWarps * 32 / kRows;  // staging threads per row
};
template <bool Pair, int NT>
constexpr size_t stage_bytes() {
    return size_t(Pair ? 2 : 1) * kRows * kSegRowBytes + size_t(kTok) * NT * kXLd * sizeof(__half);
}
// Dynamic shared memory one block may take (sm_90: 227 KB, less the table).
constexpr size_t kSmemPerBlock = 227 * 1024 - 256 * sizeof(uint32_t);
// Stages in flight. NT 1, and the down products at NT 4, run two blocks per
// multiprocessor (4 and 3 stages); gate|up at NT 4 and 8 needs more than
// half the registers, so one block runs per multiprocessor and Deep gives it
// the stages that fit (6 and 4: more weight bytes in flight per
// multiprocessor; KernelPlan::moe_deep_pipeline).
template <bool Pair, int NT, bool Deep>
constexpr int stages() {
    if constexpr (Deep) return int(std::min<size_t>(6, kSmemPerBlock / stage_bytes<Pair, NT>()));
    return NT == 1 ? 4 : 3;
}
template <bool Pair, int NT, bool Deep>
constexpr size_t smem_bytes() { return stages<Pair, NT, Deep>() * stage_bytes<Pair, NT>(); }
// The end-of-pass reduction of the k-split partial sums reuses the stages.
template <bool Pair, int NT, bool Deep>
constexpr bool reduction_fits() {
    return size_t(Geometry<NT>::kKSplit) * kRowWarps * 32 * 8 * NT * sizeof(float) <= smem_bytes<Pair, NT, Deep>();
}
static_assert(reduction_fits<false, 1, false>() && reduction_fits<true, 1, false>() &&
              reduction_fits<false, 4, false>() && reduction_fits<true, 4, false>() && reduction_fits<true, 8, false>());
static_assert(smem_bytes<true, 8, false>() <= kSmemPerBlock && smem_bytes<true, 8, true>() <= kSmemPerBlock &&
              smem_bytes<true, 4, true>() <= kSmemPerBlock && stages<true, 4, true>() == 6 &&
              stages<true, 8, true>() == 4);

__device__ __forceinline__ uint32_t half2_bits(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
}

// FP4 (E2M1) code -> value.
__device__ __forceinline__ float fp4_value(int n) {
    const int m = n & 7;
    // exponent 0: subnormal, m / 2; else 2^(e - 1) * (1 + mantissa / 2)
    const float v = m < 2 ? 0.5f * float(m) : float(1 << ((m >> 1) - 1)) * (m & 1 ? 1.5f : 1.0f);
    return (n & 8) ? -v : v;
}

// Block i of a staged segment, rows w0 (lane row g) and w1 (g + 8): the A
// fragments of its two k16 steps (step 0: values 0..15, step 1: 16..31)
// through the table (code byte -> two FP16 values). In the device layout
// code word w holds values 4w..4w+3 (nibbles 0..3) and 16+4w..16+4w+3
// (nibbles 4..7), so lane (g, t) needs bytes t & 1 (step 0) and 2 + (t & 1)
// (step 1) of words t / 2 (k = 2t, 2t+1) and t / 2 + 2 (k = 2t+8, 2t+9).
__device__ __forceinline__ void a_fragments(const uint32_t* lut, const uint8_t* w0, const uint8_t* w1, int i, int t,
                                            uint32_t (&a0)[4], uint32_t (&a1)[4]) {
    const uint32_t* c0 = reinterpret_cast<const uint32_t*>(w0 + 16 + 16 * i);
    const uint32_t* c1 = reinterpret_cast<const uint32_t*>(w1 + 16 + 16 * i);
    const uint32_t w00 = c0[t >> 1], w02 = c0[(t >> 1) + 2], w10 = c1[t >> 1], w12 = c1[(t >> 1) + 2];
    const int s0 = 8 * (t & 1), s1 = s0 + 16;
    a0[0] = lut[(w00 >> s0) & 255u];
    a0[1] = lut[(w10 >> s0) & 255u];
    a0[2] = lut[(w02 >> s0) & 255u];
    a0[3] = lut[(w12 >> s0) & 255u];
    a1[0] = lut[(w00 >> s1) & 255u];
    a1[1] = lut[(w10 >> s1) & 255u];
    a1[2] = lut[(w02 >> s1) & 255u];
    a1[3] = lut[(w12 >> s1) & 255u];
}

// acc += scale * (A . x) for one block and one tile of 8 tokens, x's
// fragments in b (ldmatrix of the tile's 8 tokens x the block's 32
// columns: steps 0 and 1, two registers each): two mma.sync into zeroed
// sums, then the rows' block scales (powers of two).
__device__ __forceinline__ void scaled_mma(const uint32_t (&a0)[4], const uint32_t (&a1)[4], const uint32_t (&b)[4],
                                           float sc0, float sc1, float (&acc)[4]) {
    float c[4] = {};
    detail::mma16816(c, a0, b[0], b[1]);
    detail::mma16816(c, a1, b[2], b[3]);
    acc[0] = fmaf(sc0, c[0], acc[0]);
    acc[1] = fmaf(sc0, c[1], acc[1]);
    acc[2] = fmaf(sc1, c[2], acc[2]);
    acc[3] = fmaf(sc1, c[3], acc[3]);
}

// Blocks per multiprocessor the registers must allow (see stages()).
template <bool Pair, int NT>
constexpr int min_blocks() { return NT == 1 || !Pair ? 2 : 1; }

// Pair: out16[i][r] = expert_swiglu(a_r . x_i + bias_a, b_r . x_i + bias_b);
// otherwise out32[i][r] = a_r . x_i (the caller adds the bias). i runs over
// expert e's sorted pairs offsets[e] .. offsets[e+1); x16 [pairs][a.cols].
template <bool Pair, int NT, bool Deep>
__global__ void __launch_bounds__(Geometry<NT>::kWarps * 32, min_blocks<Pair, NT>())
    mma_rows_kernel(const __half* x16, const int32_t* offsets, DevMat a, DevMat b, float alpha, float limit,
                    __half* out16, float* out32, int ldo) {
    constexpr int kMats = Pair ? 2 : 1;
    constexpr int kKSplit = Geometry<NT>::kKSplit, kThreadsPerRow = Geometry<NT>::kThreadsPerRow;
    constexpr int kStages = stages<Pair, NT, Deep>();
    constexpr size_t kStage = stage_bytes<Pair, NT>();
    constexpr int kPass = kTok * NT;  // tokens per pass
    __shared__ uint32_t lut[256];
    extern __shared__ int4 smem_raw[];
    uint8_t* smem = reinterpret_cast<uint8_t*>(smem_raw);
    for (int i = threadIdx.x; i < 256; i += blockDim.x) lut[i] = half2_bits(fp4_value(i & 15), fp4_value(i >> 4));
    pdl_entry();
    const int e = blockIdx.y;
    const int off = offsets[e], cnt = offsets[e + 1] - off;
    if (cnt <= int(blockIdx.z) * kPass) return;  // (the whole block) no pass of this slice
    const int K = a.cols, nkb = K / 32, nseg = (nkb + kSegBlocks - 1) / kSegBlocks;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * kRows, nrows = min(kRows, a.rows - row0);
    // Warp (rw, kw): rows rw * 16 .. + 16 of the block, blocks kw, kw + kKSplit, ...
    // of each segment; the kKSplit partial sums are added in kw order at the end.
    const int rw = warp % kRowWarps, kw = warp / kRowWarps;
    const int r0 = rw * 16;  // the warp's first row within the block
    const bool has_rows = r0 < nrows;
    // The rows this thread stages (kThreadsPerRow threads per row; rows
    // past the matrix repeat its last one, their results are dropped).
    const int sr = threadIdx.x / kThreadsPerRow, sc = threadIdx.x % kThreadsPerRow;
    const uint8_t* src_a = row_ptr(a, e, row0 + min(sr, nrows - 1));
    const uint8_t* src_b = Pair ? row_ptr(b, e, row0 + min(sr, nrows - 1)) : nullptr;

    // Segment S into stage S % kStages (an empty commit past the last, so
    // every iteration waits on the same count): its rows' header and code
    // blocks, and the inputs of the pass's tiles for its columns (zeros past
    // n tokens; the rows of tiles past the last are neither staged nor read:
    // a decode step's experts average a few tokens, one tile of a pass of 4).
    auto issue = [&](int S, int j0, int n) {
        if (S < nseg) {
            uint8_t* st = smem + size_t(S % kStages) * kStage;
            const int nb = min(kSegBlocks, nkb - S * kSegBlocks);
            const size_t grp = size_t(S / 2) * kMxfp4GroupBytes, codes = grp + 16 + size_t(S & 1) * kSegBlocks * 16;
            for (int c = sc; c <= nb; c += kThreadsPerRow) {
                // run 0: the header; run c >= 1: code block c - 1
                const size_t from = c == 0 ? grp : codes + size_t(c - 1) * 16;
                detail::cp_async16(st + size_t(sr) * kSegRowBytes + c * 16, src_a + from, 16);
                if constexpr (Pair) detail::cp_async16(st + size_t(kRows + sr) * kSegRowBytes + c * 16, src_b + from, 16);
            }
            __half* xs = reinterpret_cast<__half*>(st + size_t(kMats) * kRows * kSegRowBytes);
            constexpr int kRuns = kSegVals / 8;  // 16-byte runs of 8 halves per token
            const int staged = (n + kTok - 1) / kTok * kTok;  // the rows of the pass's tiles
            for (int idx = threadIdx.x; idx < staged * kRuns; idx += blockDim.x) {
                const int j = idx / kRuns, c = idx % kRuns;
                if (c >= nb * 4) continue;
                const __half* src = x16 + size_t(off + j0 + min(j, n - 1)) * K + size_t(S) * kSegVals + c * 8;
                detail::cp_async16(xs + j * kXLd + c * 8, src, j < n ? 16 : 0);
            }
        }
        detail::cp_async_commit();
    };

    // Slice z of the grid takes passes z, z + gridDim.z, ...: an expert with
    // many tokens (routing is rarely even) spreads its passes over blocks
    // instead of running them one after another in one.
    for (int j0 = int(blockIdx.z) * kPass; j0 < cnt; j0 += int(gridDim.z) * kPass) {
        const int n = min(kPass, cnt - j0);
        const int tiles = (n + kTok - 1) / kTok;
        float acc_a[NT][4] = {}, acc_b[NT][4] = {};
        __syncthreads();  // the previous pass's reads of every stage are done
        for (int S = 0; S < kStages - 1; ++S) issue(S, j0, n);
        for (int S = 0; S < nseg; ++S) {
            detail::cp_async_wait<kStages - 2>();
            __syncthreads();  // segment S is visible; segment S - 1's stage is free
            issue(S + kStages - 1, j0, n);
            if (has_rows) {
                const uint8_t* st = smem + size_t(S % kStages) * kStage;
                const uint8_t* wa0 = st + size_t(r0 + g) * kSegRowBytes;
                const uint8_t* wa1 = wa0 + 8 * kSegRowBytes;
                const uint8_t* wb0 = wa0 + size_t(kRows) * kSegRowBytes;
                const uint8_t* wb1 = wb0 + 8 * kSegRowBytes;
                // ldmatrix row address of this lane: token lane % 8 of a tile,
                // columns 8 * (lane / 8) .. + 8 of a block
                const __half* xl = reinterpret_cast<const __half*>(st + size_t(kMats) * kRows * kSegRowBytes) +
                                   (lane & 7) * kXLd + 8 * (lane >> 3);
                const int nb = min(kSegBlocks, nkb - S * kSegBlocks), e0 = (S & 1) * kSegBlocks;
                for (int i = kw; i < nb; i += kKSplit) {
                    // the tiles' x fragments, one ldmatrix each, shared by gate and up
                    uint32_t bx[NT][4];
#pragma unroll
                    for (int u = 0; u < NT; ++u)
                        if (u < tiles) detail::ldsm_x4(bx[u], xl + u * kTok * kXLd + i * 32);
                    uint32_t a0[4], a1[4];
                    a_fragments(lut, wa0, wa1, i, t, a0, a1);
                    float sa0 = e8m0_value(wa0[e0 + i]), sa1 = e8m0_value(wa1[e0 + i]);
#pragma unroll
                    for (int u = 0; u < NT; ++u)
                        if (u < tiles) scaled_mma(a0, a1, bx[u], sa0, sa1, acc_a[u]);
                    if constexpr (Pair) {
                        a_fragments(lut, wb0, wb1, i, t, a0, a1);
                        sa0 = e8m0_value(wb0[e0 + i]);
                        sa1 = e8m0_value(wb1[e0 + i]);
#pragma unroll
                        for (int u = 0; u < NT; ++u)
                            if (u < tiles) scaled_mma(a0, a1, bx[u], sa0, sa1, acc_b[u]);
                    }
                }
            }
        }
        detail::cp_async_wait<0>();  // (only empty groups remain)
        __syncthreads();              // every warp's reads of the stages are done
        float* red = reinterpret_cast<float*>(smem);  // [kw][rw][lane][tile][gate 4 | up 4]
        if (has_rows) {
            float* mine = red + ((size_t(kw) * kRowWarps + rw) * 32 + lane) * 8 * NT;
#pragma unroll
            for (int u = 0; u < NT; ++u)
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    mine[8 * u + q] = acc_a[u][q];
                    mine[8 * u + 4 + q] = acc_b[u][q];
                }
        }
        __syncthreads();
        if (kw != 0 || !has_rows) continue;
#pragma unroll
        for (int u = 0; u < NT; ++u)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc_a[u][q] = acc_b[u][q] = 0.0f;
        for (int k = 0; k < kKSplit; ++k) {
            const float* part = red + ((size_t(k) * kRowWarps + rw) * 32 + lane) * 8 * NT;
#pragma unroll
            for (int u = 0; u < NT; ++u)
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    acc_a[u][q] += part[8 * u + q];
                    acc_b[u][q] += part[8 * u + 4 + q];
                }
        }
#pragma unroll
        for (int u = 0; u < NT; ++u) {
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int r = row0 + r0 + g + (q >= 2 ? 8 : 0), j = u * kTok + 2 * t + (q & 1);
                if (r >= a.rows || j >= n) continue;
                const size_t i = size_t(off + j0 + j);
                if constexpr (Pair)
                    out16[i * ldo + r] = __float2half_rn(
                        expert_swiglu(acc_a[u][q] + bias_of(a, e, r), acc_b[u][q] + bias_of(b, e, r), alpha, limit));
                else
                    out32[i * ldo + r] = acc_a[u][q];
            }
        }
    }
}

// Pass slices per expert (grid z): enough that an expert holding every
// token of the call runs its passes side by side, at most this many. (A
// grid sized from the average tokens per expert instead, the idle blocks
// left out, measured no faster: a block past its expert's passes ends
// before it stages anything.)
constexpr int kMaxPassSlices = 16;

template <bool Pair, int NT, bool Deep>
void launch_rows_nt(int ntok, const __half* x16, const int32_t* offsets, int n_expert, const DevMat& a,
                    const DevMat& b, float alpha, float limit, __half* out16, float* out32, int ldo,
                    cudaStream_t stream) {
    const size_t smem = smem_bytes<Pair, NT, Deep>();
    auto kernel = mma_rows_kernel<Pair, NT, Deep>;
    allow_dynamic_smem(kernel, smem);
    const int slices = std::clamp((ntok + kTok * NT - 1) / (kTok * NT), 1, kMaxPassSlices);
    launch(Pair ? "moe mma gate_up" : "moe mma down", kernel,
           dim3(unsigned((a.rows + kRows - 1) / kRows), unsigned(n_expert), unsigned(slices)),
           Geometry<NT>::kWarps * 32, smem, stream, x16, offsets, a, b, alpha, limit, out16, out32, ldo);
    EHC_LAUNCHED("mma_rows_kernel");
}

template <bool Pair>
void launch_rows(int pairs, int ntok, const __half* x16, const int32_t* offsets, int n_expert, const DevMat& a,
                 const DevMat& b, float alpha, float limit, __half* out16, float* out32, int ldo, cudaStream_t stream) {
    auto go = [&]<int NT>() {
        if constexpr (Pair && NT >= 4) {
            if (plan().moe_deep_pipeline)
                return launch_rows_nt<Pair, NT, true>(ntok, x16, offsets, n_expert, a, b, alpha, limit, out16, out32,
                                                      ldo, stream);
        }
        launch_rows_nt<Pair, NT, false>(ntok, x16, offsets, n_expert, a, b, alpha, limit, out16, out32, ldo, stream);
    };
    // Tokens per expert above which a pass takes 4 tiles (KernelPlan::
    // moe_wide_pass_tokens) or 8 (moe_long_pass_tokens): ntok tokens routed
    // k ways over n_expert experts average pairs / n_expert = ntok * k /
    // n_expert each.
    // (The down products keep 32-token passes: two 16-warp blocks of those
    // fit a multiprocessor where one 8-warp block of the 64-token pass does.)
    const int per_expert = pairs / n_expert;
    if constexpr (Pair) {
        if (per_expert > plan().moe_long_pass_tokens) return go.template operator()<8>();
    }
    if (per_expert > plan().moe_wide_pass_tokens)
        go.template operator()<4>();
    else
        go.template operator()<1>();
}

}  // namespace

namespace moe_detail {

bool mma_experts(const ExpertMat& gate, const ExpertMat& up, const ExpertMat& down) {
    return gate.type == EH_TYPE_MXFP4 && up.type == EH_TYPE_MXFP4 && down.type == EH_TYPE_MXFP4 &&
           gate.cols % 32 == 0 && down.cols % 32 == 0;
}

void mma_gate_up(const __half* x16, int pairs, int ntok, const int32_t* offsets, int n_expert, const DevMat& g, const DevMat& u,
                 float alpha, float limit, __half* act16, cudaStream_t stream) {
    launch_rows<true>(pairs, ntok, x16, offsets, n_expert, g, u, alpha, limit, act16, nullptr, g.rows, stream);
}

void mma_down(const __half* act16, int pairs, int ntok, const int32_t* offsets, int n_expert, const DevMat& d, float* out,
              cudaStream_t stream) {
    launch_rows<false>(pairs, ntok, act16, offsets, n_expert, d, d, 0.0f, 0.0f, nullptr, out, d.rows, stream);
}

}  // namespace moe_detail

bool moe_grouped_on_tensor_cores(const ExpertMat& gate, const ExpertMat& up, const ExpertMat& down) {
    return moe_detail::mma_experts(gate, up, down);
}

}  // namespace ehcuda

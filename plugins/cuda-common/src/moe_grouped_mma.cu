// The tensor-core form of the grouped MoE products (moe_grouped in
// moe.hpp picks it; see moe_common.cuh for the calls), for MXFP4, Q4_K and
// Q6_K experts.
//
// Block (64 rows, expert e): 4 groups of 16 rows, each group's k range
// split over 4 warps (2 for the 64-token pass; see Geometry), a GEMM of
// those rows by the tiles of 8 of the tokens routed to e that one pass
// takes. The K dimension is walked a segment of 256 values at a time: the
// block copies that segment of each of its rows (for MXFP4 half a group's
// code bytes with the group's 16-byte exponent header; for a K-quant its
// super-block, scales included: Fmt<T>::stage) and the pass's FP16 inputs
// for those 256 columns into shared memory with cp.async, three to six
// stages deep, so the next segments stream in while one is multiplied (the
// rows come from memory in 16-byte runs, and enough of them are in flight
// to keep HBM busy). MXFP4: per block of 32 values a lane turns one code
// word of each of its two rows into FP16 values by bit operations alone
// (Fmt<T>::fp4_pairs; no table: a table in shared memory cost a bank-conflicted
// load per code byte, the kernel's bottleneck), loads each tile's input
// fragments with two 8-byte loads (shared by gate and up), and two
// mma.sync per tile give the 16 rows x 8 tokens partial sums that the
// block's scales fold into the FP32 accumulators. K-quants: a warp
// takes two blocks that share code bytes, builds their fragments of both
// matrices as FP16 values over a row factor (Fmt<T>::codes), then loads
// each tile's inputs once for both (quad_unit). Each weight byte is read
// once per pass; the inputs are FP16 as in the cuBLAS prefill path
// (moe_prefill); the order of the sums is fixed. gate|up keeps 16 rows
// of gate and the same 16 of up per warp and applies the SwiGLU in
// registers, writing FP16 activations in sorted pair order for the down
// kernel, which writes FP32 [pair][row].
//
// The one-token form (moe_decode_mma, moe_invariant.hpp) is the 8-token
// pass's kernel without the grouping: block (64 rows, slot) takes the
// slot's expert (each gate|up block ranks the router's logits itself) and
// a tile holding the one token, and the last down block of a row group to
// finish adds the slots' outputs to h (combine_sorted's sum). A (row,
// token) is summed exactly as in every 8- to 48-token pass (four-way K
// split, same fragments, same order), so a token decoded alone gets the
// bits it gets in a batched step. (The 64-token MXFP4 pass splits K two
// ways: another order.)
//
// MXFP4's few-token passes (a 64-sequence gpt-oss decode step routes ~8
// tokens to an expert) are bound by the instructions the multiprocessors
// issue per weight byte rather than by HBM (the code decode, staging
// addresses, address arithmetic per unit), so its path keeps them few
// (mma_rows_kernel's kMx), and passes of 16 tokens
// (KernelPlan::moe_decode_pass_tokens) decode an expert of 9 to 16 tokens
// once instead of twice.
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "ehcuda/check.hpp"
#include "ehcuda/expert_route.hpp"
#include "ehcuda/kernel_plan.hpp"
#include "ehcuda/launch.cuh"
#include "ehcuda/moe_invariant.hpp"
#include "ehcuda/mxfp4.cuh"
#include "ehcuda/quant.cuh"
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
// A stage holds one segment of 256 values of every row (Fmt<T>::kRowBytes
// bytes a row) and the pass's inputs for those 256 columns. A pass takes
// NT tiles of 8 tokens: each A fragment feeds NT mma (NT 1 when experts get
// a few tokens each; kWideTiles, 4 or 6, past KernelPlan::
// moe_wide_pass_tokens and, MXFP4 only, 8 past moe_long_pass_tokens, so
// the codes are turned into fragments once per 32 to 64 tokens: the kernel
// is bound by that conversion, not by HBM). Every pass of every expert has
// its own block (find_pass).
constexpr int kSegBlocks = 8;  // blocks of 32 values per segment
constexpr int kSegVals = kSegBlocks * 32;
static_assert(kSegBlocks * 2 == kMxfp4GroupBlocks, "an MXFP4 segment is half a group");

__device__ __forceinline__ uint32_t half2_bits(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
}

__device__ __forceinline__ uint32_t ld_u16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }
// The FP16 value at a 2-byte aligned address (a super-block's d or dmin).
__device__ __forceinline__ float f16_u16(const uint8_t* p) { return __half2float(__ushort_as_half(uint16_t(ld_u16(p)))); }

__device__ __forceinline__ uint32_t hfma2_bits(uint32_t a, uint32_t b, uint32_t c) {
    const __half2 r = __hfma2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b),
                              *reinterpret_cast<const __half2*>(&c));
    return *reinterpret_cast<const uint32_t*>(&r);
}

__device__ __forceinline__ uint32_t hsub2_bits(uint32_t a, uint32_t b) {
    const __half2 r = __hsub2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
    return *reinterpret_cast<const uint32_t*>(&r);
}
__device__ __forceinline__ uint32_t hmul2_bits(uint32_t a, uint32_t b) {
    const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
    return *reinterpret_cast<const uint32_t*>(&r);
}

// cp_async16 to a shared-window address (MXFP4's staging).
__device__ __forceinline__ void cp_async16_s(uint32_t dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

// Two 32-bit words from 8-byte aligned shared memory (a: shared window).
__device__ __forceinline__ void lds64(uint32_t a, uint32_t& lo, uint32_t& hi) {
    asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];\n" : "=r"(lo), "=r"(hi) : "r"(a));
}

// A warp's view of one matrix's rows in a stage: w0 and w1 the segment of
// the lane's fragment rows g and g + 8; wl (shared window) the row this
// lane addresses for an ldmatrix of the warp's 16 rows (row l % 8, + 8 for
// lanes 8-15 and 24-31, 16 bytes on for lanes 16-31).
struct Rows {
    const uint8_t* w0;
    const uint8_t* w1;
    uint32_t wl;
};

// How a format's A fragments pair with the inputs, and so how the inputs
// are staged and loaded (kXLd: halves per staged token row; x_lane: the
// lane's first half in a tile; XQuads also kUnit: blocks of 32 values a
// warp takes at once; first(u): the first block of the segment's unit u;
// tile(xl, i, b, u, f): tile u's fragments for block b of the unit from
// block i).
// XPairs (MXFP4): a code word of the device layout holds values 4w..4w+3
// (nibbles 0..3) and 16+4w..16+4w+3 (nibbles 4..7), and the bit operations
// of Fmt<MXFP4>::fp4_pairs turn nibbles j and j + 4 into one FP16 pair, so
// the A fragments take k in an order of their own: in k step s, lane t's
// k = 2t, 2t+1 are values 4t+2s and 16+4t+2s, and k = 2t+8, 2t+9 are
// 4t+2s+1 and 16+4t+2s+1. The inputs follow that order: the lane loads
// values 4t..4t+3 and 16+4t..16+4t+3 of its token (two 8-byte loads, as
// XQuads) and pairs them with byte permutes (+16 halves a row: a
// half-warp's eight-byte loads from 4 tokens cover the 32 banks once).
struct XPairs {
    static constexpr int kXLd = kSegVals + 16;
    __device__ __forceinline__ static int x_lane(int lane) { return (lane >> 2) * kXLd + 4 * (lane & 3); }
    // a tile's fragments for a block whose lane inputs are at a (shared
    // window): f[0], f[1] k step 0; f[2], f[3] step 1
    __device__ __forceinline__ static void tile(uint32_t a, uint32_t (&f)[4]) {
        uint32_t p0, p1, q0, q1;
        lds64(a, p0, p1);                         // values 4t .. 4t+3
        lds64(a + 16 * sizeof(__half), q0, q1);  // values 16+4t .. 16+4t+3
        f[0] = __byte_perm(p0, q0, 0x5410);
        f[1] = __byte_perm(p0, q0, 0x7632);
        f[2] = __byte_perm(p1, q1, 0x5410);
        f[3] = __byte_perm(p1, q1, 0x7632);
    }
};
// XQuads<Step>: lane (g, t) holds values 4t..4t+3 and 16+4t..16+4t+3 of
// a block of 32 (as an ldmatrix of Q4_K's code bytes leaves them), so k
// steps 0 and 1 take input columns 4t..4t+3 (k 2t, 2t+1, 2t+8, 2t+9) and 16
// on: one 8-byte load each. A unit is blocks i and i + Step (+16 halves a
// row: a half-warp's eight-byte loads from 4 tokens cover the 32 banks once).
template <int Step>
struct XQuads {
    static constexpr int kXLd = kSegVals + 16;
    static constexpr int kUnit = 2;
    __device__ __forceinline__ static int first(int unit) { return unit % Step + 2 * Step * (unit / Step); }
    __device__ __forceinline__ static int x_lane(int lane) { return (lane >> 2) * kXLd + 4 * (lane & 3); }
    __device__ __forceinline__ static void tile(uint32_t xl, int i, int b, int u, uint32_t (&f)[4]) {
        const uint32_t a = xl + uint32_t(u * kTok * kXLd + (i + b * Step) * 32) * uint32_t(sizeof(__half));
        lds64(a, f[0], f[1]);
        lds64(a + 16 * sizeof(__half), f[2], f[3]);
    }
};

// Where a format takes tile u's input fragments for block b of its unit:
// loaded before the unit (MXFP4's block(), the gate|up pair sharing them),
// or by tile() as each tile comes (quad_unit(), which has both
// matrices' fragments built first).
template <int U, int NT>
struct XLoaded {
    const uint32_t (&bx)[U][NT][4];
    __device__ __forceinline__ void operator()(int b, int u, uint32_t (&f)[4]) const {
#pragma unroll
        for (int q = 0; q < 4; ++q) f[q] = bx[b][u][q];
    }
};
template <class X>
struct XOnDemand {
    uint32_t xl;
    int i;
    __device__ __forceinline__ void operator()(int b, int u, uint32_t (&f)[4]) const { X::tile(xl, i, b, u, f); }
};

// c = A0 . b(step 0) + A1 . b(step 1): the products of one block of 32
// values with one tile of 8 tokens (b: its ldmatrix fragments, two
// registers a k16 step), into zeroed sums.
__device__ __forceinline__ void block_mma(const uint32_t (&a0)[4], const uint32_t (&a1)[4], const uint32_t (&b)[4],
                                          float (&c)[4]) {
    c[0] = c[1] = c[2] = c[3] = 0.0f;
    detail::mma16816(c, a0, b[0], b[1]);
    detail::mma16816(c, a1, b[2], b[3]);
}

// acc[u] += the rows' scales (s0 row g, s1 row g + 8) times the block's
// products with tile u, for every tile of the pass.
template <int NT, class X>
__device__ __forceinline__ void scaled_tiles(const uint32_t (&a0)[4], const uint32_t (&a1)[4], const X& x, int tiles,
                                             float s0, float s1, float (&acc)[NT][4]) {
#pragma unroll
    for (int u = 0; u < NT; ++u) {
        if (u >= tiles) continue;
        uint32_t b[4];
        x(0, u, b);
        float c[4];
        block_mma(a0, a1, b, c);
        acc[u][0] = fmaf(s0, c[0], acc[u][0]);
        acc[u][1] = fmaf(s0, c[1], acc[u][1]);
        acc[u][2] = fmaf(s1, c[2], acc[u][2]);
        acc[u][3] = fmaf(s1, c[3], acc[u][3]);
    }
}

// The weight formats the kernel reads. Each gives
//   kRowBytes: shared-memory bytes one row's segment takes in a stage;
//   an input layout (XPairs or XQuads above);
//   MXFP4 (XPairs): block(...): acc[u] += the values of one block of rows g
//     and g + 8 . tile u, for every tile u < tiles (the kernel stages its
//     segments itself);
//   the K-quants (XQuads): lead(row, S): where in those bytes segment S of
//     the row begins; stage(dst, row, S, nb, c0, step): cp.async of segment
//     S of the row (nb blocks of 32 values), 16-byte runs c0, c0 + step,
//     ...; codes(...): the A fragments of the unit's two blocks (quad_unit
//     below multiplies them).
// In a fragment, lane (g, t) holds columns 2t, 2t+1 and 2t+8, 2t+9 of rows
// g and g + 8 (a[0] row g, a[1] row g + 8, a[2] and a[3] the same at +8).
template <uint32_t T>
struct Fmt;

// MXFP4: a group is a 16-byte exponent header and 256 code bytes,
// contiguous in the device layout (16-byte aligned); a segment is half a
// group's codes with the header. The block scale is a power of two.
template <>
struct Fmt<EH_TYPE_MXFP4> : XPairs {
    static constexpr int kRowBytes = 16 + kSegBlocks * 16;
    // Nibbles j and j + 4 of code word q (bits 4j.. and 16+4j..), j = 0..3,
    // as FP16 pairs p[j] of 2^-14 times their E2M1 values, exactly: the
    // nibble's sign to bit 15, its two exponent bits and one mantissa bit to
    // bits 11..9 (an FP16 exponent field of 0..3: e > 0 is 2^(e-15) (1 +
    // m/2), e = 0 the subnormal m 2^-15, 2^-14 times E2M1's 2^(e-1) (1 +
    // m/2) and m/2). In 10 operations: pair j is word W rotated left by
    // 12 - 4j and masked, where W holds nibble j's sign where q has it (bit
    // 4j + 3) and its three other bits at 4j - 3 .. 4j - 1, i.e. q rotated
    // right by 3: the even pairs' bits and the odd pairs' do not collide, so
    // one W serves pairs 0 and 2 and another 1 and 3. (Checked exhaustively,
    // every 32-bit q, against the nibble-by-nibble shifts and masks.)
    __device__ __forceinline__ static void fp4_pairs(uint32_t q, uint32_t (&p)[4]) {
        const uint32_t r = __funnelshift_r(q, q, 3);
        const uint32_t we = (q & 0x08080808u) | (r & ~0x08080808u);
        const uint32_t wo = (q & 0x80808080u) | (r & ~0x80808080u);
        p[0] = __funnelshift_l(we, we, 12) & 0x8E008E00u;
        p[1] = __funnelshift_l(wo, wo, 8) & 0x8E008E00u;
        p[2] = __funnelshift_l(we, we, 4) & 0x8E008E00u;
        p[3] = wo & 0x8E008E00u;
    }
    // 2^14 times the scale 2^(e-127) of exponent byte e: the float of
    // exponent field e + 14, normal for every e up to 240; above, +inf
    // (exponent field 255), as 2^14 e8m0_value(e) gives (e = 255 is NaN in
    // the format)
    __device__ __forceinline__ static float scale_2p14(uint32_t e) { return __uint_as_float(min(e + 14u, 255u) << 23); }
    // One block's values: q points at code word t of the block in row g's
    // staged segment, ex at row g's exponent byte of the block; row g + 8
    // lies 8 rows on. Lane (g, t) takes code word t of rows g and g + 8
    // (XPairs says which k each value stands for); the scales carry the 2^14.
    template <int NT, class X>
    __device__ __forceinline__ static void block(const uint8_t* q, const uint8_t* ex, const X& x, int tiles,
                                                 float (&acc)[NT][4]) {
        uint32_t p0[4], p1[4];
        fp4_pairs(*reinterpret_cast<const uint32_t*>(q), p0);
        fp4_pairs(*reinterpret_cast<const uint32_t*>(q + 8 * kRowBytes), p1);
        const uint32_t a0[4] = {p0[0], p1[0], p0[1], p1[1]};
        const uint32_t a1[4] = {p0[2], p1[2], p0[3], p1[3]};
        scaled_tiles<NT>(a0, a1, x, tiles, scale_2p14(ex[0]), scale_2p14(ex[8 * kRowBytes]), acc);
    }
};

// K-quants: a segment is one super-block of Bytes bytes, which need not
// start on a 16-byte boundary (Q6_K's are 210 bytes: a 768-column row is
// 630), so it is staged from the boundary at or below it, the last run cut
// at the segment's end (cp.async fills the rest with zeros): the bytes
// before it belong to the row or tensor before, in the same allocation
// (device allocations are 256-byte aligned). Rows must be 2-byte aligned
// (mma_matrix checks), so every 16-bit code load below is aligned. A format
// whose rows are 16-byte aligned (Aligned) needs no room for the lead.
template <int Bytes, bool Aligned>
struct KquantStage {
    static constexpr int kRowBytes = Aligned ? Bytes : 16 * ((15 + Bytes + 15) / 16);
    static_assert(!Aligned || Bytes % 16 == 0);
    __device__ __forceinline__ static int lead(const uint8_t* row, int S) {
        if constexpr (Aligned) return 0;
        return int(reinterpret_cast<uintptr_t>(row + size_t(S) * Bytes) & 15u);
    }
    __device__ __forceinline__ static void stage(uint8_t* dst, const uint8_t* row, int S, int, int c0, int step) {
        const uint8_t* from = row + size_t(S) * Bytes;
        const uint8_t* base = from - (reinterpret_cast<uintptr_t>(from) & 15u);
        const uint8_t* end = from + Bytes;
        for (int c = c0; base + 16 * c < end; c += step) {
            const ptrdiff_t left = end - (base + 16 * c);
            detail::cp_async16(dst + 16 * c, base + 16 * c, left < 16 ? int(left) : 16);
        }
    }
};

// Q4_K (144 bytes / 256): d, dmin (FP16), 12 bytes of 6-bit scales and
// minimums, qs[128]: sub-block s (block i of the segment) is the low (s
// even) or high nibbles of qs[32 (s / 2) .. + 32), value d sc q - dmin m.
// A warp takes the two sub-blocks of 32 code bytes at once (XQuads): one
// ldmatrix gives each lane four bytes of rows g and g + 8 in each half,
// that is the codes of both sub-blocks. A = (d sc q - dmin m) / P, rounded
// once to FP16 (the precision of the cuBLAS form, which dequantizes the
// experts to FP16) by one hfma2 a pair: q comes in as the FP16 subnormal
// q 2^-24 (low nibble) or 16 q 2^-24 (high), the code bits masked in
// place, so its factor is d sc 2^24 / P or 2^20 / P, and P = 2^15 times a
// power of two above |d| and |dmin| keeps that factor in FP16's range.
// P, the same for the super-block's sub-blocks, scales the FP32 sums. Each
// of a row quad's four lanes works out one (row, sub-block) pair's factor
// and minimum and the quad shares them. Rows must be 16-byte aligned
// (mma_matrix: the data; 144-byte super-blocks), so the stage holds a
// row's segment from its first byte (kRowBytes 144: the eight rows of an
// ldmatrix fall in distinct banks).
template <>
struct Fmt<EH_TYPE_Q4_K> : KquantStage<144, true>, XQuads<1> {
    // The unit's A fragments ([sub-block i / i + 1][k step]) and the row
    // factors P of rows g and g + 8.
    __device__ __forceinline__ static void codes(const Rows& r, int i, int lane, uint32_t (&a)[2][2][4], float (&p)[2]) {
        const int t = lane & 3, quad = lane & ~3;
        // this lane's pair: row g + 8 (t & 1), sub-block i + (t >> 1)
        const K4Head h = k4_head((t & 1) ? r.w1 : r.w0, i + (t >> 1));
        // 2^e above max(|d|, |dmin|) and its inverse, from the exponent bits
        const uint32_t pb = (__float_as_uint(fmaxf(fabsf(h.d), fabsf(h.dmin))) & 0x7F800000u) + 0x00800000u;
        const float inv = __uint_as_float(0x7F000000u - pb);
        const uint32_t fm = half2_bits(h.d * h.sc * inv * ((t >> 1) ? 32.0f : 512.0f),
                                       -(h.dmin * h.mn * inv) * (1.0f / 32768.0f));
        const float pl = __uint_as_float(pb) * 32768.0f;
        // (factor, -minimum) of row g / g + 8, sub-block i (low) and i + 1 (high)
        uint32_t f[4], m[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const uint32_t v = __shfl_sync(0xffffffffu, fm, quad | k);
            f[k] = __byte_perm(v, 0, 0x1010);
            m[k] = __byte_perm(v, 0, 0x3232);
        }
        p[0] = __shfl_sync(0xffffffffu, pl, quad);
        p[1] = __shfl_sync(0xffffffffu, pl, quad | 1);
        uint32_t q[4];  // rows g, g + 8 bytes 4t..4t+3; the same at 16 + 4t
        detail::ldsm_x4(q, r.wl + uint32_t(16 + 16 * i));
        // A of code bytes (4t + j, 4t + j + 1) (j 0 or 2) of word w, sub-block
        // h (0: low nibbles), row pair k = 2 h + (row g + 8)
        auto a_of = [&](uint32_t w, int j, int hi, int k) {
            const uint32_t y = __byte_perm(w, 0, j ? 0x4342u : 0x4140u);
            return hfma2_bits(y & (hi ? 0x00F000F0u : 0x000F000Fu), f[k], m[k]);
        };
#pragma unroll
        for (int hi = 0; hi < 2; ++hi)
#pragma unroll
            for (int st = 0; st < 2; ++st) {
                a[hi][st][0] = a_of(q[2 * st], 0, hi, 2 * hi);
                a[hi][st][1] = a_of(q[2 * st + 1], 0, hi, 2 * hi + 1);
                a[hi][st][2] = a_of(q[2 * st], 2, hi, 2 * hi);
                a[hi][st][3] = a_of(q[2 * st + 1], 2, hi, 2 * hi + 1);
            }
    }
};

// Q6_K (210 bytes / 256): ql[128], qh[64], int8 scales[16], d (FP16). Block
// i is quarter i % 4 of half i / 4: low (quarters 0, 1) or high nibbles of
// ql[64 h + 32 (i & 1) ..], with bits 2 (i % 4) .. + 1 of qh[128 + 32 h ..]
// above them; each 16 values have their own scale. A warp takes quarters qd
// and qd + 2 of a half at once (XQuads<2>): the same ql bytes (low and high
// nibbles) and qh bytes (bits 2 qd and 2 qd + 4), four of each a lane and
// k step, read as words (a row is 2-byte aligned, so a word is two aligned
// loads and a funnel shift). A = (q - 32) sc 2^-16, rounded once to FP16
// (as the cuBLAS form's dequantized experts) by one hfma2 a pair from the
// 6-bit code as the FP16 subnormal q 2^-24: factor 256 sc, exact, and
// addend -sc 2^-11; d 2^16 scales the FP32 sums.
template <>
struct Fmt<EH_TYPE_Q6_K> : KquantStage<210, false>, XQuads<2> {
    // Four bytes at a 2-byte aligned shared address.
    __device__ __forceinline__ static uint32_t ld4(const uint8_t* p) {
        const int mis = int(reinterpret_cast<uintptr_t>(p) & 3u);
        const uint32_t* w = reinterpret_cast<const uint32_t*>(p - mis);
        return __funnelshift_r(w[0], w[1], uint32_t(mis) * 8u);
    }
    // The unit's A fragments ([quarter qd / qd + 2][k step]) and the row
    // factors of rows g and g + 8.
    __device__ __forceinline__ static void codes(const Rows& r, int i, int lane, uint32_t (&a)[2][2][4], float (&p)[2]) {
        const int t = lane & 3, h = i >> 2, qd = i & 3;  // (qd 0 or 1: the pair is qd, qd + 2)
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            const uint8_t* w = rr ? r.w1 : r.w0;
            uint32_t sf[2][2], nf[2][2];  // (factor, addend) pairs [quarter][k step]
#pragma unroll
            for (int hq = 0; hq < 2; ++hq) {
                // the two int8 scales as FP16: (s + 128) below 0x64 is 1152 + s
                const uint32_t y = __byte_perm(ld_u16(w + 192 + 8 * h + 2 * qd + 4 * hq) ^ 0x8080u, 0x64646464u, 0x4140u);
                const uint32_t sc = hsub2_bits(y, 0x64806480u);
                const uint32_t f = hmul2_bits(sc, 0x5C005C00u), n = hmul2_bits(sc, 0x90009000u);  // 256, -2^-11
                sf[hq][0] = __byte_perm(f, 0, 0x1010);
                sf[hq][1] = __byte_perm(f, 0, 0x3232);
                nf[hq][0] = __byte_perm(n, 0, 0x1010);
                nf[hq][1] = __byte_perm(n, 0, 0x3232);
            }
            p[rr] = f16_u16(w + 208) * 65536.0f;
            const uint8_t* ql = w + 64 * h + 32 * qd + 4 * t;
            const uint8_t* qh = w + 128 + 32 * h + 4 * t;
#pragma unroll
            for (int st = 0; st < 2; ++st) {
                const uint32_t L = ld4(ql + 16 * st), H = ld4(qh + 16 * st);
                const uint32_t v[2] = {(L & 0x0F0F0F0Fu) | ((H << (4 - 2 * qd)) & 0x30303030u),
                                       ((L >> 4) & 0x0F0F0F0Fu) | ((H >> (2 * qd)) & 0x30303030u)};
#pragma unroll
                for (int hq = 0; hq < 2; ++hq) {
                    a[hq][st][rr] = hfma2_bits(__byte_perm(v[hq], 0, 0x4140u), sf[hq][st], nf[hq][st]);
                    a[hq][st][rr + 2] = hfma2_bits(__byte_perm(v[hq], 0, 0x4342u), sf[hq][st], nf[hq][st]);
                }
            }
        }
    }
};

// An XQuads format's unit: acc[m][u] += the unit's values of matrix m's
// rows . tile u, for every tile u < tiles (F::codes: the A fragments
// [block][k step] and the FP32 factors of rows g and g + 8; both matrices'
// first, then each tile's inputs loaded once for them).
template <class F, int NT, int M, class X>
__device__ __forceinline__ void quad_unit(const Rows* r, int i, int lane, const X& x, int tiles, float (*acc)[NT][4]) {
    uint32_t a[M][2][2][4];
    float p[M][2];
#pragma unroll
    for (int mi = 0; mi < M; ++mi) F::codes(r[mi], i, lane, a[mi], p[mi]);
#pragma unroll
    for (int u = 0; u < NT; ++u) {
        if (u >= tiles) continue;
        float c[M][4] = {};
#pragma unroll
        for (int b = 0; b < 2; ++b) {
            uint32_t f[4];
            x(b, u, f);
#pragma unroll
            for (int mi = 0; mi < M; ++mi) {
                detail::mma16816(c[mi], a[mi][b][0], f[0], f[1]);
                detail::mma16816(c[mi], a[mi][b][1], f[2], f[3]);
            }
        }
#pragma unroll
        for (int mi = 0; mi < M; ++mi) {
            acc[mi][u][0] = fmaf(p[mi][0], c[mi][0], acc[mi][u][0]);
            acc[mi][u][1] = fmaf(p[mi][0], c[mi][1], acc[mi][u][1]);
            acc[mi][u][2] = fmaf(p[mi][1], c[mi][2], acc[mi][u][2]);
            acc[mi][u][3] = fmaf(p[mi][1], c[mi][3], acc[mi][u][3]);
        }
    }
}

// A block's warps: kRowWarps groups of 16 rows, each group's k range split
// over KSplit warps (more warps hide the latency of the fragment building
// and mma; their partial sums are added in a fixed order at the end). The
// 64-token pass keeps 64 accumulators a lane, which 16 warps' registers
// cannot hold, so it splits k two ways.
template <int NT>
struct Geometry {
    static constexpr int kKSplit = NT >= 8 ? 2 : 4;
    static constexpr int kWarps = kRowWarps * kKSplit;
    static constexpr int kThreadsPerRow = kWarps * 32 / kRows;  // staging threads per row
};
// Tiles of a wide pass: 4 (32 tokens) for MXFP4; 6 (48 tokens) for the
// K-quants, whose units take fewer registers (XQuads: no preloaded input
// fragments), so that an expert of a 512-token Qwen3-MoE pass (32 tokens
// on average, more than 32 for nearly half of them) is one pass, not two
// (each pass builds the rows' fragments anew).
template <uint32_t T>
constexpr int kWideTiles = T == EH_TYPE_MXFP4 ? 4 : 6;
template <uint32_t T, bool Pair, int NT>
constexpr size_t stage_bytes() {
    return size_t(Pair ? 2 : 1) * kRows * Fmt<T>::kRowBytes + size_t(kTok) * NT * Fmt<T>::kXLd * sizeof(__half);
}
// Dynamic shared memory one block may take (sm_90: 227 KB, less room for the static).
constexpr size_t kSmemPerBlock = 227 * 1024 - 1024;
// Stages in flight. NT 1 and 2 and the down products run two blocks per
// multiprocessor (min_blocks), each keeping as many stages as both can
// hold: MXFP4 up to 6 (8-token gate|up 5, 16-token 4, down 6, down at NT 4
// 4: a few-token pass's block streams only ~12 segments, and 3 of 9 KB in
// flight a down block left HBM idle); the K-quants 4 at NT 1 and 3 at NT 6
// (fewer where two blocks would not fit: Q6_K's wider rows). gate|up at NT
// 4 and up needs more than half the registers, so one block runs per
// multiprocessor and Deep gives it the stages that fit (MXFP4 6 and 4: more
// weight bytes in flight per multiprocessor; KernelPlan::
// moe_deep_pipeline).
template <uint32_t T, bool Pair, int NT, bool Deep>
constexpr int stages() {
    if constexpr (Deep) return int(std::min<size_t>(6, kSmemPerBlock / stage_bytes<T, Pair, NT>()));
    if constexpr (T == EH_TYPE_MXFP4) return int(std::min<size_t>(6, kSmemPerBlock / 2 / stage_bytes<T, Pair, NT>()));
    return int(std::min<size_t>(NT <= 2 ? 4 : 3, kSmemPerBlock / 2 / stage_bytes<T, Pair, NT>()));
}
template <uint32_t T, bool Pair, int NT, bool Deep>
constexpr size_t smem_bytes() { return stages<T, Pair, NT, Deep>() * stage_bytes<T, Pair, NT>(); }
// The end-of-pass reduction of the k-split partial sums reuses the stages.
template <uint32_t T, bool Pair, int NT, bool Deep>
constexpr bool fits() {
    return stages<T, Pair, NT, Deep>() >= 2 && smem_bytes<T, Pair, NT, Deep>() <= kSmemPerBlock &&
           size_t(Geometry<NT>::kKSplit) * kRowWarps * 32 * 4 * (Pair ? 2 : 1) * NT * sizeof(float) <=
               smem_bytes<T, Pair, NT, Deep>();
}
static_assert(fits<EH_TYPE_MXFP4, false, 1, false>() && fits<EH_TYPE_MXFP4, true, 1, false>() &&
              fits<EH_TYPE_MXFP4, false, 2, false>() && fits<EH_TYPE_MXFP4, true, 2, false>() &&
              fits<EH_TYPE_MXFP4, false, 4, false>() && fits<EH_TYPE_MXFP4, true, 4, false>() &&
              fits<EH_TYPE_MXFP4, true, 4, true>() && fits<EH_TYPE_MXFP4, true, 8, false>() &&
              fits<EH_TYPE_MXFP4, true, 8, true>());
static_assert(stages<EH_TYPE_MXFP4, true, 1, false>() == 5 && stages<EH_TYPE_MXFP4, false, 1, false>() == 6 &&
              stages<EH_TYPE_MXFP4, true, 2, false>() == 4 && stages<EH_TYPE_MXFP4, false, 2, false>() == 6 &&
              stages<EH_TYPE_MXFP4, false, 4, false>() == 4 && stages<EH_TYPE_MXFP4, true, 4, true>() == 6 &&
              stages<EH_TYPE_MXFP4, true, 4, false>() == 3 && stages<EH_TYPE_MXFP4, true, 8, true>() == 4 &&
              stages<EH_TYPE_MXFP4, true, 8, false>() == 2);
static_assert(fits<EH_TYPE_Q4_K, true, 1, false>() && fits<EH_TYPE_Q4_K, true, 6, true>() &&
              fits<EH_TYPE_Q4_K, false, 1, false>() && fits<EH_TYPE_Q4_K, false, 6, false>() &&
              fits<EH_TYPE_Q6_K, true, 1, false>() && fits<EH_TYPE_Q6_K, true, 6, true>() &&
              fits<EH_TYPE_Q6_K, false, 1, false>() && fits<EH_TYPE_Q6_K, false, 6, false>());

// The call's passes, expert by expert (expert e holds ceil(cnt_e / per) of
// them, cnt_e = offsets[e + 1] - offsets[e]): for pass `pass`, sel[0] its
// expert (-1 past the last pass) and sel[1] its first pair within the
// expert. Warp 0 scans the offsets (a prefix sum of the experts' pass
// counts, 32 experts a round); the whole block calls it and reads sel after.
// (Sizing the grid for an expert that could hold every token launched
// mostly empty blocks: a 512-token Qwen3-MoE pass, 128 experts of ~32
// tokens each, had 16 x 128 blocks a row group for 128 to 256 passes.
// Ordering the passes round by round, every expert's first pass before any
// second, measured slower: each block then counts the experts of every
// round before its own.)
__device__ __forceinline__ void find_pass(const int32_t* offsets, int n_expert, int per, int pass, int* sel) {
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        int e = -1, j0 = 0, base = 0;
        for (int c0 = 0; c0 < n_expert; c0 += 32) {
            const int x = c0 + lane;
            const int np = x < n_expert ? (offsets[x + 1] - offsets[x] + per - 1) / per : 0;
            int inc = np;  // inclusive prefix sum over the round's lanes
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int v = __shfl_up_sync(0xffffffffu, inc, o);
                if (lane >= o) inc += v;
            }
            const int first = base + inc - np;  // this lane's expert's first pass
            const unsigned m = __ballot_sync(0xffffffffu, np > 0 && pass >= first && pass < base + inc);
            if (m) {  // (uniform)
                const int src = __ffs(m) - 1;
                e = c0 + src;
                j0 = (pass - __shfl_sync(0xffffffffu, first, src)) * per;
                break;
            }
            base += __shfl_sync(0xffffffffu, inc, 31);
        }
        if (lane == 0) {
            sel[0] = e;
            sel[1] = j0;
        }
    }
    __syncthreads();
}

// The one-token form's own arguments (moe_decode_mma): block (x, slot)
// takes the slot's expert. gate|up: with logits, warp 0 ranks them
// (route_warp, moe_route's bits) and block (0, 0) leaves the ids and
// weights for the down kernel; without, ids holds them. down: the expert
// from ids, and the last of a row group's k blocks to finish (counters,
// zero before and left zero) adds the slots' outputs, bias included, to h
// in rank order as combine_sorted does.
struct OneToken {
    const float* logits = nullptr;
    int k = 0;
    int32_t* ids = nullptr;
    float* weights = nullptr;
    float* h = nullptr;
    int* counters = nullptr;
    const float* bias = nullptr;
    int bias_stride = 0;
};

// The one-token down kernel's end (OneToken): every thread of the block
// calls it once its own stores are issued. The block's slot output is in
// out32; the last of the k blocks of this row group adds all k slots' to h.
__device__ __forceinline__ void one_combine(const OneToken& one, const float* out32, int ldo, int row0, int nrows,
                                            int* sel) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        const bool last = atomicAdd(one.counters + blockIdx.x, 1) == one.k - 1;
        if (last) one.counters[blockIdx.x] = 0;  // every block of the group has counted
        sel[1] = last;
    }
    __syncthreads();
    if (!sel[1]) return;
    __threadfence();
    for (int i = int(threadIdx.x); i < nrows; i += int(blockDim.x)) {
        const int r = row0 + i;
        float out = 0.0f;
        for (int s = 0; s < one.k; ++s) {
            const int e = one.ids[s];
            const float b = one.bias ? one.bias[size_t(e) * one.bias_stride + r] : 0.0f;
            out = fmaf(one.weights[s], __ldcg(out32 + size_t(s) * ldo + r) + b, out);
        }
        one.h[r] += out;
    }
}

// Blocks per multiprocessor the registers must allow (see stages()).
template <bool Pair, int NT>
constexpr int min_blocks() { return NT <= 2 || !Pair ? 2 : 1; }

// Pair: out16[i][r] = expert_swiglu(a_r . x_i + bias_a, b_r . x_i + bias_b);
// otherwise out32[i][r] = a_r . x_i (the caller adds the bias). i runs over
// expert e's sorted pairs offsets[e] .. offsets[e+1); x16 [pairs][a.cols].
// One: the one-token form (OneToken above): i is the block's slot, x16 the
// token's row (gate|up) or the slots' activations (down); the arithmetic
// of a (row, token) is the grouped form's, line for line, so the bits are.
// MXFP4 (kMx): the instructions issued per weight byte bound its few-token
// passes, so they are kept few: the codes decoded by Fmt::fp4_pairs, each
// thread's staging addresses worked out once a pass (its weight runs and
// input runs advance by a fixed step a segment), a segment's units
// unrolled.
template <uint32_t T, bool Pair, int NT, bool Deep, bool One = false>
__global__ void __launch_bounds__(Geometry<NT>::kWarps * 32, min_blocks<Pair, NT>())
    mma_rows_kernel(const __half* x16, const int32_t* offsets, int n_expert, DevMat a, DevMat b, float alpha,
                    float limit, __half* out16, float* out32, int ldo, OneToken one) {
    using W = Fmt<T>;
    constexpr bool kMx = T == EH_TYPE_MXFP4;
    constexpr int kMats = Pair ? 2 : 1;
    constexpr int kKSplit = Geometry<NT>::kKSplit, kThreadsPerRow = Geometry<NT>::kThreadsPerRow;
    constexpr int kStages = stages<T, Pair, NT, Deep>();
    constexpr size_t kStage = stage_bytes<T, Pair, NT>();
    constexpr int kPass = kTok * NT;  // tokens per pass
    __shared__ int sel[2];
    extern __shared__ int4 smem_raw[];
    uint8_t* smem = reinterpret_cast<uint8_t*>(smem_raw);
    pdl_entry();
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
    // The memory rows of this lane's fragment rows g and g + 8 (for lead()).
    const int fr0 = row0 + min(r0 + g, nrows - 1), fr1 = row0 + min(r0 + g + 8, nrows - 1);
    const int srow = row0 + min(sr, nrows - 1);

    // Block (x, y, z) takes pass y + z * gridDim.y of the call for its 64 rows.
    // The block's expert e, its output rows off + j0 .. + n and its first
    // input row xrow.
    int e, j0, off, n, xrow;
    if constexpr (One) {
        const int slot = int(blockIdx.y);
        if (Pair && one.logits) {
            if (threadIdx.x < 32) {
                int id;
                float wt;
                route_warp(one.logits, n_expert, one.k, lane, id, wt);
                const int mine = __shfl_sync(0xffffffffu, id, slot);
                if (lane == 0) sel[0] = mine;
                if (blockIdx.x == 0 && slot == 0 && lane < one.k) {
                    one.ids[lane] = id;
                    one.weights[lane] = wt;
                }
            }
            __syncthreads();
            e = sel[0];
        } else {
            e = one.ids[slot];
        }
        j0 = 0;
        off = slot;
        n = 1;
        xrow = Pair ? 0 : slot;
    } else {
        find_pass(offsets, n_expert, kPass, int(blockIdx.y + blockIdx.z * gridDim.y), sel);
        e = sel[0];
        j0 = sel[1];
        if (e < 0) return;  // (the whole block) past the last pass
        off = offsets[e];
        n = min(kPass, offsets[e + 1] - off - j0);
        xrow = off + j0;
    }

    // Segment S into stage S % kStages (an empty commit past the last, so
    // every iteration waits on the same count): its rows' bytes, and the
    // inputs of the pass's tiles for its columns (zeros past n tokens; the
    // rows of tiles past the last are neither staged nor read: a decode
    // step's experts average a few tokens, one tile of a pass of 4).
    // MXFP4: a segment is half a group's codes with the group's 16-byte
    // exponent header (the device layout holds them contiguous, 16-byte
    // aligned); this thread's weight runs are c = sc, sc + kThreadsPerRow,
    // ... of its row (run 0 the group's header at (S / 2) *
    // kMxfp4GroupBytes, run c >= 1 code block c - 1 of the segment, 16 * c
    // further on, and half a group more for odd S) and its input runs the
    // lane's 8 halves of the tokens j = warp, warp + kWarps, ... of the pass.
    constexpr int kWRuns = (kSegBlocks + 1 + kThreadsPerRow - 1) / kThreadsPerRow;
    constexpr int kXRuns = (kPass * (kSegVals / 8) + Geometry<NT>::kWarps * 32 - 1) / (Geometry<NT>::kWarps * 32);
    [[maybe_unused]] const uint8_t* lw_a = nullptr;
    [[maybe_unused]] const uint8_t* lw_b = nullptr;
    [[maybe_unused]] const __half* lx[kXRuns] = {};
    [[maybe_unused]] int lx_bytes[kXRuns] = {};
    [[maybe_unused]] uint32_t l_smem = 0;
    // MXFP4: offsets in a stage of this lane's code word t of block kw in row
    // r0 + g (gate's; up's kRows rows on), of that row's exponent byte of
    // block kw in an even segment, and of its inputs of block kw in tile 0
    // (XPairs::tile); each unit after is a fixed step on
    [[maybe_unused]] const int l_q = (r0 + g) * W::kRowBytes + 16 + 16 * kw + 4 * t;
    [[maybe_unused]] const int l_e = (r0 + g) * W::kRowBytes + kw;
    [[maybe_unused]] const int l_x =
        kMats * kRows * W::kRowBytes + (W::x_lane(lane) + kw * 32) * int(sizeof(__half));
    if constexpr (kMx) {
        lw_a = row_ptr(a, e, srow);
        if constexpr (Pair) lw_b = row_ptr(b, e, srow);
        const int staged = (n + kTok - 1) / kTok * kTok;
#pragma unroll
        for (int m = 0; m < kXRuns; ++m) {
            const int j = warp + m * Geometry<NT>::kWarps;
            lx[m] = x16 + size_t(xrow + min(j, n - 1)) * K + lane * 8;
            lx_bytes[m] = j < n ? 16 : j < staged ? 0 : -1;  // -1: not staged
        }
        l_smem = uint32_t(__cvta_generic_to_shared(smem));
    }
    auto issue_mx = [&](int S) {
        if (S < nseg) {
            const uint32_t st = l_smem + uint32_t(S % kStages) * uint32_t(kStage);
            const int nb = min(kSegBlocks, nkb - S * kSegBlocks);
            const size_t grp = size_t(S >> 1) * kMxfp4GroupBytes;
            const int odd = (S & 1) * kSegBlocks * 16;
            const uint32_t wd = st + uint32_t(sr * W::kRowBytes);
#pragma unroll
            for (int m = 0; m < kWRuns; ++m) {
                const int c = sc + m * kThreadsPerRow;
                if (c <= nb) {
                    const size_t from = grp + size_t(16 * c + (c ? odd : 0));
                    cp_async16_s(wd + uint32_t(16 * c), lw_a + from, 16);
                    if constexpr (Pair)
                        cp_async16_s(wd + uint32_t(kRows * W::kRowBytes + 16 * c), lw_b + from, 16);
                }
            }
            const uint32_t xd = st + uint32_t(kMats * kRows * W::kRowBytes);
            if (lane < nb * 4) {
#pragma unroll
                for (int m = 0; m < kXRuns; ++m) {
                    const int j = warp + m * Geometry<NT>::kWarps;
                    if (lx_bytes[m] >= 0)
                        cp_async16_s(xd + uint32_t((j * W::kXLd + lane * 8) * sizeof(__half)),
                                     lx[m] + size_t(S) * kSegVals, lx_bytes[m]);
                }
            }
        }
        detail::cp_async_commit();
    };
    auto issue = [&](int S) {
        if constexpr (kMx) {
            issue_mx(S);
        } else {
            if (S < nseg) {
                uint8_t* st = smem + size_t(S % kStages) * kStage;
                const int nb = min(kSegBlocks, nkb - S * kSegBlocks);
                W::stage(st + size_t(sr) * W::kRowBytes, row_ptr(a, e, srow), S, nb, sc, kThreadsPerRow);
                if constexpr (Pair)
                    W::stage(st + size_t(kRows + sr) * W::kRowBytes, row_ptr(b, e, srow), S, nb, sc, kThreadsPerRow);
                __half* xs = reinterpret_cast<__half*>(st + size_t(kMats) * kRows * W::kRowBytes);
                constexpr int kRuns = kSegVals / 8;  // 16-byte runs of 8 halves per token
                const int staged = (n + kTok - 1) / kTok * kTok;  // the rows of the pass's tiles
                for (int idx = threadIdx.x; idx < staged * kRuns; idx += blockDim.x) {
                    const int j = idx / kRuns, c = idx % kRuns;
                    if (c >= nb * 4) continue;
                    const __half* src = x16 + size_t(xrow + min(j, n - 1)) * K + size_t(S) * kSegVals + c * 8;
                    detail::cp_async16(xs + j * W::kXLd + c * 8, src, j < n ? 16 : 0);
                }
            }
            detail::cp_async_commit();
        }
    };

    const int tiles = (n + kTok - 1) / kTok;
    float acc[2][NT][4] = {};  // gate (or the one matrix), up
    float(&acc_a)[NT][4] = acc[0];
    float(&acc_b)[NT][4] = acc[1];
    for (int S = 0; S < kStages - 1; ++S) issue(S);
    for (int S = 0; S < nseg; ++S) {
        detail::cp_async_wait<kStages - 2>();
        __syncthreads();  // segment S is visible; segment S - 1's stage is free
        issue(S + kStages - 1);
        if (has_rows) {
            const int nb = min(kSegBlocks, nkb - S * kSegBlocks);
            if constexpr (kMx) {
                // the segment's units kw, kw + kKSplit, ... in order
                const int so = (S % kStages) * int(kStage);
                const uint8_t* q = smem + so + l_q;
                const uint8_t* ex = smem + so + l_e + (S & 1) * kSegBlocks;
                const uint32_t xs = l_smem + uint32_t(so + l_x);
#pragma unroll
                for (int uu = 0; uu < kSegBlocks / kKSplit; ++uu) {
                    if (kw + uu * kKSplit < nb) {
                        // the tiles' x fragments, shared by gate and up
                        uint32_t bx[1][NT][4];
#pragma unroll
                        for (int u = 0; u < NT; ++u)
                            W::tile(xs + uint32_t((u * kTok * W::kXLd + uu * kKSplit * 32) * sizeof(__half)),
                                    bx[0][u]);
                        const XLoaded<1, NT> x{bx};
                        const int uq = uu * kKSplit * 16, ue = uu * kKSplit;
                        W::template block<NT>(q + uq, ex + ue, x, tiles, acc_a);
                        if constexpr (Pair)
                            W::template block<NT>(q + kRows * W::kRowBytes + uq, ex + kRows * W::kRowBytes + ue, x,
                                                  tiles, acc_b);
                    }
                }
            } else {
                const uint8_t* st = smem + size_t(S % kStages) * kStage;
                // this lane's row of an ldmatrix of the warp's 16 rows (Rows)
                const size_t lrow =
                    size_t(r0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * W::kRowBytes + 16 * (lane >> 4);
                const uint32_t sw = uint32_t(__cvta_generic_to_shared(st));
                const Rows ra{st + size_t(r0 + g) * W::kRowBytes + W::lead(row_ptr(a, e, fr0), S),
                              st + size_t(r0 + g + 8) * W::kRowBytes + W::lead(row_ptr(a, e, fr1), S),
                              sw + uint32_t(lrow)};
                Rows rb{};
                if constexpr (Pair)
                    rb = Rows{st + size_t(kRows + r0 + g) * W::kRowBytes + W::lead(row_ptr(b, e, fr0), S),
                              st + size_t(kRows + r0 + g + 8) * W::kRowBytes + W::lead(row_ptr(b, e, fr1), S),
                              sw + uint32_t(size_t(kRows) * W::kRowBytes + lrow)};
                // the lane's input address in the first tile (shared window)
                const uint32_t xl =
                    sw + uint32_t((size_t(kMats) * kRows * W::kRowBytes) + size_t(W::x_lane(lane)) * sizeof(__half));
                for (int unit = kw; unit * W::kUnit < nb; unit += kKSplit) {
                    const int i = W::first(unit);  // the unit's first block
                    // both matrices' fragments first, then each tile's inputs
                    // once for them
                    const Rows rs[2] = {ra, rb};
                    quad_unit<W, NT, kMats>(rs, i, lane, XOnDemand<W>{xl, i}, tiles, acc);
                }
            }
        }
    }
    detail::cp_async_wait<0>();  // (only empty groups remain)
    __syncthreads();              // every warp's reads of the stages are done
    constexpr int kRed = 4 * kMats;  // floats a lane and tile: gate 4 | up 4
    // [kw][rw][tile][kRed][lane]: lane fastest, so a warp's stores and loads
    // of one value fall in 32 distinct banks
    float* red = reinterpret_cast<float*>(smem);
    if (has_rows) {
        float* mine = red + (size_t(kw) * kRowWarps + rw) * kRed * NT * 32 + lane;
#pragma unroll
        for (int u = 0; u < NT; ++u)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                mine[(kRed * u + q) * 32] = acc_a[u][q];
                if constexpr (Pair) mine[(kRed * u + 4 + q) * 32] = acc_b[u][q];
            }
    }
    __syncthreads();
    constexpr bool kCombine = One && !Pair;  // (the one-token down kernel adds to h below)
    if (kw != 0 || !has_rows) {
        if constexpr (kCombine) return one_combine(one, out32, ldo, row0, nrows, sel);
        return;
    }
#pragma unroll
    for (int u = 0; u < NT; ++u)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc_a[u][q] = acc_b[u][q] = 0.0f;
    for (int k = 0; k < kKSplit; ++k) {
        const float* part = red + (size_t(k) * kRowWarps + rw) * kRed * NT * 32 + lane;
#pragma unroll
        for (int u = 0; u < NT; ++u)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                acc_a[u][q] += part[(kRed * u + q) * 32];
                if constexpr (Pair) acc_b[u][q] += part[(kRed * u + 4 + q) * 32];
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
    if constexpr (kCombine) one_combine(one, out32, ldo, row0, nrows, sel);
}

template <uint32_t T, bool Pair, int NT, bool Deep>
void launch_rows_nt(int pairs, const __half* x16, const int32_t* offsets, int n_expert, const DevMat& a,
                    const DevMat& b, float alpha, float limit, __half* out16, float* out32, int ldo,
                    cudaStream_t stream) {
    const size_t smem = smem_bytes<T, Pair, NT, Deep>();
    auto kernel = mma_rows_kernel<T, Pair, NT, Deep, false>;
    allow_dynamic_smem(kernel, smem);
    // The most passes `pairs` pairs can make: each expert's last may be partial.
    constexpr int kPass = kTok * NT;
    const long passes = (long(pairs) + kPass - 1) / kPass + std::min(n_expert, pairs);
    const long ny = std::min(passes, 65535L), nz = (passes + ny - 1) / ny;  // (grid y holds 65535 at most)
    launch(Pair ? "moe mma gate_up" : "moe mma down", kernel,
           dim3(unsigned((a.rows + kRows - 1) / kRows), unsigned(ny), unsigned(nz)),
           Geometry<NT>::kWarps * 32, smem, stream, x16, offsets, n_expert, a, b, alpha, limit, out16, out32, ldo,
           OneToken{});
    EHC_LAUNCHED("mma_rows_kernel");
}

// The weight types of the tensor-core form, one instance set each.
template <class F>
bool mma_type_dispatch(uint32_t type, F&& f) {
    switch (type) {
        case EH_TYPE_MXFP4: f.template operator()<EH_TYPE_MXFP4>(); return true;
        case EH_TYPE_Q4_K: f.template operator()<EH_TYPE_Q4_K>(); return true;
        case EH_TYPE_Q6_K: f.template operator()<EH_TYPE_Q6_K>(); return true;
        default: return false;
    }
}

template <bool Pair>
void launch_rows(uint32_t type, int pairs, const __half* x16, const int32_t* offsets, int n_expert,
                 const DevMat& a, const DevMat& b, float alpha, float limit, __half* out16, float* out32, int ldo,
                 cudaStream_t stream) {
    // Tokens a pass: expert_route's tensor_core_pass_tokens, the one rule
    // (the load's log and inspect --kernels print it); the kernels below are
    // those of tensor_core_pass_kernel's widths, no other.
    const int tokens = tensor_core_pass_tokens(plan(), type, Pair, pairs, n_expert);
    bool ran = false;
    const bool known = mma_type_dispatch(type, [&]<uint32_t T>() {
        auto go = [&]<int NT>() {
            if constexpr (tensor_core_pass_kernel(T, Pair, kTok * NT)) {
                if (tokens != kTok * NT) return;
                ran = true;
                // gate|up at NT 4 and 8 keeps the stages that fit (Deep); for
                // MXFP4 moe_deep_pipeline may say otherwise (the K-quants have no
                // shallow instance: one fewer each).
                constexpr bool kDeep = Pair && NT >= 4;
                if constexpr (kDeep && T == EH_TYPE_MXFP4) {
                    if (!plan().moe_deep_pipeline)
                        return launch_rows_nt<T, Pair, NT, false>(pairs, x16, offsets, n_expert, a, b, alpha, limit,
                                                                  out16, out32, ldo, stream);
                }
                launch_rows_nt<T, Pair, NT, kDeep>(pairs, x16, offsets, n_expert, a, b, alpha, limit, out16, out32,
                                                   ldo, stream);
            }
        };
        go.template operator()<1>();
        go.template operator()<2>();
        go.template operator()<4>();
        go.template operator()<6>();
        go.template operator()<8>();
    });
    if (!known) throw ehp::Error(EH_INTERNAL, "moe mma: weight type without a tensor-core form");
    if (!ran)
        throw ehp::Error(EH_INTERNAL, "moe mma: no pass kernel of " + std::to_string(tokens) +
                                          " tokens for this type (tensor_core_pass_kernel)");
}

// The one-token form (moe_decode_mma): block (64 rows, slot), the 8-token
// pass's kernel with the slot's expert and no grouping.
template <bool Pair>
void launch_one(uint32_t type, const __half* x16, int n_expert, const DevMat& a, const DevMat& b, float alpha,
                float limit, __half* out16, float* out32, int ldo, const OneToken& one, cudaStream_t stream) {
    const bool known = mma_type_dispatch(type, [&]<uint32_t T>() {
        const size_t smem = smem_bytes<T, Pair, 1, false>();
        auto kernel = mma_rows_kernel<T, Pair, 1, false, true>;
        allow_dynamic_smem(kernel, smem);
        launch(Pair ? "moe mma one-token gate_up" : "moe mma one-token down", kernel,
               dim3(unsigned((a.rows + kRows - 1) / kRows), unsigned(one.k), 1u), Geometry<1>::kWarps * 32, smem,
               stream, x16, static_cast<const int32_t*>(nullptr), n_expert, a, b, alpha, limit, out16, out32, ldo, one);
        EHC_LAUNCHED("mma_rows_kernel (one token)");
    });
    if (!known) throw ehp::Error(EH_INTERNAL, "moe mma: weight type without a tensor-core form");
}

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// Whether a matrix of experts can take the tensor-core form: a type it
// reads, whole segments of 256 values for the K-quants (32 for MXFP4,
// whose partial last segment the kernel handles), aligned rows: Q4_K's on
// 16 bytes (an ldmatrix of the staged codes), Q6_K's on 2 and the data on
// 4 (its 16-bit code loads; MXFP4 is checked for 16 by to_dev).
bool mma_matrix(const ExpertMat& m) {
    if (!mma_type_dispatch(m.type, [&]<uint32_t>() {})) return false;  // (a type it has instances for)
    if (m.type == EH_TYPE_MXFP4) return m.cols % 32 == 0;
    const size_t row_align = m.type == EH_TYPE_Q4_K ? 16 : 2;
    return m.cols % kSegVals == 0 && reinterpret_cast<uintptr_t>(m.data) % std::max<size_t>(row_align, 4) == 0 &&
           m.row_bytes % row_align == 0 && m.expert_stride % row_align == 0;
}

}  // namespace

namespace moe_detail {

bool mma_experts(const ExpertMat& gate, const ExpertMat& up, const ExpertMat& down) {
    return gate.type == up.type && mma_matrix(gate) && mma_matrix(up) && mma_matrix(down);
}

void mma_gate_up(const __half* x16, int pairs, const int32_t* offsets, int n_expert, const DevMat& g, const DevMat& u,
                 uint32_t type, float alpha, float limit, __half* act16, cudaStream_t stream) {
    launch_rows<true>(type, pairs, x16, offsets, n_expert, g, u, alpha, limit, act16, nullptr, g.rows, stream);
}

void mma_down(const __half* act16, int pairs, const int32_t* offsets, int n_expert, const DevMat& d,
              uint32_t type, float* out, cudaStream_t stream) {
    launch_rows<false>(type, pairs, act16, offsets, n_expert, d, d, 0.0f, 0.0f, nullptr, out, d.rows, stream);
}

}  // namespace moe_detail

bool moe_grouped_on_tensor_cores(const ExpertMat& gate, const ExpertMat& up, const ExpertMat& down) {
    return moe_detail::mma_experts(gate, up, down);
}

bool moe_decode_mma_supported(const ExpertMat& gate, const ExpertMat& up, const ExpertMat& down, int k, int n_expert) {
    return moe_grouped_supported(gate, up, down, k) && moe_detail::mma_experts(gate, up, down) && n_expert >= k &&
           n_expert <= kMaxRouteExperts;
}

size_t moe_decode_mma_scratch_bytes(int k, int n_embd, int n_ff) {
    if (k < 1 || n_embd < 1 || n_ff < 1) return 0;
    return align256(size_t(k) * size_t(n_ff) * 2) + size_t(k) * size_t(n_embd) * 4;
}

int moe_decode_mma_counters(int n_embd) { return (n_embd + kRows - 1) / kRows; }

void moe_decode_mma(const MoeDecodeMmaArgs& a, cudaStream_t stream) {
    if (!moe_decode_mma_supported(a.gate, a.up, a.down, a.k, a.n_expert))
        throw ehp::Error(EH_INTERNAL, "moe decode mma: experts not supported (check moe_decode_mma_supported)");
    const DevMat g = moe_detail::to_dev(a.gate, "moe gate"), u = moe_detail::to_dev(a.up, "moe up"),
                 d = moe_detail::to_dev(a.down, "moe down");
    const int E = g.cols, F = g.rows;
    if (!a.x16 || !a.ids || !a.weights || !a.h || !a.counters || !a.scratch ||
        a.scratch_bytes < moe_decode_mma_scratch_bytes(a.k, E, F) || reinterpret_cast<uintptr_t>(a.x16) % 16 ||
        reinterpret_cast<uintptr_t>(a.scratch) % 256)
        throw ehp::Error(EH_INTERNAL, "moe decode mma: missing buffer, unaligned input or scratch too small");
    __half* act16 = static_cast<__half*>(a.scratch);
    float* dout = reinterpret_cast<float*>(static_cast<char*>(a.scratch) + align256(size_t(a.k) * size_t(F) * 2));
    OneToken one;
    one.logits = a.logits;
    one.k = a.k;
    one.ids = a.ids;
    one.weights = a.weights;
    launch_one<true>(a.gate.type, static_cast<const __half*>(a.x16), a.n_expert, g, u, a.alpha, a.limit, act16,
                     nullptr, F, one, stream);
    one.logits = nullptr;
    one.h = a.h;
    one.counters = a.counters;
    one.bias = a.down.bias;
    one.bias_stride = a.down.bias_stride;
    launch_one<false>(a.down.type, act16, a.n_expert, d, d, 0.0f, 0.0f, nullptr, dout, E, one, stream);
}

}  // namespace ehcuda

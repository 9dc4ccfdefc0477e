// Pieces shared by the MoE kernels: the per-pair kernels (moe.cu), the
// single-token decode kernels (moe_decode.cu), the grouped forms
// (moe_grouped*.cu) and the cuBLAS prefill path (moe_prefill.cu), so all
// apply the same activation and read expert rows the same way.
#pragma once

#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include <engine_host/plugin_abi.hpp>

#include "ehcuda/moe.hpp"

namespace ehcuda {

// The experts' activation (moe.hpp). alpha > 0: gpt-oss's clamped SwiGLU,
// gate = min(gate, limit), up = clamp(up, -limit, limit), out = (up + 1) *
// gate * sigmoid(alpha * gate). alpha == kPlainSwiGlu (0): silu(gate) * up,
// unclamped (Qwen3-MoE). The branch is uniform across a launch.
__device__ __forceinline__ float expert_swiglu(float g, float u, float alpha, float limit) {
    if (alpha == kPlainSwiGlu) return u * (g / (1.0f + __expf(-g)));
    g = fminf(g, limit);
    u = fminf(fmaxf(u, -limit), limit);
    return (u + 1.0f) * (g / (1.0f + __expf(-alpha * g)));
}

// Top-k by selection, one warp per token: k rounds of a warp-wide argmax
// over the experts not yet taken (lane i holds experts i, i+32, ..., and a
// bit per expert it has given up); ties go to the lower index (as the CPU
// reference's ordering), NaN ranks below every number. Lane s < k gets
// slot s's expert and its weight, a softmax over the selected logits.
// A round compares order-preserving integer keys (route_key): the lane's
// own best, then the warp's largest key and, among the lanes holding it,
// the lowest expert, each in one warp reduction instruction. (Comparing
// floats and indices through 5 pairs of shuffles a round took ~8 us for
// the top-8 of 128 experts, one dependent chain of ~1,000 instructions;
// one thread per token walking every expert k times took ~20 us per
// gpt-oss layer.) k <= 32, n_expert <= kMaxRouteExperts.
constexpr int kMaxRouteExperts = 32 * 32;

// 1 for NaN, else the float's bits mapped so that unsigned order is the
// numbers' order (-0 as +0, so they tie as floats do); 0 is left for "no
// expert". Every number's key is above 1 (-inf's is 0x007FFFFF).
__device__ __forceinline__ uint32_t route_key(float v) {
    if (isnan(v)) return 1u;
    const uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float route_value(uint32_t key) {
    if (key <= 1u) return __uint_as_float(0x7FC00000u);  // NaN
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key);
}

__device__ __forceinline__ void route_warp(const float* l, int n_expert, int k, int lane, int& my_id, float& my_w) {
    uint32_t taken = 0;  // bit j: expert lane + 32 j is selected
    my_id = -1;
    uint32_t my_key = 0;
    for (int s = 0; s < k; ++s) {
        uint32_t bk = 0;  // the lane's best key; on ties its lowest expert
        int be = -1;
        for (int j = 0, e = lane; e < n_expert; ++j, e += 32) {
            const uint32_t key = route_key(l[e]);
            if (!((taken >> j) & 1u) && key > bk) {
                bk = key;
                be = e;
            }
        }
        const uint32_t m = __reduce_max_sync(0xffffffffu, bk);
        const uint32_t w = __reduce_min_sync(0xffffffffu, m != 0u && bk == m ? uint32_t(be) : 0xffffffffu);
        const int win = m != 0u ? int(w) : -1;
        if (win >= 0 && (win & 31) == lane) taken |= 1u << (win >> 5);
        if (lane == s) {
            my_id = win;
            my_key = m;
        }
    }
    const float my_val = route_value(my_key);
    const float mx = __shfl_sync(0xffffffffu, my_val, 0);
    const float p = lane < k ? expf(my_val - mx) : 0.0f;
    float sum = p;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    my_w = p / sum;
}

// A decode MoE's routing done by the expert kernel itself (moe_decode with
// logits): each block routes for itself; block (0, 0) leaves the ids and
// weights in memory for the down kernel. logits NULL: ids are given.
struct FusedRoute {
    const float* logits = nullptr;
    int n_expert = 0, k = 0;
    int32_t* ids = nullptr;
    float* weights = nullptr;
};

namespace moe_detail {

// Kernel-side copy of an ExpertMat.
struct DevMat {
    const uint8_t* data;
    size_t row_bytes;
    size_t expert_stride;
    const float* bias;
    int bias_stride;
    int rows, cols, row0;
};

inline DevMat to_dev(const ExpertMat& m, const char* what) {
    if (!moe_type_supported(m.type))
        throw ehp::Error(EH_UNSUPPORTED, std::string(what) + ": unsupported weight type " + ehp::type_name(m.type));
    if (m.cols <= 0 || m.cols % 32 || m.rows <= 0 || m.row_bytes != moe_row_bytes(m.type, m.cols) || !m.data)
        throw ehp::Error(EH_INTERNAL, std::string(what) + ": bad shape");
    if (m.type == EH_TYPE_MXFP4 && reinterpret_cast<uintptr_t>(m.data) % 16)
        throw ehp::Error(EH_INTERNAL, std::string(what) + ": MXFP4 data is not 16-byte aligned");
    return DevMat{static_cast<const uint8_t*>(m.data), m.row_bytes, m.expert_stride, m.bias, m.bias_stride,
                  m.rows, m.cols, m.row0};
}

__device__ __forceinline__ const uint8_t* row_ptr(const DevMat& m, int e, int r) {
    return m.data + size_t(e) * m.expert_stride + size_t(m.row0 + r) * m.row_bytes;
}

__device__ __forceinline__ float bias_of(const DevMat& m, int e, int r) {
    return m.bias ? m.bias[size_t(e) * m.bias_stride + r] : 0.0f;
}

// The P (token, slot) pairs of `ids` grouped by expert, a stable counting
// sort on the device (moe_prefill.cu): expert e's pairs, in pair order, are
// sorted[offsets[e] .. offsets[e+1]), and pos[pair] is a pair's place. A
// negative id (expert parallelism's mark for another rank's pair,
// moe_expert_range.hpp) sorts before expert 0: those pairs fill
// sorted[0 .. offsets[0]), in no expert's range. Ids past n_expert are left
// out (offsets[n_expert] < P).
void group_pairs(const int32_t* ids, int P, int n_expert, int32_t* offsets, int32_t* sorted, int32_t* pos,
                 cudaStream_t stream);
// The tensor-core form of moe_grouped (moe_grouped_mma.cu): whether it
// serves these experts (gate and up of one type, each matrix MXFP4, Q4_K or
// Q6_K), and its two products over the pairs grouped by expert (offsets
// from group_pairs; inputs FP16 in sorted order; `type` the matrix's):
// act16[i] = expert_swiglu(gate . x16[i] + bg, up . x16[i] + bu) as FP16,
// then out[i] = down . act16[i] (no bias: combine_sorted adds it).
bool mma_experts(const ExpertMat& gate, const ExpertMat& up, const ExpertMat& down);
// `pairs` (all experts' together) picks the kernel's tokens per pass and
// bounds the passes.
void mma_gate_up(const __half* x16, int pairs, const int32_t* offsets, int n_expert, const DevMat& g, const DevMat& u,
                 uint32_t type, float alpha, float limit, __half* act16, cudaStream_t stream);
void mma_down(const __half* act16, int pairs, const int32_t* offsets, int n_expert, const DevMat& d, uint32_t type,
              float* out, cudaStream_t stream);
// The tile form (moe_grouped_tiles.cu): blocks of 128 weight rows by
// kTilePairs pairs of one expert, the weights decoded into shared memory
// once per block, any moe type (gate and up may differ). Same inputs and
// outputs as mma_gate_up / mma_down. tile_units lists the blocks' (expert,
// first pair) units from the offsets (at most tile_units_max(pairs,
// n_expert) of them) into w, which both products then read.
constexpr int kTilePairs = 128;
struct TileUnit {
    int expert, first;
};
struct TileWork {
    TileUnit* units;  // [tile_units_max]
    int* count;       // one int
};
int tile_units_max(int pairs, int n_expert);
bool tile_experts(const ExpertMat& gate, const ExpertMat& up, const ExpertMat& down, int n_expert);
void tile_units(const int32_t* offsets, int n_expert, const TileWork& w, cudaStream_t stream);
void tile_gate_up(const __half* x16, int pairs, const int32_t* offsets, int n_expert, const TileWork& w,
                  const DevMat& g, uint32_t type_g, const DevMat& u, uint32_t type_u, float alpha, float limit,
                  __half* act16, cudaStream_t stream);
void tile_down(const __half* act16, int pairs, const int32_t* offsets, int n_expert, const TileWork& w, const DevMat& d,
               uint32_t type_d, float* out, cudaStream_t stream);
// x16[i] = x[sorted[i] / k] as FP16 (cols a multiple of 8, ldx of 4).
void gather_half_rows(const float* x, int ldx, int cols, int k, const int32_t* sorted, int P, __half* x16,
                      cudaStream_t stream);
// h[t][r] += sum over s in rank order of w[t*k+s] * (d[pos[t*k+s]][r] +
// bias[e][r]), e = ids[t*k+s]: the experts' outputs d in sorted order. Slots
// of negative id add no term.
void combine_sorted(const float* d, int embd, int ntok, int k, const int32_t* ids, const float* weights,
                    const int32_t* pos, const float* bias, int bias_stride, float* h, int ldh, cudaStream_t stream);

}  // namespace moe_detail
}  // namespace ehcuda
